"""KafkaRuntime: events appended to Kafka, read back from the projector's PostgreSQL model.

An append returns once the projector has applied it (or refused it): the runtime listens
for the projector's position notifications, so its own list / get / resume always see
its writes (read-your-writes), and a refused event (a stale epoch, a taken seq, an erased
session) raises the same typed error as on the embedded runtimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from loomflow import errors
from loomflow.errors import InvalidEventError, StoreError
from loomflow.producers import EventProducer, Position, Topics, ensure_topics, scope_key
from loomflow.producers.topics import unreachable
from loomflow.projections import postgres as pg
from loomflow.projections.fold import CheckpointRow, SessionRow, StepRow, fold, materialise
from loomflow.runtime.base import (
    ANY_USER,
    EventStore,
    PruneResult,
    RestoredState,
    Runtime,
    Scope,
    Serializer,
    _check_prune_filters,
)
from loomflow.runtime.postgres import PostgresStore
from loomflow.schemas import CheckpointsPruned, Event, Message
from loomflow.schemas.codec import decode_event
from loomflow.schemas.events import MAX_EVENT_BYTES

__all__ = ["KafkaRuntime", "KafkaStore"]

logger = logging.getLogger("loomflow.runtime.kafka")

# the producer's own partitioner: the reader must find the partition the writer chose
_partitioner = DefaultPartitioner()

_REFUSALS: dict[str, type[InvalidEventError]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidEventError,
        errors.StaleWriterError,
        errors.SequenceConflictError,
        errors.SessionErasedError,
    )
}


class _Positions:
    """The projector's applied offsets, fed by LISTEN/NOTIFY, awaited by appends."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}
        self._waiters: list[tuple[dict[int, int], asyncio.Future[None]]] = []

    def passed(self, wanted: dict[int, int]) -> bool:
        return all(self._seen.get(p, -1) > offset for p, offset in wanted.items())

    def advance(self, partition: int, next_offset: int) -> None:
        if next_offset <= self._seen.get(partition, -1):
            return
        self._seen[partition] = next_offset
        waiting = []
        for wanted, done in self._waiters:
            if done.done():
                continue
            if self.passed(wanted):
                done.set_result(None)
            else:
                waiting.append((wanted, done))
        self._waiters = waiting

    def waiter(self, wanted: dict[int, int]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.passed(wanted):
            done.set_result(None)
        else:
            self._waiters.append((wanted, done))
        return done


class KafkaStore(EventStore):
    """Appends to the events topic; serves reads from the read model in PostgreSQL."""

    def __init__(
        self,
        bootstrap: str,
        dsn: str,
        *,
        topics: Topics | None = None,
        schema: str = "loomflow",
        group_id: str = "loomflow-projector",
        projection_timeout: float = 15.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics or Topics()
        self.group_id = group_id
        self.projection_timeout = projection_timeout
        self._reads = PostgresStore(dsn, schema=schema)
        self._schema = schema
        self._dsn = dsn
        self._producer = EventProducer(bootstrap, self.topics)
        self._positions = _Positions()
        self._listener: asyncpg.Connection | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._started = False
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        """Create the topics if needed, start the producer and listen for positions."""
        async with self._start_lock:
            if self._started:
                return
            await ensure_topics(self.bootstrap, self.topics)
            await self._producer.start()
            await self._reads.session(Scope("loomflow-probe"))  # connects and migrates
            try:
                self._listener = await asyncpg.connect(self._dsn)
            except (OSError, asyncpg.PostgresError) as exc:
                raise StoreError(f"PostgreSQL is not reachable: {exc}") from exc
            channel = pg.positions_channel(self._schema)
            await self._listener.add_listener(channel, self._on_position)
            # positions committed before we listened: read them once
            stored = await pg.load_positions(
                self._listener, self._schema, self.group_id, self.topics.events
            )
            for partition, next_offset in stored.items():
                self._positions.advance(partition, next_offset)
            self._started = True

    def _on_position(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        group, topic, partition, next_offset = payload.rsplit(":", 3)
        if group == self.group_id and topic == self.topics.events:
            self._positions.advance(int(partition), int(next_offset))

    async def close(self) -> None:
        await self._producer.stop()
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        await self._reads.close()
        self._started = False

    async def append(self, events: Sequence[Event]) -> None:
        if not events:
            return
        await self.start()
        positions = await self._producer.send(events)
        await self._await_projection(positions)
        await self._verdict(events)

    async def _await_projection(self, positions: Sequence[Position]) -> None:
        """Wait until the projector's committed positions pass ``positions``.

        Notifications wake the wait at once; once a second the positions table is read
        too, so a lost notification (or a dropped LISTEN connection) only costs latency.
        """
        wanted: dict[int, int] = {}
        for position in positions:
            wanted[position.partition] = max(wanted.get(position.partition, -1), position.offset)
        done = self._positions.waiter(wanted)
        deadline = asyncio.get_running_loop().time() + self.projection_timeout
        while not done.done():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                done.cancel()
                raise StoreError(
                    f"the projector has not applied {self.topics.events} offsets {wanted} "
                    f"within {self.projection_timeout:.0f} s; is `loomflow processor` running "
                    "against the same Kafka and PostgreSQL?"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), min(1.0, remaining))
            if not done.done():
                stored = await self._reads.positions(self.group_id, self.topics.events)
                for partition, next_offset in stored.items():
                    self._positions.advance(partition, next_offset)

    async def _verdict(self, events: Sequence[Event]) -> None:
        """Raise the projector's reason if it refused any of our events."""
        refusal = await self._reads.refusal([event.event_id for event in events])
        if refusal is None:
            return
        error_type, reason = refusal
        for event in events:
            self._reads.forget(event)
        raise _REFUSALS.get(error_type, InvalidEventError)(reason)

    async def session(self, scope: Scope) -> SessionRow | None:
        """The session as the log has it: the read model's row plus unprojected events."""
        await self.start()
        row = await self._reads.session(scope)
        for event in await self.unprojected(scope, row.last_seq if row else 0):
            try:
                row, _ = fold(row, event)
            except InvalidEventError:
                break  # the projector will refuse it too; nothing after it counts yet
        return row

    async def projected_session(self, scope: Scope) -> SessionRow | None:
        """The session's row in the read model, without the events it has not projected."""
        await self.start()
        return await self._reads.session(scope)

    async def unprojected(self, scope: Scope, after_seq: int) -> list[Event]:
        """The scope's events past ``after_seq`` that are in Kafka but not yet projected.

        Empty unless the projector lags: then the session's partition is read from the
        projector's committed offset to its end, so a resume never waits for the read
        model to catch up (it costs a read of the lagging part of one partition).
        """
        await self.start()
        key = scope_key(scope.user_id, scope.session_id)
        partitions = sorted(await self._producer.partitions_for())
        partition = _partitioner(key, partitions, partitions)
        tp = TopicPartition(self.topics.events, partition)
        committed = (await self._reads.positions(self.group_id, self.topics.events)).get(
            partition, 0
        )
        reader = await self._reader()
        end = (await reader.end_offsets([tp]))[tp]
        if committed >= end:
            return []
        reader.assign([tp])
        reader.seek(tp, committed)
        later: list[Event] = []
        while await reader.position(tp) < end:
            for record in (await reader.getmany(tp, timeout_ms=1000)).get(tp, []):
                if record.offset >= end or record.key != key:
                    continue
                try:
                    event = decode_event(record.value or b"")
                except InvalidEventError:
                    continue  # dead-lettered by the projector; never part of the session
                if event.seq > after_seq:
                    later.append(event)
        return sorted(later, key=lambda e: e.seq)

    async def _reader(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
            )
            try:
                await consumer.start()
            except KafkaError as exc:
                await consumer.stop()
                raise unreachable(self.bootstrap, exc) from exc
            self._consumer = consumer
        return self._consumer

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        await self.start()
        return await self._reads.checkpoint(scope, checkpoint_id)

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        await self.start()
        return await self._reads.list_checkpoints(scope, limit)

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        await self.start()
        return await self._reads.transcript(scope, base_seq, upto_seq, message_count)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        await self.start()
        return await self._reads.step(scope, step_key)

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        await self.start()
        return await self._reads.read_events(scope, after_seq)

    async def prune(
        self,
        *,
        before: datetime | None = None,
        session_id: str | None = None,
        user_id: Any = ANY_USER,
    ) -> PruneResult:
        """Prune by appending events, so a rebuild from the log prunes the same things.

        A whole session goes by an erasure tombstone (its id is not reused, unlike on the
        embedded stores); in a live session, checkpoints older than ``before`` go by a
        ``checkpoints.pruned`` event. Journal steps of live sessions are kept.
        """
        _check_prune_filters(before, session_id, user_id)
        await self.start()
        sessions = checkpoints = events = 0
        for row in await self._reads.matching_sessions(session_id, user_id):
            scope = Scope(row.session_id, row.user_id)
            kept = await self._reads.list_checkpoints(scope, 1 << 30)
            if before is None or row.updated_at < before:
                if await self.erase(row.session_id, user_id=row.user_id):
                    sessions += 1
                    checkpoints += len(kept)
                    events += row.last_seq
                continue
            old = [c.checkpoint_id for c in kept if c.created_at < before]
            if old and await self._append_admin(scope, CheckpointsPruned, {"checkpoint_ids": old}):
                checkpoints += len(old)
        return PruneResult(sessions=sessions, checkpoints=checkpoints, events=events)


class KafkaRuntime(Runtime):
    """Durable runs over a shared Kafka log and a PostgreSQL read model."""

    store: KafkaStore

    async def restore(self, scope: Scope, checkpoint_id: str | None = None) -> RestoredState | None:
        """The session from the read model plus the log's events it has not projected yet."""
        if checkpoint_id is not None:
            return await super().restore(scope, checkpoint_id)  # projected with all it covers
        row = await self.store.projected_session(scope)
        messages: list[Message] = []
        if row is not None and row.status != "erased":
            messages = await self._transcript(scope, row.base_seq, row.last_seq, row.message_count)
        for event in await self.store.unprojected(scope, row.last_seq if row else 0):
            try:
                row, _ = fold(row, event)
            except InvalidEventError:
                break  # the projector will refuse it too; nothing after it counts yet
            messages = materialise([event], messages)
        if row is None or row.status == "erased":
            return None
        return RestoredState(
            messages=messages,
            turns=row.turns,
            usage=row.usage,
            seq=row.last_seq,
            checkpoint_id=None,
            session=row,
        )

    def __init__(
        self,
        bootstrap: str,
        dsn: str,
        *,
        max_checkpoints_per_session: int = 20,
        serializer: Serializer = "json",
        topics: Topics | None = None,
        schema: str = "loomflow",
        group_id: str = "loomflow-projector",
        projection_timeout: float = 15.0,
    ) -> None:
        super().__init__(
            KafkaStore(
                bootstrap,
                dsn,
                topics=topics,
                schema=schema,
                group_id=group_id,
                projection_timeout=projection_timeout,
            ),
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
        )
