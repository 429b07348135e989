"""KafkaRuntime: events appended to Kafka, read back from the projector's PostgreSQL model.

Consistency, as a user meets it:

- An append is durable when Kafka acknowledges it (acks=all, idempotent producer); within
  a run it does not wait for the projector. One that Kafka does not acknowledge within
  ``kafka_ack_timeout`` (too few brokers left) fails as retriable; its events may still
  land, so the session's next append or read waits for them first.
- The claim of a session (the new epoch at the start of a run) is the one synchronous
  point: ``open_session`` returns once it is known to hold, so two writers never both
  think they own a session. Usually the log's order says so: a claim that Kafka put
  after the session as this store knew it, with no record of the session between (the
  records of other sessions there are this store's own, or read to see whose they are),
  gets from the projector the verdict the fold gave (see ``KafkaStore.confirm``).
  Otherwise ``open_session`` waits for the projector's verdict.
  The process that ran a session last knows it without reading it, until the projector
  applies a record after its own (``KafkaStore.claim_head``).
- A fenced writer learns it from the projector's notifications (a newer epoch applied,
  or one of its events refused) and raises the embedded runtimes' typed error before its
  next append; at the latest when its run ends (``confirm``). A cancel is such a newer
  epoch, and its notification says so: the cancelled run raises RunCancelledError.
- Reads see the log: a listing or a checkpoint read first waits until the projector has
  passed the end of the session's partition as it was when the read began, so it sees
  every append Kafka acknowledged before it, this process's or another's. A resume folds
  the session's unprojected tail of the log itself, so it never waits for a lagging read
  model. When a run returns, its events are in the log and their verdict is known (any
  refusal raised), so every process's reads see them; the run did not wait for the
  projector to apply them unless the log's order left that verdict to it (``confirm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from loomflow import errors
from loomflow.errors import (
    InvalidEventError,
    InvalidIdError,
    ProjectionTimeoutError,
    RunCancelledError,
    SessionErasedError,
    StaleWriterError,
    StoreError,
)
from loomflow.producers import EventProducer, Topics, ensure_topics, scope_key
from loomflow.producers.kafka import kafka_error
from loomflow.producers.topics import started
from loomflow.projections import postgres as pg
from loomflow.projections.fold import (
    CheckpointRow,
    PruneFilter,
    StepRow,
    fold,
    materialise,
)
from loomflow.projections.postgres import store_error
from loomflow.runtime.base import RestoredState, Runtime
from loomflow.runtime.postgres import PostgresStore, _redact
from loomflow.runtime.store import EventStore, PruneResult
from loomflow.schemas import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    Message,
    RunStarted,
    SessionForked,
    SignalSent,
    StepRecorded,
)
from loomflow.schemas.codec import Serializer, decode_event
from loomflow.schemas.events import MAX_EVENT_BYTES
from loomflow.schemas.scope import Scope, scope_of
from loomflow.schemas.sessions import SessionRecord
from loomflow.settings import Settings

__all__ = ["KafkaRuntime", "KafkaStore"]

logger = logging.getLogger("loomflow.runtime.kafka")

_REFUSALS: dict[str, type[InvalidEventError]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidEventError,
        errors.StaleWriterError,
        errors.RunCancelledError,
        errors.SequenceConflictError,
        errors.SessionErasedError,
        errors.SignatureError,
    )
}

#: sessions whose bookkeeping is kept before settled ones are dropped
_MAX_WATCHED = 4096

#: where this store's latest acknowledged records landed, kept to tell whose the records
#: between a session's are without reading them (``KafkaStore._only_others``)
_OWN_KEPT = 16_384

#: the span of records between a session's, from the first to the last not this store's
#: own, that a confirm reads to see that none is the session's; a longer one waits for
#: the projector instead
_GAP_READ_UP_TO = 64

#: events that claim the session for a new writer: earlier refusals were for earlier runs
#: (an erasure claims too, but nothing comes after it)
_NEW_RUN = (RunStarted, SessionForked, SignalSent)

#: events handed to the producer, with the futures of their acknowledgements
_Sending = tuple[list[Event], list["asyncio.Future[Any]"]]


def _refusal(error_type: str, reason: str) -> InvalidEventError:
    return _REFUSALS.get(error_type, InvalidEventError)(reason)


def _past(positions: dict[int, int], wanted: dict[int, int]) -> bool:
    """Whether next offsets ``positions`` pass every offset of ``wanted``."""
    return all(positions.get(p, -1) > offset for p, offset in wanted.items())


class _Positions:
    """The projector's applied offsets, fed by LISTEN/NOTIFY, awaited by confirms and reads.

    Apart from them, the offsets heard in notifications on the LISTEN connection of one
    number: PostgreSQL delivers a listener the notifications of every transaction that
    committed while it listened, in commit order, and the projector sends a batch's
    refusals before its positions in the same transaction; so a position heard there
    comes after every refusal of what it passes that committed while that connection
    listened. A position read from the table (on connecting, in the wait's poll) says
    nothing of notes in flight or sent before the connection was made.
    """

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}
        self._waiters: list[tuple[dict[int, int], asyncio.Future[None]]] = []
        self._heard: dict[int, int] = {}
        self._heard_on: int | None = None

    def passed(self, wanted: dict[int, int]) -> bool:
        return _past(self._seen, wanted)

    def at(self, partition: int) -> int:
        """The projector's next offset in ``partition`` as last heard or read (-1: none)."""
        return self._seen.get(partition, -1)

    def heard_passed(self, wanted: dict[int, int], on: int) -> bool:
        """Whether notifications on connection ``on`` passed ``wanted``."""
        return on == self._heard_on and _past(self._heard, wanted)

    def advance(self, partition: int, next_offset: int, heard_on: int | None = None) -> None:
        """The projector applied ``partition`` up to ``next_offset``; ``heard_on``: the
        number of the LISTEN connection whose notification said so (None: read)."""
        if heard_on is not None:
            if heard_on != self._heard_on:
                self._heard, self._heard_on = {}, heard_on
            self._heard[partition] = max(self._heard.get(partition, -1), next_offset)
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


#: ``_Known.latest`` when the newest checkpoint's id is not known
_UNKNOWN = "?"


@dataclass(frozen=True)
class _Known:
    """A session as the log has it below ``end`` in ``partition``: ``row`` is the fold of
    every record there, and ``latest`` the newest checkpoint's id (None: it has none;
    ``_UNKNOWN``: not known). An event of the session that Kafka puts at ``end`` or
    after, with no other record of the session before it, comes after no record the row
    does not hold, so the projector's verdict on it is the fold's on ``row``."""

    partition: int
    end: int
    row: SessionRecord | None
    latest: str | None

    def then(self, landed: Sequence[tuple[Event, int, int]]) -> _Known | None:
        """The session after ``landed`` (events of it acknowledged in the log's order,
        with their partition and offset), all applied: still known when they follow
        ``row`` seq by seq, so that nothing else of the session came between them (an
        event the projector applied there would have taken a seq of theirs)."""
        row, latest = self.row, self.latest
        for event, partition, _ in landed:
            if partition != self.partition or event.seq != (row.last_seq if row else 0) + 1:
                return None
            try:
                row, _ = fold(row, event)
            except InvalidEventError:
                return None
            if isinstance(event, CheckpointWritten):
                latest = event.payload.checkpoint_id
            elif isinstance(event, CheckpointsPruned):
                latest = _UNKNOWN
        end = max((offset + 1 for _, _, offset in landed), default=self.end)
        return _Known(self.partition, max(end, self.end), row, latest)


@dataclass
class _Watch:
    """What this store knows of a session it appended to."""

    #: the newest epoch the projector applied to the session (from its notifications)
    epoch: int = 0
    erased: bool = False
    #: the epoch of the newest cancel heard of: it fenced the run of the epoch before it
    cancelled: int | None = None
    #: (error type, reason) of the first refusal heard of one of ``unconfirmed``
    refusal: tuple[str, str] | None = None
    #: the number of the LISTEN connection that was up when the first of ``unconfirmed``
    #: was sent (None: none was): while it stays, it hears every refusal of them
    listened: int | None = None
    #: partition -> the highest offset of this store's appends
    written: dict[int, int] = field(default_factory=dict)
    #: event ids appended since the last confirm: their verdict is not known yet
    unconfirmed: set[str] = field(default_factory=set)
    #: the events of ``unconfirmed`` Kafka acknowledged, in the log's order, with their
    #: partition and offset: once the projector applied them, the read model's
    #: transcript cache follows them
    landed: list[tuple[Event, int, int]] = field(default_factory=list)
    #: the session as the log has it below an offset of its partition, where this store
    #: knows it whole: read by ``head`` from a read model that had applied every record
    #: of the session below the partition's end, then followed through this store's
    #: confirmed appends (None: unknown)
    known: _Known | None = None
    #: journal steps appended, with their partition and offset, until the projector has them
    steps: dict[str, tuple[int, int, StepRow]] = field(default_factory=dict)
    #: sent and not yet acknowledged (see KafkaStore.send)
    sending: list[_Sending] = field(default_factory=list)


class _Listener:
    """A LISTEN connection that comes back after PostgreSQL restarts or drops it.

    On every (re)connection the stored positions are read once, so what was committed
    while it was away is not missed.
    """

    def __init__(
        self,
        settings: Settings,
        on_position: Callable[[int, int, int | None], None],
        on_session: Callable[[dict[str, Any]], None],
    ) -> None:
        self._settings = settings
        self._on_position = on_position
        self._on_session = on_session
        self._conn: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        #: the number of the current (or last) connection: each one made counts one up
        self.generation = 0

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._supervise())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.connected = False
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    async def _connect(self) -> None:
        s = self._settings
        try:
            conn = await asyncpg.connect(s.postgres_dsn, timeout=s.connect_timeout)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise store_error(
                f"PostgreSQL at {_redact(s.postgres_dsn)} is not reachable "
                f"({type(exc).__name__}: {exc}); start it with `dev/postgres.sh start`",
                exc,
            ) from exc
        lost = asyncio.Event()
        try:
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(pg.positions_channel(s.db_schema), self._position)
            await conn.add_listener(pg.sessions_channel(s.db_schema), self._session)
            stored = await pg.load_positions(conn, s.db_schema, s.projector_group, s.events_topic)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        self._conn, self._lost, self.connected = conn, lost, True
        self.generation += 1
        for partition, next_offset in stored.items():
            self._on_position(partition, next_offset, None)

    async def _supervise(self) -> None:
        while True:
            await self._lost.wait()
            logger.warning("lost the LISTEN connection to PostgreSQL; reconnecting")
            await self._drop()
            backoff = 0.05
            while not self.connected:
                try:
                    await self._connect()
                except (StoreError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                    await asyncio.sleep(backoff)  # a retry delay: nothing to wait on meanwhile
                    backoff = min(backoff * 2, 2.0)
            logger.info("LISTEN connection to PostgreSQL is back")

    def _position(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        group, topic, partition, next_offset = payload.rsplit(":", 3)
        s = self._settings
        if group == s.projector_group and topic == s.events_topic:
            on = self.generation if conn is self._conn else None  # else: still connecting
            self._on_position(int(partition), int(next_offset), on)

    def _session(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            note = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(note, dict):
            self._on_session(note)


class KafkaStore(EventStore):
    """Appends to the events topic; serves reads from the read model in PostgreSQL."""

    sends_ahead = True

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings = Settings.resolve(settings)
        self.bootstrap = settings.kafka_bootstrap
        self.topics = Topics.from_settings(settings)
        self.group_id = settings.projector_group
        self.projection_timeout = settings.projection_timeout
        self.signer, self.signing_refused = settings.writer_key()
        #: the rule of signatures the projector applies, applied to the unprojected tail
        self.signatures = settings.signatures_policy()
        # the read model's store never appends: it has no use for the key
        self._reads = PostgresStore.from_settings(
            settings.model_copy(update={"signing_key": None, "signing_key_file": None})
        )
        self._producer = EventProducer(
            self.bootstrap, self.topics, ack_timeout=settings.kafka_ack_timeout
        )
        self._positions = _Positions()
        self._listener = _Listener(settings, self._positions.advance, self._heard)
        self._watches: dict[Scope, _Watch] = {}
        #: the projector applied an event of this store's: it runs, and takes this store's
        #: events as this store does (the same configuration, a key its keyring trusts)
        self._vouched = False
        self._consumer: AIOKafkaConsumer | None = None
        self._reader_lock = asyncio.Lock()
        #: (partition, offset) -> the session of a record this store appended there
        self._own: dict[tuple[int, int], Scope] = {}
        self._started = False
        self._start_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"KafkaStore({self.settings.describe()})"

    @property
    def listening(self) -> bool:
        """Whether the projector's notifications reach this store now (else it polls)."""
        return self._listener.connected

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the topics if needed, start the producer and listen to the projector.

        A start that fails releases what it had opened, the read model's pool too: a
        caller often drops a store that could not start without closing it, and the
        next start connects again."""
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            try:
                await self._reads.open()  # connects, and migrates or checks the schema
                await ensure_topics(self.bootstrap, self.topics, create=self.settings.auto_migrate)
                await self._producer.start()
                await self._listener.start()
            except BaseException:
                await self._release()
                await self._reads.disconnect()
                raise
            self._started = True

    async def open(self) -> None:
        """Topics, producer, read model and LISTEN connection now, not on first use."""
        await self.start()

    async def setup(self) -> None:
        """Create the topics and create or migrate the read model's schema now."""
        await ensure_topics(self.bootstrap, self.topics)
        await self._reads.setup()

    async def close(self) -> None:
        await self._release()
        await self._reads.close()

    async def _release(self) -> None:
        self._started = False
        await self._listener.close()
        with contextlib.suppress(Exception):
            await self._producer.stop()
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
            self._consumer = None

    # -- writes ------------------------------------------------------------------------------

    async def _append(self, events: Sequence[Event]) -> None:
        """Append to the log; return once Kafka acknowledged these events and any this
        store sent earlier for the same sessions.

        Raises the typed refusal first if the projector has told this store that the
        session moved on (a newer epoch, an erasure, or a refused earlier event).
        """
        if not events:
            return
        pending = await self._enqueue(events)
        await self._settle({scope_of(e) for e in events}, pending)

    async def _send(self, events: Sequence[Event]) -> None:
        """Hand events to the producer and return; the session's next ``append`` (or
        ``confirm``) waits for their acknowledgement and raises their failure."""
        if not events:
            return
        pending = await self._enqueue(events)
        for key in {scope_of(e) for e in events}:
            self._watch(key).sending.append(pending)

    async def _enqueue(self, events: Sequence[Event]) -> _Sending:
        await self.start()
        for event in events:
            self._check(event)
        for event in events:
            watch = self._watch(scope_of(event))
            if isinstance(event, _NEW_RUN):
                watch.refusal = None  # a new claim: earlier verdicts were for earlier runs
                watch.unconfirmed.clear()
                watch.landed.clear()
            if not watch.unconfirmed:
                listener = self._listener
                watch.listened = listener.generation if listener.connected else None
            watch.unconfirmed.add(event.event_id)  # its fate is unknown from here on
        try:
            futures = await self._producer.enqueue(events)
        except InvalidEventError:  # too large for the log: none of them was sent
            for event in events:
                self._watch(scope_of(event)).unconfirmed.discard(event.event_id)
            raise
        for event, future in zip(events, futures, strict=True):
            future.add_done_callback(functools.partial(self._own_landed, scope_of(event)))
        return list(events), futures

    def _own_landed(self, scope: Scope, future: asyncio.Future[Any]) -> None:
        """Note where Kafka put a record of ``scope`` this store sent (as it acknowledges
        it, whichever session's confirm comes first)."""
        if future.cancelled() or future.exception() is not None:
            return
        metadata = future.result()
        self._own[(metadata.partition, metadata.offset)] = scope
        while len(self._own) > _OWN_KEPT:
            del self._own[next(iter(self._own))]

    async def _settle(self, keys: set[Scope], *also: _Sending, quiet: bool = False) -> None:
        """Wait for the acknowledgement of what was sent for ``keys`` (and ``also``), in
        order, and note where each event landed; raise the first failure (unless
        ``quiet``: then a failed send only means those events are not in the log).

        Sends that Kafka has not acknowledged within the producer's ``ack_timeout`` raise
        StoreUnavailableError even when ``quiet``: they may still land, so they stay
        queued for their sessions, and the next append or read of those sessions waits for
        them first. Until they are known, neither is the session as the log has it."""
        waiting: list[_Sending] = []
        for key in keys:
            watch = self._watches.get(key)
            if watch is not None and watch.sending:
                waiting.extend(watch.sending)
                watch.sending = []
        waiting.extend(also)
        failure: StoreError | None = None
        for n, (events, futures) in enumerate(waiting):
            try:
                positions = await self._producer.acked(futures)
            except StoreError as exc:
                if not all(future.done() for future in futures):
                    self._still_sending(waiting[n:])
                    raise
                failure = failure or exc
                logger.debug("a send of %d event(s) failed: %s", len(events), exc)
                continue
            for event, position in zip(events, positions, strict=True):
                self._landed(event, position.partition, position.offset)
        if failure is not None and not quiet:
            raise failure

    def _still_sending(self, sendings: list[_Sending]) -> None:
        """Put sends not acknowledged yet back at the head of their sessions' queues."""
        seen: set[int] = set()
        for sending in reversed(sendings):
            if id(sending) in seen:
                continue
            seen.add(id(sending))
            for key in {scope_of(e) for e in sending[0]}:
                self._watch(key).sending.insert(0, sending)

    def _landed(self, event: Event, partition: int, offset: int) -> None:
        watch = self._watch(scope_of(event))
        watch.written[partition] = max(watch.written.get(partition, -1), offset)
        if event.event_id in watch.unconfirmed:
            watch.landed.append((event, partition, offset))
        if isinstance(event, StepRecorded):
            p = event.payload
            row = StepRow(p.step_key, p.input_hash, event.seq, p.value, p.serializer, event.at)
            watch.steps[p.step_key] = (partition, offset, row)

    def _check(self, event: Event) -> None:
        scope = scope_of(event)
        watch = self._watches.get(scope)
        if watch is None:
            return
        if watch.refusal is not None and not isinstance(event, _NEW_RUN):
            raise _refusal(*watch.refusal)
        if watch.erased:
            raise SessionErasedError(f"{scope.describe()} was erased; start a new session id")
        if event.epoch < watch.epoch:
            if watch.cancelled is not None and event.epoch == watch.cancelled - 1:
                raise RunCancelledError.of(event.run_id, scope.describe())
            raise StaleWriterError(
                f"writer epoch {event.epoch} is older than epoch {watch.epoch} of "
                f"{scope.describe()}: another run took the session over"
            )

    def _watch(self, key: Scope) -> _Watch:
        watch = self._watches.get(key)
        if watch is None:
            if len(self._watches) >= _MAX_WATCHED:
                self._forget_settled()
            watch = self._watches[key] = _Watch()
        return watch

    def _forget_settled(self) -> None:
        # a session with no unconfirmed event and nothing unprojected needs no bookkeeping:
        # were its writer fenced meanwhile, the projector refuses it and says so again
        self._watches = {
            key: w
            for key, w in self._watches.items()
            if w.unconfirmed or w.sending or not self._positions.passed(w.written)
        }

    def _heard(self, note: dict[str, Any]) -> None:
        """A projector's notification: a session's new epoch (of a cancel, an erasure),
        or a refused event."""
        try:
            scope = Scope.of(note.get("s"), note.get("u"))
        except InvalidIdError:
            return  # not a session's note
        watch = self._watches.get(scope)
        if watch is None:
            return  # not a session this store writes to
        if "epoch" in note:
            epoch = int(note["epoch"])
            watch.epoch = max(watch.epoch, epoch)
            watch.erased = watch.erased or bool(note.get("erased"))
            if note.get("cancelled"):
                watch.cancelled = max(watch.cancelled or 0, epoch)
        elif note.get("event") in watch.unconfirmed and watch.refusal is None:
            watch.refusal = (str(note.get("error")), str(note.get("reason")))

    async def confirm(self, scope: Scope, *, visible: bool = True) -> None:
        """Wait until the projector applied this store's appends to ``scope``; raise the
        typed refusal of any of them.

        ``visible=False`` (a claim, a run's end) asks for the verdict alone: appends that
        Kafka put after the session as this store knows it (read by a ``head`` whose
        partition held no unapplied record of the session, then followed through its
        confirmed appends), with no record of the session but theirs in between, are not
        waited for (see ``_follows``): the projector applies them as the fold just did.
        That is the common case of a session resumed where it was left, whatever other
        sessions wrote to its partition meanwhile (with many sessions at once, the rule).
        Another record of the session in between, or too many records of other
        processes to read (``_GAP_READ_UP_TO``), waits.

        The refusals are heard on the LISTEN connection; the read model is asked for them
        (one round trip) only when that connection cannot have heard them all: it was
        re-made since the first of them was sent, or the wait learned the position from
        the table rather than from a notification (see ``_Positions``)."""
        await self._settle({scope})
        watch = self._watches.get(scope)
        if watch is None or not watch.unconfirmed:
            return
        known, watch.known = watch.known, None
        after = None if known is None or visible else await self._follows(scope, watch, known)
        if after is not None:
            # what the projector will make of them is known: it applies them
            applied = [event for event, _, _ in watch.landed]
            watch.unconfirmed.clear()
            watch.landed = []
            watch.known = after
            self._reads.follow(applied)
            return
        await self._projected(watch.written)
        ids = set(watch.unconfirmed)
        refusal = watch.refusal
        if refusal is None and not (
            watch.listened is not None
            and self._positions.heard_passed(watch.written, watch.listened)
        ):
            # a refusal may have been sent while no connection of this store listened
            refusal = await self._reads.refusal(list(ids))
        watch.unconfirmed.difference_update(ids)
        watch.steps = {
            k: v for k, v in watch.steps.items() if not self._positions.passed({v[0]: v[1]})
        }
        confirmed = [x for x in watch.landed if x[0].event_id in ids]
        watch.landed = [x for x in watch.landed if x[0].event_id not in ids]
        if refusal is not None:
            self._reads.forget(scope)  # its transcript may hold what was refused
            raise _refusal(*refusal)
        if known is not None and len(confirmed) == len(ids) and not watch.landed:
            watch.known = known.then(confirmed)
        applied = [event for event, _, _ in confirmed]
        self._vouched = self._vouched or bool(applied)
        # the read model holds them now, at their seqs: the next read of this session (a
        # resume in this process) is served from memory, the very message objects the run
        # appended, so a model's work on its transcript carries on instead of starting over
        self._reads.follow(applied)

    async def _follows(self, scope: Scope, watch: _Watch, known: _Known) -> _Known | None:
        """The session after the unconfirmed events when the projector's verdict on them
        is known without waiting for it (None: it is not): they are all acknowledged, in
        the known partition at ``known.end`` or after it, no record of the session but
        them came after ``known.end`` (the records between them are other sessions'; see
        ``_only_others``), the projector applied an event of this store's before (it runs,
        configured as this store is and trusting its key: a store's first claim waits for
        it, and a timeout names the processor), and the fold and the rule of signatures,
        which the projector applies to that same row, accept each in turn. Anything else
        waits for the projector."""
        landed = watch.landed
        if not self._vouched or watch.refusal is not None or len(landed) != len(watch.unconfirmed):
            return None
        mine: set[int] = set()
        for event, partition, offset in landed:
            if partition != known.partition or offset < known.end:
                return None
            try:
                self.signatures.check(event)
            except InvalidEventError:
                return None  # the projector refuses it: its verdict is awaited, and raised
            mine.add(offset)
        last = max(mine, default=known.end)
        if last - known.end > _OWN_KEPT:
            return None  # a session left long ago: whose records came since is not known
        between = [o for o in range(known.end, last) if o not in mine]
        if between and not await self._only_others(scope, known.partition, between):
            return None
        return known.then(landed)  # None when the fold refuses one

    async def _only_others(self, scope: Scope, partition: int, offsets: list[int]) -> bool:
        """Whether none of the records at ``offsets`` of ``partition`` is of ``scope``.

        A record this store appended for another session is known by where it landed;
        the others are read, when they span no more than ``_GAP_READ_UP_TO`` records: a
        few records of other processes' sessions in the same partition, read in one
        fetch, where the projector's verdict takes a fetch, a transaction and a
        notification, after whatever it has to apply first."""
        unknown = self._not_own(scope, partition, offsets)
        if unknown is None:
            return False  # this store's record of the session, not among those confirmed
        if not unknown:
            return True
        if unknown[-1] - unknown[0] >= _GAP_READ_UP_TO:
            return False
        key = scope_key(scope.user_id, scope.session_id)
        wanted = set(unknown)
        records = await self._records(partition, unknown[0], unknown[-1] + 1)
        return not any(r.offset in wanted and r.key == key for r in records)

    def _not_own(self, scope: Scope, partition: int, offsets: Sequence[int]) -> list[int] | None:
        """The offsets whose records this store did not append (or no longer knows of),
        in order; None when it appended one of them for ``scope`` itself."""
        unknown = []
        for offset in offsets:
            whose = self._own.get((partition, offset))
            if whose == scope:
                return None
            if whose is None:
                unknown.append(offset)
        return unknown

    async def _projected(self, wanted: dict[int, int]) -> None:
        """Wait until the projector's committed positions pass ``wanted``.

        Notifications wake the wait at once; once a second the positions table is read
        too, so a lost notification (or a LISTEN connection being re-made) only costs
        latency.
        """
        if not wanted or self._positions.passed(wanted):
            return
        done = self._positions.waiter(wanted)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.projection_timeout
        while not done.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                done.cancel()
                raise ProjectionTimeoutError(await self._diagnose(wanted))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), min(1.0, remaining))
            if not done.done():
                with contextlib.suppress(StoreError):
                    stored = await self._reads.positions(self.group_id, self.topics.events)
                    for partition, next_offset in stored.items():
                        self._positions.advance(partition, next_offset)

    async def _diagnose(self, wanted: dict[int, int]) -> str:
        """Why the projector may not have applied ``wanted``: what the processors report."""
        s = self.settings
        head = (
            f"the projector has not applied {s.events_topic} offsets {wanted} within "
            f"{self.projection_timeout:g} s. This runtime waits for the processor group "
            f"{s.projector_group!r} projecting into PostgreSQL schema {s.db_schema!r} "
            f"(processor id {s.processor_id!r}, Kafka {s.kafka_bootstrap}); what it appended "
            "stays in the log, applied once a processor runs."
        )
        try:
            seen = await self._reads.processors()
        except StoreError as exc:
            return f"{head} The processors table could not be read ({exc})."
        ours = [p for schema, p in seen if schema == s.db_schema]
        mine = [p for p in ours if p.consumer == s.projector_group and p.topic == s.events_topic]
        live = [p for p in mine if p.seen_seconds_ago < 10]
        if live:
            return (
                f"{head} Its workers report in ({', '.join(_worker(p) for p in live)}) but "
                "are behind: the processor is overloaded or failing; see its log."
            )
        if seen:
            listing = "; ".join(f"schema {schema!r}: {_worker(p)}" for schema, p in seen[:6])
            return (
                f"{head} No worker of that group reports there. Processors seen: {listing}. "
                "Start `loomflow processor` with the same LOOMFLOW_* settings as this runtime."
            )
        return (
            f"{head} No processor reports to this database now (one that stops removes its "
            "row): start `loomflow processor` with the same LOOMFLOW_* settings as this "
            "runtime, against the same Kafka and PostgreSQL."
        )

    # -- reads ---------------------------------------------------------------------------------

    async def _synced(self, scope: Scope) -> None:
        """Wait until the projector has applied everything the scope's partition held
        when this read began: a listing or a checkpoint read sees every append that Kafka
        acknowledged before it, from any process (one offsets request, then usually no
        wait at all)."""
        partition = await self._partition_of(scope)
        await self._passed({partition: await self._end_of(partition)})

    async def synced(self) -> None:
        """Wait until the projector has applied everything the events topic held when
        this was called, from any process: what a reader of the read model itself (a
        listing of sessions, as ``loomflow sessions ls`` reads it) waits for to see every
        run that had returned. A run returns once its events hold, not once the
        projector applied them; this store's own reads wait by position themselves."""
        await self.start()
        await self._passed(await self._ends(sorted(await self._producer.partitions_for())))

    async def _passed(self, ends: dict[int, int]) -> None:
        """Wait until the projector has applied each partition up to its end in ``ends``."""
        await self._projected({p: end - 1 for p, end in ends.items() if end > 0})

    async def _end_of(self, partition: int) -> int:
        """The events topic's partition's end offset now (one request to its leader)."""
        return (await self._ends([partition]))[partition]

    async def _ends(self, partitions: Sequence[int]) -> dict[int, int]:
        """The end offsets of the events topic's ``partitions`` now (one request)."""
        tps = [TopicPartition(self.topics.events, p) for p in partitions]
        async with self._reader_lock:
            reader = await self._reader()
            try:
                ends = await reader.end_offsets(tps)
            except KafkaError as exc:
                where = f"{self.topics.events}/{','.join(map(str, partitions))}"
                raise kafka_error(f"reading the end of {where} failed", exc) from exc
        return {tp.partition: int(end) for tp, end in ends.items()}

    async def _partition_of(self, scope: Scope) -> int:
        return await self._producer.partition_of(scope_key(scope.user_id, scope.session_id))

    async def session(self, scope: Scope) -> SessionRecord | None:
        """The session as the log has it: the read model's row plus unprojected events
        (this store's own among them, so it never waits for the projector). What this
        store sent for the session is settled first: acknowledged, or known not to be in
        the log."""
        row, _ = await self.head(scope)
        return row

    async def head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None]:
        """``session``, and the newest checkpoint's id from the read model and the same
        unprojected events: one read of the session and no wait for the projector
        (unless an unprojected ``checkpoints.pruned`` makes the newest one unknown)."""
        await self.start()
        await self._settle({scope}, quiet=True)
        # the read model and the log's end at once: an append Kafka acknowledged before
        # this read began is below that end, whichever of the two answers first
        projected = asyncio.ensure_future(self._projected_head(scope, checkpoint=checkpoint))
        try:
            partition = await self._partition_of(scope)
            end = await self._end_of(partition)
        except BaseException:
            projected.cancel()
            await asyncio.wait({projected})
            if not projected.cancelled():
                projected.exception()  # the end's failure is what the caller hears of
            raise
        row, latest, since = await projected
        tail = await self.unprojected(scope, row.last_seq if row else 0, since, end=end)
        # the projector's own row, of every record of the partition below its end when
        # the records it has not applied are other sessions' (its transcript is in the
        # read model): what a claim made of this read needs to be confirmed without it
        self._watch(scope).known = (
            None if tail else _Known(partition, end, row, latest if checkpoint else _UNKNOWN)
        )
        pruned = False
        for event in tail:
            try:
                row, _ = fold(row, event)
            except InvalidEventError:
                break  # the projector will refuse it too; nothing after it counts yet
            if isinstance(event, CheckpointWritten):
                latest = event.payload.checkpoint_id
            pruned = pruned or isinstance(event, CheckpointsPruned)
        if checkpoint and pruned:  # which one is the newest now: the projector knows
            newest = await self.checkpoint(scope, None)
            latest = None if newest is None else newest.checkpoint_id
        return row, latest if checkpoint else None

    async def claim_head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None]:
        """``head`` for a claim, without reading the session when this store knows it:
        it confirmed its own last appends to it, and the projector has applied no record
        of the session's partition after them (it may not have applied them yet: a run
        does not wait for it). A record that came after them is not seen here, but the
        claim's confirmation sees it (the claim lands behind it: the projector's verdict
        is awaited, and a claim it refuses is made again of a read; ``open_session``)."""
        watch = self._watches.get(scope)
        known = None if watch is None else watch.known
        if (
            known is None
            or watch is None
            or watch.unconfirmed
            or watch.sending
            or self._positions.at(known.partition) > known.end
            or (checkpoint and known.latest == _UNKNOWN)
        ):
            return await self.head(scope, checkpoint=checkpoint)
        return known.row, known.latest if checkpoint else None

    async def projected_session(self, scope: Scope) -> tuple[SessionRecord | None, int]:
        """The session's row in the read model, and the projector's position in the
        session's partition in the same snapshot: the row holds every event below that
        position and none above it, so reading the log from there misses nothing and
        folds nothing twice, whatever the projector commits meanwhile."""
        row, _, since = await self._projected_head(scope)
        return row, since

    async def _projected_head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None, int]:
        """The read model's row of the session (and its newest checkpoint's id), and the
        projector's next offset in the session's partition, all of one snapshot: the row
        holds every event of the partition below that offset, and none after it."""
        await self.start()
        partition = await self._partition_of(scope)
        return await self._reads.head_at(
            scope, checkpoint=checkpoint, position=(self.group_id, self.topics.events, partition)
        )

    async def unprojected(
        self, scope: Scope, after_seq: int, since: int, *, end: int | None = None
    ) -> list[Event]:
        """The scope's events past ``after_seq`` in the log from offset ``since`` (a
        position from ``projected_session``) to its end (``end``: the partition's end
        offset as the caller read it, else now).

        Empty unless the projector lags: then the lagging part of one partition is read,
        so a resume never waits for the read model to catch up. What the projector
        refuses is left out: what does not decode, and with signatures required an event
        whose signature does not hold.
        """
        await self.start()
        key = scope_key(scope.user_id, scope.session_id)
        partition = await self._partition_of(scope)
        if end is None:
            end = await self._end_of(partition)
        if since >= end:
            return []
        if end - since <= _OWN_KEPT and self._not_own(scope, partition, range(since, end)) == []:
            return []  # all this store's own records, of other sessions: nothing to read
        later: list[Event] = []
        taken: set[int] = set()
        for record in await self._records(partition, since, end):
            if record.key != key:
                continue
            try:
                event = decode_event(record.value or b"")
                self.signatures.check(event)  # a forgery is never replayed
            except InvalidEventError:
                continue  # dead-lettered by the projector; never part of it
            if event.seq > after_seq and event.seq not in taken:
                taken.add(event.seq)  # the first at a seq is what the fold keeps
                later.append(event)
        return sorted(later, key=lambda e: e.seq)

    async def _records(self, partition: int, start: int, stop: int) -> list[Any]:
        """The events topic's records of ``partition`` from offset ``start`` to ``stop``."""
        tp = TopicPartition(self.topics.events, partition)
        found: list[Any] = []
        async with self._reader_lock:  # one consumer, assigned to one partition at a time
            reader = await self._reader()
            try:
                reader.assign([tp])
                reader.seek(tp, start)
                reader.resume(tp)
                while await reader.position(tp) < stop:
                    fetched = await reader.getmany(tp, timeout_ms=1000)
                    found.extend(r for r in fetched.get(tp, []) if r.offset < stop)
            except KafkaError as exc:
                raise kafka_error(
                    f"reading partition {partition} of {self.topics.events} failed", exc
                ) from exc
            finally:
                # no fetch left waiting at the partition's end: the next seek would wait for
                # it (up to fetch_max_wait_ms, 500 ms), and an end_offsets() meanwhile made
                # it do so every time
                reader.pause(tp)
        return found

    async def _reader(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
            )
            self._consumer = await started(consumer, self.bootstrap)
        return self._consumer

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        await self.start()
        await self._synced(scope)
        return await self._reads.checkpoint(scope, checkpoint_id)

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        await self.start()
        await self._synced(scope)
        return await self._reads.list_checkpoints(scope, limit)

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        """The transcript up to ``upto_seq``, a seq the caller read from the model."""
        await self.start()
        return await self._reads.transcript(scope, base_seq, upto_seq, message_count)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        """The journal entry: this store's own unprojected record first, else the model's.

        Never waits for the projector: a run's own steps are in memory until projected,
        and everything before its claim was projected when the claim was.
        """
        await self.start()
        watch = self._watches.get(scope)
        if watch is not None and step_key in watch.steps:
            partition, offset, row = watch.steps[step_key]
            if not self._positions.passed({partition: offset}):
                return row
            del watch.steps[step_key]
        return await self._reads.step(scope, step_key)

    async def sessions_in_flight(self, limit: int = 500) -> list[SessionRecord]:
        """The read model's runs in flight (it may lag the log: ``session`` has the
        session as the log holds it)."""
        await self.start()
        return await self._reads.sessions_in_flight(limit)

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        await self.start()
        await self._synced(scope)
        return await self._reads.read_events(scope, after_seq)

    async def _prune(self, match: PruneFilter) -> PruneResult:
        """Prune by appending events, so a rebuild from the log prunes the same things.

        A whole session goes by an erasure tombstone (its id is not reused, unlike on the
        embedded stores); in a live session, checkpoints older than ``before`` go by a
        ``checkpoints.pruned`` event. Journal steps of live sessions are kept.
        """
        await self.start()
        await self.synced()  # the sessions as the log has them: a run returns before that
        before = match.before
        sessions = checkpoints = events = 0
        for row in await self._reads.matching_sessions(match):
            scope = Scope(row.session_id, row.user_id)
            kept = await self._reads.list_checkpoints(scope, 1 << 30)
            if before is None or row.updated_at < before:
                if await self.erase(row.session_id, user_id=row.user_id):
                    sessions += 1
                    checkpoints += len(kept)
                    events += row.last_seq
                continue
            old = [c.checkpoint_id for c in kept if c.created_at < before]
            if old and await self.append_admin(scope, CheckpointsPruned, {"checkpoint_ids": old}):
                checkpoints += len(old)
        return PruneResult(sessions=sessions, checkpoints=checkpoints, events=events)


def _worker(p: pg.ProcessorRow) -> str:
    return (
        f"group {p.consumer!r} on topic {p.topic!r} (worker {p.worker}, partitions "
        f"{p.partitions}, last seen {p.seen_seconds_ago:.0f} s ago)"
    )


class KafkaRuntime(Runtime):
    """Durable runs over a shared Kafka log and a PostgreSQL read model.

    With no arguments it uses the ``LOOMFLOW_*`` environment and the same defaults as
    ``loomflow processor`` (see :class:`loomflow.settings.Settings`); arguments given here
    take precedence over the environment.
    """

    store: KafkaStore

    def __init__(
        self,
        bootstrap: str | None = None,
        dsn: str | None = None,
        *,
        max_checkpoints_per_session: int | None = None,
        serializer: Serializer | None = None,
        lease_seconds: float | None = None,
        retry_seconds: float | None = None,
        settings: Settings | None = None,
        schema: str | None = None,
        topic_prefix: str | None = None,
        processor_id: str | None = None,
        projection_timeout: float | None = None,
    ) -> None:
        resolved = Settings.resolve(
            settings,
            kafka_bootstrap=bootstrap,
            postgres_dsn=dsn,
            db_schema=schema,
            topic_prefix=topic_prefix,
            processor_id=processor_id,
            projection_timeout=projection_timeout,
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
        )
        super().__init__(KafkaStore(resolved), settings=resolved)

    async def restore(self, scope: Scope, checkpoint_id: str | None = None) -> RestoredState | None:
        """The session from the read model plus the log's events it has not projected yet."""
        if checkpoint_id is not None:
            return await super().restore(scope, checkpoint_id)  # projected with all it covers
        row, since = await self.store.projected_session(scope)
        messages: list[Message] = []
        if row is not None and row.status != "erased":
            messages = await self._transcript(scope, row.base_seq, row.last_seq, row.message_count)
        for event in await self.store.unprojected(scope, row.last_seq if row else 0, since):
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
