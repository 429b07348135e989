"""How the console draws a page: its Jinja2 templates, the filters that show model and
tool output as text, and what every page is given (the console's scope, whether it
writes, its CSRF token). Below the routes (``pages``, ``live``) and the application that
mounts them, so that none of them imports another in a circle."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from loomflow.ui.backend import ConsoleConfig
from loomflow.ui.guard import Guard

__all__ = ["page", "templates"]

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


def page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """The template ``name`` with what every page shows (the console's scope, whether it
    writes, its CSRF token)."""
    from loomflow.runtime import ANY_USER

    config: ConsoleConfig = request.app.state.config
    guard: Guard = request.app.state.guard
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
