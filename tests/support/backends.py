"""The runtimes the conformance suite runs against, each able to reopen its storage."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from loomflow.processors import Projector
from loomflow.producers import Topics, ensure_topics
from loomflow.runtime import EventStore, InProcRuntime, PostgresRuntime, Runtime, SqliteRuntime
from loomflow.runtime.kafka import KafkaRuntime
from loomflow.settings import Settings
from tests.support.services import kafka_bootstrap, postgres_dsn


@dataclass
class Backend:
    """Opens runtimes on one storage: a second runtime sees what the first wrote.

    Whoever opens a runtime closes it (the conformance suites close theirs); ``close``
    tears the storage down.
    """

    name: str
    opener: Callable[..., Runtime]
    cleanup: Callable[[], Awaitable[None]] | None = None
    setup: Callable[[], Awaitable[None]] | None = None

    def runtime(self, **kwargs: Any) -> Runtime:
        """A runtime on this storage, with the backend's defaults for what is not given."""
        return self.opener(**kwargs)

    def store(self) -> EventStore:
        """An event store on this storage, as a runtime with default settings opens it."""
        return self.opener().store

    async def open(self) -> None:
        if self.setup is not None:
            await self.setup()

    async def close(self) -> None:
        if self.cleanup is not None:
            await self.cleanup()


def inproc_backend(tmp_path: Path) -> Backend:
    shared: list[Runtime] = []

    def opener(**kwargs: Any) -> Runtime:
        # every runtime shares the first one's memory, as a reopened file would
        if not shared:
            shared.append(InProcRuntime(**kwargs))
            return shared[0]
        return Runtime(shared[0].store, **kwargs)

    return Backend("inproc", opener)


def sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "journal.db"
    return Backend("sqlite", lambda **kwargs: SqliteRuntime(path, **kwargs))


def postgres_backend(tmp_path: Path) -> Backend:
    dsn = postgres_dsn()
    schema = f"lf_test_{secrets.token_hex(6)}"  # one schema per test: tests never share rows

    async def drop_schema() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    return Backend(
        "postgres",
        lambda **kwargs: PostgresRuntime(dsn, schema=schema, **kwargs),
        cleanup=drop_schema,
    )


def kafka_backend(tmp_path: Path) -> Backend:
    """Kafka for the log, a projector task in this process, PostgreSQL for the read model.

    Topics, schema and processor id are this test's own, handed to both sides through
    one Settings object, as LOOMFLOW_* variables would.
    """
    tag = secrets.token_hex(5)
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap(),
        postgres_dsn=postgres_dsn(),
        db_schema=f"lf_test_{tag}",
        topic_prefix=f"lf-test-{tag}",
        topic_partitions=2,
        processor_id=f"lf-test-{tag}",
    )
    projector = Projector(settings, poll_ms=20, session_timeout_ms=6_000, heartbeat_interval_ms=500)
    stop = asyncio.Event()
    running: list[asyncio.Task[None]] = []

    async def setup() -> None:
        await ensure_topics(settings.kafka_bootstrap, Topics.from_settings(settings))
        await projector.start()
        running.append(asyncio.create_task(projector.run(stop)))

    async def cleanup() -> None:
        stop.set()
        for task in running:
            await task
        await projector.stop()
        await drop_environment(settings)

    return Backend(
        "kafka",
        lambda **kwargs: KafkaRuntime(settings=settings, **kwargs),
        cleanup=cleanup,
        setup=setup,
    )


async def drop_environment(settings: Settings) -> None:
    """Drop a test's schema and delete its topics."""
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{settings.db_schema}" CASCADE')
    finally:
        await conn.close()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(
            [settings.events_topic, settings.snapshots_topic, settings.dlq_topic]
        )
    finally:
        await admin.close()


BACKENDS: dict[str, Callable[[Path], Backend]] = {
    "inproc": inproc_backend,
    "kafka": kafka_backend,
    "postgres": postgres_backend,
    "sqlite": sqlite_backend,
}


#: the runtimes over each SQL dialect's read model, as a fixture's params
SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@asynccontextmanager
async def backend_runtime(name: str, tmp_path: Path) -> AsyncIterator[Runtime]:
    """A runtime, open, on storage of the backend ``name`` that is torn down after it."""
    backend = BACKENDS[name](tmp_path)
    await backend.open()
    try:
        async with backend.runtime() as opened:
            yield opened
    finally:
        await backend.close()
