"""What is live in the console, as server-sent events (sse-starlette): a session's new
events and status, the list's changed rows, and the log's new records (the tail page).

Each stream sends server-rendered fragments, escaped as every page is; the page's script
puts each where its ``data-live`` element says (appended, or replacing the element of the
same id). A session's stream and the list's look at the read model every
``poll_seconds``; the tail reads the log itself, from its end, as ``loomflow tail`` does.
A stream whose store goes down says so once and keeps trying.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from loomflow.control import verbs
from loomflow.control.status import status as status_of
from loomflow.errors import StoreError
from loomflow.ui import views
from loomflow.ui.backend import Backend, StoreDown
from loomflow.ui.pages import scope_of, session_url
from loomflow.ui.params import ListFilters, backend_of
from loomflow.ui.render import templates

__all__ = ["router"]

router = APIRouter(prefix="/live", include_in_schema=False)


def _fragment(name: str, **context: Any) -> str:
    return templates.get_template(name).render(session_url=session_url, **context)


def _sse(event: str, html: str) -> ServerSentEvent:
    return ServerSentEvent(data=orjson.dumps({"html": html}).decode(), event=event)


@router.get("/sessions/{session_id}")
async def session(
    request: Request,
    session_id: str,
    user: str | None = None,
    after: int = 0,
    drawn: str | None = None,
) -> EventSourceResponse:
    """The session's events after seq ``after``, and its status line when it changes
    (saying, once it is no longer the ``drawn`` one the page was drawn in, that the
    page's runs, fork tree and waits are as they were then)."""
    scope = scope_of(request, session_id, user)
    backend = backend_of(request)
    poll = backend.config.poll_seconds
    await verbs.session(await backend.runtime(), scope)  # not there (or another's): 404

    failing: tuple[type[BaseException], ...] = (StoreDown, *backend.down)

    async def stream() -> AsyncIterator[ServerSentEvent]:
        last = max(0, after)
        shown: tuple[Any, ...] | None = None
        names: dict[str, str] = {}
        said_down = False
        while not await request.is_disconnected():
            try:
                store = await backend.store()
                row = await store.session(scope)
                events = await store.read_events(scope, last) if row is not None else []
            except failing as exc:
                await backend.forget()
                if not said_down:
                    said_down = True
                    yield _sse("down", _fragment("_down.html", message=str(exc)))
                await asyncio.sleep(poll * 4)
                continue
            if said_down:
                said_down = False
                yield _sse("down", _fragment("_down.html", message=None))
            for event in events:
                last = max(last, event.seq)
                yield _sse("event", _fragment("_event_row.html", e=views.event_item(event)))
                for name, html in _transcript(event, names):
                    yield _sse(name, html)
            if row is not None:
                state = (status_of(row), row.last_seq, row.updated_at, row.usage)
                if state != shown:
                    shown = state
                    yield _sse(
                        "status",
                        _fragment("_session_status.html", s=views.session_item(row), drawn=drawn),
                    )
            await asyncio.sleep(poll)

    return EventSourceResponse(stream(), ping=15)


def _transcript(event: Any, names: dict[str, str]) -> list[tuple[str, str]]:
    """What ``event`` changes in the page's transcript: the messages a turn appended
    ("message", each a new item), or the whole transcript a compaction left
    ("transcript"); ``names`` learns the tool each call id names, for its result."""
    if event.type not in ("turn.appended", "transcript.compacted"):
        return []
    messages = event.payload.messages
    for message in messages:
        names.update({call.id: call.name for call in message.tool_calls})
    if event.type == "transcript.compacted":
        return [("transcript", _fragment("_transcript.html", messages=messages, names=names))]
    return [("message", _fragment("_message.html", m=m, names=names)) for m in messages]


@router.get("/sessions")
async def sessions(
    request: Request, filters: ListFilters, shown: datetime | None = None
) -> EventSourceResponse:
    """The rows of the list's sessions that changed since the page was drawn at
    ``shown`` (else since the stream began): their new status, turns and cost, new
    sessions first, under the list's filters."""
    backend = backend_of(request)
    poll = backend.config.poll_seconds

    failing: tuple[type[BaseException], ...] = (StoreDown, *backend.down)

    async def stream() -> AsyncIterator[ServerSentEvent]:
        # the newest last activity sent (or read at first); from the page's drawing on,
        # so that what changed before the stream began is sent too
        seen: datetime | None = shown
        sent: dict[tuple[str | None, str], datetime] = {}
        while not await request.is_disconnected():
            try:
                store = await backend.store()
                newest = views.Filters(
                    user=filters.user,
                    statuses=filters.statuses,
                    agent=filters.agent,
                    since=max(filter(None, (seen, filters.since)), default=None),
                )
                listing = await views.sessions_page(
                    store, newest, scope_user=backend.config.user, limit=100
                )
            except failing:
                await backend.forget()
                await asyncio.sleep(poll * 4)
                continue
            rows = listing.sessions
            for item in reversed(rows):
                key = (item.user_id, item.session_id)
                if seen is not None and sent.get(key) != item.updated_at:
                    yield _sse("row", _fragment("_session_row.html", s=item))
                sent[key] = item.updated_at
            if rows:
                seen = max(seen or rows[0].updated_at, rows[0].updated_at)
                # what is older than the newest sent is never read again
                sent = {k: at for k, at in sent.items() if at >= seen}
            elif seen is None:
                seen = datetime.now(UTC)
            await asyncio.sleep(poll)

    return EventSourceResponse(stream(), ping=15)


@router.get("/tail")
async def tail(
    request: Request,
    type: Annotated[list[str] | None, Query()] = None,
    session: str | None = None,
) -> EventSourceResponse:
    """The log's records from now on, of the given types (``run.*`` takes a family) and
    session, each as a row of the tail page."""
    backend = backend_of(request)
    types = views.tail_types(type or [])
    if session:
        scope_of(request, session, None)  # an id, or 404
    config = backend.config

    def keep(event: Any) -> bool:
        from loomflow.runtime import ANY_USER

        if config.user is not ANY_USER and event.user_id != config.user:
            return False
        if session and event.session_id != session:
            return False
        return not types or any(
            event.type == t or (t.endswith(".*") and event.type.startswith(t[:-1])) for t in types
        )

    async def stream() -> AsyncIterator[ServerSentEvent]:
        source = config.source
        if source.db is None and source.settings is not None and not await _kafka_fed(backend):
            yield _sse(
                "down",
                _fragment(
                    "_down.html",
                    message="the tail reads a SQLite log or a Kafka topic; this PostgreSQL "
                    "read model has no Kafka log feeding it",
                ),
            )
            return
        failing = _log_down(backend)
        said: str | None = None
        while not await request.is_disconnected():
            reader = source.reader(start="end")
            try:
                await reader.open()
                # from here on every record appended is shown: the page says it follows
                yield ServerSentEvent(data="{}", event="following")
                if said is not None:
                    said = None
                    yield _sse("down", _fragment("_down.html", message=None))
                while not await request.is_disconnected():
                    for record in await reader.read(wait=config.poll_seconds):
                        event = record.event
                        if event is None or not keep(event):
                            continue
                        yield _sse("record", _fragment("_tail_row.html", r=record, e=event))
            except failing as exc:  # the log is gone or does not answer: say so, once
                if said != str(exc):
                    said = str(exc)
                    yield _sse("down", _fragment("_down.html", message=said))
                await asyncio.sleep(config.poll_seconds * 4)
            finally:
                await reader.close()

    return EventSourceResponse(stream(), ping=15)


def _log_down(backend: Backend) -> tuple[type[BaseException], ...]:
    """What reading the log raises when it is gone or does not answer."""
    return (*backend.down, StoreError)


async def _kafka_fed(backend: Backend) -> bool:
    from loomflow.runtime import PostgresStore

    try:
        store = await backend.store()
    except StoreDown:
        return False
    return isinstance(store, PostgresStore) and bool(await store.consumed_topics())
