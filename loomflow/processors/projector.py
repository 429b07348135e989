"""The projector: consumes the events topic and folds it into the PostgreSQL read model.

The hot loop is a plain aiokafka batch consumer (``getmany``), not a faust agent: faust's
per-event machinery costs ~230 µs of CPU an event, a batch loop a few. Exactly-once in
effect: each partition's batch is applied in one transaction together with the partition's
next offset in ``positions``, every write is idempotent by (scope, seq), and on assignment
the consumer seeks to the offsets stored in PostgreSQL, not to Kafka's committed ones.

Nothing on the topic stops it: a record that does not decode, that the fold refuses, or
that PostgreSQL refuses as data is dead-lettered (bytes kept whole, with the reason) and
the partition moves on. Anything else that fails a round (a lost connection, a broker
restart) is logged and the round is retried from the stored positions, with a bounded
back-off; the worker itself never ends on an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from loomflow.errors import InvalidEventError, StoreError
from loomflow.producers import EventProducer, Topics, scope_key
from loomflow.producers.topics import unreachable
from loomflow.projections import postgres as pg
from loomflow.projections.postgres import DeadLetterRow
from loomflow.schemas import Checkpoint, CheckpointWritten, Event, RunStarted, SessionErased
from loomflow.schemas.codec import decode_event
from loomflow.schemas.events import MAX_EVENT_BYTES, SessionForked
from loomflow.settings import Settings

__all__ = ["DeadLetter", "Projector", "apply_records", "decode_record"]

logger = logging.getLogger("loomflow.processors.projector")

DeadLetter = DeadLetterRow

#: Errors that say something about a record, not about the database's health: the record
#: is dead-lettered. Anything else fails the round, which is retried.
_REFUSED = (
    InvalidEventError,
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
)

#: How long a stale heartbeat row may stand before a runtime calls its worker gone.
HEARTBEAT_SECONDS = 2.0


@dataclass
class _Outcome:
    applied: list[Event] = field(default_factory=list)
    dead: list[DeadLetterRow] = field(default_factory=list)


def decode_record(record: Any) -> Event:
    """The event a record carries, checked against the record's key."""
    if record.value is None:
        raise InvalidEventError("a record without a value (a tombstone): not an event")
    event = decode_event(record.value)
    if record.key != scope_key(event.user_id, event.session_id):
        raise InvalidEventError(
            f"record key {record.key!r} is not the scope of the event it carries "
            f"(session {event.session_id!r}, user {event.user_id!r})"
        )
    return event


def _reason(exc: BaseException) -> str:
    if isinstance(exc, InvalidEventError):
        return exc.reason
    return f"PostgreSQL refused it ({type(exc).__name__}): {exc}"


def _notes(outcome: _Outcome, refused: list[tuple[Event, DeadLetterRow]]) -> list[str]:
    """What runtimes listening on the schema must hear: new epochs and refused events."""
    notes = [
        orjson.dumps(
            {
                "u": event.user_id,
                "s": event.session_id,
                "epoch": event.epoch,
                "erased": isinstance(event, SessionErased),
            }
        ).decode()
        for event in outcome.applied
        if isinstance(event, RunStarted | SessionForked | SessionErased)
    ]
    notes.extend(
        orjson.dumps(
            {
                "u": event.user_id,
                "s": event.session_id,
                "run": event.run_id,
                "event": event.event_id,
                "error": letter.error_type,
                "reason": pg.printable(letter.reason, 2000),
            }
        ).decode()
        for event, letter in refused
    )
    return notes


async def apply_records(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    tp: TopicPartition,
    records: Sequence[Any],
) -> _Outcome:
    """Fold one partition's records into the read model, in the caller's transaction.

    Records that do not decode, or that the fold or PostgreSQL refuse, become dead
    letters with their reason; runtimes hear of new epochs and refused events when the
    transaction commits; the partition's next offset is saved for ``consumer``.
    """
    outcome = _Outcome()
    candidates: list[tuple[Event, Any]] = []
    for record in records:
        try:
            candidates.append((decode_record(record), record))
        except InvalidEventError as exc:
            outcome.dead.append(_letter(tp, record, exc))
    refused: list[tuple[Event, DeadLetterRow]] = []
    try:
        async with conn.transaction():  # the whole batch at once: the common case
            await pg.apply_events(conn, schema, [event for event, _ in candidates])
        outcome.applied.extend(event for event, _ in candidates)
    except _REFUSED:
        # something in it was refused: one savepoint per event, so it fails alone
        for event, record in candidates:
            try:
                async with conn.transaction():
                    await pg.apply_events(conn, schema, [event])
            except _REFUSED as exc:
                letter = _letter(tp, record, exc, event)
                outcome.dead.append(letter)
                refused.append((event, letter))
            else:
                outcome.applied.append(event)
    await pg.add_dead_letters(conn, schema, outcome.dead)
    for letter in outcome.dead:
        logger.warning("dead-lettered %s: %s", letter.source, pg.printable(letter.reason, 300))
    await pg.notify_sessions(conn, schema, _notes(outcome, refused))
    await pg.save_position(conn, schema, consumer, tp.topic, tp.partition, records[-1].offset + 1)
    return outcome


def _letter(
    tp: TopicPartition, record: Any, exc: BaseException, event: Event | None = None
) -> DeadLetterRow:
    return DeadLetterRow(
        source=f"{tp.topic}/{tp.partition}@{record.offset}",
        reason=_reason(exc),
        record=record.value,
        key=record.key,
        event_id=event.event_id if event is not None else None,
        error_type=type(exc).__name__ if event is not None else "InvalidEventError",
    )


class _SeekToStoredPositions(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, projector: Projector, consumer: AIOKafkaConsumer) -> None:
        self._projector = projector
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        return None  # positions are committed with every batch; nothing to flush

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._projector._seek(self._consumer, assigned)


class Projector:
    """One projector worker; several share the partitions through their consumer group.

    Kafka, PostgreSQL, the topics, the schema and the group come from ``settings`` (by
    default the ``LOOMFLOW_*`` environment, see :class:`loomflow.settings.Settings`), so a
    projector and a runtime configured the same way meet on the same positions.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        max_records: int = 2000,
        poll_ms: int = 100,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        publish_snapshots: bool = True,
    ) -> None:
        self.settings = settings = Settings.resolve(settings)
        self.bootstrap = settings.kafka_bootstrap
        self.dsn = settings.postgres_dsn
        self.topics = Topics.from_settings(settings)
        self.schema = settings.db_schema
        self.group_id = settings.projector_group
        self.max_records = max_records
        self.poll_ms = poll_ms
        self.publish_snapshots = publish_snapshots
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._consumer_options = {
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": heartbeat_interval_ms,
            "rebalance_timeout_ms": max(session_timeout_ms, 5_000),
        }
        self._pool: asyncpg.Pool | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: EventProducer | None = None
        self.applied = 0
        self.dead_lettered = 0
        self.failed_rounds = 0
        self._snapshots_due: dict[tuple[str | None, str], CheckpointWritten] = {}
        self._snapshots_wanted = asyncio.Event()
        self._snapshots_idle = asyncio.Event()
        self._snapshots_idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        #: set when a round failed: the consumer's position is past what was applied, so
        #: nothing is fetched until it is back at the positions stored in PostgreSQL
        self._resync = False

    async def start(self) -> None:
        """Connect to PostgreSQL (migrating the schema) and join the consumer group.

        A start that fails releases what it opened.
        """
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=8, timeout=self.settings.connect_timeout
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(
                f"PostgreSQL is not reachable ({type(exc).__name__}: {exc}); start it with "
                "`dev/postgres.sh start`"
            ) from exc
        async with self._pool.acquire() as conn:
            await pg.migrate(conn, self.schema)
        self._producer = EventProducer(self.bootstrap, self.topics)
        await self._producer.start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
            **self._consumer_options,
        )
        # the first assignment may come while start() runs: the listener holds the consumer
        consumer.subscribe([self.topics.events], listener=_SeekToStoredPositions(self, consumer))
        try:
            await consumer.start()
        except KafkaError as exc:
            await consumer.stop()
            raise unreachable(self.bootstrap, exc) from exc
        self._consumer = consumer
        await self._report()
        self._tasks = [
            asyncio.create_task(self._publish_snapshots()),
            asyncio.create_task(self._heartbeat()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # cancelled mid-query, asyncpg raises its own error
                logger.debug("background task stopped with %r", exc)
        self._tasks = []
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None
        if self._pool is not None:
            with contextlib.suppress(Exception):
                async with self._pool.acquire(timeout=2) as conn:
                    await pg.forget_processor(
                        conn, self.schema, self.group_id, self.topics.events, self.worker
                    )
            await self._pool.close()
            self._pool = None

    def assignment(self) -> set[int]:
        """The partitions of the events topic this worker holds now."""
        if self._consumer is None:
            return set()
        return {tp.partition for tp in self._consumer.assignment()}

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Project until ``stop`` is set (or forever); nothing on the topic stops it.

        A round that fails (a lost connection, a broker restart, anything unexpected) is
        logged; the consumer goes back to the positions stored in PostgreSQL and tries
        again after a back-off that doubles up to 5 s. Nothing is skipped, and the
        idempotent fold applies nothing twice.
        """
        stop = stop or asyncio.Event()
        backoff = 0.05
        while not stop.is_set():
            try:
                await self.step()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed_rounds += 1
                logger.warning(
                    "projection round failed (%s: %s); retrying in %.2f s",
                    type(exc).__name__,
                    exc,
                    backoff,
                    exc_info=not isinstance(exc, StoreError | KafkaError | OSError),
                )
                self._resync = True
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)  # back off, or stop now
                backoff = min(backoff * 2, 5.0)

    async def step(self) -> int:
        """Fetch one round of records and apply them; return how many were handled.

        Partitions are applied concurrently, each in its own transaction on its own
        connection: a session lives in one partition, so they never touch the same rows.
        """
        assert self._consumer is not None, "start() the projector first"
        if self._resync:  # after a failed round: back to the stored positions first
            await self._seek(self._consumer, list(self._consumer.assignment()))
            self._resync = False
        batches = await self._consumer.getmany(
            timeout_ms=self.poll_ms, max_records=self.max_records
        )
        work = {tp: records for tp, records in batches.items() if records}
        if not work:
            return 0
        outcomes = await asyncio.gather(
            *(self._apply_partition(tp, records) for tp, records in work.items()),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        # Kafka's own committed offsets only shorten the replay after a restart: the
        # positions in PostgreSQL stay the truth (the consumer seeks to them)
        with contextlib.suppress(KafkaError):
            await self._consumer.commit(
                {tp: records[-1].offset + 1 for tp, records in work.items()}
            )
        return sum(len(records) for records in work.values())

    async def snapshots_published(self) -> None:
        """Wait until every checkpoint applied so far has been published (or failed to)."""
        await self._snapshots_idle.wait()  # cleared whenever a snapshot falls due

    # -- internals -----------------------------------------------------------------------

    async def _seek(self, consumer: AIOKafkaConsumer, assigned: Sequence[TopicPartition]) -> None:
        """Start each assigned partition at the offset stored with the read model."""
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            stored = await pg.load_positions(conn, self.schema, self.group_id, self.topics.events)
        for tp in assigned:
            if tp.partition in stored:
                consumer.seek(tp, stored[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)

    async def _apply_partition(self, tp: TopicPartition, records: Sequence[Any]) -> None:
        """Apply one partition's records and its next offset in one transaction."""
        assert self._pool is not None
        async with self._pool.acquire() as conn, conn.transaction():
            outcome = await apply_records(conn, self.schema, self.group_id, tp, records)
        self.applied += len(outcome.applied)
        self.dead_lettered += len(outcome.dead)
        await self._after_commit(outcome)

    async def _after_commit(self, outcome: _Outcome) -> None:
        """Dead letters to the DLQ topic; checkpoints to the snapshot publisher.

        Both happen after the commit: the database is the record of truth for both, and
        a failure here is logged, never a reason to re-apply the batch.
        """
        assert self._producer is not None
        for letter in outcome.dead:
            headers = [
                ("reason", pg.printable(letter.reason, 4000).encode()),
                ("source", letter.source.encode()),
                ("error_type", letter.error_type.encode()),
            ]
            if letter.record is None:
                headers.append(("null_value", b"true"))  # a null value cannot be resent as one
            try:
                await self._producer.send_raw(
                    self.topics.dlq, letter.record or b"", key=letter.key, headers=headers
                )
            except Exception as exc:
                logger.warning(
                    "dead-lettering %s to %s failed: %s", letter.source, self.topics.dlq, exc
                )
        if self.publish_snapshots:
            for event in outcome.applied:
                if isinstance(event, CheckpointWritten):
                    self._snapshots_due[(event.user_id, event.session_id)] = event
            if self._snapshots_due:
                self._snapshots_idle.clear()
                self._snapshots_wanted.set()

    async def _publish_snapshots(self) -> None:
        """Publish the latest checkpoint of each session that wrote one, off the hot path.

        Sessions that checkpoint again before their turn comes are published once, with
        their newest checkpoint: under load the snapshot topic lags a little, projection
        never waits for it.
        """
        assert self._producer is not None
        while True:
            await self._snapshots_wanted.wait()
            self._snapshots_wanted.clear()
            due, self._snapshots_due = self._snapshots_due, {}
            for (user_id, session_id), event in due.items():
                try:
                    snapshot = await self._snapshot(user_id, session_id, event)
                    if snapshot is not None:
                        await self._producer.send_raw(
                            self.topics.snapshots,
                            snapshot.model_dump_json().encode(),
                            key=scope_key(user_id, session_id),
                        )
                except Exception as exc:  # a snapshot is an optimisation: log, go on
                    logger.warning("snapshot of session %s failed: %s", session_id, exc)
            if not self._snapshots_due:
                self._snapshots_idle.set()

    async def _snapshot(
        self, user_id: str | None, session_id: str, event: CheckpointWritten
    ) -> Checkpoint | None:
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            row = await pg.get_checkpoint(
                conn, self.schema, user_id, session_id, event.payload.checkpoint_id
            )
            if row is None:  # already dropped by retention in a later event of the batch
                return None
            messages = await pg.read_transcript(
                conn, self.schema, user_id, session_id, row.base_seq, row.seq
            )
        return Checkpoint(
            session_id=session_id,
            checkpoint_id=row.checkpoint_id,
            turn=row.turn,
            messages=messages,
            cumulative_usage=row.cumulative_usage,
            cursor=row.cursor,
            created_at=row.created_at,
        )

    async def _report(self) -> None:
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            await pg.report_processor(
                conn,
                self.schema,
                self.group_id,
                self.topics.events,
                self.worker,
                sorted(self.assignment()),
            )

    async def _heartbeat(self) -> None:
        """Tell runtimes that this worker is alive, which group it is and what it holds."""
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await self._report()
            except Exception as exc:  # PostgreSQL away: the next beat tries again
                logger.debug("heartbeat failed: %r", exc)
