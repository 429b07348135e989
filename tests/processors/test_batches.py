"""What one batch of the projector costs and tells: the statements of a lone claim, the
notifications runtimes wait on, and the offsets it leaves in Kafka."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from loomflow.processors.projector import apply_records
from loomflow.producers import EventProducer, scope_key
from loomflow.projections import postgres as pg
from loomflow.runtime.postgres import PostgresStore
from loomflow.schemas.events import EventBase
from loomflow.testing import SessionLog
from tests.support.kafka_env import KafkaEnv, session_events
from tests.support.services import postgres_dsn
from tests.support.waiting import eventually


def _records(events: Sequence[EventBase], first: int = 0) -> list[Any]:
    return [
        SimpleNamespace(
            topic="t",
            partition=0,
            offset=first + n,
            key=scope_key(e.user_id, e.session_id),
            value=e.model_dump_json().encode(),
            headers=[],
            timestamp=0,
        )
        for n, e in enumerate(events)
    ]


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    name = f"lf_test_batch_{secrets.token_hex(4)}"
    await PostgresStore(postgres_dsn(), schema=name).open()  # made and migrated
    yield name
    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_a_lone_claim_is_applied_without_savepoints_and_heard_with_its_position(
    schema: str,
) -> None:
    """A runtime's claim waits for this batch: its statements are the round trips it pays."""
    warm, claim = SessionLog("s0", "ada").claim(), SessionLog("s1", "ada").claim()
    heard: list[tuple[str, str]] = []
    both = asyncio.Event()

    def listen(_conn: Any, _pid: int, channel: str, payload: str) -> None:
        heard.append((channel, payload))
        if len(heard) == 2:
            both.set()

    listener = await asyncpg.connect(postgres_dsn())
    conn = await asyncpg.connect(postgres_dsn())
    try:
        # a first batch: asyncpg's look-up of the types is its own, once a connection
        await apply_records(conn, schema, "g", {TopicPartition("t", 0): _records([warm])})
        for channel in (pg.sessions_channel(schema), pg.positions_channel(schema)):
            await listener.add_listener(channel, listen)
        statements: list[str] = []
        conn.add_query_logger(lambda record: statements.append(record.query))
        batch = {TopicPartition("t", 0): _records([claim], first=41)}
        outcome = await apply_records(conn, schema, "g", batch)
        await asyncio.wait_for(both.wait(), 10)
    finally:
        await conn.close()
        await listener.close()
    assert [e.event_id for e in outcome.applied] == [claim.event_id] and not outcome.dead
    # begin, the session's lock, its log and session rows, the notes and position, commit
    assert not [s for s in statements if "SAVEPOINT" in s.upper()]
    assert len(statements) == 5, statements
    (_, note), (_, position) = heard
    assert [channel for channel, _ in heard] == [
        pg.sessions_channel(schema),
        pg.positions_channel(schema),
    ]
    assert '"s":"s1"' in note and '"epoch":1' in note
    assert position == "g:t:0:42"


@pytest.mark.postgres
async def test_a_refused_event_is_dead_lettered_alone_and_the_rest_applied(schema: str) -> None:
    log = SessionLog("s1", "ada")
    events = [log.claim(), log.turn("one"), log.turn("two")]
    other = SessionLog("s2", "ada")
    late = other.claim()
    stale = events[1].model_copy(update={"epoch": 0})  # an older writer's: refused
    batch = {TopicPartition("t", 0): _records([events[0], stale, late])}
    conn = await asyncpg.connect(postgres_dsn())
    try:
        outcome = await apply_records(conn, schema, "g", batch)
        stored = await conn.fetchval(f'SELECT count(*) FROM "{schema}".events')
        position = await pg.load_positions(conn, schema, "g", "t")
    finally:
        await conn.close()
    assert [e.event_id for e in outcome.applied] == [events[0].event_id, late.event_id]
    (letter,) = outcome.dead
    assert letter.event_id == stale.event_id and letter.source == "t/0@1"
    assert stored == 2 and position == {0: 3}


@pytest.mark.kafka
async def test_the_applied_offsets_reach_kafka_by_the_time_the_projector_stops() -> None:
    """Kafka's committed offsets are taken off the hot path (committed every few seconds,
    not after each fetch); what was applied is still committed there at the end."""
    env = await KafkaEnv.create(partitions=2)
    try:
        projector = await env.start_projector(commit_interval=3600.0)
        producer = EventProducer(env.bootstrap, env.topics)
        try:
            for session in ("s1", "s2", "s3"):  # a batch each, at least
                await producer.send(session_events(session, 2))
                await eventually(env.caught_up, what=f"the projector to apply {session}")
        finally:
            await producer.stop()
        await env.stop_projector(projector)
        ends = {p: o for p, o in (await env.end_offsets()).items() if o}
        consumer = AIOKafkaConsumer(bootstrap_servers=env.bootstrap, group_id=env.group)
        await consumer.start()
        try:
            committed = {
                p: await consumer.committed(TopicPartition(env.topics.events, p)) for p in ends
            }
        finally:
            await consumer.stop()
        assert committed == ends
    finally:
        await env.close()
