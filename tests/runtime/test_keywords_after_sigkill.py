"""A run with context, extra_tools and output_schema is SIGKILLed mid-run; a new process
resumes it with the same keywords: nothing recorded runs again, and the answer validates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loomflow.runtime import Scope
from loomflow.schemas import RunStarted, new_id
from tests.support.kafka_env import KafkaEnv
from tests.support.keywords_worker import OSLO, City, agent_on, keywords, runtime_of
from tests.support.services import postgres_dsn
from tests.support.waiting import kill_once_hanging

ROOT = Path(__file__).resolve().parents[2]


def _worker(kind: str, db: Path, log: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    command = ["-m", "tests.support.keywords_worker", kind, str(db), "s1", str(log)]
    return subprocess.Popen(
        [sys.executable, *command, "--hang-at", "3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "kind",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.postgres]),
    ],
)
async def test_a_resume_after_sigkill_keeps_the_keywords_and_repeats_nothing(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, log = tmp_path / "journal.db", tmp_path / "calls.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    kafka: KafkaEnv | None = None
    if kind == "postgres":
        schema = f"kw_{new_id('t').split('_')[-1].lower()}"
        env.update(LOOMFLOW_POSTGRES_DSN=postgres_dsn(), LOOMFLOW_SCHEMA=schema)
    elif kind == "kafka":
        kafka = await KafkaEnv.create()
        await kafka.start_projector()
        env.update(kafka.variables())
    for name, value in env.items():
        if name.startswith("LOOMFLOW_"):
            monkeypatch.setenv(name, value)  # the resuming runtime reads them as the worker did
    # the 3rd model call asks for the answer again after the schema refused the first
    victim = _worker(kind, db, log, env)
    await kill_once_hanging(victim)
    assert log.read_text().splitlines() == [
        "model 0",
        "tool Oslo for u1/acme",
        "model 1",
        "model 2",
    ]

    runtime = runtime_of(kind, str(db))
    try:
        result = await agent_on(runtime, log).resume(session_id="s1", **keywords(log))
        events = await runtime.store.read_events(Scope("s1", "u1"))
    finally:
        await runtime.close()
        if kind == "postgres":
            await _drop(env["LOOMFLOW_SCHEMA"])
        if kafka is not None:
            await kafka.close()
    assert result.parsed == City(name="Oslo", population=709000) and result.output == OSLO
    assert result.restored_turns == 2 and result.model_calls == 1
    # the tool ran once, in the killed process; the resume asked for the answer alone
    assert log.read_text().splitlines()[4:] == ["model 2"]
    resumed = [e for e in events if isinstance(e, RunStarted)][-1]
    # on Kafka the last pass's checkpoint travels with the next prompt, which is sent without
    # waiting for its acknowledgement (it is ours to send again): killed before the broker
    # had it, the session has no checkpoint, and resume() falls back to run() on its log
    modes = {"resume", "run"} if kind == "kafka" else {"resume"}
    assert resumed.payload.mode in modes and resumed.payload.metadata == {"tenant": "acme"}


async def _drop(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
