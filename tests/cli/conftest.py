"""Fixtures of the command-line tests."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import asyncpg
import pytest

from tests.support.cli import Cli, runner
from tests.support.services import postgres_dsn


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """``loomflow ARGS`` in this process: exit code, stdout and stderr."""
    return runner(capsys)


@pytest.fixture
def schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A schema of this test's own, named as a user would: LOOMFLOW_SCHEMA (and the DSN
    by LOOMFLOW_POSTGRES_DSN), no option."""
    name = f"lf_test_{secrets.token_hex(6)}"
    dsn = postgres_dsn()
    monkeypatch.setenv("LOOMFLOW_POSTGRES_DSN", dsn)
    monkeypatch.setenv("LOOMFLOW_SCHEMA", name)
    yield name

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())
