"""The console's ASGI application: FastAPI with Jinja2 pages, a JSON API under ``/api/``
(its OpenAPI description at ``/api/openapi.json``) and server-sent events for what is
live, over one :class:`~loomflow.ui.backend.Backend`.

Every page and every API answer is scoped as the console is (``ConsoleConfig.user``);
what it does not show answers 404 alike. A store that is down answers 503 with a page
that says so and tries again; it never takes the console down.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from loomflow.control.refused import Missing, Refused
from loomflow.errors import LoomflowError
from loomflow.ui.backend import Backend, ConsoleConfig, StoreDown
from loomflow.ui.guard import Guard, is_loopback

__all__ = ["create_app", "templates"]

_HERE = Path(__file__).parent

templates = Jinja2Templates(directory=_HERE / "templates")

#: C0 and C1 control characters but tab and newline, which a page shows as ``\xNN``
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    r"""Model and tool output as a page shows it: control characters (binary-looking
    text) as ``\xNN`` escapes; the template escapes the rest."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _json_text(value: Any) -> str:
    """A tool call's arguments as indented JSON text (escaped by the template)."""
    return _visible(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


templates.env.filters["visible"] = _visible
templates.env.filters["tojson_text"] = _json_text


def create_app(config: ConsoleConfig, guard: Guard | None = None) -> FastAPI:
    """The console over ``config``'s store; ``guard`` (default: of ``config.token``)
    checks tokens and CSRF."""
    from loomflow.ui import api, live, pages

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


def page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """The template ``name`` with what every page shows (the console's scope, whether it
    writes, its CSRF token)."""
    config: ConsoleConfig = request.app.state.config
    guard: Guard = request.app.state.guard
    from loomflow.runtime import ANY_USER

    shared = {
        "scope_user": None if config.user is ANY_USER else config.user,
        "scoped": config.user is not ANY_USER,
        "read_only": config.read_only,
        "can_retry": config.agent is not None and not config.read_only,
        "csrf": guard.csrf,
        "source": _source_name(config),
    }
    return templates.TemplateResponse(request, name, {**shared, **context}, status_code=status_code)


def _source_name(config: ConsoleConfig) -> str:
    source = config.source
    if source.db is not None:
        return f"SQLite {source.db}"
    assert source.settings is not None
    return f"PostgreSQL schema {source.settings.db_schema}"
