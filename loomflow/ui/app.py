"""The console's ASGI application: FastAPI with Jinja2 pages, a JSON API under ``/api/``
(its OpenAPI description at ``/api/openapi.json``) and server-sent events for what is
live, over one :class:`~loomflow.ui.backend.Backend`.

Every page and every API answer is scoped as the console is (``ConsoleConfig.user``);
what it does not show answers 404 alike. A store that is down answers 503 with a page
that says so and tries again; it never takes the console down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from loomflow.control.refused import Missing, Refused
from loomflow.errors import LoomflowError
from loomflow.ui import api, live, pages
from loomflow.ui.backend import Backend, ConsoleConfig, StoreDown
from loomflow.ui.guard import Guard, is_loopback
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
    app.state.guard = guard
    app.state.config = config
    app.middleware("http")(guard)
    app.mount("/static", StaticFiles(directory=_HERE / "static"), name="static")
    app.include_router(pages.router)
    app.include_router(api.router)
    app.include_router(live.router)

    @app.exception_handler(StoreDown)
    async def store_down(request: Request, exc: StoreDown) -> Response:
        await backend.forget()
        message = f"the store does not answer: {exc}"
        if _wants_json(request):
            return JSONResponse({"error": message, "retry": True}, 503)
        return page(request, "down.html", {"message": message}, 503)

    @app.exception_handler(LoomflowError)
    async def declined(request: Request, exc: LoomflowError) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": str(exc)}, 409)
        return page(request, "refused.html", {"message": str(exc), "code": 409}, 409)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        code = 404 if isinstance(exc, Missing) else 400 if exc.code == 2 else 409
        if _wants_json(request):
            return JSONResponse({"error": str(exc)}, code)
        return page(request, "refused.html", {"message": str(exc), "code": code}, code)

    return app


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")
