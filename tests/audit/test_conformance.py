"""loomflow.testing's audit-trail suite, run against our trails: a SQLite file beside an
embedded log, and the read model's PostgreSQL schema audited from the Kafka topic by
the audit group (as ``loomflow audit`` pairs them). What only one of them has to prove
is in test_auditor.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from loomflow.projections.audit import PostgresTrail, SqliteTrail, Trail, default_trail_path
from loomflow.projections.chain import Entry
from loomflow.runtime import PostgresStore
from loomflow.testing import AuditedLog, AuditTrailConformance, TrailTampering
from tests.support.kafka_env import KafkaEnv
from tests.support.logs import KafkaGroupLog

_COLUMNS = ("n", "body", "digest", "prev", "hash")


def _entry_row(entry: Entry) -> tuple[object, ...]:
    """The entry as a row of audit_entries, in its columns' order."""
    return (
        entry.user_id or "",
        entry.session_id,
        entry.n,
        entry.position,
        entry.key,
        entry.seq,
        entry.type,
        entry.at,
        entry.digest,
        entry.body,
        entry.prev,
        entry.hash,
    )


class SqliteTampering(TrailTampering):
    """Statements on the trail's file, as the sqlite3 shell runs them."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def _run(self, sql: str, *args: object) -> None:
        def run() -> int:
            with closing(sqlite3.connect(self.path)) as conn, conn:
                return conn.execute(sql, args).rowcount

        assert await asyncio.to_thread(run) == 1, sql

    async def delete(self, user_id: str | None, session_id: str, n: int) -> None:
        await self._run(
            "DELETE FROM audit_entries WHERE user_id = ? AND session_id = ? AND n = ?",
            user_id or "",
            session_id,
            n,
        )

    async def update(self, user_id: str | None, session_id: str, n: int, /, **columns: Any) -> None:
        assert set(columns) <= set(_COLUMNS), columns
        assignments = ", ".join(f"{name} = ?" for name in columns)
        await self._run(
            f"UPDATE audit_entries SET {assignments} WHERE user_id = ? AND session_id = ? "
            "AND n = ?",
            *columns.values(),
            user_id or "",
            session_id,
            n,
        )

    async def insert(self, entry: Entry) -> None:
        row = list(_entry_row(entry))
        row[7] = entry.at.isoformat()
        await self._run(f"INSERT INTO audit_entries VALUES ({', '.join('?' * 12)})", *row)


class PostgresTampering(TrailTampering):
    """Statements on the trail's tables, as psql runs them."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.table = f'"{schema}".audit_entries'

    async def _run(self, sql: str, *args: object) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            status = await conn.execute(sql, *args)
        finally:
            await conn.close()
        assert status.split()[-1] == "1", (sql, status)

    async def delete(self, user_id: str | None, session_id: str, n: int) -> None:
        await self._run(
            f"DELETE FROM {self.table} WHERE user_id = $1 AND session_id = $2 AND n = $3",
            user_id or "",
            session_id,
            n,
        )

    async def update(self, user_id: str | None, session_id: str, n: int, /, **columns: Any) -> None:
        assert set(columns) <= set(_COLUMNS), columns
        assignments = ", ".join(f"{name} = ${k}" for k, name in enumerate(columns, start=4))
        await self._run(
            f"UPDATE {self.table} SET {assignments} WHERE user_id = $1 AND session_id = $2 "
            "AND n = $3",
            user_id or "",
            session_id,
            n,
            *columns.values(),
        )

    async def insert(self, entry: Entry) -> None:
        params = ", ".join(f"${k}" for k in range(1, 13))
        await self._run(f"INSERT INTO {self.table} VALUES ({params})", *_entry_row(entry))


class TestSqliteTrail(AuditTrailConformance):
    """Beside the embedded log (the suite's default ``log``)."""

    @pytest.fixture
    def open_trail(self, tmp_path: Path) -> Callable[[], Trail]:
        return lambda: SqliteTrail(default_trail_path(tmp_path / "journal.db"))

    @pytest.fixture
    def tamper(self, tmp_path: Path) -> TrailTampering:
        return SqliteTampering(default_trail_path(tmp_path / "journal.db"))


@pytest.mark.kafka
@pytest.mark.postgres
class TestPostgresTrail(AuditTrailConformance):
    """In the read model's schema, audited from the topic by the audit group: a trail
    that keeps no position (the group does)."""

    @pytest.fixture
    async def kafka_env(self) -> AsyncIterator[KafkaEnv]:
        env = await KafkaEnv.create(partitions=2)
        await env.start_projector()  # erase and prune read the read model
        yield env
        await env.close()

    @pytest.fixture
    def log(self, kafka_env: KafkaEnv) -> AuditedLog:
        return KafkaGroupLog(kafka_env)

    @pytest.fixture
    def open_trail(self, kafka_env: KafkaEnv) -> Callable[[], Trail]:
        def trail() -> Trail:
            store = PostgresStore.from_settings(kafka_env.settings, max_size=2)
            return PostgresTrail(store._call, "audit trail of the test", on_close=store.close)

        return trail

    @pytest.fixture
    def tamper(self, kafka_env: KafkaEnv) -> TrailTampering:
        return PostgresTampering(kafka_env.dsn, kafka_env.schema)
