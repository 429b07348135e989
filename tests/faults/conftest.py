"""The fault-injection suite: each scenario runs a bounded number of trials in CI and the
counts RELIABILITY.md reports with ``pytest tests/faults --soak``."""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from loomflow.runtime import PostgresRuntime, Runtime, SqliteRuntime
from tests.support.kafka_env import ROOT, KafkaEnv
from tests.support.services import postgres_dsn

#: how many trials a scenario runs: ``trials(ci=5, soak=50)``
Trials = Callable[..., int]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    """Whether the suite runs with ``--soak``."""
    return bool(request.config.getoption("--soak"))


@pytest.fixture
def trials(request: pytest.FixtureRequest) -> Trials:
    """The number of trials for a scenario: ``ci`` normally, ``soak`` with ``--soak``."""
    soaking = bool(request.config.getoption("--soak"))

    def count(*, ci: int, soak: int) -> int:
        return soak if soaking else ci

    return count


@dataclass
class Place:
    """Where a trial's agent runs: the child's command-line flag, its LOOMFLOW_*
    variables, and a runtime on the same storage for the process that resumes."""

    name: str
    flag: list[str]
    variables: dict[str, str]
    runtime: Callable[[Path], Runtime]
    #: the events a runtime may report before the log acknowledged them (Kafka sends a
    #: prompt without waiting; the next append waits for it)
    sends_ahead: bool = False

    async def agent_process(
        self, db: Path, session: str, log: Path, *options: str
    ) -> asyncio.subprocess.Process:
        """The research agent of tests/support/crash_worker.py in its own process, on this
        place's storage and configured by its LOOMFLOW_* variables alone, logging its
        calls and acknowledged events to ``log``; its stderr is piped."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
        env.update(self.variables, PYTHONPATH=str(ROOT))
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.crash_worker",
            str(db),
            session,
            str(log),
            *options,
            *self.flag,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("kafka", marks=pytest.mark.kafka),
    ]
)
async def place(request: pytest.FixtureRequest) -> AsyncIterator[Place]:
    name = request.param
    if name == "sqlite":
        yield Place(name, [], {}, lambda db: SqliteRuntime(db))
    elif name == "postgres":
        schema = f"lf_test_{secrets.token_hex(6)}"
        dsn = postgres_dsn()
        yield Place(
            name,
            ["--postgres"],
            {"LOOMFLOW_POSTGRES_DSN": dsn, "LOOMFLOW_SCHEMA": schema},
            lambda db: PostgresRuntime(dsn, schema=schema),
        )
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    else:
        env = await KafkaEnv.create()
        await env.start_projector()
        try:
            yield Place(
                name, ["--kafka"], env.variables(), lambda db: env.runtime(), sends_ahead=True
            )
        finally:
            await env.close()
