"""``loomflow ui`` over the scaled path's read models, each as a process of its own:

- the Kafka read model, with defaults only: sessions written by a ``KafkaRuntime`` of
  the default settings, projected by a default ``loomflow processor`` (started as the
  README starts it), and the console started with no option; its actions go through the
  Kafka log (``KafkaRuntime``), and are seen in the read model once projected;
- ``PostgresRuntime``'s own schema, where the console's actions write to PostgreSQL.

The Kafka case owns the default names (topics ``loomflow.*``, schema ``loomflow``), as the
README's test does: it deletes them first and last.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from loomflow.log.reader import drain, kafka_reader
from loomflow.runtime import KafkaRuntime, PostgresRuntime, Scope
from loomflow.settings import Settings
from tests.support import lifecycle
from tests.support.console_app import SCRIPT, Journal, ui_process, write_journal
from tests.support.services import postgres_dsn
from tests.support.waiting import eventually
from tests.test_readme import default_names, processor, user_env, user_settings

__all__ = ["default_names", "processor"]  # the README test's fixtures of the Kafka path


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _get(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    answer = await client.get(path, params=params)
    assert answer.status_code == 200, (path, answer.text)
    return answer.json()


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    answer = await client.post(path, params={"user": "alice"}, json=body)
    assert answer.status_code == 200, (path, answer.text)
    return answer.json()


async def _drive(ui_url: str, journal: Journal) -> dict[str, Any]:
    """What a person does in the console: the list, a session, then a signal, a cancel
    and a fork, each seen in the read model once it is there. What the actions made."""
    async with httpx.AsyncClient(base_url=ui_url, timeout=60) as client:

        async def listed() -> bool:
            page = await _get(client, "/api/sessions")
            return bool(page["total_sessions"] == journal.count)

        await eventually(listed, within=60, what="the console to list every session")
        rows = await _get(client, "/api/sessions", limit=3)
        assert len(rows["sessions"]) == 3 and rows["next_cursor"]
        rest = await _get(client, "/api/sessions", limit=100, cursor=rows["next_cursor"])
        ids = {r["session_id"] for r in rows["sessions"] + rest["sessions"]}
        assert ids == {*journal.alice, *journal.bob, *journal.waiting, journal.hostile}
        page = (await client.get("/")).text
        assert all(f"/sessions/{s}" in page for s in journal.alice)

        hostile = await _get(client, f"/api/sessions/{journal.hostile}", user="alice")
        assert hostile["transcript"][-1]["content"].startswith(SCRIPT)
        (checkpoint,) = hostile["checkpoints"]
        html = (await client.get(f"/sessions/{journal.hostile}", params={"user": "alice"})).text
        assert "&lt;script&gt;" in html and SCRIPT not in html

        client.headers["X-CSRF-Token"] = (await _get(client, "/api/csrf"))["csrf"]
        signalled, cancelled = journal.waiting
        sent = await _post(
            client,
            f"/api/sessions/{signalled}/signal",
            {"name": "approve", "data": {"ok": True}},
        )
        await _post(client, f"/api/sessions/{cancelled}/cancel", {"reason": "by hand"})
        forked = await _post(
            client,
            f"/api/sessions/{journal.hostile}/fork",
            {"checkpoint_id": checkpoint["checkpoint_id"], "new_id": "forked-in-the-console"},
        )

        async def projected() -> bool:
            events = await _get(client, f"/api/sessions/{signalled}/events", user="alice")
            status = await _get(client, f"/api/sessions/{cancelled}", user="alice")
            child = await client.get(f"/api/sessions/{forked['session_id']}?user=alice")
            return (
                any(e["seq"] == sent["seq"] and e["type"] == "signal.sent" for e in events)
                and status["session"]["status"] == "cancelled"
                and child.status_code == 200
                and child.json()["session"]["parent_session_id"] == journal.hostile
            )

        await eventually(projected, within=60, what="the actions in the read model")
        # the unknown still reads as such, after the read model changed
        missing = await client.post(
            f"/api/sessions/{journal.hostile}/fork",
            params={"user": "alice"},
            json={"checkpoint_id": "ckpt-none"},
        )
        assert missing.status_code == 404
        assert checkpoint["checkpoint_id"] in missing.json()["error"]
        return {"signalled": signalled, "cancelled": cancelled, "forked": forked["session_id"]}


@pytest.mark.kafka
async def test_the_console_over_the_kafka_read_model_acts_through_the_log(
    default_names: Settings, processor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    async def created() -> bool:
        return default_names.events_topic in await _topics(default_names.kafka_bootstrap)

    await eventually(created, within=60, what="the processor to create the default topics")
    async with KafkaRuntime(settings=user_settings()) as runtime:
        journal = await write_journal(runtime, zoo=False)

    # the console with no option: the default settings' PostgreSQL read model
    with ui_process(tmp_path, env=user_env()) as ui:
        assert "the PostgreSQL read model" in ui.stderr()
        made = await _drive(ui.url, journal)
        assert "appending through the Kafka log" in ui.stderr()

    # each action is a record of the Kafka log: the processor projected it from there
    found: dict[tuple[str, str], int] = {}
    async with kafka_reader(user_settings(), group=None, start="beginning") as reader:
        async for batch in drain(reader):
            for record in batch:
                if record.event is not None:
                    key = (record.event.session_id, record.event.type)
                    found[key] = found.get(key, 0) + 1
    assert found[(made["signalled"], "signal.sent")] == 1
    assert found[(made["cancelled"], "run.cancelled")] == 1
    assert found[(made["forked"], "session.forked")] == 1

    # the waiting run receives the console's signal
    lifecycle.APPROVALS.clear()
    async with KafkaRuntime(settings=user_settings()) as runtime:
        done = await lifecycle.payer(runtime).resume(session_id=made["signalled"], user_id="alice")
        assert done.stop_reason == "completed"
        assert lifecycle.APPROVALS == [{"ok": True}]
        row = await runtime.store.session(Scope(made["cancelled"], "alice"))
        assert row is not None and row.status == "cancelled"
    assert processor.poll() is None, "the processor died"


@pytest.fixture
async def own_schema() -> AsyncIterator[str]:
    """A PostgresRuntime schema of this test's own; dropped after."""
    name = f"lf_test_{secrets.token_hex(6)}"
    yield name
    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_the_console_over_a_postgres_runtimes_schema_writes_to_postgresql(
    own_schema: str, tmp_path: Path
) -> None:
    async with PostgresRuntime(postgres_dsn(), schema=own_schema) as runtime:
        journal = await write_journal(runtime, zoo=False)
    env = {**user_env(), "LOOMFLOW_POSTGRES_DSN": postgres_dsn(), "LOOMFLOW_SCHEMA": own_schema}
    with ui_process(tmp_path, "--port", "0", env=env) as ui:
        made = await _drive(ui.url, journal)
        assert "Kafka" not in ui.stderr()
        assert "writing to the PostgreSQL read model" in ui.stderr()
    async with PostgresRuntime(postgres_dsn(), schema=own_schema) as runtime:
        events = await runtime.store.read_events(Scope(made["signalled"], "alice"))
        assert events[-1].type == "signal.sent"
        lifecycle.APPROVALS.clear()
        done = await lifecycle.payer(runtime).resume(session_id=made["signalled"], user_id="alice")
        assert done.stop_reason == "completed" and lifecycle.APPROVALS == [{"ok": True}]


@pytest.mark.postgres
async def test_the_console_says_which_postgresql_schema_it_serves(
    own_schema: str, tmp_path: Path
) -> None:
    """Its first line names the read model as every command's note names it: host, port,
    database and schema, never the DSN's user or password (it said only "the PostgreSQL
    read model", so a user with several schemas could not tell which one it served)."""
    async with PostgresRuntime(postgres_dsn(), schema=own_schema) as runtime:
        await write_journal(runtime, zoo=False)
    url = urlsplit(postgres_dsn())
    where = f"{url.hostname}:{url.port or 5432}{url.path}, schema {own_schema}"
    env = {**user_env(), "LOOMFLOW_POSTGRES_DSN": postgres_dsn(), "LOOMFLOW_SCHEMA": own_schema}
    for named in ((), ("--dsn", postgres_dsn())):  # by the settings, or by --dsn
        with ui_process(tmp_path, "--port", "0", *named, env=env) as ui:
            first = ui.stderr().splitlines()[0]
        assert first == (
            f"loomflow console on {ui.url} (the PostgreSQL read model at {where}); Ctrl-C stops"
        ), first  # the whole line: no user, no password
