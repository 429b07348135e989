"""Compare a PostgreSQL read model with the fold of the log it was projected from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from loomflow.errors import InvalidEventError
from loomflow.producers import Topics
from loomflow.projections import postgres as pg
from loomflow.runtime import InProcStore, Scope
from loomflow.schemas import Event
from loomflow.schemas.codec import decode_event
from loomflow.schemas.events import MAX_EVENT_BYTES

Snapshot = dict[tuple[str | None, str], dict[str, Any]]


async def read_records(bootstrap: str, topic: str, partitions: int) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its current end, partition by partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[ConsumerRecord] = []
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                records.extend(r for r in batch.get(tp, []) if r.offset < ends[tp])
        return records
    finally:
        await consumer.stop()


async def log_events(bootstrap: str, topics: Topics) -> list[Event]:
    """Every decodable event of the events topic, partition by partition, in offset order."""
    events: list[Event] = []
    for record in await read_records(bootstrap, topics.events, topics.partitions):
        try:
            events.append(decode_event(record.value or b""))
        except InvalidEventError:
            continue  # the projector dead-letters these: no part of the model
    return events


async def fold_of(events: list[Event]) -> Snapshot:
    """The read model the shared fold makes of these events (refused ones skipped)."""
    store = InProcStore()
    for event in events:
        try:
            await store.append([event])
        except InvalidEventError:
            continue
    return snapshot_of(store)


def snapshot_of(store: InProcStore) -> Snapshot:
    """The read model an in-process store folded, in the shape ``in_postgres`` reads."""
    snapshot: Snapshot = {}
    for scope, entry in store._memory.sessions.items():
        snapshot[(scope.user_id, scope.session_id)] = {
            "session": asdict(entry.row),
            "checkpoints": [asdict(c) for c in entry.checkpoints],
            "steps": {k: asdict(v) for k, v in entry.steps.items()},
            "events": [(e.seq, e.event_id) for e in entry.log],
        }
    return snapshot


async def in_postgres(
    dsn: str, schema: str, only: Callable[[str | None, str], bool] | None = None
) -> Snapshot:
    """The same shape, read from a PostgreSQL read model (of the sessions ``only``
    selects, by user and session id)."""
    conn = await asyncpg.connect(dsn)
    try:
        keys = await conn.fetch(f'SELECT user_id, session_id FROM "{schema}".sessions')
        snapshot: Snapshot = {}
        for uid, sid in keys:
            user = uid or None
            if only is not None and not only(user, sid):
                continue
            row = await pg.load_session(conn, schema, user, sid)
            assert row is not None
            checkpoints = await pg.list_checkpoints(conn, schema, user, sid, 1 << 30)
            step_keys = await conn.fetch(
                f'SELECT step_key FROM "{schema}".steps WHERE user_id = $1 AND session_id = $2',
                uid,
                sid,
            )
            steps = {}
            for (step_key,) in step_keys:
                step = await pg.get_step(conn, schema, user, sid, step_key)
                assert step is not None
                steps[step_key] = asdict(step)
            events = await pg.read_events(conn, schema, user, sid, 0, 1 << 62)
            snapshot[(user, sid)] = {
                "session": asdict(row),
                "checkpoints": [asdict(c) for c in reversed(checkpoints)],
                "steps": steps,
                "events": [(e.seq, e.event_id) for e in events],
            }
        return snapshot
    finally:
        await conn.close()


def scope_of(key: tuple[str | None, str]) -> Scope:
    return Scope(key[1], key[0])
