"""The console's ASGI application: FastAPI with Jinja2 pages, a JSON API under ``/api/``
(its OpenAPI description at ``/api/openapi.json``) and server-sent events for what is
live, over one :class:`~loomflow.ui.backend.Backend`.

Every page and every API answer is scoped as the console is (``ConsoleConfig.user``);
what it does not show answers 404 alike. A store that is down answers 503 with a page
that says so and tries again; it never takes the console down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from loomflow.control.refused import Missing, Refused
from loomflow.errors import LoomflowError, StoreError
from loomflow.runtime import ANY_USER
from loomflow.ui import analytics, api, live, pages
from loomflow.ui.backend import Backend, ConsoleConfig, StoreDown
from loomflow.ui.guard import Forbidden, Guard, is_loopback
from loomflow.ui.render import page

__all__ = ["create_app"]

_HERE = Path(__file__).parent


def create_app(config: ConsoleConfig, guard: Guard | None = None) -> FastAPI:
    """The console over ``config``'s store; ``guard`` (default: of ``config.token``)
    checks tokens and CSRF."""
    backend = Backend(config)
    guard = guard or Guard(config.token, loopback=is_loopback(config.host))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # a retry still running stops here, as in any process that ends: its run is
            # left for a worker after its lease
            running = list(app.state.tasks)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await backend.close()

    app = FastAPI(
        title="loomflow console",
        description="The sessions, runs, checkpoints and forks of a loomflow log.",
        lifespan=lifespan,
        openapi_url="/api/openapi.json",
        # their pages load scripts from a CDN: the console makes no request elsewhere
        docs_url=None,
        redoc_url=None,
    )
    app.state.backend = backend
    #: the retries running in this process, and what became of each (by user/session)
    app.state.tasks = set()
    app.state.retries = {}
    app.state.guard = guard
    app.state.config = config
    app.middleware("http")(guard)
    app.mount("/static", StaticFiles(directory=_HERE / "static"), name="static")
    app.include_router(pages.router)
    app.include_router(api.router)
    app.include_router(live.router)
    app.include_router(analytics.router)

    async def store_down(request: Request, exc: Exception) -> Response:
        # whatever is open may be broken: the next request opens the store again
        await backend.forget()
        said = str(exc) if isinstance(exc, StoreDown) else f"{type(exc).__name__}: {exc}"
        message = f"the store does not answer: {said}"
        if _wants_json(request):
            return JSONResponse({"error": message, "retry": True}, 503)
        return page(request, "down.html", {"message": message}, 503)

    # the store may go down after it was opened, in the middle of any request
    for down in (StoreDown, StoreError, *backend.down):
        app.add_exception_handler(cast("type[Exception]", down), store_down)

    @app.exception_handler(LoomflowError)
    async def declined(request: Request, exc: LoomflowError) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": str(exc)}, 409)
        return page(request, "refused.html", {"message": str(exc), "code": 409}, 409)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        if isinstance(exc, Missing):
            code, message = 404, _in_console(str(exc), scoped=config.user is not ANY_USER)
        else:
            code, message = (
                (403 if isinstance(exc, Forbidden) else 400 if exc.code == 2 else 409),
                str(exc),
            )
        if _wants_json(request):
            return JSONResponse({"error": message}, code)
        return page(request, "refused.html", {"message": message, "code": code}, code)

    @app.exception_handler(StarletteHTTPException)
    async def no_route(request: Request, exc: StarletteHTTPException) -> Response:
        # a path or method the console has not: said as its other refusals are
        if exc.status_code == 404:
            message = f"no page at {request.url.path}; the console's pages are linked from /"
        else:
            message = str(exc.detail)
        if _wants_json(request):
            return JSONResponse({"error": message}, exc.status_code, headers=exc.headers)
        context = {"message": message, "code": exc.status_code}
        return page(request, "refused.html", context, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> Response:
        # a body that is not JSON, a missing field, a query value of the wrong type: 400
        # (FastAPI's 422) with what is wrong, before anything ran
        message = "; ".join(_problem(error) for error in exc.errors())
        if _wants_json(request):
            return JSONResponse({"error": message}, 400)
        return page(request, "refused.html", {"message": message, "code": 400}, 400)

    return app


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


#: the verbs' pointers for a person at the command line, and the console's for them
_POINTERS = (
    (
        " (a user's sessions need --user U)",
        " (a user's session is named with ?user=U)",
    ),
    (
        "list them with `loomflow sessions ls`",
        "the sessions this console shows are listed at / and at GET /api/sessions",
    ),
)


def _in_console(message: str, *, scoped: bool) -> str:
    """A verb's "not found" with the console's pointers to what exists."""
    for cli, console in _POINTERS:
        message = message.replace(cli, "" if scoped and "?user" in console else console)
    return message


def _problem(error: Any) -> str:
    """One problem of a request FastAPI did not validate, as a person reads it."""
    where = [str(part) for part in error.get("loc", ()) if not isinstance(part, int)]
    if error.get("type") == "json_invalid":
        reason = error.get("ctx", {}).get("error", "")
        return f"the body is not JSON: {reason}" if reason else "the body is not JSON"
    return f"{'.'.join(where) or 'the request'}: {error.get('msg', 'is not valid')}"
