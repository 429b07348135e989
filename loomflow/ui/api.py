"""The console's data as JSON under ``/api/``, described at ``/api/openapi.json``: the
same models the pages are drawn from, and the same actions, each through the verb the
command line uses. A POST carries the CSRF token of ``GET /api/csrf`` in
``X-CSRF-Token`` (and the console's token, when it has one, as a bearer token)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Request
from pydantic import BaseModel, ConfigDict, Field

from loomflow.control import verbs
from loomflow.control.refused import Missing
from loomflow.ui import views
from loomflow.ui.backend import ConsoleConfig
from loomflow.ui.guard import Forbidden
from loomflow.ui.pages import scope_of
from loomflow.ui.params import ListFilters, backend_of

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["api"])


class Csrf(BaseModel):
    csrf: str


class Forked(BaseModel):
    session_id: str


class Sent(BaseModel):
    seq: int


class SignalBody(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    #: any JSON value
    data: Any = None


class ForkBody(BaseModel):
    #: a key it does not know is refused, not ignored (a fork with ``"as"`` got an id
    #: of its own making)
    model_config = ConfigDict(extra="forbid")

    checkpoint_id: str
    new_id: str | None = None


class CancelBody(BaseModel):
    reason: str = ""


def _writes(request: Request, csrf: str | None) -> None:
    """Refuse (403) an action of a read-only console, or without the CSRF token."""
    config: ConsoleConfig = request.app.state.config
    if config.read_only:
        raise Forbidden("this console is read-only (loomflow ui --read-only): it takes no action")
    if not request.app.state.guard.csrf_ok(csrf):
        raise Forbidden("X-CSRF-Token is missing or wrong: GET /api/csrf gives it")


@router.get("/csrf")
async def csrf(request: Request) -> Csrf:
    """The token every POST of this console carries in ``X-CSRF-Token``."""
    return Csrf(csrf=request.app.state.guard.csrf)


@router.get("/sessions")
async def sessions(
    request: Request,
    filters: ListFilters,
    cursor: str | None = None,
    limit: int = views.PAGE,
) -> views.SessionsPage:
    """A page of sessions, the most recently active first; ``next_cursor`` gives the
    next. ``user``: a user's id, ``-`` for the sessions of no user, empty or absent for
    every user's; ``status``: the statuses of ``loomflow sessions ls --status``; ``since``: an
    ISO time or an age (``30m``)."""
    backend = backend_of(request)
    return await views.sessions_page(
        await backend.store(),
        filters,
        scope_user=backend.config.user,
        cursor=cursor,
        limit=limit,
    )


@router.get("/sessions/{session_id}")
async def session(
    request: Request, session_id: str, user: str | None = None
) -> views.SessionDetail:
    """A session: its row, transcript, runs, events (the newest), checkpoints, fork tree,
    wait and inbox."""
    scope = scope_of(request, session_id, user)
    backend = backend_of(request)
    return await views.session_detail(
        await backend.runtime(), scope, await backend.store(), await backend.trail()
    )


@router.get("/sessions/{session_id}/events")
async def events(
    request: Request, session_id: str, user: str | None = None, after: int = 0
) -> list[views.EventItem]:
    """The session's events after seq ``after``, oldest first."""
    scope = scope_of(request, session_id, user)
    backend = backend_of(request)
    runtime = await backend.runtime()
    await verbs.session(runtime, scope)
    store = await backend.store()
    return [views.event_item(e) for e in await store.read_events(scope, max(0, after))]


@router.post("/sessions/{session_id}/fork")
async def fork(
    request: Request,
    session_id: str,
    body: ForkBody,
    user: str | None = None,
    x_csrf_token: Annotated[str | None, Header()] = None,
) -> Forked:
    """Fork the session from a checkpoint (``session.forked``); the new session's id."""
    _writes(request, x_csrf_token)
    scope = scope_of(request, session_id, user)
    backend = backend_of(request)
    runtime = await backend.writer()
    try:
        child = await verbs.fork(runtime, scope, body.checkpoint_id, new_id=body.new_id)
    except Missing:
        await verbs.session(await backend.runtime(), scope)  # the session itself is missing
        store = await backend.store()
        known = [c.checkpoint_id for c in await store.list_checkpoints(scope, 20)]
        raise Missing(
            f"no checkpoint {body.checkpoint_id} of {scope.describe()}; "
            + (f"its checkpoints (newest first): {', '.join(known)}" if known else "it has none")
        ) from None
    return Forked(session_id=child)


@router.post("/sessions/{session_id}/signal")
async def signal(
    request: Request,
    session_id: str,
    body: Annotated[SignalBody, Body()],
    user: str | None = None,
    x_csrf_token: Annotated[str | None, Header()] = None,
) -> Sent:
    """Send a signal (``signal.sent``) with a JSON value; its seq."""
    _writes(request, x_csrf_token)
    scope = scope_of(request, session_id, user)
    runtime = await backend_of(request).writer()
    await verbs.session(runtime, scope)
    return Sent(seq=await verbs.signal(runtime, scope, body.name, body.data))


@router.post("/sessions/{session_id}/cancel")
async def cancel(
    request: Request,
    session_id: str,
    body: CancelBody,
    user: str | None = None,
    x_csrf_token: Annotated[str | None, Header()] = None,
) -> Sent:
    """Cancel the session's run (``run.cancelled``); the event's seq."""
    _writes(request, x_csrf_token)
    scope = scope_of(request, session_id, user)
    runtime = await backend_of(request).writer()
    _, seq = await verbs.cancel(runtime, scope, body.reason or "cancelled through the console")
    return Sent(seq=seq)
