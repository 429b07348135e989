"""What the console's pages and its JSON API show, read from the store: the models both
are rendered from, so a page and ``/api/`` never disagree.

The session list is a page of :class:`SessionItem` after a cursor (the store's listing
order, most recently active first), with the filters of ``loomflow sessions ls``; a
session is its row, transcript, runs (folded from its events: who ran each, what ended
it, what a resume replayed instead of calling the model), checkpoints, fork tree, waits
and inbox. Every string in them is data: templates escape it, the API serialises it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from loomflow.control import verbs
from loomflow.control.refused import Refused
from loomflow.control.status import STATUSES, status
from loomflow.control.when import parse_when
from loomflow.log.describe import describe
from loomflow.schemas import Message, Usage

if TYPE_CHECKING:
    from loomflow.projections.audit import Trail
    from loomflow.projections.fold import CheckpointRow
    from loomflow.runtime import DatabaseStore, Runtime, Scope
    from loomflow.schemas.events import Event
    from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "NO_USER",
    "AuditView",
    "CheckpointItem",
    "EventItem",
    "Filters",
    "ForkNode",
    "RunItem",
    "SessionDetail",
    "SessionItem",
    "SessionsPage",
    "event_item",
    "session_detail",
    "session_item",
    "sessions_page",
    "tail_types",
]

#: the list's ``user`` filter for the sessions run without a user (no id starts with "-")
NO_USER = "-"
#: rows of a page of the session list, unless the request asks for another count
PAGE = 50
#: the most rows a page gives
MAX_PAGE = 500
#: the generations of a fork tree drawn above and below a session
TREE_DEPTH = 6
#: a session's events the page lists (the newest); the API pages through all of them
EVENTS_SHOWN = 500

_FROZEN = ConfigDict(frozen=True)


@dataclass(frozen=True)
class Filters:
    """The filters of the session list, as ``sessions ls`` takes them: ``user`` is a
    user's id, ``""`` for the sessions run without a user, None for every user's (the
    console's scope narrows it further). In a query string the sessions run without a
    user are ``user=-`` (NO_USER), and an empty ``user`` is every user's, as the list's
    form leaves it."""

    user: str | None = None
    statuses: tuple[str, ...] = ()
    since: datetime | None = None
    agent: str | None = None

    @classmethod
    def of(
        cls,
        *,
        user: str | None = None,
        status: Sequence[str] = (),
        since: str | None = None,
        agent: str | None = None,
    ) -> Filters:
        """From a query string's values; Refused (400) naming what is wrong."""
        from loomflow.errors import InvalidIdError
        from loomflow.schemas import validate_id

        statuses = tuple(
            sorted({name.strip() for value in status for name in value.split(",") if name.strip()})
        )
        user = "" if user == NO_USER else (user or None)
        unknown = [name for name in statuses if name not in STATUSES]
        if unknown:
            raise Refused(f"unknown status {', '.join(unknown)}: one of {', '.join(STATUSES)}", 2)
        try:
            if user:
                validate_id(user, "user id")
            if agent:
                validate_id(agent, "agent")
        except InvalidIdError as exc:
            raise Refused(str(exc), 2) from None
        moment = None
        if since and since.strip():
            try:
                moment = parse_when(since)
            except ValueError as exc:
                raise Refused(f"since: {exc}", 2) from None
        return cls(user=user, statuses=statuses, since=moment, agent=agent or None)

    def query(self) -> dict[str, str]:
        """These filters as a query string's values (the links of the next page)."""
        values: dict[str, str] = {}
        if self.user is not None:
            values["user"] = self.user or NO_USER
        if self.statuses:
            values["status"] = ",".join(self.statuses)
        if self.since is not None:
            values["since"] = self.since.isoformat()
        if self.agent:
            values["agent"] = self.agent
        return values


class SessionItem(BaseModel):
    """A row of the session list, as ``sessions ls --json`` gives it."""

    model_config = _FROZEN
    session_id: str
    user_id: str | None
    status: str
    agent: str | None
    turns: int
    messages: int
    usage: Usage
    created_at: datetime
    updated_at: datetime
    last_run_id: str | None
    parent_session_id: str | None
    parent_checkpoint_id: str | None
    waiting_for: str | None = None
    inbox: int = 0
    last_error: str | None = None


class SessionsPage(BaseModel):
    """A page of the session list: its rows, the cursor of the next page (None: the last
    page), and the totals of every session the filters keep."""

    model_config = _FROZEN
    sessions: list[SessionItem]
    next_cursor: str | None
    total_sessions: int
    total_usage: Usage


class CheckpointItem(BaseModel):
    model_config = _FROZEN
    checkpoint_id: str
    seq: int
    turn: int
    messages: int
    created_at: datetime
    usage: Usage


class EventItem(BaseModel):
    """An event of a session's history, with a line saying what it did."""

    model_config = _FROZEN
    seq: int
    type: str
    run_id: str | None
    at: datetime
    epoch: int
    summary: str


class RunItem(BaseModel):
    """A run of a session, folded from its events."""

    model_config = _FROZEN
    run_id: str
    mode: str
    agent: str | None
    model: str | None
    #: who ran it: the worker that took it over (None for a caller's run), and the
    #: process (host:pid) that claimed the session for it (None in older events)
    worker: str | None
    process: str | None = None
    started_at: datetime
    first_seq: int
    last_seq: int
    #: finished, failed, waiting, cancelled, interrupted (a later run took the session
    #: over), erased, or running
    ended: str
    #: the run that took the session over from this one, when it was interrupted
    interrupted_by: str | None = None
    #: the run this one took the session over from
    took_over: str | None = None
    from_checkpoint: str | None = None
    #: model calls restored from the log instead of being called and billed again
    replayed_turns: int = 0
    model_calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None


class ForkNode(BaseModel):
    """A session of a fork tree, with the sessions forked from it."""

    model_config = _FROZEN
    session_id: str
    status: str
    from_checkpoint: str | None
    updated_at: datetime
    children: list[ForkNode] = Field(default_factory=list)
    #: True for the session the page is about
    current: bool = False
    #: forks not drawn (deeper than the tree is drawn, or past the list's limit)
    more: int = 0


class AuditView(BaseModel):
    """The session against the audit trail (``loomflow.audit.status``): ``state`` is
    verified, pending, unaudited, mismatch, or none (the log has no trail yet)."""

    model_config = _FROZEN
    state: str
    entries: int = 0
    pending: int = 0
    problems: list[str] = Field(default_factory=list)


class SessionDetail(BaseModel):
    """Everything the session page shows."""

    model_config = _FROZEN
    session: SessionItem
    transcript: list[Message]
    runs: list[RunItem]
    events: list[EventItem]
    events_total: int
    checkpoints: list[CheckpointItem]
    tree: ForkNode
    waiting: dict[str, Any] | None
    inbox: list[dict[str, Any]]
    audit: AuditView


def session_item(row: SessionRecord) -> SessionItem:
    waits = row.status in ("waiting", "signalled") and row.waiting is not None
    return SessionItem(
        session_id=row.session_id,
        user_id=row.user_id,
        status=status(row),
        agent=row.agent,
        turns=row.turns,
        messages=row.message_count,
        usage=row.usage,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_run_id=row.last_run_id,
        parent_session_id=row.parent_session_id,
        parent_checkpoint_id=row.parent_checkpoint_id,
        waiting_for=row.waiting.signal if waits and row.waiting is not None else None,
        inbox=len(row.inbox),
        last_error=row.last_error,
    )


def _checkpoint_item(row: CheckpointRow) -> CheckpointItem:
    return CheckpointItem(
        checkpoint_id=row.checkpoint_id,
        seq=row.seq,
        turn=row.turn,
        messages=row.message_count,
        created_at=row.created_at,
        usage=row.cumulative_usage,
    )


def whose(scope_user: Any, filters: Filters) -> Any:
    """The ``user_id`` the store lists for: the console's own user when it is scoped to
    one (a filter naming another reads as that user's empty list), else the filter's."""
    from loomflow.runtime import ANY_USER

    wanted: Any = ANY_USER if filters.user is None else (filters.user or None)
    if scope_user is ANY_USER:
        return wanted
    if wanted is ANY_USER or wanted == scope_user:
        return scope_user
    return _NOBODY


#: the user of a list a user-scoped console refuses to show: nobody's sessions
_NOBODY = object()


async def sessions_page(
    store: DatabaseStore,
    filters: Filters,
    *,
    scope_user: Any,
    cursor: str | None = None,
    limit: int = PAGE,
) -> SessionsPage:
    """A page of the session list after ``cursor`` (an opaque token of the previous
    page); Refused (400) for a cursor that is not one."""
    from loomflow.schemas.sessions import SessionCursor

    user_id = whose(scope_user, filters)
    if user_id is _NOBODY:
        return SessionsPage(sessions=[], next_cursor=None, total_sessions=0, total_usage=Usage())
    after = None
    if cursor:
        try:
            after = SessionCursor.decode(cursor)
        except ValueError:
            raise Refused(
                "cursor: not the cursor of a page of this list; follow the list's next-page "
                "link (or next_cursor of /api/sessions) unchanged",
                2,
            ) from None
    if not 1 <= limit <= MAX_PAGE:
        raise Refused(f"limit: a whole number from 1 to {MAX_PAGE}, not {limit}", 2)
    rows = await verbs.matching(
        store,
        user_id=user_id,
        statuses=filters.statuses,
        since=filters.since,
        agent=filters.agent,
        limit=limit + 1,
        after=after,
    )
    shown = rows[:limit]
    more = SessionCursor.of(shown[-1]).encode() if len(rows) > limit else None
    totals = await store.session_totals(
        user_id=user_id,
        status=_stored(filters.statuses),
        since=filters.since,
        agent=filters.agent,
    )
    return SessionsPage(
        sessions=[session_item(row) for row in shown],
        next_cursor=more,
        total_sessions=totals.sessions,
        total_usage=totals.usage,
    )


def _stored(statuses: Sequence[str]) -> list[str] | None:
    """The stored statuses the totals count: those the log writes, each status a person
    reads mapped to the one it is read from (abandoned from running; forked: any)."""
    from loomflow.control.status import STORED

    if not statuses:
        return None
    stored = {STORED.get(name, name) for name in statuses}
    if None in stored:
        return None
    return sorted(s for s in stored if s is not None)


async def session_detail(
    runtime: Runtime, scope: Scope, store: DatabaseStore, trail: Trail | None = None
) -> SessionDetail:
    """The session page's data, with its audit state against ``trail`` (None: the log
    has none); Refused (404) for a session the console does not show."""
    from loomflow.audit.status import session_audit

    row = await verbs.session(runtime, scope)
    restored = await runtime.restore(scope)
    transcript = [] if restored is None else list(restored.messages)
    checkpoints = await store.list_checkpoints(scope, 1 << 30)
    events = await store.read_events(scope)
    tree = await fork_tree(store, row)
    waits = row.status in ("waiting", "signalled") and row.waiting is not None
    return SessionDetail(
        session=session_item(row),
        transcript=transcript,
        runs=runs_of(events),
        events=[event_item(event) for event in events[-EVENTS_SHOWN:]],
        events_total=len(events),
        checkpoints=[_checkpoint_item(c) for c in checkpoints],
        tree=tree,
        waiting=None
        if not waits or row.waiting is None
        else {
            "signal": row.waiting.signal,
            "until": row.waiting.until,
            "where": row.waiting.where,
        },
        inbox=[{"seq": s.seq, "name": s.name, "at": s.at} for s in row.inbox],
        audit=AuditView(state="none")
        if trail is None
        else AuditView(
            **asdict(session_audit(events, await trail.entries(scope.user_id, scope.session_id)))
        ),
    )


async def fork_tree(store: DatabaseStore, row: SessionRecord) -> ForkNode:
    """The fork tree around ``row``: up its parents to the root (at most TREE_DEPTH),
    and down every fork of each session drawn, TREE_DEPTH generations below ``row``."""
    from loomflow.runtime import Scope

    root = row
    for _ in range(TREE_DEPTH):
        if root.parent_session_id is None:
            break
        parent = await store.session(Scope(root.parent_session_id, root.user_id))
        if parent is None or parent.status == "erased":
            break
        root = parent

    async def node(at: SessionRecord, depth: int) -> ForkNode:
        children: list[ForkNode] = []
        more = 0
        if depth < 2 * TREE_DEPTH:
            forks = await store.list_sessions(
                user_id=at.user_id, parent_session_id=at.session_id, limit=101
            )
            for child in sorted(forks[:100], key=lambda r: r.created_at):
                children.append(await node(child, depth + 1))
            more = max(0, len(forks) - 100)
        return ForkNode(
            session_id=at.session_id,
            status=status(at),
            from_checkpoint=at.parent_checkpoint_id,
            updated_at=at.updated_at,
            children=children,
            current=at.session_id == row.session_id,
            more=more,
        )

    return await node(root, 0)


def runs_of(events: Sequence[Event]) -> list[RunItem]:
    """The runs of a session's events, oldest first: who ran each, what ended it, the
    model calls it made and what it cost, and the turns it replayed (model calls recorded
    after the session's latest checkpoint before it started, which a resume restores
    from the log instead of calling the model again)."""
    runs: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    since_checkpoint = 0
    current: dict[str, Any] | None = None
    for event in events:
        kind = event.type
        payload: Any = event.payload
        if kind == "run.started":
            if current is not None and current["ended"] == "running":
                current["ended"] = "interrupted"
                current["interrupted_by"] = event.run_id
            current = {
                "run_id": event.run_id or "",
                "mode": payload.mode,
                "agent": payload.agent,
                "model": payload.model,
                "worker": payload.worker,
                "process": payload.process,
                "started_at": event.at,
                "first_seq": event.seq,
                "last_seq": event.seq,
                "ended": "running",
                "took_over": payload.interrupted,
                "from_checkpoint": payload.from_checkpoint,
                "replayed_turns": since_checkpoint if payload.mode != "run" else 0,
                "model_calls": 0,
                "usage": Usage(),
                "error": None,
            }
            if payload.interrupted and payload.interrupted in by_id:
                taken = by_id[payload.interrupted]
                if taken["ended"] in ("running", "interrupted"):
                    taken["ended"] = "interrupted"
                    taken["interrupted_by"] = event.run_id
            runs.append(current)
            if event.run_id:
                by_id[event.run_id] = current
            continue
        run = by_id.get(event.run_id or "") if event.run_id else current
        if run is not None:
            run["last_seq"] = max(run["last_seq"], event.seq)
        if kind in ("turn.appended", "transcript.compacted"):
            if run is not None:
                run["usage"] = run["usage"] + payload.usage
            if kind == "turn.appended" and payload.model_call:
                since_checkpoint += 1
                if run is not None:
                    run["model_calls"] += 1
        elif kind in ("checkpoint.written", "session.forked"):
            since_checkpoint = 0
        elif run is None:
            continue
        elif kind == "run.finished":
            run["ended"] = "finished"
        elif kind == "run.failed":
            run["ended"] = "stuck" if payload.parked else "failed"
            run["error"] = f"{payload.error_type}: {payload.error}"
        elif kind == "run.waiting":
            run["ended"] = "waiting"
        elif kind == "run.cancelled":
            run["ended"] = "cancelled"
            run["error"] = payload.reason or None
        elif kind == "session.erased":
            run["ended"] = "erased"
    return [RunItem(**run) for run in runs]


def event_item(event: Event) -> EventItem:
    return EventItem(
        seq=event.seq,
        type=event.type,
        run_id=event.run_id,
        at=event.at,
        epoch=event.epoch,
        summary=describe(event),
    )


def tail_types(given: list[str]) -> list[str]:
    """The event types a tail keeps (``run.*`` a family), as ``loomflow tail --type``
    takes them, repeated or comma-separated; Refused (400) for one no event has."""
    from loomflow.log.describe import event_types

    known = event_types()
    types = [t.strip() for value in given for t in value.split(",") if t.strip()]
    for kind in types:
        family = kind.endswith(".*") and any(k.startswith(kind[:-1]) for k in known)
        if kind not in known and not family:
            raise Refused(f"type: no event is of type {kind!r}; they are {', '.join(known)}", 2)
    return types
