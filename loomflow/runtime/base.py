"""What an Agent talks to: a runtime over an event store (a log plus its read model)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, ParamSpec, Self, TypeVar, cast, overload

from loomflow.errors import (
    CorruptRecordError,
    InvalidEventError,
    InvalidIdError,
    LoomflowError,
    SequenceConflictError,
)
from loomflow.projections.fold import CheckpointRow, SessionRow, StepRow
from loomflow.schemas import (
    Checkpoint,
    CheckpointMeta,
    Event,
    EventBase,
    Message,
    RunStarted,
    SessionErased,
    SessionForked,
    StepRecorded,
    TranscriptCompacted,
    TurnAppended,
    Usage,
    new_id,
    validate_id,
)
from loomflow.schemas.codec import decode_value, encode_value, input_hash
from loomflow.schemas.events import (
    RunStartedPayload,
    SessionErasedPayload,
    SessionForkedPayload,
    StepRecordedPayload,
)

__all__ = [
    "ANY_USER",
    "EventStore",
    "GroupCommit",
    "Journal",
    "PruneResult",
    "RestoredState",
    "Runtime",
    "Scope",
    "Serializer",
    "SessionWriter",
    "TranscriptCache",
    "current_journal",
]

logger = logging.getLogger("loomflow.runtime")

Serializer = Literal["json", "pickle"]
T = TypeVar("T")
P = ParamSpec("P")
E = TypeVar("E", bound=EventBase)


class _AnyUser:
    def __repr__(self) -> str:
        return "ANY_USER"


#: Passed as ``user_id`` to store-wide operations to match every user.
ANY_USER: Any = _AnyUser()


@dataclass(frozen=True)
class Scope:
    """Whose session: every read and write is scoped by (user, session)."""

    session_id: str
    user_id: str | None = None

    @classmethod
    def of(cls, session_id: object, user_id: object = None) -> Scope:
        """Validate ids supplied by a caller and return their scope."""
        sid = validate_id(session_id, "session_id")
        uid = None if user_id is None else validate_id(user_id, "user_id")
        return cls(sid, uid)

    def describe(self) -> str:
        who = "no user" if self.user_id is None else f"user {self.user_id}"
        return f"session {self.session_id} ({who})"


@dataclass(frozen=True)
class PruneResult:
    """What ``store.prune`` deleted."""

    sessions: int = 0
    checkpoints: int = 0
    steps: int = 0
    events: int = 0


@dataclass(frozen=True)
class RestoredState:
    """A session's transcript, turn count and usage at a point of its log."""

    messages: list[Message]
    turns: int
    usage: Usage
    seq: int
    checkpoint_id: str | None
    session: SessionRow


@dataclass
class _CachedTranscript:
    base_seq: int
    seq: int
    messages: list[Message]


class TranscriptCache:
    """Transcripts this process read or wrote lately, so a read need not re-parse the log.

    An entry holds a session's transcript from its base up to ``seq``. Between two bases a
    transcript only grows, so any checkpoint with the same base is a prefix of it. Entries
    follow the appends of their own store and are dropped at any gap (another writer).
    """

    def __init__(self, max_sessions: int = 64) -> None:
        self._max = max_sessions
        self._entries: OrderedDict[tuple[str | None, str], _CachedTranscript] = OrderedDict()

    def lookup(self, key: tuple[str | None, str], base_seq: int) -> _CachedTranscript | None:
        entry = self._entries.get(key)
        if entry is None or entry.base_seq != base_seq:
            return None
        self._entries.move_to_end(key)
        return entry

    def store(
        self, key: tuple[str | None, str], base_seq: int, seq: int, messages: list[Message]
    ) -> None:
        self._entries[key] = _CachedTranscript(base_seq, seq, messages)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def follow(self, events: Sequence[Event]) -> None:
        """Keep entries in step with events this store just appended."""
        for event in events:
            key = (event.user_id, event.session_id)
            if isinstance(event, SessionForked | TranscriptCompacted):
                self.store(key, event.seq, event.seq, list(event.payload.messages))
                continue
            entry = self._entries.get(key)
            if entry is None:
                if event.seq == 1:  # a session this store starts: its writer will read it
                    first = list(event.payload.messages) if isinstance(event, TurnAppended) else []
                    self.store(key, 0, 1, first)
                continue
            if entry.seq != event.seq - 1 or isinstance(event, SessionErased):
                del self._entries[key]
                continue
            if isinstance(event, TurnAppended):
                entry.messages.extend(event.payload.messages)
            entry.seq = event.seq

    async def read(
        self,
        key: tuple[str | None, str],
        base_seq: int,
        upto_seq: int,
        message_count: int,
        fetch: Callable[[int, int], Awaitable[list[Message]]],
    ) -> list[Message]:
        """The transcript at ``upto_seq``: from memory, extended by what another writer
        added since (``fetch(lo, hi)`` reads the log's transcript rows lo..hi), or read
        whole from ``base_seq``."""
        cached = self.lookup(key, base_seq)
        if cached is None:
            messages = await fetch(base_seq, upto_seq)
            self.store(key, base_seq, upto_seq, list(messages))
            return messages
        if cached.seq < upto_seq:
            seq = cached.seq
            added = await fetch(seq + 1, upto_seq)
            if self.lookup(key, base_seq) is not cached or cached.seq != seq:
                return await fetch(base_seq, upto_seq)  # it changed while we read
            cached.messages.extend(added)
            cached.seq = upto_seq
        return cached.messages[:message_count]

    def forget(self, key: tuple[str | None, str] | None = None) -> None:
        if key is None:
            self._entries.clear()
        else:
            self._entries.pop(key, None)


Outcomes = list["LoomflowError | None"]


class GroupCommit:
    """Appends that arrive while a commit runs go into the next round, committed together.

    ``commit(batches)`` applies one round (one transaction) and returns each batch's
    outcome: None, or the error that refused that batch alone. Many concurrent sessions
    then cost one commit per round instead of one each.
    """

    def __init__(
        self,
        commit: Callable[[list[list[Event]]], Awaitable[Outcomes]],
        cache: TranscriptCache,
    ) -> None:
        self._commit = commit
        self._cache = cache
        self._pending: list[tuple[list[Event], asyncio.Future[None]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def append(self, events: list[Event]) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((events, done))
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                outcomes = await self._commit([events for events, _ in batch])
            except BaseException as exc:
                for events, done in batch:  # the outcome may be unknown: read them again
                    self._forget(events)
                    if done.done():
                        continue
                    if isinstance(exc, asyncio.CancelledError):
                        done.cancel()
                    else:
                        done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (events, done), outcome in zip(batch, outcomes, strict=True):
                if outcome is None:
                    self._cache.follow(events)
                    if not done.done():
                        done.set_result(None)
                else:
                    self._forget(events)
                    if not done.done():
                        done.set_exception(outcome)

    def _forget(self, events: list[Event]) -> None:
        for event in events:
            self._cache.forget((event.user_id, event.session_id))


class EventStore(ABC):
    """A log of events plus the read model folded from it.

    ``append`` folds each event and applies the result in the same transaction as the
    write; re-appending an event already stored at its seq (same event id) is a no-op,
    so a writer may retry an append whose outcome it did not see.
    """

    @abstractmethod
    async def append(self, events: Sequence[Event]) -> None:
        """Append events atomically; raise InvalidEventError subclasses on refusal."""

    async def send(self, events: Sequence[Event]) -> None:
        """Append events without waiting for them to be durable, where the store can.

        For input that the caller still holds (a prompt): the next ``append`` or
        ``confirm`` of the same session waits for them too, and raises their failure.
        The embedded stores append at once.
        """
        await self.append(events)

    @abstractmethod
    async def session(self, scope: Scope) -> SessionRow | None:
        """The session's row, or None when it has no events."""

    @abstractmethod
    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        """The named checkpoint (the newest when id is None), or None."""

    @abstractmethod
    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        """Up to ``limit`` checkpoints, newest first."""

    @abstractmethod
    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        """The transcript as of ``upto_seq``, folded from its base at ``base_seq``.

        ``message_count`` is how many messages the read model recorded at ``upto_seq``;
        a store may use it to serve a prefix of a longer transcript it already holds.
        """

    @abstractmethod
    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        """The latest journal entry recorded under ``step_key``, or None."""

    @abstractmethod
    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        """The session's events after ``after_seq``, in order."""

    @abstractmethod
    async def prune(
        self,
        *,
        before: datetime | None = None,
        session_id: str | None = None,
        user_id: Any = ANY_USER,
    ) -> PruneResult:
        """Delete journal entries and checkpoints matching every given filter.

        Sessions whose last event is older than ``before`` (or all matching sessions when
        ``before`` is None) are deleted whole; in the others, checkpoints and journal
        steps recorded before ``before`` are. At least one filter is required.
        """

    async def erase(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Erase a session everywhere, leaving a tombstone; False if it did not exist."""
        scope = Scope.of(session_id, user_id)
        payload = SessionErasedPayload(reason="erase requested")
        return await self._append_admin(scope, SessionErased, payload)

    async def _append_admin(self, scope: Scope, cls: type[Event], payload: Any) -> bool:
        """Append one event outside any run, at the session's current epoch (so it fences
        nobody); False when the session does not exist or was erased."""
        for _ in range(8):
            row = await self.session(scope)
            if row is None or row.status == "erased":
                return False
            event = cls(
                user_id=scope.user_id,
                session_id=scope.session_id,
                run_id=new_id("run"),
                seq=row.last_seq + 1,
                epoch=row.epoch,
                payload=payload,
            )
            try:
                await self.append([event])
                await self.confirm(scope)
            except SequenceConflictError:
                continue  # a writer appended meanwhile: go again after it
            return True
        raise SequenceConflictError(f"{scope.describe()} keeps changing; try again")

    async def confirm(self, scope: Scope) -> None:  # noqa: B027 - most stores need no wait
        """Return once the read model holds every event this store appended to ``scope``.

        Raise the typed refusal (an InvalidEventError subclass) of any of them. The
        embedded stores fold each append in its own transaction, so they have applied
        (or refused) an append when it returns; a log-first store (Kafka) waits here for
        its projector.
        """

    async def open(self) -> None:  # noqa: B027 - stores without resources open on creation
        """Connect (and create or migrate what the store needs) now instead of on first use."""

    async def close(self) -> None:  # noqa: B027 - stores without resources need not close
        """Release connections and threads."""

    async def __aenter__(self) -> Self:
        try:
            await self.open()
        except BaseException:
            await self.close()  # a failed open leaves nothing behind
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _check_prune_filters(before: datetime | None, session_id: str | None, user_id: Any) -> None:
    if before is None and session_id is None and user_id is ANY_USER:
        raise ValueError(
            "prune() needs at least one filter (before=, session_id= or user_id=); "
            "refusing to delete the whole store"
        )
    if before is not None and before.tzinfo is None:
        raise ValueError("prune(before=...) needs an aware datetime, e.g. datetime.now(UTC)")
    if session_id is not None:
        validate_id(session_id, "session_id")
    if user_id is not ANY_USER and user_id is not None:
        validate_id(user_id, "user_id")


class Runtime:
    """Durable execution for an Agent: events to a store, restore, checkpoints, journal."""

    supports_checkpoints = True

    def __init__(
        self,
        store: EventStore,
        *,
        max_checkpoints_per_session: int = 20,
        serializer: Serializer = "json",
    ) -> None:
        if serializer not in ("json", "pickle"):
            raise ValueError(f"serializer must be 'json' or 'pickle', not {serializer!r}")
        if not isinstance(max_checkpoints_per_session, int):
            raise TypeError("max_checkpoints_per_session must be an int (< 1 keeps all)")
        self._store = store
        self.max_checkpoints_per_session = max_checkpoints_per_session
        self.serializer: Serializer = serializer

    @property
    def store(self) -> EventStore:
        return self._store

    async def open(self) -> None:
        """Connect now (creating or migrating what the store needs) instead of on first use."""
        await self._store.open()

    async def close(self) -> None:
        """Release the store's connections and threads; the runtime cannot be used after."""
        await self._store.close()

    async def __aenter__(self) -> Self:
        """Open the runtime; ``async with`` closes it again, whatever happened."""
        try:
            await self.open()
        except BaseException:
            await self.close()  # a failed open leaves nothing behind
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open_session(
        self,
        scope: Scope,
        *,
        run_id: str,
        mode: Literal["run", "resume", "fork"] = "run",
        from_checkpoint: str | None = None,
        metadata: dict[str, Any] | None = None,
        fork: SessionForkedPayload | None = None,
    ) -> SessionWriter:
        """Claim the session for one writer (a new epoch) and record that a run started."""
        started = RunStartedPayload(
            mode=mode, from_checkpoint=from_checkpoint, metadata=metadata or {}
        )
        for _ in range(8):
            row = await self._store.session(scope)
            if fork is not None and row is not None:
                raise InvalidIdError(f"fork target {scope.describe()} already exists")
            writer = SessionWriter(
                self,
                scope,
                run_id=run_id,
                epoch=(row.epoch if row else 0) + 1,
                next_seq=(row.last_seq if row else 0) + 1,
            )
            events: list[Event] = []
            if fork is not None:
                events.append(writer.make(SessionForked, fork))
            events.append(writer.make(RunStarted, started, offset=len(events)))
            try:
                await self._store.append(events)
                # the one synchronous point of a run: the claim is applied before it goes on
                await self._store.confirm(scope)
            except SequenceConflictError:
                continue  # another writer opened the session between our read and write
            writer.next_seq += len(events)
            return writer
        raise SequenceConflictError(
            f"could not claim {scope.describe()}: other writers keep appending to it"
        )

    async def restore(self, scope: Scope, checkpoint_id: str | None = None) -> RestoredState | None:
        """Rebuild the session at its last event, or at a checkpoint; None if unknown."""
        row = await self._store.session(scope)
        if row is None or row.status == "erased":
            return None
        if checkpoint_id is None:
            return RestoredState(
                messages=await self._transcript(
                    scope, row.base_seq, row.last_seq, row.message_count
                ),
                turns=row.turns,
                usage=row.usage,
                seq=row.last_seq,
                checkpoint_id=None,
                session=row,
            )
        ckpt = await self._store.checkpoint(scope, checkpoint_id)
        if ckpt is None:
            return None
        return RestoredState(
            messages=await self._transcript(scope, ckpt.base_seq, ckpt.seq, ckpt.message_count),
            turns=ckpt.turn,
            usage=ckpt.cumulative_usage,
            seq=ckpt.seq,
            checkpoint_id=ckpt.checkpoint_id,
            session=row,
        )

    async def get_checkpoint(
        self, scope: Scope, checkpoint_id: str | None = None
    ) -> Checkpoint | None:
        """The full checkpoint (messages materialised), newest when id is None."""
        ckpt = await self._store.checkpoint(scope, checkpoint_id)
        if ckpt is None:
            return None
        return Checkpoint(
            session_id=scope.session_id,
            checkpoint_id=ckpt.checkpoint_id,
            turn=ckpt.turn,
            messages=await self._transcript(scope, ckpt.base_seq, ckpt.seq, ckpt.message_count),
            cumulative_usage=ckpt.cumulative_usage,
            cursor=ckpt.cursor,
            created_at=ckpt.created_at,
        )

    async def _transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, expected: int
    ) -> list[Message]:
        messages = await self._store.transcript(scope, base_seq, upto_seq, expected)
        if len(messages) != expected:
            raise CorruptRecordError(
                f"transcript of {scope.describe()} up to seq {upto_seq} has {len(messages)} "
                f"messages where {expected} were recorded: the store lost or gained rows"
            )
        return messages

    async def list_checkpoints(self, scope: Scope, limit: int = 50) -> list[CheckpointMeta]:
        """Checkpoint metadata, newest first; never loads messages."""
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, not {limit!r}")
        rows = await self._store.list_checkpoints(scope, limit)
        return [
            CheckpointMeta(
                session_id=scope.session_id,
                checkpoint_id=r.checkpoint_id,
                turn=r.turn,
                created_at=r.created_at,
            )
            for r in rows
        ]


class SessionWriter:
    """The single writer of one session for one run: assigns seq and stamps its epoch.

    ``stage`` holds an event (a checkpoint) to go out with the next ``emit``: events made
    together cost one write, not one each. The loop stages only where no model or tool
    call runs before that next emit.

    An append that fails with anything but a refusal may still have landed (a timeout
    after the write reached the log, a connection lost before the commit's reply). Its
    events are then in doubt: before the next append the writer reads the session once
    to learn how many landed, and goes on after them, giving back the seqs of those that
    did not. So an unknown outcome never turns into a taken seq or a gap.
    """

    def __init__(
        self, runtime: Runtime, scope: Scope, *, run_id: str, epoch: int, next_seq: int
    ) -> None:
        self.runtime = runtime
        self.scope = scope
        self.run_id = run_id
        self.epoch = epoch
        self.next_seq = next_seq
        self._staged: list[Event] = []
        self._in_doubt: list[Event] = []
        #: events sent without waiting for durability: the next append waits for them
        self._unacked: list[Event] = []

    def make(self, cls: type[E], payload: Any, *, offset: int = 0) -> E:
        """Build the event that the next append (plus ``offset``) will write."""
        return cls(
            user_id=self.scope.user_id,
            session_id=self.scope.session_id,
            run_id=self.run_id,
            seq=self.next_seq + offset,
            epoch=self.epoch,
            payload=payload,
        )

    def stage(self, cls: type[E], payload: Any) -> E:
        """Build an event that the next ``emit`` appends in front of its own."""
        event = self.make(cls, payload)
        self._staged.append(cast(Event, event))
        self.next_seq += 1
        return event

    async def emit(self, cls: type[E], payload: Any) -> E:
        """Append one event, after any staged ones, and return once it is durable.

        Raise what the store raised. Staged events are optional (checkpoints): when a
        write that carries them fails for another reason than a refusal, the writer
        warns, learns what landed, and writes this event alone.
        """
        return await self._write(cls, payload, durable=True)

    async def send(self, cls: type[E], payload: Any) -> E:
        """``emit`` for input the caller still holds (the prompt of a pass): on Kafka it
        returns before the broker's acknowledgement, which the next ``emit`` (the model's
        answer) waits for, so the acknowledgement overlaps the model call."""
        return await self._write(cls, payload, durable=False)

    async def _write(self, cls: type[E], payload: Any, *, durable: bool) -> E:
        if self._in_doubt:
            await self._resolve_doubt()
        staged, self._staged = self._staged, []
        event = self.make(cls, payload)
        try:
            await self._append([*staged, cast(Event, event)], durable=durable)
        except InvalidEventError:
            raise
        except Exception as exc:
            if not staged:
                raise
            logger.warning(
                "writing %s of %s failed (%s: %s); the run goes on without it",
                " and ".join(e.type for e in staged),
                self.scope.describe(),
                type(exc).__name__,
                exc,
            )
            await self._resolve_doubt()
            if self.next_seq > event.seq:
                return event  # it landed after all
            event = self.make(cls, payload)
            await self._append([cast(Event, event)], durable=durable)
        return event

    async def _append(self, batch: list[Event], *, durable: bool = True) -> None:
        self.next_seq = batch[-1].seq + 1
        store = self.runtime.store
        try:
            await (store.append(batch) if durable else store.send(batch))
        except InvalidEventError:
            self.next_seq = (self._unacked or batch)[0].seq  # refused: none of it counts
            self._unacked = []
            raise
        except BaseException:
            self._in_doubt = [*self._unacked, *batch]
            self._unacked = []
            raise
        self._unacked = [] if durable else [*self._unacked, *batch]

    async def _resolve_doubt(self) -> None:
        batch = self._in_doubt
        row = await self.runtime.store.session(self.scope)  # raises while the store is away
        landed = row.last_seq if row is not None else 0
        # a batch lands as a prefix (a transaction, or records of one partition in order)
        self.next_seq = max(batch[0].seq, min(landed, batch[-1].seq) + 1)
        if self.next_seq <= batch[-1].seq:
            logger.info(
                "%s: %d event(s) from seq %d did not land; their seqs are reused",
                self.scope.describe(),
                batch[-1].seq + 1 - self.next_seq,
                self.next_seq,
            )
        self._in_doubt = []

    async def confirm(self) -> None:
        """Wait until the read model holds this run's events; raise any refusal of them."""
        if self._staged:
            staged, self._staged = self._staged, []
            await self._append(staged)
        try:
            await self.runtime.store.confirm(self.scope)
        except InvalidEventError:
            raise
        except BaseException:
            self._in_doubt, self._unacked = [*self._unacked], []
            raise
        self._unacked = []


_current_journal: contextvars.ContextVar[Journal | None] = contextvars.ContextVar(
    "loomflow_journal", default=None
)


def current_journal() -> Journal | None:
    """The journal of the tool call running now, or None outside an agent run."""
    return _current_journal.get()


class Journal:
    """Journaled steps: same key and same inputs return the recorded result.

    A step whose key was recorded with different inputs runs again and its new result
    is recorded. A step that ran but whose record was not written before a crash runs
    again on resume: delivery is at least once, so steps should be idempotent.
    """

    def __init__(self, writer: SessionWriter, prefix: str = "") -> None:
        self._writer = writer
        self._prefix = prefix

    def scoped(self, prefix: str) -> Journal:
        return Journal(self._writer, self._prefix + prefix)

    # Two overloads, because ``Callable[..., T | Awaitable[T]]`` cannot be solved for a
    # coroutine function: mypy refused ``await journal.step("k", async_fn, x)``. The async
    # one comes first so that a coroutine function's T is its awaited result.
    @overload
    async def step(
        self, key: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    @overload
    async def step(
        self, key: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    async def step(
        self, key: str, fn: Callable[P, T | Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once per (key, inputs); replay its recorded value.

        ``fn`` may be a plain or a coroutine function; the step returns its (awaited) result.
        """
        if not isinstance(key, str) or not key:
            raise ValueError("a step key must be a non-empty string")
        runtime = self._writer.runtime
        full_key = self._prefix + key
        digest = input_hash([list(args), kwargs])
        recorded = await runtime.store.step(self._writer.scope, full_key)
        if recorded is not None and recorded.input_hash == digest:
            return cast(T, decode_value(recorded.value, runtime.serializer))
        outcome = fn(*args, **kwargs)
        value = cast(T, await outcome) if inspect.isawaitable(outcome) else outcome
        stored = encode_value(value, runtime.serializer)
        await self._writer.emit(
            StepRecorded,
            StepRecordedPayload(
                step_key=full_key, input_hash=digest, value=stored, serializer=runtime.serializer
            ),
        )
        return value

    def activate(self) -> contextvars.Token[Journal | None]:
        return _current_journal.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token[Journal | None]) -> None:
        _current_journal.reset(token)
