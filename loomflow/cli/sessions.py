"""``loomflow sessions``, ``checkpoints``, ``prune`` and ``signal``: look into a store,
fork, prune, signal; their parsers and handlers.

Every command reads one store: the SQLite file of a ``SqliteRuntime`` (``--db``), or a
PostgreSQL read model (``--dsn``, ``--schema``; by default the ``LOOMFLOW_*`` settings,
as every other process reads them): ``PostgresRuntime``'s, or the one ``loomflow
processor`` folds a Kafka log into. ``stores.Source`` opens it (reading never creates
a store); ``render`` draws its rows.

Sessions are scoped by user as in the library: ``--user U`` names the user, no
``--user`` means the sessions run without one (``user_id=None``), and only ``ls`` and
``prune`` take ``--all-users``. Another user's session is "not found", as a missing one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.cli.options import Refused, parse_when, positive_int
from loomflow.cli.render import (
    checkpoints_table,
    console,
    count,
    session_head,
    sessions_table,
    timestamp,
    transcript,
    who,
)
from loomflow.cli.stores import Access, Source, quiet_kafka

if TYPE_CHECKING:
    from rich.console import Console

    from loomflow.runtime import DatabaseStore, Runtime
    from loomflow.schemas.sessions import SessionRecord

__all__ = ["NAMES", "add_parser"]

NAMES = ("sessions", "checkpoints", "prune", "signal")

Action = Callable[[argparse.Namespace, "Runtime", "Console"], Awaitable[int]]


# -- arguments -------------------------------------------------------------------------


def _id(what: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        from loomflow.errors import InvalidIdError
        from loomflow.schemas import validate_id

        try:
            return validate_id(text, what)
        except InvalidIdError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def _parents() -> dict[str, argparse.ArgumentParser]:
    """Option sets the commands share: the store, one user or every user, writes."""
    # no argument group around these: argparse moves a mutually exclusive group of a
    # parent parser out of it, so --db and --dsn would be listed apart from --schema
    store = argparse.ArgumentParser(add_help=False)
    which = store.add_mutually_exclusive_group()
    which.add_argument(
        "--db",
        type=Path,
        metavar="PATH",
        help="the SQLite file of a SqliteRuntime (it must exist)",
    )
    which.add_argument(
        "--dsn",
        metavar="URL",
        help="postgresql:// URL of the read model of PostgresRuntime or of `loomflow "
        "processor` (default, without --db: LOOMFLOW_POSTGRES_DSN)",
    )
    store.add_argument(
        "--schema", metavar="NAME", help="its PostgreSQL schema (default: LOOMFLOW_SCHEMA)"
    )
    user = argparse.ArgumentParser(add_help=False)
    user.add_argument(
        "--user",
        type=_id("user id"),
        metavar="U",
        help="the user the session belongs to (default: none, as user_id=None)",
    )
    users = argparse.ArgumentParser(add_help=False)
    whose = users.add_mutually_exclusive_group()
    whose.add_argument(
        "--user",
        type=_id("user id"),
        metavar="U",
        help="this user's sessions (default: those run without a user, user_id=None)",
    )
    whose.add_argument("--all-users", action="store_true", help="every user's sessions")
    writes = argparse.ArgumentParser(add_help=False)
    writes.add_argument(
        "--kafka",
        action="store_true",
        help="append through the Kafka log (KafkaRuntime, the LOOMFLOW_* settings), for a "
        "read model that `loomflow processor` fills; the processor must be running",
    )
    return {"store": store, "user": user, "users": users, "writes": writes}


def _session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "session",
        type=_id("session id"),
        metavar="SESSION",
        help="a session id, as `loomflow sessions ls` lists them",
    )


def _limit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=positive_int, default=50, metavar="N", help="at most N rows (default: 50)"
    )


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sessions`` (ls, show, fork), ``checkpoints`` (ls) and ``prune``."""
    p = _parents()
    sessions = commands.add_parser(
        "sessions",
        help="list sessions, show one (transcript, checkpoints, forks), fork one",
        description="Inspect the sessions of a store, or fork one from a checkpoint.",
    )
    verbs = sessions.add_subparsers(dest="verb", required=True, metavar="{ls,show,fork}")
    ls = verbs.add_parser(
        "ls",
        parents=[p["users"], p["store"]],
        help="one row per session, the most recently active first",
        description="One row per session: id, user, status, turns, last activity, tokens "
        "and cost, the session it was forked from. Erased sessions are not listed.",
    )
    _limit_option(ls)
    ls.add_argument(
        "--stuck",
        action="store_true",
        help="only the sessions a worker gave up on (parked), with their last error",
    )
    ls.set_defaults(handler=_handler("sessions ls", _list_sessions))
    show = verbs.add_parser(
        "show",
        parents=[p["user"], p["store"]],
        help="a session's transcript, checkpoints, lineage and usage",
        description="The transcript (tool calls and results one line each), checkpoints "
        "newest first, the session it was forked from and the sessions forked from it, "
        "tokens and cost.",
    )
    _session_argument(show)
    show.set_defaults(handler=_handler("sessions show", _show_session))
    fork = verbs.add_parser(
        "fork",
        parents=[p["user"], p["store"], p["writes"]],
        help="start a new session from a checkpoint, calling no model",
        description="Create a session that starts from a checkpoint of SESSION (its "
        "transcript, turns and usage then), as agent.resume(..., from_checkpoint=...) "
        "does, without running it; print its id. Resume it with agent.resume(session_id=...).",
    )
    _session_argument(fork)
    fork.add_argument(
        "--from",
        dest="checkpoint",
        required=True,
        type=_id("checkpoint id"),
        metavar="CKPT",
        help="the checkpoint to start from (see `loomflow checkpoints ls SESSION`)",
    )
    fork.add_argument(
        "--as",
        dest="new_id",
        type=_id("session id"),
        metavar="NEW_ID",
        help="the new session's id (default: a new sess… id)",
    )
    fork.set_defaults(handler=_handler("sessions fork", _fork, writes=True))

    checkpoints = commands.add_parser(
        "checkpoints",
        help="list a session's checkpoints",
        description="Inspect the checkpoints of a session.",
    )
    ckpt_verbs = checkpoints.add_subparsers(dest="verb", required=True, metavar="{ls}")
    ckpt_ls = ckpt_verbs.add_parser(
        "ls",
        parents=[p["user"], p["store"]],
        help="checkpoints newest first",
        description="A session's checkpoints, newest first: id, turn, messages, when, "
        "tokens and cost up to it.",
    )
    _session_argument(ckpt_ls)
    _limit_option(ckpt_ls)
    ckpt_ls.set_defaults(handler=_handler("checkpoints ls", _list_checkpoints))

    prune = commands.add_parser(
        "prune",
        parents=[p["users"], p["store"], p["writes"]],
        help="delete sessions, checkpoints and journal steps older than a date",
        description="runtime.store.prune(before=...): sessions last active before WHEN "
        "are deleted whole; in the others, checkpoints and journal steps recorded before "
        "WHEN. Asks first unless --yes.",
    )
    prune.add_argument(
        "--before",
        required=True,
        type=parse_when,
        metavar="WHEN",
        help="an ISO date or datetime (UTC unless it names a zone), or an age: 30d, 12h, 45m, 2w",
    )
    prune.add_argument("--session", type=_id("session id"), metavar="S", help="only this session")
    prune.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    prune.set_defaults(handler=_handler("prune", _prune, writes=True))

    send = commands.add_parser(
        "signal",
        parents=[p["user"], p["store"], p["writes"]],
        help="send a signal (a JSON payload) to a session's run",
        description="Send the signal NAME to SESSION, as agent.signal does: a run that "
        "waits for it (wait_for_signal(NAME)) is resumed by a worker and receives the "
        "payload; a run that waits for it later receives it then.",
    )
    _session_argument(send)
    send.add_argument("name", metavar="NAME", help="the signal's name")
    send.add_argument(
        "--json", default="null", metavar="JSON", help="the payload, as JSON (default: null)"
    )
    send.set_defaults(handler=_handler("signal", _signal, writes=True))


# -- running a command -----------------------------------------------------------------


def _handler(name: str, action: Action, *, writes: bool = False) -> Callable[..., int]:
    """``action`` run on the store the arguments name; errors become a message on
    stderr and an exit code."""

    def handle(args: argparse.Namespace) -> int:
        from loomflow.errors import InvalidIdError, LoomflowError

        out = console()
        access: Access = "read"
        if writes:
            access = "kafka" if args.kafka else "write"
        if access == "kafka":
            quiet_kafka()  # its error below says what went wrong, once
        try:
            return asyncio.run(_on_store(args, action, out, access))
        except Refused as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return exc.code
        except InvalidIdError as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return 2
        except LoomflowError as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return 1

    return handle


async def _on_store(args: argparse.Namespace, action: Action, out: Console, access: Access) -> int:
    source = Source.of(args.db, dsn=args.dsn, schema=args.schema)
    if source is None:
        raise Refused("fix the LOOMFLOW_* variable named above", 2)
    async with source.runtime(access) as runtime:
        return await action(args, runtime, out)


def _store(runtime: Runtime) -> DatabaseStore:
    """The store of a reading command (never --kafka): SQLite or PostgreSQL."""
    from loomflow.runtime import DatabaseStore

    store = runtime.store
    assert isinstance(store, DatabaseStore)
    return store


def _whose(args: argparse.Namespace) -> Any:
    """The user_id a listing or prune is scoped to: ANY_USER, a user, or None."""
    from loomflow.runtime import ANY_USER

    return ANY_USER if getattr(args, "all_users", False) else args.user


def _none_of(user_id: Any) -> str:
    """What ``sessions ls`` says when it lists nothing, and where else to look."""
    from loomflow.runtime import ANY_USER

    if user_id is ANY_USER:
        return "no sessions of any user"
    if user_id is not None:
        return f"no sessions of user {user_id}; --all-users lists everyone's"
    return "no sessions run without a user; --user U lists a user's, --all-users everyone's"


async def _session(runtime: Runtime, args: argparse.Namespace) -> SessionRecord:
    """The row of ``args.session`` for ``args.user``; another user's is "not found"."""
    from loomflow.runtime import Scope

    scope = Scope(args.session, args.user)
    row = await runtime.store.session(scope)
    if row is None:
        raise Refused(
            f"no {scope.describe()}; list them with `loomflow sessions ls` (a user's "
            "sessions need --user U)"
        )
    if row.status == "erased":
        raise Refused(f"{scope.describe()} was erased")
    return row


# -- the commands ----------------------------------------------------------------------


async def _list_sessions(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    user_id = _whose(args)
    status = "stuck" if args.stuck else None
    rows = await _store(runtime).list_sessions(user_id=user_id, limit=args.limit + 1, status=status)
    if not rows:
        out.print("no stuck sessions" if args.stuck else _none_of(user_id))
        return 0
    out.print(sessions_table(rows[: args.limit], parent=True))
    if args.stuck:
        for row in rows[: args.limit]:
            out.print(f"{row.session_id}: {row.last_error}", markup=False, highlight=False)
    if len(rows) > args.limit:
        out.print(f"the {args.limit} most recently active shown; --limit N for more")
    return 0


async def _show_session(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from rich.text import Text

    from loomflow.runtime import Scope

    row = await _session(runtime, args)
    scope = Scope(row.session_id, row.user_id)
    restored = await runtime.restore(scope)
    messages = [] if restored is None else restored.messages
    store = _store(runtime)
    checkpoints = await store.list_checkpoints(scope, 1 << 30)
    forks = await store.list_sessions(
        user_id=row.user_id, parent_session_id=row.session_id, limit=1000
    )

    out.print(session_head(row))
    out.print()
    out.print(Text(f"transcript ({len(messages)} messages)", style="bold"))
    out.print(transcript(messages))
    out.print()
    if checkpoints:
        out.print(Text(f"checkpoints ({len(checkpoints)}, newest first)", style="bold"))
        out.print(checkpoints_table(checkpoints))
    else:
        out.print(Text("checkpoints: none", style="bold"))
    out.print()
    if forks:
        out.print(Text(f"forked from this session ({len(forks)})", style="bold"))
        out.print(sessions_table(forks, parent=False))
    else:
        out.print(Text("forked from this session: none", style="bold"))
    return 0


async def _list_checkpoints(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    row = await _session(runtime, args)
    scope = Scope(row.session_id, row.user_id)
    rows = await _store(runtime).list_checkpoints(scope, args.limit + 1)
    if not rows:
        out.print(f"{scope.describe()} has no checkpoints")
        return 0
    out.print(checkpoints_table(rows[: args.limit]))
    if len(rows) > args.limit:
        out.print(f"the {args.limit} newest shown; --limit N for more")
    return 0


async def _fork(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.errors import CheckpointNotFoundError, InvalidIdError
    from loomflow.runtime import Scope

    await _session(runtime, args)
    try:
        child = await runtime.fork(
            Scope(args.session, args.user), args.checkpoint, session_id=args.new_id
        )
    except CheckpointNotFoundError:
        raise Refused(
            f"no checkpoint {args.checkpoint} for {Scope(args.session, args.user).describe()}; "
            f"list them with `loomflow checkpoints ls {args.session}`"
        ) from None
    except InvalidIdError as exc:  # the new id is taken
        raise Refused(f"{exc}; choose another --as", 1) from None
    print(child.session_id)  # alone on stdout, for NEW=$(loomflow sessions fork ...)
    return 0


async def _signal(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    import orjson

    from loomflow.errors import SessionNotFoundError
    from loomflow.runtime import Scope

    try:
        data = orjson.loads(args.json)
    except orjson.JSONDecodeError as exc:
        raise Refused(f"--json is not JSON: {exc}", 2) from None
    try:
        seq = await runtime.signal(Scope(args.session, args.user), args.name, data)
    except SessionNotFoundError:
        raise Refused(
            f"no session {args.session} of {who(args.user)}; list them with `loomflow sessions ls`"
        ) from None
    except ValueError as exc:  # the name
        raise Refused(str(exc), 2) from None
    print(f"sent {args.name} to {args.session} (seq {seq})")
    return 0


async def _prune(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    user_id = _whose(args)
    what = f"sessions of {who(user_id)}"
    if args.session is not None:
        what = f"session {args.session} of {who(user_id)}"
    before = timestamp(args.before, exact=True)
    plan = (
        f"{what}: delete those last active before {before} whole, and in the others the "
        "checkpoints and journal steps recorded before it"
    )
    if not args.yes:
        if not sys.stdin.isatty():
            raise Refused(f"would prune {plan}; pass --yes to do it without asking", 2)
        from rich.prompt import Confirm

        if not Confirm.ask(f"Prune {plan}?", console=out, default=False):
            out.print("nothing pruned")
            return 0
    result = await runtime.store.prune(before=args.before, session_id=args.session, user_id=user_id)
    counts = (
        count(result.sessions, "session"),
        count(result.checkpoints, "checkpoint"),
        count(result.steps, "journal step"),
        count(result.events, "event"),
    )
    out.print(f"deleted {', '.join(counts)} ({what}, before {before})")
    return 0
