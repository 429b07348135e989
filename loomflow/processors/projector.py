"""The projector: consumes the events topic and folds it into the PostgreSQL read model.

The hot loop is a plain aiokafka batch consumer (``getmany``), not a faust agent: faust's
per-event machinery costs ~230 µs of CPU an event, a batch loop a few. Exactly-once in
effect: each partition's batch is applied in one transaction together with the partition's
next offset in ``positions``, every write is idempotent by (scope, seq), and on assignment
the consumer seeks to the offsets stored in PostgreSQL, not to Kafka's committed ones.

Nothing on the topic stops it: a record that does not decode, that the fold refuses, or
that PostgreSQL refuses as data is dead-lettered (bytes kept whole, with the reason) and
the partition moves on. So is an event whose signature does not hold when the settings
require signatures (``LOOMFLOW_SIGNATURES``; in ``check`` mode it is projected, counted
and logged). Anything else that fails a round (a lost connection, a broker restart) is
logged and the round is retried from the stored positions, with a bounded back-off; the
worker itself never ends on an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Self

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from loomflow.errors import InvalidEventError, SignatureError, StoreError
from loomflow.log.records import decode_record
from loomflow.processors.snapshots import SnapshotPublisher
from loomflow.producers import EventProducer, Topics
from loomflow.producers.topics import started
from loomflow.projections import postgres as pg
from loomflow.projections.apply import scopes
from loomflow.projections.postgres import DeadLetterRow, store_error
from loomflow.schemas import Event
from loomflow.schemas.events import CLAIM_TYPES, MAX_EVENT_BYTES
from loomflow.schemas.scope import Scope
from loomflow.schemas.sessions import SessionRecord
from loomflow.schemas.signing import NO_SIGNATURES, Signatures
from loomflow.settings import Settings

__all__ = ["CheckPool", "DeadLetter", "Projector", "apply_records", "tune_gc"]

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

#: events that set a session's epoch or end it: runtimes writing to it must hear of them
#: (a signal's claim among them: it fences a writer that went silent past its lease)
_CLAIMS = frozenset(cls.model_fields["type"].default for cls in CLAIM_TYPES)

#: The largest batch of records the worker's producer (snapshots, dead letters) sends to a
#: partition at once. aiokafka's default, 16 KiB, is less than a snapshot of a few dozen
#: messages: each went in a batch and a request of its own, and a flush of 1,800
#: snapshots cost 17% more of the worker's CPU. Half of the broker's default
#: ``max.message.bytes`` (1 MiB), so that a topic made by hand takes the batches too.
_SNAPSHOT_BATCH_BYTES = 512 * 1024

#: How often a worker refreshes its row in ``processors`` (what runtimes name in errors).
HEARTBEAT_SECONDS = 2.0


@dataclass(frozen=True)
class CheckPool:
    """Threads that check a batch's signatures beside the event loop's thread."""

    executor: Executor
    threads: int

    @classmethod
    def of(cls, threads: int) -> CheckPool | None:
        """A pool of ``threads`` threads; None for none (the loop's thread checks all)."""
        if threads < 1:
            return None
        return cls(ThreadPoolExecutor(threads, thread_name_prefix="loomflow-verify"), threads)

    def close(self) -> None:
        self.executor.shutdown(wait=True)


@dataclass
class _Outcome:
    applied: list[Event] = field(default_factory=list)
    dead: list[DeadLetterRow] = field(default_factory=list)
    #: events projected although their signature does not hold (``check`` mode)
    unverified: int = 0


async def _keep_session(conn: asyncpg.Connection) -> None:
    """No reset when a connection goes back to the pool: the projector leaves no session
    state behind, and asyncpg's reset costs a round trip on every release."""


async def _finish(lane: _Lane) -> None:
    """Wait for the lane's batch in flight (its queue is empty), then end its task."""
    await lane.idle.wait()
    assert lane.task is not None
    lane.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await lane.task


def tune_gc() -> None:
    """Garbage collection for a process whose job is projecting (``loomflow processor``).

    Decoding allocates tens of objects an event, so the young generation fills every few
    dozen events, and each collection also walks what the process built at start-up (the
    faust app, pydantic's validators). Measured here, that was over half of the
    projector's CPU per event. Freezing the start-up heap and collecting the young
    generation less often keeps the collector's cost near that of the garbage itself;
    events are acyclic, so reference counting frees them without it.

    A batch holds its few thousand events (~140k objects) until it is written: with a
    young generation of 20k objects each was walked by several collections and promoted
    twice, ~6 µs of CPU an event (of ~54, apply_records alone); at 100k, most of a batch
    is freed before a collection sees it.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, InvalidEventError):
        return exc.reason
    return f"PostgreSQL refused it ({type(exc).__name__}): {exc}"


def _claim_notes(applied: Sequence[Event]) -> list[str]:
    """What runtimes listening on the schema must hear of applied events: new epochs."""
    return [
        orjson.dumps(
            {
                "u": event.user_id,
                "s": event.session_id,
                "epoch": event.epoch,
                "erased": event.type == "session.erased",
                "cancelled": event.type == "run.cancelled",
            }
        ).decode()
        for event in applied
        if event.type in _CLAIMS
    ]


def _notes(outcome: _Outcome, refused: list[tuple[Event, DeadLetterRow]]) -> list[str]:
    """What runtimes listening on the schema must hear: new epochs and refused events."""
    notes = _claim_notes(outcome.applied)
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


class _Refused(Exception):
    """The batch's one transaction was refused as data: apply it again event by event."""


async def apply_records(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    batches: Mapping[TopicPartition, Sequence[Any]],
    signatures: Signatures = NO_SIGNATURES,
    pool: CheckPool | None = None,
    known: dict[Scope, SessionRecord] | None = None,
) -> _Outcome:
    """Fold partitions' records into the read model with each partition's next offset,
    in one transaction of its own (a savepoint when the caller has one open).

    Records that do not decode, whose signature ``signatures`` refuses, or that the fold
    or PostgreSQL refuse, become dead letters with their reason; runtimes hear of new
    epochs and refused events when the transaction commits; each partition's next offset
    is saved for ``consumer``. A session's events are all in one partition, so merging
    partitions keeps its order.

    With ``pool``, the batch's signatures are checked over its threads as well as this
    one (Ed25519 verification releases the GIL), the same check and refusals as without.

    The whole batch goes in one transaction with no savepoint (each costs two round trips,
    and a runtime's claim waits for this one); only when something in it is refused is
    it rolled back and applied again, each event in a savepoint, so that it fails alone.

    ``known`` holds the session rows of this caller's own last batches (the projector's,
    for the partitions it holds), kept up to date: a small batch of known sessions that
    nothing refuses goes in one guarded statement with its positions and notes, one
    round trip where a transaction costs five (see ``pg.apply_known``).
    """
    outcome = _Outcome()
    candidates: list[tuple[Event, TopicPartition, Any]] = []
    payloads: dict[int, str] = {}
    for tp, records in batches.items():
        for record in records:
            try:
                event, payload = decode_record(record)
            except InvalidEventError as exc:
                outcome.dead.append(_letter(tp, record, exc))
                continue
            candidates.append((event, tp, record))
            if payload is not None:
                payloads[id(event)] = payload
    refused: list[tuple[Event, DeadLetterRow]] = []
    candidates = await _checked(candidates, signatures, pool, outcome, refused)
    events = [event for event, _, _ in candidates]
    if known is not None:
        if await _apply_known(conn, schema, consumer, batches, events, payloads, known, outcome):
            return outcome
        for scope in scopes(events):  # this batch decides their rows anew
            known.pop(scope, None)
    try:
        async with conn.transaction():  # the whole batch at once: the common case
            try:
                changed = await pg.apply_events(conn, schema, events, payloads)
            except _REFUSED as exc:
                raise _Refused from exc
            outcome.applied.extend(events)
            await _close(conn, schema, consumer, batches, outcome, refused)
        pg.remember(known, changed)
        return outcome
    except _Refused:
        pass
    async with conn.transaction():
        for event, tp, record in candidates:
            try:
                async with conn.transaction():
                    await pg.apply_events(conn, schema, [event], payloads)
            except _REFUSED as exc:
                letter = _letter(tp, record, exc, event)
                outcome.dead.append(letter)
                refused.append((event, letter))
            else:
                outcome.applied.append(event)
        await _close(conn, schema, consumer, batches, outcome, refused)
    return outcome


#: batches of up to this many events may go in one guarded statement (``_apply_known``);
#: larger ones are what COPY and the waves of a transaction are for
_KNOWN_UP_TO = 16


async def _apply_known(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    batches: Mapping[TopicPartition, Sequence[Any]],
    events: list[Event],
    payloads: Mapping[int, str],
    known: dict[Scope, SessionRecord],
    outcome: _Outcome,
) -> bool:
    """Apply a small batch folded from ``known`` rows, its positions and notes in the same
    statement; False (nothing written) when it cannot go that way: dead letters to write,
    several topics, an unknown session, a refusal, a change beyond the log, the session
    rows and a checkpoint, or a row that moved on."""
    topics = {tp.topic for tp in batches}
    if outcome.dead or not events or len(events) > _KNOWN_UP_TO or len(topics) != 1:
        return False
    positions = pg.Positions(
        consumer,
        topics.pop(),
        {tp.partition: records[-1].offset + 1 for tp, records in batches.items()},
        _claim_notes(events),
    )
    try:
        written = await pg.apply_known(conn, schema, events, known, payloads, positions)
    except _REFUSED:
        return False  # the transaction's way finds the event to blame
    if written:
        outcome.applied.extend(events)
    return written


async def _checked(
    candidates: list[tuple[Event, TopicPartition, Any]],
    signatures: Signatures,
    pool: CheckPool | None,
    outcome: _Outcome,
    refused: list[tuple[Event, DeadLetterRow]],
) -> list[tuple[Event, TopicPartition, Any]]:
    """The candidates whose signature ``signatures`` lets through; the others become dead
    letters (and ``refused``: their writers hear of it, as of any refusal)."""
    if signatures.mode == "off":
        return candidates
    verdicts = await _verdicts(signatures, [event for event, _, _ in candidates], pool)
    kept = []
    for (event, tp, record), verdict in zip(candidates, verdicts, strict=True):
        if isinstance(verdict, SignatureError):
            letter = _letter(tp, record, verdict, event)
            outcome.dead.append(letter)
            refused.append((event, letter))
            continue
        if verdict is not None:
            outcome.unverified += 1
            logger.warning(
                "projected %s/%s@%s, but %s", tp.topic, tp.partition, record.offset, verdict
            )
        kept.append((event, tp, record))
    return kept


#: a batch smaller than this is checked in the loop's thread: handing a share to another
#: thread costs more than it saves
_POOLED_FROM = 8


def _verdict(signatures: Signatures, events: Sequence[Event]) -> list[str | Exception | None]:
    """``signatures.check`` of each event: None, the problem it counts, or its refusal."""
    out: list[str | Exception | None] = []
    for event in events:
        try:
            out.append(signatures.check(event))
        except SignatureError as exc:
            out.append(exc)
    return out


async def _verdicts(
    signatures: Signatures, events: list[Event], pool: CheckPool | None
) -> list[str | Exception | None]:
    """Each event's verdict, the batch split in even shares between ``pool``'s threads
    and this one."""
    if pool is None or len(events) < _POOLED_FROM:
        return _verdict(signatures, events)
    size = -(-len(events) // (pool.threads + 1))
    shares = [events[i : i + size] for i in range(0, len(events), size)]
    loop = asyncio.get_running_loop()
    others = [
        loop.run_in_executor(pool.executor, _verdict, signatures, share) for share in shares[1:]
    ]
    mine = _verdict(signatures, shares[0])
    return mine + [verdict for share in await asyncio.gather(*others) for verdict in share]


async def _close(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    batches: Mapping[TopicPartition, Sequence[Any]],
    outcome: _Outcome,
    refused: list[tuple[Event, DeadLetterRow]],
) -> None:
    """What ends a batch's transaction: its dead letters, the notes runtimes hear and the
    partitions' next offsets."""
    # a record consumed again (after a rebalance or a failed round) is dead-lettered once
    outcome.dead = await pg.add_dead_letters(conn, schema, outcome.dead)
    refused[:] = [(event, letter) for event, letter in refused if letter in outcome.dead]
    for letter in outcome.dead:
        logger.warning("dead-lettered %s: %s", letter.source, pg.printable(letter.reason, 300))
    notes = _notes(outcome, refused)
    for topic in {tp.topic for tp in batches}:
        await pg.save_positions(
            conn,
            schema,
            consumer,
            topic,
            {tp.partition: r[-1].offset + 1 for tp, r in batches.items() if tp.topic == topic},
            notes,
        )
        notes = []  # sent once, with the first topic's positions


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
        # positions are committed with every batch: finish the ones in flight, drop the rest
        await self._projector._retire(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._projector._seek(self._consumer, assigned)


class _Lane:
    """Fetched records of some partitions, applied in order by one task.

    Everything fetched while a transaction runs goes into the next one: under load the
    batches grow by themselves, and a quiet lane still applies a record at once.
    """

    def __init__(self) -> None:
        self.pending: dict[TopicPartition, list[Any]] = {}
        self.ready = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.task: asyncio.Task[None] | None = None
        self.applied_to: dict[TopicPartition, int] = {}  # next offsets committed since

    def submit(self, tp: TopicPartition, records: Sequence[Any]) -> None:
        self.pending.setdefault(tp, []).extend(records)
        self.idle.clear()
        self.ready.set()

    def queued(self, tp: TopicPartition) -> int:
        return len(self.pending.get(tp, ()))


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
        snapshot_interval: float = 30.0,
        fetch_max_wait_ms: int = 20,
        lanes: int = 2,
        commit_interval: float = 5.0,
    ) -> None:
        self.settings = settings = Settings.resolve(settings)
        self.bootstrap = settings.kafka_bootstrap
        self.dsn = settings.postgres_dsn
        self.topics = Topics.from_settings(settings)
        self.schema = settings.db_schema
        self.group_id = settings.projector_group
        self.max_records = max_records
        self.poll_ms = poll_ms
        self.fetch_max_wait_ms = fetch_max_wait_ms
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
        #: events projected although their signature does not hold (``check`` mode)
        self.signature_problems = 0
        self.failed_rounds = 0
        #: what it does with events' signatures (the settings' LOOMFLOW_SIGNATURES)
        self.signatures = settings.signatures_policy()
        #: threads that check signatures beside the loop's (LOOMFLOW_SIGNATURE_THREADS)
        self.signature_threads = settings.signature_threads
        self._checks: CheckPool | None = None
        #: seconds between commits of the applied offsets to Kafka (see _commit_offsets)
        self.commit_interval = commit_interval
        self._committed_at = 0.0
        self._committing: asyncio.Task[None] | None = None
        self._to_commit: dict[TopicPartition, int] = {}
        self.snapshot_interval = snapshot_interval
        self._snapshots: SnapshotPublisher | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: set when a round failed: the consumer's position is past what was applied, so
        #: nothing is fetched until it is back at the positions stored in PostgreSQL
        self._resync = False
        self._lanes: dict[int, _Lane] = {}
        #: the session rows of this worker's own last batches (apply_records' ``known``)
        self._known: dict[Scope, SessionRecord] = {}
        self._lane_failure: BaseException | None = None
        self._drained = asyncio.Event()
        #: a partition with this many fetches' worth of records queued is not fetched
        self.max_queued_batches = 2
        self.lanes = lanes

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
                self.dsn,
                min_size=1,
                max_size=8,
                timeout=self.settings.connect_timeout,
                reset=_keep_session,
                # The read model is a view of the log: a commit PostgreSQL loses in a crash
                # is projected again from the positions it stores beside the rows, so the
                # projector need not wait for each commit's WAL flush (a disk sync a batch).
                server_settings={"synchronous_commit": "off"},
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise store_error(
                f"PostgreSQL is not reachable ({type(exc).__name__}: {exc}); start it with "
                "`dev/postgres.sh start`",
                exc,
            ) from exc
        async with self._pool.acquire() as conn:
            if self.settings.auto_migrate:
                await pg.migrate(conn, self.schema)
            else:
                await pg.check_version(conn, self.schema)
        if self.signatures.mode != "off":
            self._checks = CheckPool.of(self.signature_threads)
        self._producer = EventProducer(
            self.bootstrap, self.topics, max_batch_size=_SNAPSHOT_BATCH_BYTES
        )
        await self._producer.start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
            # aiokafka has one fetch in flight per broker: while it waits for data of other
            # partitions, a partition whose buffer was just drained is not fetched again.
            # A short wait bounds that (500 ms by default, seen as ~0.5 s of lag).
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            **self._consumer_options,
        )
        # the first assignment may come while start() runs: the listener holds the consumer
        consumer.subscribe([self.topics.events], listener=_SeekToStoredPositions(self, consumer))
        self._consumer = await started(consumer, self.bootstrap)
        await self._report()
        self._tasks = [asyncio.create_task(self._heartbeat())]
        if self.publish_snapshots:
            self._snapshots = SnapshotPublisher(
                self._pool,
                self._producer,
                schema=self.schema,
                topic=self.topics.snapshots,
                interval=self.snapshot_interval,
            )
            self._tasks.append(asyncio.create_task(self._snapshots.run()))

    async def stop(self) -> None:
        for lane in self._lanes.values():
            lane.pending.clear()
        for lane in self._lanes.values():
            await _finish(lane)
            self._to_commit.update(lane.applied_to)
        self._lanes = {}
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
        if self._snapshots is not None:
            self._snapshots.close()
            self._snapshots = None
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._commit_offsets(self._consumer, now=True)
                if self._committing is not None:
                    await self._committing
            self._committing = None
            with contextlib.suppress(Exception):
                await self._consumer.stop()
            self._consumer = None
        if self._checks is not None:
            self._checks.close()
            self._checks = None
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

    async def __aenter__(self) -> Self:
        await self.start()  # a failed start releases what it opened
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

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
        """Fetch one round of records and hand them to the lanes; return how many.

        Lane tasks apply the records (partition p in lane p % ``lanes``), each lane one
        transaction at a time holding everything fetched for it meanwhile, while this
        loop fetches the next ones: decoding, folding and PostgreSQL's work overlap
        instead of taking turns. Two lanes (the default) keep the worker busy while one
        transaction waits for PostgreSQL's COPY and commit: with a backlog the worker's
        CPU was busy 0.82 of the time with one lane, 0.92 with two, for ~10% more events
        a second (BENCHMARKS.md, 2026-12-07 (evening)), which leaves a third little to
        fill. A session lives in one partition, so lanes never touch the same rows. A
        partition far behind is not fetched from, so memory stays bounded (it is left out
        of the fetch, not paused: aiokafka drops what it buffered of a paused partition,
        and fetching it again had a worker read 2.3 times the topic's bytes). A failed
        transaction drops whatever was fetched after it and fails the next step, which
        goes back to the stored positions first.
        """
        consumer = self._consumer
        assert consumer is not None, "start() the projector first"
        if self._lane_failure is not None:
            failure, self._lane_failure = self._lane_failure, None
            raise failure
        if self._resync:  # after a failed batch: back to the stored positions first
            await self._retire(list(consumer.assignment()))
            await self._seek(consumer, list(consumer.assignment()))
            self._resync = False
        assigned = consumer.assignment()
        self._drained.clear()
        wanted = self._wanted(assigned)
        if assigned and not wanted:
            # every partition waits on its lane: wait for one to catch up instead of polling
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self.poll_ms / 1000)
            assigned = consumer.assignment()
            wanted = self._wanted(assigned)
            if not wanted:
                return 0
        # all of them: the consumer's own (also while the assignment changes)
        only = wanted if len(wanted) < len(assigned) else ()
        batches = await consumer.getmany(
            *only, timeout_ms=self.poll_ms, max_records=self.max_records
        )
        if self._resync:
            return 0  # fetched past a failed transaction: dropped, fetched again after a seek
        fetched = 0
        for tp, records in batches.items():
            if records:
                self._lane(tp).submit(tp, records)
                fetched += len(records)
        await self._commit_offsets(consumer)
        return fetched

    def _lane(self, tp: TopicPartition) -> _Lane:
        index = tp.partition % self.lanes
        lane = self._lanes.get(index)
        if lane is None:
            lane = self._lanes[index] = _Lane()
            lane.task = asyncio.create_task(self._drive(lane))
        return lane

    async def _drive(self, lane: _Lane) -> None:
        while True:
            await lane.ready.wait()
            lane.ready.clear()
            while lane.pending:
                batches, lane.pending = lane.pending, {}
                self._drained.set()  # its partitions have room again
                if self._resync:
                    # a transaction failed: what was fetched after it would leave a gap;
                    # the next step goes back to the stored positions and fetches it again
                    continue
                try:
                    await self._apply(batches)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # what follows in this lane would leave a gap: drop it and resync
                    lane.pending.clear()
                    self._resync = True
                    if self._lane_failure is None:
                        self._lane_failure = exc
                    break
                for tp, records in batches.items():
                    lane.applied_to[tp] = records[-1].offset + 1
            lane.idle.set()
            self._drained.set()

    def _wanted(self, assigned: set[TopicPartition]) -> list[TopicPartition]:
        """The assigned partitions whose lane has room for another fetch's records."""
        limit = self.max_records * self.max_queued_batches
        return [tp for tp in assigned if self._lane(tp).queued(tp) < limit]

    async def _commit_offsets(self, consumer: AIOKafkaConsumer, now: bool = False) -> None:
        """Commit the offsets the lanes applied to Kafka, every ``commit_interval`` seconds
        (or ``now``), in a task of its own.

        Kafka's committed offsets only shorten the replay after a restart (the consumer
        seeks to the positions stored in PostgreSQL, which stay the truth), and a commit
        holds up the consumer's next fetch: awaited after every fetch, it was most of
        the time from a record's ack to its apply on an idle projector (2.4 of 3.8 ms).
        """
        for lane in self._lanes.values():
            self._to_commit.update(lane.applied_to)
            lane.applied_to = {}
        due = now or time.monotonic() - self._committed_at >= self.commit_interval
        if not self._to_commit or not due:
            return
        if self._committing is not None and not self._committing.done():
            return  # the one in flight is not back yet: these go with the next
        done, self._to_commit = self._to_commit, {}
        self._committed_at = time.monotonic()
        self._committing = asyncio.create_task(self._commit(consumer, done))

    @staticmethod
    async def _commit(consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:  # a rebalance took a partition: the next owner commits
            logger.debug("committing offsets to Kafka failed: %r", exc)

    async def _retire(self, partitions: Sequence[TopicPartition]) -> None:
        """Drop what the lanes hold of ``partitions`` and let the transactions in flight
        finish (they commit or fail whole: either way consistent)."""
        gone = set(partitions)
        self._known.clear()  # another worker may write these sessions next
        for lane in self._lanes.values():
            for tp in gone & set(lane.pending):
                del lane.pending[tp]
        for lane in list(self._lanes.values()):
            await lane.idle.wait()

    async def snapshots_published(self) -> None:
        """Publish every due snapshot now and wait until they are sent (or failed)."""
        if self._snapshots is not None:
            await self._snapshots.flush()

    @property
    def snapshots(self) -> int:
        """How many snapshots this worker published."""
        return 0 if self._snapshots is None else self._snapshots.published

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

    async def _apply(self, batches: Mapping[TopicPartition, Sequence[Any]]) -> None:
        """Apply partitions' records and their next offsets (one transaction)."""
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            outcome = await apply_records(
                conn,
                self.schema,
                self.group_id,
                batches,
                self.signatures,
                self._checks,
                self._known,
            )
        self.applied += len(outcome.applied)
        self.dead_lettered += len(outcome.dead)
        self.signature_problems += outcome.unverified
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
        if self._snapshots is not None:
            for event in outcome.applied:
                if event.type == "checkpoint.written":
                    self._snapshots.checkpointed(event)
                elif event.type == "session.erased":
                    self._snapshots.erased(event)

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
