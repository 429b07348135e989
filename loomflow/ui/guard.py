"""Who may use the console, and which requests may change anything.

- A token, when the console has one (``LOOMFLOW_UI_TOKEN``, or made at start when it
  listens beyond the loopback): every request but the login link's carries it, as
  ``Authorization: Bearer TOKEN`` (tools) or the cookie the one-time login link sets
  (a browser). The link's code works once; the token itself is never put in a URL.
- On the loopback, only the loopback's host names are answered (a page of another site
  cannot reach the console through a DNS name it rebinds to 127.0.0.1).
- Every request that changes something (POST) carries the CSRF token (a form's field or
  the ``X-CSRF-Token`` header), which only the console's own pages and ``GET
  /api/csrf`` give, and an ``Origin``, when the browser sends one, that is the console's.
- Every answer forbids the page to load or send anything to another origin (its Content
  Security Policy), to be framed, or to be sniffed as another type.

Written here rather than taken from a library: Starlette has the host check but no CSRF
or one-time login middleware, and these are a few comparisons over standard hmac.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from ipaddress import ip_address

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from loomflow.control.refused import Refused

__all__ = ["COOKIE", "CSP", "Forbidden", "Guard", "host_of", "is_loopback"]

COOKIE = "loomflow_console"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'"
)

_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


class Forbidden(Refused):
    """An action this console does not take (read-only, or without the CSRF token):
    answered 403, nothing done."""


def _same(given: str, secret: str) -> bool:
    """``given == secret`` in constant time; any text (compare_digest refuses non-ASCII
    strings, which a header or a form can hold)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


def host_of(header: str) -> str:
    """The host name of a Host header, without its port: ``[::1]:8765`` is ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[: end + 1] if end >= 0 else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address to listen on) is the loopback."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    """The console's token, its one-time login code and its CSRF token."""

    def __init__(self, token: str | None, *, loopback: bool) -> None:
        self.token = token
        self.loopback = loopback
        self.csrf = secrets.token_urlsafe(32)
        self._codes: set[str] = set()

    def login_code(self) -> str:
        """A new code for the one-time login link (``/login?code=...``)."""
        code = secrets.token_urlsafe(24)
        self._codes.add(code)
        return code

    def _authorised(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() == "bearer" and _same(value.strip(), self.token):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return bool(cookie) and _same(cookie, self.token)

    def csrf_ok(self, given: str | None) -> bool:
        """Whether ``given`` is this console's CSRF token."""
        return given is not None and _same(given, self.csrf)

    async def __call__(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        host = host_of(request.headers.get("host") or "")
        if self.loopback and not is_loopback(host):
            return PlainTextResponse(
                f"this console answers on the loopback only, not as {host!r}", 421
            )
        if request.url.path == "/login":
            return self._login(request)
        if not self._authorised(request):
            return PlainTextResponse(
                "this console needs its token: open the login link it printed when it "
                "started, or send Authorization: Bearer TOKEN",
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            origin = request.headers.get("origin")
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if origin is not None and origin != own:
                return PlainTextResponse(f"refused: a request from {origin}", 403)
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    def _login(self, request: Request) -> Response:
        code = request.query_params.get("code", "")
        if self.token is None:
            return RedirectResponse("/", 303)
        if code not in self._codes:
            return PlainTextResponse(
                "this login link was used already or is not one; restart the console "
                "for a new one, or send Authorization: Bearer TOKEN",
                401,
            )
        self._codes.discard(code)
        response = RedirectResponse("/", 303)
        response.set_cookie(
            COOKIE,
            self.token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response
