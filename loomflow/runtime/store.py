"""The event store: a log plus the read model folded from it, one interface for every backend."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from loomflow.errors import ProjectionTimeoutError, SequenceConflictError, SigningKeyError
from loomflow.lifecycle import Resource
from loomflow.runtime.cache import TranscriptCache
from loomflow.schemas.clock import utcnow
from loomflow.schemas.ids import new_id, validate_id
from loomflow.schemas.scope import ANY_USER, Scope

if TYPE_CHECKING:
    from loomflow.projections.fold import CheckpointRow, PruneFilter, StepRow
    from loomflow.schemas import Event, EventBase, Message
    from loomflow.schemas.sessions import SessionCursor, SessionRecord, SessionTotals
    from loomflow.schemas.signing import Signer

__all__ = ["DatabaseStore", "EventStore", "PruneResult", "prune_filter"]

E = TypeVar("E", bound="EventBase")


@dataclass(frozen=True)
class PruneResult:
    """What ``store.prune`` deleted."""

    sessions: int = 0
    checkpoints: int = 0
    steps: int = 0
    events: int = 0


#: the largest LIMIT both SQL dialects take (a 64-bit int); a larger one lists them all
_MAX_LIMIT = 2**63 - 1


class EventStore(Resource, ABC):
    """A log of events plus the read model folded from it.

    ``append`` folds each event and applies the result in the same transaction as the
    write; re-appending an event already stored at its seq (same event id) is a no-op,
    so a writer may retry an append whose outcome it did not see.

    With a ``signer``, every event appended without a signature is signed first (see
    ``sign``): ``append`` and ``send`` are the one way into every backend's log, so no
    writer (a run, a lifecycle verb, an erasure, Kafka's prune) can leave one unsigned.
    A backend implements ``_append`` (and ``_send``, where it can send ahead).
    """

    #: an append returns or raises by itself within a bounded time (no server to wait
    #: for), so a writer need not arm a timer around each one (see writer.py: _within)
    appends_bounded: ClassVar[bool] = False
    #: ``send`` returns before the log acknowledged the events (Kafka): the writer tells
    #: a run's observers of them only once a later append or confirm acknowledged them
    sends_ahead: ClassVar[bool] = False
    #: the key this store signs the events it appends with (None: it signs nothing);
    #: read once from the store's settings (``LOOMFLOW_SIGNING_KEY[_FILE]``)
    signer: Signer | None = None
    #: why the keyring (``LOOMFLOW_KEYRING``) does not let ``signer`` sign events now (a
    #: retired key, one not in it, one of another role; no key where signatures are
    #: required): every signing raises it, before anything is written, as every reader
    #: of the log would refuse what it appended
    signing_refused: str | None = None

    def sign(self, event: E) -> E:
        """The event as this store appends it: signed with its key, unless it carries a
        signature already (an event re-appended as it was: a rebuild, a copy from
        another log), or the store has no key. Ed25519 is deterministic, so an event
        signed again is the same bytes. SigningKeyError when the key may not sign
        (``signing_refused``)."""
        if event.sig is not None:
            return event
        if self.signing_refused is not None:
            raise SigningKeyError(self.signing_refused)
        return event if self.signer is None else self.signer.sign_event(event)

    async def append(self, events: Sequence[Event]) -> None:
        """Append events atomically, each signed (``sign``); raise InvalidEventError
        subclasses on refusal."""
        await self._append(self._signed(events))

    async def send(self, events: Sequence[Event]) -> None:
        """Append events without waiting for them to be durable, where the store can.

        For input that the caller still holds (a prompt): the next ``append`` or
        ``confirm`` of the same session waits for them too, and raises their failure.
        The embedded stores append at once.
        """
        await self._send(self._signed(events))

    def _signed(self, events: Sequence[Event]) -> Sequence[Event]:
        if self.signer is None and self.signing_refused is None:
            return events
        return [self.sign(event) for event in events]

    @abstractmethod
    async def _append(self, events: Sequence[Event]) -> None:
        """The backend's append of events that ``append`` signed (see ``append``)."""

    async def _send(self, events: Sequence[Event]) -> None:
        """The backend's ``send`` of signed events; by default an ``append``."""
        await self.append(events)

    @abstractmethod
    async def session(self, scope: Scope) -> SessionRecord | None:
        """The session's row, or None when it has no events."""

    async def head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None]:
        """The session as ``session`` has it and, when ``checkpoint``, the id of its
        newest checkpoint (None: it has none): what a run that claims the session reads
        of it, once."""
        row = await self.session(scope)
        latest = await self.checkpoint(scope, None) if checkpoint and row is not None else None
        return row, None if latest is None else latest.checkpoint_id

    async def claim_head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None]:
        """``head`` as a claim reads it: a store may answer from what it knows of the
        session instead of reading it, when a claim made of a stale answer is refused
        (it then reads the session and claims again)."""
        return await self.head(scope, checkpoint=checkpoint)

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

    async def sessions_in_flight(self, limit: int = 500) -> list[SessionRecord]:
        """Where a worker looks for runs to take over (of every user), up to ``limit`` of
        each kind: the running sessions, the longest silent first (their leases say which
        are abandoned); the signalled ones; the waiting ones whose wait timed out."""
        raise NotImplementedError(f"{type(self).__name__} cannot list the runs in flight")

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
        steps recorded before ``before`` are. An erased session keeps its tombstone, so a
        late or replayed event of it is still refused. At least one filter is required;
        ``user_id=None`` means the sessions run without a user, ``ANY_USER`` (the default)
        every user's.
        """
        return await self._prune(prune_filter(before, session_id, user_id))

    @abstractmethod
    async def _prune(self, match: PruneFilter) -> PruneResult:
        """Delete what the checked filter selects (see ``prune``)."""

    async def erase(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Erase a session everywhere, leaving a tombstone; False if it did not exist."""
        from loomflow.schemas.events import SessionErased, SessionErasedPayload

        scope = Scope.of(session_id, user_id)
        payload = SessionErasedPayload(reason="erase requested")
        return await self.append_admin(scope, SessionErased, payload) is not None

    async def append_admin(
        self,
        scope: Scope,
        cls: type[Event],
        payload: Any,
        *,
        claim: bool = False,
        check: Callable[[SessionRecord], None] | None = None,
        latest_run: bool = False,
    ) -> int | None:
        """Append one event outside any run, right after the session's last one; return
        its seq, or None when the session does not exist or was erased.

        It is written at the session's current epoch (it fences nobody), or with
        ``claim`` at the next one (a claiming event: a signal, a cancel). ``check`` sees
        the row first and raises to refuse; it sees it again each time a writer got in
        first. ``latest_run``: the event is one of the session's latest run (a cancel
        ends it), under that run's id; else under a new one.
        """
        for _ in range(8):
            row = await self.session(scope)
            if row is None or row.status == "erased":
                return None
            if check is not None:
                check(row)
            event = cls(
                user_id=scope.user_id,
                session_id=scope.session_id,
                run_id=row.last_run_id if latest_run and row.last_run_id else new_id("run"),
                seq=row.last_seq + 1,
                epoch=row.epoch + 1 if claim else row.epoch,
                payload=payload,
            )
            try:
                await self.append([event])
                await self.confirm(scope)
            except SequenceConflictError:
                continue  # a writer appended meanwhile: go again after it
            except ProjectionTimeoutError as exc:  # a log-first store: it is written
                raise ProjectionTimeoutError(
                    f"{exc} The {event.type} event (seq {event.seq} of {scope.describe()}) "
                    "is in the log: do not send it again"
                ) from exc
            return event.seq
        raise SequenceConflictError(f"{scope.describe()} keeps changing; try again")

    async def setup(self) -> None:
        """Create or migrate what the store needs (tables, topics) now.

        Stores do this on first use unless told not to (``LOOMFLOW_AUTO_MIGRATE=false``);
        a deploy that migrates ahead runs this (or ``loomflow setup``) once. The embedded
        stores always migrate their file when they open it.
        """
        await self.open()

    async def confirm(self, scope: Scope, *, visible: bool = True) -> None:
        """Return once the read model holds every event this store appended to ``scope``.

        Raise the typed refusal (an InvalidEventError subclass) of any of them. The
        embedded stores fold each append in its own transaction, so they have applied
        (or refused) an append when it returns; a log-first store (Kafka) waits here for
        its projector. ``visible=False`` asks for the verdict alone (a claim: whether the
        session is this writer's; a run's end: whether its events hold), which such a
        store may know without the projector.
        """


def prune_filter(before: datetime | None, session_id: str | None, user_id: Any) -> PruneFilter:
    """The filters of a ``prune`` call, checked: refuses a call that would match the whole
    store, a naive datetime and invalid ids."""
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
    from loomflow.projections.fold import PruneFilter

    return PruneFilter(
        before=before,
        session_id=session_id,
        user_id=None if user_id is ANY_USER else user_id,
        any_user=user_id is ANY_USER,
    )


def _selection(
    user_id: Any, status: str | Sequence[str] | None
) -> tuple[str | None, bool, tuple[str, ...] | None] | None:
    """The user and statuses of a listing's filters, checked, as the queries take them:
    (user id, every user's, statuses or None for all); None when no session can match
    (no status asked for)."""
    any_user = user_id is ANY_USER
    if not any_user and user_id is not None:
        validate_id(user_id, "user_id")
    statuses = None if status is None else (status,) if isinstance(status, str) else status
    if statuses is not None and not statuses:
        return None
    return None if any_user else user_id, any_user, None if statuses is None else tuple(statuses)


class DatabaseStore(EventStore):
    """The reads of a store whose read model is a database (SQLite, PostgreSQL).

    A backend names the module of its read queries (``queries``: functions taking the
    connection, then the user id and session id, then the read's own arguments; listing
    takes the user alone) and says how one runs (``_query``); the reads, and a transcript
    cache that follows this store's appends, are the same for all of them.
    """

    #: the backend's module of read queries (see the projections package)
    queries: ClassVar[Any]

    def __init__(self) -> None:
        self._cache = TranscriptCache()

    @abstractmethod
    async def _query(self, query: Callable[..., Any], *args: Any) -> Any:
        """Run ``query(connection, [schema,] *args)``."""

    async def _read(self, query: Callable[..., Any], scope: Scope, *args: Any) -> Any:
        """Run a query of one session: ``query(connection, [schema,] user_id, session_id,
        *args)``."""
        return await self._query(query, scope.user_id, scope.session_id, *args)

    def forget(self, scope: Scope | None = None) -> None:
        """Drop what the transcript cache holds of the session (of every session: None)."""
        self._cache.forget(scope)

    def follow(self, events: Sequence[Event]) -> None:
        """Keep the transcript cache in step with events the read model now holds that
        came another way than this store's appends (a projector applying a KafkaStore's
        appends); a gap from what the cache holds drops the session's entry."""
        self._cache.follow(events)

    async def session(self, scope: Scope) -> SessionRecord | None:
        row: SessionRecord | None = await self._read(self.queries.load_session, scope)
        return row

    async def list_sessions(
        self,
        *,
        user_id: Any,
        parent_session_id: str | None = None,
        limit: int = 100,
        status: str | Sequence[str] | None = None,
        since: datetime | None = None,
        agent: str | None = None,
        after: SessionCursor | None = None,
    ) -> list[SessionRecord]:
        """Up to ``limit`` sessions, the most recently active first; metadata only.

        ``user_id`` has no default: a user's id, None for the sessions run without a
        user, or ``ANY_USER`` for every user's. With ``parent_session_id``, only the
        sessions forked from that session; with ``status`` (running, waiting, signalled,
        finished, failed, stuck, cancelled, or several of them), only the sessions in it;
        with ``since``, only those last active at or after it; with ``agent``, only those
        whose latest run is of that agent. Erased sessions are not listed.

        The order is ``updated_at`` newest first, then user id, then session id (no user
        first). ``after`` pages on: only the sessions after that cursor in this order are
        listed, so ``after=SessionCursor.of(page[-1])`` gives the next page.
        """
        from loomflow.schemas.sessions import SessionCursor

        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, not {limit!r}")
        if after is not None and not isinstance(after, SessionCursor):
            raise TypeError(
                f"after must be a SessionCursor, not {type(after).__name__}: read a page's "
                "token with SessionCursor.decode(token)"
            )
        if parent_session_id is not None:
            validate_id(parent_session_id, "parent_session_id")
        selected = _selection(user_id, status)
        if selected is None:
            return []
        rows: list[SessionRecord] = await self._query(
            self.queries.list_sessions,
            *selected,
            parent_session_id,
            min(limit, _MAX_LIMIT),
            since,
            agent,
            after,
        )
        return rows

    async def session_totals(
        self,
        *,
        user_id: Any,
        status: str | Sequence[str] | None = None,
        since: datetime | None = None,
        agent: str | None = None,
    ) -> SessionTotals:
        """How many sessions ``list_sessions`` with these filters lists in all, and their
        usage summed (tokens and cost); the filters mean what they mean there, and
        erased sessions are not counted."""
        from loomflow.schemas.sessions import SessionTotals

        selected = _selection(user_id, status)
        if selected is None:
            return SessionTotals()
        totals: SessionTotals = await self._query(
            self.queries.session_totals, *selected, since, agent
        )
        return totals

    async def sessions_in_flight(self, limit: int = 500) -> list[SessionRecord]:
        rows: list[SessionRecord] = await self._query(
            self.queries.sessions_in_flight, utcnow(), limit
        )
        return rows

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        row: CheckpointRow | None = await self._read(
            self.queries.get_checkpoint, scope, checkpoint_id
        )
        return row

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        rows: list[CheckpointRow] = await self._read(
            self.queries.list_checkpoints, scope, min(limit, _MAX_LIMIT)
        )
        return rows

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        async def fetch(lo: int, hi: int) -> list[Message]:
            messages: list[Message] = await self._read(self.queries.read_transcript, scope, lo, hi)
            return messages

        return await self._cache.read(scope, base_seq, upto_seq, message_count, fetch)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        row: StepRow | None = await self._read(self.queries.get_step, scope, step_key)
        return row

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        events: list[Event] = await self._read(
            self.queries.read_events, scope, after_seq + 1, 2**62
        )
        return events
