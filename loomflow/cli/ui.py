"""``loomflow ui``: the web console over a store (the ``[ui]`` extra).

It opens the store as every other command does (``--db``, or the ``LOOMFLOW_*``
settings with ``--dsn`` and ``--schema`` over theirs) and serves the console with
uvicorn on ``LOOMFLOW_UI_HOST``:``LOOMFLOW_UI_PORT`` (127.0.0.1:8765). Beyond the
loopback it asks for a token (``LOOMFLOW_UI_TOKEN``, or one it makes): the one-time
login link it prints sets it in the browser.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from loomflow.cli.options import id_of

__all__ = ["NAMES", "add_parser"]

NAMES = ("ui",)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = commands.add_parser(
        "ui",
        help="the web console: sessions, transcripts, fork trees, live runs",
        description="Serve the web console over a store: the session list with filters, a "
        "session's transcript, runs, checkpoints and fork tree, live events, the tail of "
        "the log, analytics, and the actions (fork, signal, cancel, retry, erase) through "
        "the same code as the commands. Listens on LOOMFLOW_UI_HOST:LOOMFLOW_UI_PORT "
        "(default 127.0.0.1:8765); beyond the loopback every request needs a token "
        "(LOOMFLOW_UI_TOKEN, or one made at start), which the printed one-time login link "
        "sets in the browser. Ctrl-C stops.",
    )
    which = ui.add_mutually_exclusive_group()
    which.add_argument(
        "--db", type=Path, metavar="PATH", help="the SQLite file of a SqliteRuntime (it must exist)"
    )
    which.add_argument(
        "--dsn",
        metavar="URL",
        help="postgresql:// URL of the read model (default, without --db: LOOMFLOW_POSTGRES_DSN)",
    )
    ui.add_argument("--schema", metavar="NAME", help="its PostgreSQL schema")
    ui.add_argument("--host", help="the address to listen on (default: LOOMFLOW_UI_HOST)")
    ui.add_argument(
        "--port",
        type=_port,
        help="the port, 0 to 65535 (default: LOOMFLOW_UI_PORT; 0: any free one)",
    )
    ui.add_argument(
        "--user",
        type=id_of("user id"),
        metavar="U",
        help="show only this user's sessions: every page and the API are scoped to U, and "
        "another user's ids read as unknown (default: every user's)",
    )
    ui.add_argument(
        "--read-only",
        action="store_true",
        help="no actions: fork, signal, cancel, retry and erase are off",
    )
    ui.add_argument(
        "--agent",
        metavar="module:factory",
        help="what gives the Agents a retry runs (as for `loomflow worker`); without it "
        "the console does not retry stuck runs",
    )
    ui.set_defaults(handler=_ui)


def _port(text: str) -> int:
    """An argument type: a TCP port (0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: one of 0 to 65535")
    return value


def _ui(args: argparse.Namespace) -> int:
    # a missing module of the [ui] extra is named before anything starts: FastAPI says of
    # a missing python_multipart, and Starlette of jinja2, with other errors than a
    # ModuleNotFoundError, which the command line turns into the extra's name
    import fastapi  # noqa: F401
    import jinja2  # noqa: F401  (Starlette's templates assert it is there)
    import python_multipart  # noqa: F401
    import sse_starlette  # noqa: F401
    import uvicorn  # noqa: F401

    import loomflow.ui  # noqa: F401
    from loomflow.control.refused import Refused
    from loomflow.control.source import Source, quiet_kafka, read_settings

    settings = read_settings()
    if settings is None:
        return 2
    if args.db is not None and not args.db.is_file():
        # as every command that reads a store: it opens one, it does not wait for one, and
        # a store that cannot be read is exit 1 (the arguments themselves were well formed)
        what = "is a directory" if args.db.is_dir() else "does not exist"
        print(
            f"loomflow ui: --db {args.db} {what}: name the SQLite file of a SqliteRuntime",
            file=sys.stderr,
        )
        return 1
    try:
        source = Source.of(args.db, dsn=args.dsn, schema=args.schema)
    except Refused as exc:
        print(f"loomflow ui: {exc}", file=sys.stderr)
        return exc.code
    if source is None:
        return 2
    if args.agent is not None:
        from loomflow.control.agents import load_agents

        try:
            load_agents(args.agent)  # a typo is said now, not at the first retry
        except ValueError as exc:
            print(f"loomflow ui: --agent: {exc}", file=sys.stderr)
            return 2
    quiet_kafka()
    try:
        return asyncio.run(_serve(args, source, settings))
    except KeyboardInterrupt:  # Ctrl-C while it starts, before its own handlers are set
        print("loomflow console stopped", file=sys.stderr)
        return 0


async def _serve(args: argparse.Namespace, source: Any, settings: Any) -> int:
    import uvicorn

    from loomflow.runtime import ANY_USER
    from loomflow.ui.app import create_app
    from loomflow.ui.backend import ConsoleConfig
    from loomflow.ui.guard import Guard, is_loopback

    host = args.host or settings.ui_host
    port = settings.ui_port if args.port is None else args.port
    loopback = is_loopback(host)
    token = settings.ui_token.get_secret_value() if settings.ui_token is not None else None
    if token is None and not loopback:
        token = secrets.token_urlsafe(32)
    try:
        sock = _bound(host, port)
    except OSError as exc:
        print(
            f"loomflow ui: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    port = sock.getsockname()[1]
    config = ConsoleConfig(
        source=source,
        user=ANY_USER if args.user is None else args.user,
        read_only=args.read_only,
        token=token,
        agent=args.agent,
        host=host,
        port=port,
    )
    guard = Guard(token, loopback=loopback)
    app = create_app(config, guard)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    )
    started = asyncio.Event()
    startup = server.startup

    async def announced(sockets: Any = None) -> None:  # uvicorn has no started callback
        await startup(sockets=sockets)
        started.set()

    server.startup = announced  # type: ignore[method-assign]
    # Ctrl-C and SIGTERM stop it as they stop every command: the server shuts down (its
    # live streams told so, through handle_exit), and the command exits 0. uvicorn's own
    # handlers would raise the signal again once it stopped (a KeyboardInterrupt
    # traceback, exit 130).
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, server.handle_exit, signum, None)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    waiting = asyncio.create_task(started.wait())
    await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if not started.is_set():
        waiting.cancel()
        return 1
    url = _url(host, port)
    lines = [f"loomflow console on {url} ({source.name}); Ctrl-C stops"]
    if token is not None:
        lines.append(
            f"open {url}login?code={guard.login_code()} to sign in (the link works once); "
            "tools send Authorization: Bearer $LOOMFLOW_UI_TOKEN"
        )
        if settings.ui_token is None:
            # a browser signs in once per link; tools (and another browser, by its
            # Authorization header) need the token itself, shown here to who started it
            lines.append(
                f"the token, made for this run (set LOOMFLOW_UI_TOKEN to keep one): {token}"
            )
    # one write: a reader of this output finds the link with the address
    sys.stderr.write("".join(f"{line}\n" for line in lines))
    sys.stderr.flush()
    await serving
    print("loomflow console stopped", file=sys.stderr)
    return 0


def _url(host: str, port: int) -> str:
    """The console's address as a browser opens it: a wildcard address (every interface)
    named by the machine's host name, which a browser elsewhere can reach."""
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = socket.gethostname()
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _bound(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, so that the port is known (``0``: a free
    one) before the console says where it is."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP
    # (a connection inherits its listener's 0), and without it a kept-alive connection's
    # every answer waited ~40 ms (headers and body are two writes: Nagle's algorithm
    # against the browser's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock
