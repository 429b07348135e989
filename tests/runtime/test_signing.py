"""Signed writes as a user sets them up: a signing key in the environment, nothing passed
in code, and every event a run appends is signed before it is written; with no key, none
is, and the log holds no ``sig`` at all."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import orjson
import pytest
from pydantic import SecretStr

from loomflow import Agent, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import InProcStore, Runtime, Scope, SqliteRuntime
from loomflow.schemas.signing import Keyring, Signer
from loomflow.settings import Settings


def population(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 709000"


async def _run(runtime: Runtime) -> None:
    model = ScriptedModel([ScriptedModel.tool_call("population", city="Oslo"), "709000."])
    agent = Agent(
        "Answer with data.",
        model=model,
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
        tools=[population],
    )
    await agent.run("How many live in Oslo?", session_id="s1", user_id="ada")


def _stored(db: Path) -> list[tuple[str, str | None]]:
    """(type, sig column) of every row of the log, as the file holds them."""
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT type, sig FROM loomflow_events ORDER BY position").fetchall()


@pytest.mark.parametrize("given", ["LOOMFLOW_SIGNING_KEY", "LOOMFLOW_SIGNING_KEY_FILE"])
async def test_a_key_in_the_environment_signs_every_event_a_run_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    signer = Signer.generate()
    if given == "LOOMFLOW_SIGNING_KEY_FILE":
        signer.write(tmp_path / "writer.pem")
        monkeypatch.setenv(given, str(tmp_path / "writer.pem"))
    else:
        monkeypatch.setenv(given, signer.pem().decode())
    db = tmp_path / "journal.db"
    async with SqliteRuntime(db) as runtime:
        await _run(runtime)
        events = await runtime.store.read_events(Scope("s1", "ada"))
    rows = _stored(db)
    types = [kind for kind, _ in rows]
    assert {"run.started", "turn.appended", "checkpoint.written", "run.finished"} <= set(types)
    assert all(sig is not None and orjson.loads(sig)["key"] == signer.key_id for _, sig in rows)
    keyring = Keyring.of(signer.trusted())
    assert [e.type for e in events] == types
    assert [keyring.event_problem(e) for e in events] == [None] * len(events)


async def test_with_no_key_no_event_carries_a_signature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOOMFLOW_SIGNING_KEY", raising=False)
    monkeypatch.delenv("LOOMFLOW_SIGNING_KEY_FILE", raising=False)
    db = tmp_path / "journal.db"
    async with SqliteRuntime(db) as runtime:
        await _run(runtime)
        events = await runtime.store.read_events(Scope("s1", "ada"))
    assert _stored(db) and all(sig is None for _, sig in _stored(db))
    assert events and all(b'"sig"' not in e.model_dump_json().encode() for e in events)


async def test_a_store_built_apart_signs_with_the_key_of_its_runtimes_settings() -> None:
    signer = Signer.generate()
    settings = Settings(signing_key=SecretStr(signer.pem().decode()))
    store = InProcStore(settings=Settings(signing_key=None))
    async with Runtime(store, settings=settings) as runtime:
        await _run(runtime)
        events = await runtime.store.read_events(Scope("s1", "ada"))
    keyring = Keyring.of(signer.trusted())
    assert events and [keyring.event_problem(e) for e in events] == [None] * len(events)


def test_stores_built_from_settings_read_their_key_once_there() -> None:
    from loomflow.runtime import PostgresStore
    from loomflow.runtime.kafka import KafkaStore

    signer = Signer.generate()
    settings = Settings(signing_key=SecretStr(signer.pem().decode()))
    for store in (PostgresStore.from_settings(settings), KafkaStore(settings)):
        assert store.signer is not None and store.signer.key_id == signer.key_id
