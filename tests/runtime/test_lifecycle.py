"""Opening and closing: ``async with`` returns the object, closing is final, errors say
whether trying again can help."""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loomflow import Agent, new_id
from loomflow.errors import (
    LoomflowError,
    ProjectionTimeoutError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from loomflow.models import AnthropicModel, ScriptedModel
from loomflow.runtime import InProcRuntime, KafkaRuntime, PostgresRuntime, Scope, SqliteRuntime
from loomflow.settings import Settings
from tests.support.services import kafka_bootstrap, postgres_dsn


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


# -- a failed start leaves nothing behind ------------------------------------------------
#
# A runtime that could not open is often dropped by its caller without close() (the error
# said to try again later, and the next attempt makes a new one), so whatever the failed
# start had opened by then must be released by the start itself.


@dataclass(frozen=True)
class _Held:
    """What this process holds: its open file descriptors (number -> what it is) and its
    asyncio tasks not done yet."""

    fds: dict[int, str]
    tasks: set[asyncio.Task[Any]]

    @classmethod
    def now(cls) -> _Held:
        fds = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue  # the descriptor listdir itself used, closed by now
        return cls(fds, {t for t in asyncio.all_tasks() if not t.done()})

    def since(self, before: _Held) -> list[str]:
        """What is held now that was not ``before``."""
        fds = [f"fd {n} ({what})" for n, what in self.fds.items() if before.fds.get(n) != what]
        tasks = [f"task {t.get_coro()!r}" for t in self.tasks - before.tasks]
        return fds + tasks


def _tagged(dsn: str, application: str) -> str:
    """``dsn`` whose connections PostgreSQL lists under ``application``."""
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={application}"


async def _connections(application: str) -> int:
    """How many connections to the test database PostgreSQL lists under ``application``."""
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn())
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application
            )
        )
    finally:
        await conn.close()


async def _assert_nothing_left(before: _Held, application: str) -> None:
    """Nothing opened since ``before`` is still open, and PostgreSQL has no connection
    of ``application``; a socket closes an iteration or two of the loop after its
    transport did, so this waits (5 s at most) before it fails with what is left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        left = _Held.now().since(before)
        connections = await _connections(application)
        if connections:
            left.append(f"{connections} connection(s) to PostgreSQL")
        if not left or loop.time() > deadline:
            break
        await asyncio.sleep(0.05)  # the poll interval of the condition, not a wait for it
    assert not left, f"the failed start left behind: {left}"


@pytest.mark.postgres
async def test_a_postgres_runtime_that_fails_to_open_leaves_nothing_behind() -> None:
    application = f"lf_test_{secrets.token_hex(4)}"
    dsn = _tagged(postgres_dsn(), application)
    before = _Held.now()
    # nothing listens there
    unreachable = PostgresRuntime(
        _tagged("postgresql://loomflow:loomflow@127.0.0.1:1/loomflow", application)
    )
    with pytest.raises(StoreUnavailableError):
        await unreachable.open()
    # connected, then the schema check refuses: the pool it had opened is closed again
    schema = f"missing_{secrets.token_hex(4)}"
    refused = PostgresRuntime(
        settings=Settings(postgres_dsn=dsn, db_schema=schema, auto_migrate=False)
    )
    with pytest.raises(StoreError, match="loomflow setup"):
        await refused.open()
    # neither was closed: what they held went with the start
    await _assert_nothing_left(before, application)
    await unreachable.close()
    await refused.close()


@pytest.mark.kafka
async def test_a_kafka_runtime_whose_broker_does_not_answer_leaves_nothing_behind() -> None:
    """The read model's pool was open when the broker was found missing."""
    application = f"lf_test_{secrets.token_hex(4)}"
    settings = Settings(
        kafka_bootstrap="127.0.0.1:1",  # nothing listens there
        postgres_dsn=_tagged(postgres_dsn(), application),
        db_schema=f"lf_test_{secrets.token_hex(5)}",
    )
    before = _Held.now()
    runtime = KafkaRuntime(settings=settings)
    try:
        with pytest.raises(StoreUnavailableError, match=r"dev/kafka\.sh start"):
            await runtime.open()
        await _assert_nothing_left(before, application)
    finally:
        await runtime.close()
        await _drop_schema(settings.db_schema)


@pytest.mark.kafka
async def test_a_kafka_store_whose_listen_connection_is_refused_leaves_nothing_behind() -> None:
    """The producer had started, and the read model's pool was open, when PostgreSQL
    refused the LISTEN connection (the database admits one connection)."""
    import asyncpg

    from loomflow.runtime.kafka import KafkaStore
    from tests.support.backends import drop_environment

    application = f"lf_test_{secrets.token_hex(4)}"
    database = f"lf_test_{secrets.token_hex(5)}"
    admin = await asyncpg.connect(postgres_dsn())
    try:
        await admin.execute(f'CREATE DATABASE "{database}" CONNECTION LIMIT 1')
    finally:
        await admin.close()
    tag = secrets.token_hex(5)
    dsn = postgres_dsn().rsplit("/", 1)[0] + f"/{database}"
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap(),
        postgres_dsn=_tagged(dsn, application),
        db_schema=f"lf_test_{tag}",
        topic_prefix=f"lf-test-{tag}",
    )
    before = _Held.now()
    store = KafkaStore(settings)
    try:
        with pytest.raises(StoreError, match="not reachable"):
            await store.open()
        await _assert_nothing_left(before, application)
        admin = await asyncpg.connect(postgres_dsn())
        try:
            await admin.execute(f'ALTER DATABASE "{database}" CONNECTION LIMIT -1')
        finally:
            await admin.close()
        await store.open()  # the same store starts once the database admits it
        assert store.listening
    finally:
        await store.close()
        await drop_environment(settings.model_copy(update={"postgres_dsn": postgres_dsn()}))
        admin = await asyncpg.connect(postgres_dsn())
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await admin.close()


async def _drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


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
