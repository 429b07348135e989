"""Rebuild: replay the events topic from its first offset into an empty schema."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from loomflow.errors import StoreError
from loomflow.processors.projector import apply_records
from loomflow.producers import Topics
from loomflow.producers.topics import unreachable
from loomflow.projections import postgres as pg
from loomflow.schemas.events import MAX_EVENT_BYTES
from loomflow.settings import Settings

__all__ = ["RebuildResult", "rebuild"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RebuildResult:
    records: int
    applied: int
    dead_lettered: int


async def rebuild(
    settings: Settings | None = None,
    *,
    schema: str,
    batch: int = 2000,
    progress: Progress | None = None,
) -> RebuildResult:
    """Fold every record of the events topic, up to its current end, into ``schema``.

    The schema must be new or empty: a rebuild never mixes with an existing read model.
    Records that do not apply are dead-lettered there, as the live projector does (with
    the same rule of signatures, the settings').
    Positions are saved under the settings' projector group, so a processor with the
    same settings pointed at the rebuilt schema goes on from where the rebuild stopped.
    """
    settings = Settings.resolve(settings)
    topics = Topics.from_settings(settings)
    bootstrap, dsn = settings.kafka_bootstrap, settings.postgres_dsn
    consumer = settings.projector_group
    signatures = settings.signatures_policy()
    pg.check_schema(schema)
    try:
        conn = await asyncpg.connect(dsn, timeout=settings.connect_timeout)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreError(
            f"PostgreSQL is not reachable ({exc}); start it with `dev/postgres.sh start`"
        ) from exc
    consumer_ = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
    )
    try:
        await pg.migrate(conn, schema)
        if await pg.holds_events(conn, schema):
            raise StoreError(
                f"schema {schema!r} already holds a read model; rebuild into a new schema"
            )
        try:
            await consumer_.start()
        except KafkaError as exc:
            raise unreachable(bootstrap, exc) from exc
        partitions = [
            TopicPartition(topics.events, p)
            for p in sorted(await _partitions(bootstrap, topics.events))
        ]
        consumer_.assign(partitions)
        await consumer_.seek_to_beginning(*partitions)
        starts = await consumer_.beginning_offsets(partitions)
        ends = await consumer_.end_offsets(partitions)
        total = sum(ends[tp] - starts[tp] for tp in partitions)
        done = applied = dead = 0
        if progress:
            progress(0, total)
        for tp in partitions:
            while await consumer_.position(tp) < ends[tp]:
                fetched = await consumer_.getmany(tp, timeout_ms=1000, max_records=batch)
                records = [r for r in fetched.get(tp, []) if r.offset < ends[tp]]
                if not records:
                    continue
                outcome = await apply_records(conn, schema, consumer, {tp: records}, signatures)
                done += len(records)
                applied += len(outcome.applied)
                dead += len(outcome.dead)
                if progress:
                    progress(done, total)
        return RebuildResult(done, applied, dead)
    finally:
        await consumer_.stop()
        await conn.close()


async def _partitions(bootstrap: str, topic: str) -> set[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        described = await admin.describe_topics([topic])
    except KafkaError as exc:
        raise unreachable(bootstrap, exc) from exc
    finally:
        await admin.close()
    found = {p["partition"] for d in described if d["error_code"] == 0 for p in d["partitions"]}
    if not found:
        raise StoreError(f"Kafka topic {topic} does not exist: nothing to rebuild from")
    return found
