"""The console's pages and the actions their forms post.

Each action goes through the verb the command line's uses (``loomflow.control.verbs``),
so it is recorded in the log as the API records it, and answers with the page it came
from: after a success a redirect (a reload does not do it again), after a refusal the
same page with what went wrong and what was typed (nothing lost, nothing done).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from loomflow.control import verbs
from loomflow.control.refused import Missing, Refused
from loomflow.control.status import STATUSES
from loomflow.ui import views
from loomflow.ui.backend import ConsoleConfig
from loomflow.ui.guard import Forbidden
from loomflow.ui.params import ListFilters, backend_of
from loomflow.ui.render import page

__all__ = ["router", "scope_of"]

router = APIRouter(include_in_schema=False)


def scope_of(request: Request, session_id: str, user: str | None) -> Any:
    """The scope a request names: the session of ``user`` ('' or None: of no user) in a
    console of every user; in a user-scoped console, of its user only (another user
    named reads as a session that is not there)."""
    from loomflow.errors import InvalidIdError
    from loomflow.runtime import ANY_USER, Scope
    from loomflow.schemas import validate_id

    config: ConsoleConfig = request.app.state.config
    try:
        validate_id(session_id, "session id")
        if user:
            validate_id(user, "user id")
    except InvalidIdError as exc:
        raise Missing(str(exc)) from None
    if config.user is ANY_USER:
        return Scope(session_id, user or None)
    if user and user != config.user:
        raise Missing(f"no session {session_id}; the sessions this console shows are listed at /")
    return Scope(session_id, config.user)


def session_url(session_id: str, user_id: str | None, **query: Any) -> str:
    from urllib.parse import quote, urlencode

    values = {"user": user_id} if user_id else {}
    values.update({k: v for k, v in query.items() if v is not None})
    tail = f"?{urlencode(values)}" if values else ""
    return f"/sessions/{quote(session_id)}{tail}"


# -- the session list ------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def sessions(
    request: Request,
    filters: ListFilters,
    cursor: str | None = None,
    limit: int = views.PAGE,
) -> Response:
    backend = backend_of(request)
    # before the rows are read: the live stream sends each row that changed since
    shown = datetime.now(UTC)
    listing = await views.sessions_page(
        await backend.store(),
        filters,
        scope_user=backend.config.user,
        cursor=cursor,
        limit=limit,
    )
    return page(
        request,
        "sessions.html",
        {
            "page": listing,
            "filters": filters,
            # what was typed, shown again in the form (``since`` as written: 30m)
            "raw": {k: request.query_params.get(k, "") for k in ("user", "since", "agent")},
            "statuses": STATUSES,
            # new and changed rows come live to the first page only (a later one is a
            # page of older sessions, after its cursor)
            "first_page": not cursor,
            "live_query": {**filters.query(), "shown": shown.isoformat()},
            "erased": request.query_params.get("erased") == "1",
            "next_query": {**filters.query(), "cursor": listing.next_cursor, "limit": limit}
            if listing.next_cursor
            else None,
            "session_url": session_url,
        },
    )


# -- a session -------------------------------------------------------------------------


async def _session_page(
    request: Request,
    session_id: str,
    user: str | None,
    *,
    error: str | None = None,
    typed: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    scope = scope_of(request, session_id, user)
    backend = backend_of(request)
    runtime = await backend.runtime()
    detail = await views.session_detail(
        runtime, scope, await backend.store(), await backend.trail()
    )
    done = request.query_params.get("done")
    retries: dict[str, str] = request.app.state.retries
    return page(
        request,
        "session.html",
        {
            "d": detail,
            "s": detail.session,
            "error": error,
            "typed": typed or {},
            "done": _DONE.get(done or ""),
            "retry_said": retries.get(f"{scope.user_id}/{scope.session_id}"),
            "session_url": session_url,
            "user_q": scope.user_id or "",
        },
        status_code,
    )


_DONE = {
    "signal": "the signal was sent",
    "cancel": "the run was cancelled; no worker resumes it",
    "retry": "the retry started in the console; its events appear below",
    "forked": "this session was forked from the checkpoint",
}


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
async def session(request: Request, session_id: str, user: str | None = None) -> Response:
    return await _session_page(request, session_id, user)


def _writes(request: Request, csrf: str | None) -> None:
    """Refuse an action of a read-only console, or without the CSRF token."""
    config: ConsoleConfig = request.app.state.config
    if config.read_only:
        raise Forbidden("this console is read-only (loomflow ui --read-only)")
    if not request.app.state.guard.csrf_ok(csrf):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page")


async def _action(
    request: Request,
    session_id: str,
    user: str | None,
    csrf: str | None,
    typed: dict[str, str],
    act: Any,
) -> Response:
    """Run ``act(scope)``; its redirect, or the session page with the refusal."""
    from loomflow.errors import LoomflowError

    try:
        _writes(request, csrf)
        scope = scope_of(request, session_id, user)
        runtime = await backend_of(request).writer()
        return await act(runtime, scope)  # type: ignore[no-any-return]
    except Forbidden as exc:
        return await _session_page(
            request, session_id, user, error=str(exc), typed=typed, status_code=403
        )
    except Missing:
        raise
    except (Refused, LoomflowError) as exc:
        code = 400 if isinstance(exc, Refused) and exc.code == 2 else 409
        return await _session_page(
            request, session_id, user, error=str(exc), typed=typed, status_code=code
        )


@router.post("/sessions/{session_id}/fork")
async def fork(
    request: Request,
    session_id: str,
    checkpoint: Annotated[str, Form()],
    user: Annotated[str | None, Form()] = None,
    new_id: Annotated[str | None, Form()] = None,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    async def act(runtime: Any, scope: Any) -> Response:
        child = await verbs.fork(runtime, scope, checkpoint, new_id=new_id or None)
        return RedirectResponse(session_url(child, scope.user_id, done="forked"), 303)

    return await _action(request, session_id, user, csrf, {"new_id": new_id or ""}, act)


@router.post("/sessions/{session_id}/signal")
async def signal(
    request: Request,
    session_id: str,
    name: Annotated[str, Form()],
    payload: Annotated[str, Form()] = "",
    user: Annotated[str | None, Form()] = None,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    async def act(runtime: Any, scope: Any) -> Response:
        if not payload.strip():  # a placeholder read as a default would send null
            raise Refused("the payload is empty: type null to send none; nothing was sent", 2)
        data = verbs.parse_payload(payload)
        await verbs.session(runtime, scope)
        await verbs.signal(runtime, scope, name, data)
        return RedirectResponse(session_url(scope.session_id, scope.user_id, done="signal"), 303)

    typed = {"signal_name": name, "signal_payload": payload}
    return await _action(request, session_id, user, csrf, typed, act)


@router.post("/sessions/{session_id}/cancel")
async def cancel(
    request: Request,
    session_id: str,
    reason: Annotated[str, Form()] = "",
    user: Annotated[str | None, Form()] = None,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    async def act(runtime: Any, scope: Any) -> Response:
        await verbs.cancel(runtime, scope, reason or "cancelled in the console")
        return RedirectResponse(session_url(scope.session_id, scope.user_id, done="cancel"), 303)

    return await _action(request, session_id, user, csrf, {"reason": reason}, act)


@router.post("/sessions/{session_id}/retry")
async def retry(
    request: Request,
    session_id: str,
    user: Annotated[str | None, Form()] = None,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    config: ConsoleConfig = request.app.state.config
    retries: dict[str, str] = request.app.state.retries
    tasks: set[asyncio.Task[Any]] = request.app.state.tasks

    async def act(runtime: Any, scope: Any) -> Response:
        if config.agent is None:
            raise Refused(
                "this console hosts no agents: start it with --agent module:factory to "
                f"retry here, or run `loomflow sessions retry {scope.session_id} --agent "
                "module:factory`",
                2,
            )
        row = await verbs.session(runtime, scope)
        if row.status != "stuck":
            raise Refused(f"{scope.describe()} is not stuck (it is {row.status})", 2)
        key = f"{scope.user_id}/{scope.session_id}"

        async def run() -> None:
            try:
                result = await verbs.retry(runtime, scope, config.agent or "", by="loomflow ui")
                retries[key] = f"the retry ended: {result.stop_reason}"
            except Refused as exc:
                retries[key] = f"the retry failed: {exc}"

        retries.pop(key, None)
        task = asyncio.create_task(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return RedirectResponse(session_url(scope.session_id, scope.user_id, done="retry"), 303)

    return await _action(request, session_id, user, csrf, {}, act)


@router.post("/sessions/{session_id}/erase")
async def erase(
    request: Request,
    session_id: str,
    confirm: Annotated[str, Form()] = "",
    user: Annotated[str | None, Form()] = None,
    csrf: Annotated[str | None, Form()] = None,
) -> Response:
    async def act(runtime: Any, scope: Any) -> Response:
        if confirm != scope.session_id:
            raise Refused(
                f"to erase, type the session's id ({scope.session_id}) in the box: "
                "erasing cannot be undone",
                2,
            )
        await verbs.session(runtime, scope)
        await verbs.erase(runtime, scope)
        return RedirectResponse("/?erased=1", 303)

    return await _action(request, session_id, user, csrf, {"confirm": confirm}, act)


# -- the tail --------------------------------------------------------------------------


@router.get("/tail", response_class=HTMLResponse)
async def tail(
    request: Request,
    type: Annotated[list[str] | None, Query()] = None,
    session: str = "",
) -> Response:
    types = ", ".join(views.tail_types(type or []))
    if session:
        scope_of(request, session, None)  # an id, or 404
    query = {k: v for k, v in (("type", types), ("session", session)) if v}
    return page(request, "tail.html", {"raw": {"type": types, "session": session}, "query": query})
