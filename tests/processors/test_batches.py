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

from loomflow.processors.projector import Projector, apply_records
from loomflow.producers import EventProducer, scope_key
from loomflow.projections import postgres as pg
from loomflow.runtime.postgres import PostgresStore
from loomflow.schemas import Usage
from loomflow.schemas.events import EventBase
from loomflow.schemas.scope import Scope
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


class _Heard:
    """What a listener heard on a schema's sessions and positions channels."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.both = asyncio.Event()  # set once two notifications came

    def __call__(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        self.items.append((channel, payload))
        if len(self.items) == 2:
            self.both.set()

    async def listen(self, listener: asyncpg.Connection, schema: str) -> None:
        for channel in (pg.sessions_channel(schema), pg.positions_channel(schema)):
            await listener.add_listener(channel, self)


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
    heard = _Heard()
    listener = await asyncpg.connect(postgres_dsn())
    conn = await asyncpg.connect(postgres_dsn())
    try:
        # a first batch: asyncpg's look-up of the types is its own, once a connection
        await apply_records(conn, schema, "g", {TopicPartition("t", 0): _records([warm])})
        await heard.listen(listener, schema)
        statements: list[str] = []
        conn.add_query_logger(lambda record: statements.append(record.query))
        batch = {TopicPartition("t", 0): _records([claim], first=41)}
        outcome = await apply_records(conn, schema, "g", batch)
        await asyncio.wait_for(heard.both.wait(), 10)
    finally:
        await conn.close()
        await listener.close()
    assert [e.event_id for e in outcome.applied] == [claim.event_id] and not outcome.dead
    # begin, the session's lock, its log and session rows, the notes and position, commit
    assert not [s for s in statements if "SAVEPOINT" in s.upper()]
    assert len(statements) == 5, statements
    (_, note), (_, position) = heard.items
    assert [channel for channel, _ in heard.items] == [
        pg.sessions_channel(schema),
        pg.positions_channel(schema),
    ]
    assert '"s":"s1"' in note and '"epoch":1' in note
    assert position == "g:t:0:42"


@pytest.mark.postgres
async def test_a_known_sessions_next_batch_is_one_statement_with_its_notes_and_position(
    schema: str,
) -> None:
    """The projector remembers the rows of its own batches: a session's next claim, turn
    and checkpoint (what a run's pass sends) are folded from them and written with their
    position and notes in one guarded statement, heard as the transaction's way is."""
    log = SessionLog("s1", "ada")
    first = [log.claim(), log.turn("one")]
    claim, turn, ckpt = log.claim(), log.turn("two"), log.checkpoint(retain=1)
    known: dict[Any, Any] = {}
    heard = _Heard()
    listener = await asyncpg.connect(postgres_dsn())
    conn = await asyncpg.connect(postgres_dsn())
    try:
        tp = TopicPartition("t", 0)
        await apply_records(conn, schema, "g", {tp: _records(first)}, known=known)
        assert set(known) == {Scope("s1", "ada")}  # the transaction's rows, remembered
        await heard.listen(listener, schema)
        statements: list[str] = []
        conn.add_query_logger(lambda record: statements.append(record.query))
        batch = {tp: _records([claim, turn, ckpt], first=2)}
        outcome = await apply_records(conn, schema, "g", batch, known=known)
        await asyncio.wait_for(heard.both.wait(), 10)
        applied_with = list(statements)  # reads below go through the listener's connection
        stored = await listener.fetchrow(
            f'SELECT epoch, last_seq, message_count FROM "{schema}".sessions '
            "WHERE session_id = 's1'"
        )
        seqs = await listener.fetch(f'SELECT seq FROM "{schema}".events ORDER BY seq')
        checkpoints = await listener.fetchval(f'SELECT count(*) FROM "{schema}".checkpoints')
        position = await pg.load_positions(listener, schema, "g", "t")
    finally:
        await conn.close()
        await listener.close()
    assert [e.event_id for e in outcome.applied] == [e.event_id for e in (claim, turn, ckpt)]
    assert len(applied_with) == 1, applied_with
    assert tuple(stored) == (2, ckpt.seq, 2)  # epoch, last seq, messages
    assert [r[0] for r in seqs] == [e.seq for e in (*first, claim, turn, ckpt)]
    assert checkpoints == 1 and position == {0: 5}
    (_, note), (_, heard_position) = heard.items
    assert [channel for channel, _ in heard.items] == [
        pg.sessions_channel(schema),
        pg.positions_channel(schema),
    ]
    assert '"s":"s1"' in note and '"epoch":2' in note
    assert heard_position == "g:t:0:5"
    assert known[Scope("s1", "ada")].last_seq == ckpt.seq


@pytest.mark.postgres
async def test_a_known_row_another_writer_moved_on_costs_a_fallback_not_a_wrong_write(
    schema: str,
) -> None:
    log = SessionLog("s1", "ada")
    claim, mine, theirs, next_one = log.claim(), log.turn("one"), log.turn("two"), log.turn("3")
    known: dict[Any, Any] = {}
    tp = TopicPartition("t", 0)
    conn = await asyncpg.connect(postgres_dsn())
    reader = await asyncpg.connect(postgres_dsn())
    try:
        await apply_records(conn, schema, "g", {tp: _records([claim, mine])}, known=known)
        # another worker (the partition moved meanwhile) applies the next event
        await apply_records(conn, schema, "g", {tp: _records([theirs], first=2)})
        statements: list[str] = []
        conn.add_query_logger(lambda record: statements.append(record.query))
        outcome = await apply_records(
            conn, schema, "g", {tp: _records([next_one], first=3)}, known=known
        )
        seqs = await reader.fetch(f'SELECT seq FROM "{schema}".events ORDER BY seq')
        last = await reader.fetchval(f'SELECT last_seq FROM "{schema}".sessions')
    finally:
        await conn.close()
        await reader.close()
    assert [e.event_id for e in outcome.applied] == [next_one.event_id] and not outcome.dead
    assert len(statements) > 1  # the transaction's way, which reads the row it locks
    assert [r[0] for r in seqs] == [1, 2, 3, 4] and last == 4
    assert known[Scope("s1", "ada")].last_seq == 4


@pytest.mark.postgres
async def test_a_guarded_batch_writes_nothing_when_the_stored_row_moved_on(schema: str) -> None:
    """The guard itself: a row remembered wrongly (the stored one moved on since) makes
    the statement write no log row, no session row and no position, and say so."""
    log = SessionLog("s1", "ada")
    claim, turn = log.claim(), log.turn("one")
    known: dict[Any, Any] = {}
    conn = await asyncpg.connect(postgres_dsn())
    try:
        await pg.apply_known(conn, schema, [claim], known)  # unknown session: not written
        assert known == {}
        async with conn.transaction():
            pg.remember(known, await pg.apply_events(conn, schema, [claim]))
        stale = dict(known)
        async with conn.transaction():  # another writer moves the session on
            await pg.apply_events(conn, schema, [turn])
        # what the stale row folds to: the same seq as the stored turn, another event
        rival = log.turn("rival", seq=turn.seq)
        positions = pg.Positions("g", "t", {0: 9})
        wrote = await pg.apply_known(conn, schema, [rival], stale, positions=positions)
        ids = await conn.fetch(f'SELECT event_id FROM "{schema}".events ORDER BY seq')
        seqs = await conn.fetch(f'SELECT seq FROM "{schema}".events ORDER BY seq')
        position = await pg.load_positions(conn, schema, "g", "t")
    finally:
        await conn.close()
    assert wrote is False
    assert [r[0] for r in seqs] == [1, 2] and position == {}
    assert [r[0] for r in ids] == [claim.event_id, turn.event_id]


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


def _sessions(prefix: str, count: int) -> list[list[EventBase]]:
    """``count`` sessions of a claim, a model turn and a checkpoint each."""
    out = []
    for n in range(count):
        log = SessionLog(f"{prefix}{n:03d}", "ada")
        usage = Usage(input_tokens=n + 1, output_tokens=2, cost_usd=0.5)
        out.append([log.claim(), log.turn(f"q{n}", usage=usage), log.checkpoint(retain=3)])
    return out


async def _checkpoints(conn: asyncpg.Connection, schema: str, prefix: str) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT substr(session_id, length($1) + 1), checkpoint_id, seq, base_seq, turn, "
        f'message_count, usage::text, cursor, created_at FROM "{schema}".checkpoints '
        "WHERE session_id LIKE $1 || '%' ORDER BY 1",
        prefix,
    )
    return [tuple(r) for r in rows]


@pytest.mark.postgres
async def test_a_batch_of_many_checkpoints_stores_each_as_one_at_a_time_does(schema: str) -> None:
    """A wave of many new checkpoints is written by COPY, a few by one insert: the rows
    read back the same, and a checkpoint id a session already has is refused alone."""
    many = _sessions("many", 70)
    few = [[e.model_copy(update={"session_id": "few" + e.session_id[4:]}) for e in s] for s in many]
    more = _sessions("more", 70)
    # a second checkpoint with an id its session already has, among many new ones
    dup = many[5][2].model_copy(update={"seq": 4, "event_id": "evt_dup"})
    conn = await asyncpg.connect(postgres_dsn())
    try:
        batch = [e for s in many for e in s[:2]] + [s[2] for s in many]
        clean = await apply_records(conn, schema, "g", {TopicPartition("t", 0): _records(batch)})
        for n, session in enumerate(few):
            part = {TopicPartition("t", 1): _records(session, first=3 * n)}
            await apply_records(conn, schema, "g", part)
        batch = [e for s in more for e in s] + [dup]
        refused = await apply_records(
            conn, schema, "g", {TopicPartition("t", 0): _records(batch, first=210)}
        )
        stored_many = await _checkpoints(conn, schema, "many")
        stored_few = await _checkpoints(conn, schema, "few")
        stored_more = await _checkpoints(conn, schema, "more")
    finally:
        await conn.close()
    assert len(clean.applied) == 210 and not clean.dead
    assert len(stored_many) == 70 and stored_many == stored_few
    (letter,) = refused.dead
    assert letter.event_id == "evt_dup" and "checkpoint id" in letter.reason
    assert len(refused.applied) == 210 and len(stored_more) == 70


class _GatedProjector(Projector):
    """A projector whose transactions wait at a gate: a database that does not keep up."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.most_queued = 0

    async def step(self) -> int:
        fetched = await super().step()
        queued = sum(len(r) for lane in self._lanes.values() for r in lane.pending.values())
        self.most_queued = max(self.most_queued, queued)
        return fetched

    async def _apply(self, batches: Any) -> None:
        await self.gate.wait()
        await super()._apply(batches)


@pytest.mark.kafka
async def test_a_partition_its_lane_cannot_take_is_not_fetched_and_nothing_is_lost() -> None:
    env = await KafkaEnv.create(partitions=1)
    projector = _GatedProjector(env.settings, max_records=5, poll_ms=20)
    projector.max_queued_batches = 2
    events = session_events("s1", 30)  # 91 events
    stop = asyncio.Event()
    try:
        await projector.start()
        producer = EventProducer(env.bootstrap, env.topics)
        try:
            await producer.send(events)
        finally:
            await producer.stop()

        async def queue_full() -> bool:
            await projector.step()
            return projector.most_queued >= 10

        # the first batch waits at the gate; the lane queues up to its limit behind it
        await eventually(queue_full, what="the lane's queue to fill")
        for _ in range(20):  # rounds that find no room fetch nothing
            assert await asyncio.wait_for(projector.step(), 5) == 0
        assert projector.most_queued < 10 + 5
        projector.gate.set()
        task = asyncio.create_task(projector.run(stop))
        await eventually(env.caught_up, what="the projector to apply every event")
        stop.set()
        await task
        assert projector.applied == len(events) and projector.dead_lettered == 0
    finally:
        stop.set()
        projector.gate.set()
        await projector.stop()
        await env.close()


class _PartitionGated(Projector):
    """A projector whose transactions of partition 0 wait at a gate: a slow transaction
    (a large batch, a lock) in one partition."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.held = asyncio.Event()  # set once a transaction of partition 0 waits

    async def _apply(self, batches: Any) -> None:
        if any(tp.partition == 0 for tp in batches):
            self.held.set()
            await self.gate.wait()
        await super()._apply(batches)


async def _session_in(producer: EventProducer, partition: int, prefix: str) -> str:
    """A session id whose records go to ``partition``."""
    for n in range(1000):
        if await producer.partition_of(scope_key(None, f"{prefix}{n}")) == partition:
            return f"{prefix}{n}"
    raise AssertionError(f"no session of partition {partition}")


@pytest.mark.kafka
async def test_a_partition_whose_transaction_waits_does_not_hold_up_the_others() -> None:
    """The projector as ``loomflow processor`` makes it (its default lanes) applies
    partitions in more than one transaction at a time: while one waits for PostgreSQL,
    another partition's records are decoded, folded and written."""
    env = await KafkaEnv.create(partitions=2)
    projector = _PartitionGated(env.settings, poll_ms=20)
    stop = asyncio.Event()
    producer = EventProducer(env.bootstrap, env.topics)
    task: asyncio.Task[None] | None = None
    try:
        await projector.start()
        task = asyncio.create_task(projector.run(stop))
        first = await _session_in(producer, 0, "held")
        second = await _session_in(producer, 1, "free")
        held, free = session_events(first, 2), session_events(second, 2)
        await producer.send(held)
        await asyncio.wait_for(projector.held.wait(), 30)
        await producer.send(free)
        ends = await env.end_offsets()

        async def second_applied() -> bool:
            return (await env.positions()).get(1, 0) >= ends[1]

        await eventually(second_applied, what="partition 1 applied while partition 0 waits")
        assert (await env.positions()).get(0, 0) < ends[0]
        projector.gate.set()
        await eventually(env.caught_up, what="the projector to apply every event")
        assert projector.applied == len(held) + len(free) and projector.dead_lettered == 0
    finally:
        stop.set()
        projector.gate.set()
        if task is not None:
            await task
        await producer.stop()
        await projector.stop()
        await env.close()
