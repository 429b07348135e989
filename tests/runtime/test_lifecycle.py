"""Opening and closing: ``async with`` returns the object, closing is final, errors say
whether trying again can help."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomflow import Agent, new_id
from loomflow.errors import (
    LoomflowError,
    ProjectionTimeoutError,
    StoreClosedError,
    StoreUnavailableError,
)
from loomflow.models import AnthropicModel, ScriptedModel
from loomflow.runtime import InProcRuntime, KafkaRuntime, PostgresRuntime, Scope, SqliteRuntime
from tests.support.services import postgres_dsn


async def test_a_runtime_opens_in_async_with_and_is_closed_after(tmp_path: Path) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db")
    async with runtime as opened:
        assert opened is runtime
        assert (tmp_path / "journal.db").exists()  # opened (and migrated) on entry
    with pytest.raises(StoreClosedError) as caught:
        await runtime.list_checkpoints(Scope("s1"))
    assert not caught.value.retriable  # a closed store stays closed: open a new runtime
    await runtime.close()  # closing twice is harmless


@pytest.mark.postgres
async def test_a_store_and_a_projector_work_as_async_with(tmp_path: Path) -> None:
    from loomflow.processors import Projector
    from loomflow.settings import Settings

    async with SqliteRuntime(tmp_path / "j.db").store as store:
        assert await store.session(Scope("s1")) is None
    unreachable = Settings(postgres_dsn="postgresql://loomflow:loomflow@127.0.0.1:1/loomflow")
    with pytest.raises(StoreUnavailableError):
        async with Projector(unreachable):
            pass


@pytest.mark.postgres
async def test_a_runtime_that_cannot_open_raises_a_retriable_error_and_leaves_nothing() -> None:
    runtime = PostgresRuntime("postgresql://loomflow:loomflow@127.0.0.1:1/loomflow")
    with pytest.raises(StoreUnavailableError) as caught:
        async with runtime:
            pass
    assert caught.value.retriable
    kafka = KafkaRuntime("127.0.0.1:1", postgres_dsn())
    with pytest.raises(StoreUnavailableError, match=r"dev/kafka\.sh start"):
        async with kafka:
            pass


def test_which_errors_are_worth_retrying() -> None:
    assert ProjectionTimeoutError.retriable and StoreUnavailableError.retriable
    assert not StoreClosedError.retriable and not LoomflowError.retriable


class _Closable(ScriptedModel):
    closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_an_agent_closes_what_it_made_and_only_that() -> None:
    theirs = _Closable(["hi"])
    async with Agent("x", model=theirs) as agent:
        assert (await agent.run("go")).output == "hi"
    assert theirs.closed == 0  # the caller's model is the caller's to close

    made = Agent("x", model="claude-opus-4-7")
    assert isinstance(made.model, AnthropicModel)
    client = made.model.client  # built now, as a first request would
    default_runtime = made.runtime
    assert isinstance(default_runtime, InProcRuntime)
    await made.aclose()
    assert client.is_closed()
    await made.aclose()  # twice is harmless


@pytest.mark.postgres
async def test_with_automatic_migration_off_a_runtime_waits_for_setup() -> None:
    import asyncpg

    from loomflow.errors import StoreError
    from loomflow.settings import Settings

    schema = f"setup_{new_id('t').split('_')[-1].lower()}"
    settings = Settings(postgres_dsn=postgres_dsn(), db_schema=schema, auto_migrate=False)
    try:
        with pytest.raises(StoreError, match="loomflow setup") as caught:
            async with PostgresRuntime(settings=settings):
                pass
        assert "version 0" in str(caught.value)
        runtime = PostgresRuntime(settings=settings)
        await runtime.setup()  # what a deploy runs ahead, once
        await runtime.close()
        async with PostgresRuntime(settings=settings) as runtime:  # now it only checks
            agent = Agent("Answer.", model=ScriptedModel(["done"]), runtime=runtime)
            result = await agent.run("go", session_id="s1")
            assert result.output == "done"
    finally:
        conn = await asyncpg.connect(postgres_dsn())
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


@pytest.mark.kafka
def test_loomflow_setup_creates_the_schema_and_topics_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    import asyncpg

    from loomflow.cli import main
    from loomflow.projections.postgres import SCHEMA_VERSION, schema_version
    from tests.support.services import kafka_bootstrap

    name = f"setup_{new_id('t').split('_')[-1].lower()}"
    monkeypatch.setenv("LOOMFLOW_KAFKA_BOOTSTRAP", kafka_bootstrap())
    monkeypatch.setenv("LOOMFLOW_POSTGRES_DSN", postgres_dsn())
    monkeypatch.setenv("LOOMFLOW_SCHEMA", name)
    monkeypatch.setenv("LOOMFLOW_TOPIC_PREFIX", name)

    async def version() -> int:
        conn = await asyncpg.connect(postgres_dsn())
        try:
            return await schema_version(conn, name)
        finally:
            await conn.close()

    async def drop() -> None:
        conn = await asyncpg.connect(postgres_dsn())
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()

    assert asyncio.run(version()) == 0
    try:
        assert main(["setup"]) == 0
        assert asyncio.run(version()) == SCHEMA_VERSION
        assert asyncio.run(_topics_named(name)) == {
            f"{name}.events",
            f"{name}.snapshots",
            f"{name}.events.dlq",
        }
        assert f"schema {name!r} is at the current version" in capsys.readouterr().out
    finally:
        asyncio.run(drop())


@pytest.mark.kafka
def test_with_automatic_migration_off_kafka_processes_create_nothing_and_say_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from loomflow.cli import main
    from loomflow.errors import StoreError
    from loomflow.settings import Settings
    from tests.support.services import kafka_bootstrap

    name = f"nomig_{new_id('t').split('_')[-1].lower()}"
    variables = {
        "LOOMFLOW_KAFKA_BOOTSTRAP": kafka_bootstrap(),
        "LOOMFLOW_POSTGRES_DSN": postgres_dsn(),
        "LOOMFLOW_SCHEMA": name,
        "LOOMFLOW_TOPIC_PREFIX": name,
        "LOOMFLOW_PROCESSOR_ID": name,
        "LOOMFLOW_AUTO_MIGRATE": "false",
    }
    for key, value in variables.items():
        monkeypatch.setenv(key, value)

    async def open_runtime() -> None:
        async with KafkaRuntime(settings=Settings()):
            pass

    with pytest.raises(StoreError, match="loomflow setup"):
        asyncio.run(open_runtime())
    assert main(["processor"]) == 1
    assert "loomflow setup" in capsys.readouterr().err
    assert asyncio.run(_topics_named(name)) == set()  # neither of them created anything


async def _topics_named(prefix: str) -> set[str]:
    """The broker's topics whose names start with ``prefix``."""
    from aiokafka.admin import AIOKafkaAdminClient

    from tests.support.services import kafka_bootstrap

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap())
    await admin.start()
    try:
        return {t for t in await admin.list_topics() if t.startswith(prefix)}
    finally:
        await admin.close()
