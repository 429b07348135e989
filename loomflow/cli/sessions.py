"""``loomflow sessions``, ``checkpoints`` and ``prune``: look into a store, fork, prune.

Every command reads one store: the SQLite file of a ``SqliteRuntime`` (``--db``), or a
PostgreSQL read model (``--dsn``, ``--schema``; by default the ``LOOMFLOW_*`` settings,
as every other process reads them): ``PostgresRuntime``'s, or the one ``loomflow
processor`` folds a Kafka log into. Reading never creates a store.

Sessions are scoped by user as in the library: ``--user U`` names the user, no
``--user`` means the sessions run without one (``user_id=None``), and only ``ls`` and
``prune`` take ``--all-users``. Another user's session is "not found", as a missing one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.cli import _positive_int, _settings
from loomflow.cli._log import quiet_kafka

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from loomflow.projections.fold import CheckpointRow
    from loomflow.runtime import DatabaseStore, Runtime
    from loomflow.schemas import Message, Usage
    from loomflow.schemas.sessions import SessionRecord

__all__ = ["NAMES", "add_parser", "parse_when"]

NAMES = ("sessions", "checkpoints", "prune", "signal")

Action = Callable[[argparse.Namespace, "Runtime", "Console"], Awaitable[int]]

_AGE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class _Refused(Exception):
    """A request the command turns down, with its exit code (2: usage, 1: not found)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- arguments -------------------------------------------------------------------------


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """An aware UTC moment from ``--before``: an ISO date or datetime (UTC when it names
    no zone) or an age before ``now``: a whole number and s, m, h, d or w (``30d``)."""
    # A regex and timedelta, not a date-parsing dependency: these two forms are all
    # --before takes, and datetime.fromisoformat reads every ISO form since 3.11.
    age = _AGE.fullmatch(text.strip())
    if age is not None:
        delta = timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
        return (now or datetime.now(UTC)) - delta
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO date or datetime (2026-11-01, 2026-11-01T12:00:00Z) "
            "nor an age (30d, 12h, 45m, 2w)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


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
        "--limit", type=_positive_int, default=50, metavar="N", help="at most N rows (default: 50)"
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

        console = _console()
        if getattr(args, "kafka", False):
            quiet_kafka()  # its error below says what went wrong, once
        try:
            return asyncio.run(_on_store(args, action, console, writes=writes))
        except _Refused as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return exc.code
        except InvalidIdError as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return 2
        except LoomflowError as exc:
            print(f"loomflow {name}: {exc}", file=sys.stderr)
            return 1

    return handle


def _console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # piped or captured: each row whole on one line (ids never cut) for grep and
        # scripts, where rich would otherwise squeeze the tables into 80 columns
        console = Console(highlight=False, width=1000)
    return console


async def _on_store(
    args: argparse.Namespace, action: Action, console: Console, *, writes: bool
) -> int:
    runtime = _runtime(args, writes=writes)
    async with runtime:
        if writes and not getattr(args, "kafka", False) and args.db is None:
            await _refuse_kafka_read_model(runtime)
        return await action(args, runtime, console)


def _runtime(args: argparse.Namespace, *, writes: bool) -> Runtime:
    """The runtime over the store the arguments name; nothing opened yet."""
    kafka = writes and args.kafka
    if args.db is not None:
        if args.schema is not None or kafka:
            given = "--schema" if args.schema is not None else "--kafka"
            raise _Refused(f"{given} goes with a PostgreSQL read model, not with --db", 2)
        from loomflow.runtime import Runtime, SqliteStore

        return Runtime(SqliteStore(args.db, create=False))
    from pydantic import ValidationError

    from loomflow.settings import Settings

    environment = _settings()
    if environment is None:
        raise _Refused("fix the LOOMFLOW_* variable named above", 2)
    try:
        settings = Settings.resolve(environment, postgres_dsn=args.dsn, db_schema=args.schema)
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]) for e in exc.errors())
        raise _Refused(f"invalid --dsn or --schema: {problems}", 2) from None
    if kafka:
        from loomflow.runtime import KafkaRuntime

        return KafkaRuntime(settings=settings)
    from loomflow.runtime import PostgresStore, Runtime

    store = PostgresStore.from_settings(settings, max_size=2, create=False)
    return Runtime(store)


async def _refuse_kafka_read_model(runtime: Runtime) -> None:
    """Refuse to write into a read model that a Kafka log feeds: what is not in the log
    is lost to a rebuild, and the projector would then refuse the session's later events."""
    from loomflow.runtime import PostgresStore

    store = runtime.store
    if not isinstance(store, PostgresStore):
        return
    consumers = await store.consumed_topics()
    if consumers:
        groups = ", ".join(sorted({f"{group} of {topic}" for group, topic in consumers}))
        raise _Refused(
            f"schema {store.schema!r} is the read model of a Kafka log (positions of "
            f"{groups}): pass --kafka so this goes through the log",
            2,
        )


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


def _who(user_id: Any) -> str:
    from loomflow.runtime import ANY_USER

    if user_id is ANY_USER:
        return "every user"
    return "no user" if user_id is None else f"user {user_id}"


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
        raise _Refused(
            f"no {scope.describe()}; list them with `loomflow sessions ls` (a user's "
            "sessions need --user U)"
        )
    if row.status == "erased":
        raise _Refused(f"{scope.describe()} was erased")
    return row


# -- the commands ----------------------------------------------------------------------


async def _list_sessions(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    user_id = _whose(args)
    status = "stuck" if args.stuck else None
    rows = await _store(runtime).list_sessions(user_id=user_id, limit=args.limit + 1, status=status)
    if not rows:
        out.print("no stuck sessions" if args.stuck else _none_of(user_id))
        return 0
    out.print(_sessions_table(rows[: args.limit], parent=True))
    if args.stuck:
        for row in rows[: args.limit]:
            out.print(f"{row.session_id}: {row.last_error}", markup=False, highlight=False)
    if len(rows) > args.limit:
        out.print(f"the {args.limit} most recently active shown; --limit N for more")
    return 0


async def _show_session(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from rich.table import Table
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

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("session", Text(f"{row.session_id} ({_user(row.user_id)})"))
    head.add_row("status", f"{_status(row)}, {row.turns} turns, {row.message_count} messages")
    if row.status in ("waiting", "signalled") and row.waiting is not None:
        until = f" until {_time(row.waiting.until)}" if row.waiting.until else ""
        head.add_row("waits for", Text(f"signal {row.waiting.signal!r}{until}"))
    if row.inbox:
        head.add_row("inbox", Text(", ".join(f"{s.name} (seq {s.seq})" for s in row.inbox)))
    if row.status == "stuck" and row.last_error:
        head.add_row("error", Text(row.last_error))
    head.add_row("usage", _usage_line(row.usage))
    head.add_row("created", _time(row.created_at))
    head.add_row("last activity", _time(row.updated_at))
    if row.parent_session_id is not None:
        head.add_row(
            "forked from",
            Text(f"{row.parent_session_id} at checkpoint {row.parent_checkpoint_id}"),
        )
    out.print(head)
    out.print()
    out.print(Text(f"transcript ({len(messages)} messages)", style="bold"))
    out.print(_transcript(messages))
    out.print()
    if checkpoints:
        out.print(Text(f"checkpoints ({len(checkpoints)}, newest first)", style="bold"))
        out.print(_checkpoints_table(checkpoints))
    else:
        out.print(Text("checkpoints: none", style="bold"))
    out.print()
    if forks:
        out.print(Text(f"forked from this session ({len(forks)})", style="bold"))
        out.print(_sessions_table(forks, parent=False))
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
    out.print(_checkpoints_table(rows[: args.limit]))
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
        raise _Refused(
            f"no checkpoint {args.checkpoint} for {Scope(args.session, args.user).describe()}; "
            f"list them with `loomflow checkpoints ls {args.session}`"
        ) from None
    except InvalidIdError as exc:  # the new id is taken
        raise _Refused(f"{exc}; choose another --as", 1) from None
    print(child.session_id)  # alone on stdout, for NEW=$(loomflow sessions fork ...)
    return 0


async def _signal(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    import orjson

    from loomflow.errors import SessionNotFoundError
    from loomflow.runtime import Scope

    try:
        data = orjson.loads(args.json)
    except orjson.JSONDecodeError as exc:
        raise _Refused(f"--json is not JSON: {exc}", 2) from None
    try:
        seq = await runtime.signal(Scope(args.session, args.user), args.name, data)
    except SessionNotFoundError:
        raise _Refused(
            f"no session {args.session} of {_who(args.user)}; list them with `loomflow sessions ls`"
        ) from None
    except ValueError as exc:  # the name
        raise _Refused(str(exc), 2) from None
    print(f"sent {args.name} to {args.session} (seq {seq})")
    return 0


async def _prune(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    user_id = _whose(args)
    what = f"sessions of {_who(user_id)}"
    if args.session is not None:
        what = f"session {args.session} of {_who(user_id)}"
    before = _time(args.before, exact=True)
    plan = (
        f"{what}: delete those last active before {before} whole, and in the others the "
        "checkpoints and journal steps recorded before it"
    )
    if not args.yes:
        if not sys.stdin.isatty():
            raise _Refused(f"would prune {plan}; pass --yes to do it without asking", 2)
        from rich.prompt import Confirm

        if not Confirm.ask(f"Prune {plan}?", console=out, default=False):
            out.print("nothing pruned")
            return 0
    result = await runtime.store.prune(before=args.before, session_id=args.session, user_id=user_id)
    counts = (
        _count(result.sessions, "session"),
        _count(result.checkpoints, "checkpoint"),
        _count(result.steps, "journal step"),
        _count(result.events, "event"),
    )
    out.print(f"deleted {', '.join(counts)} ({what}, before {before})")
    return 0


# -- how rows look ---------------------------------------------------------------------


def _user(user_id: str | None) -> str:
    return "no user" if user_id is None else f"user {user_id}"


def _status(row: SessionRecord) -> str:
    # a session made by `sessions fork` (Runtime.fork) has had no run yet
    return "forked" if row.last_run_id is None else row.status


def _time(moment: datetime, *, exact: bool = False) -> str:
    """UTC to the second; ``exact``: with the fraction of a second, when there is one."""
    moment = moment.astimezone(UTC)
    fraction = f".{moment.microsecond:06d}" if exact and moment.microsecond else ""
    return f"{moment:%Y-%m-%d %H:%M:%S}{fraction} UTC"


def _tokens(usage: Usage) -> str:
    return f"{usage.total_tokens:,}"


def _cost(usage: Usage) -> str:
    if 0 < usage.cost_usd < 0.00005:  # would show as $0.0000: say it is not nothing
        return "<$0.0001"
    return f"${usage.cost_usd:.4f}"


def _usage_line(usage: Usage) -> str:
    return (
        f"{_tokens(usage)} tokens (input {usage.input_tokens:,}, cached "
        f"{usage.cached_input_tokens:,}, cache writes {usage.cache_write_tokens:,}, output "
        f"{usage.output_tokens:,}), {_cost(usage)}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _table(*columns: str) -> Table:
    """A table whose id columns (named first) are never wrapped or cut."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        numeric = name in ("turn", "turns", "messages", "tokens", "cost")
        is_id = name in ("session", "checkpoint", "forked from", "from checkpoint")
        table.add_column(
            name,
            justify="right" if numeric else "left",
            no_wrap=is_id or numeric,
            min_width=30 if is_id else None,
        )
    return table


def _sessions_table(rows: Sequence[SessionRecord], *, parent: bool) -> Table:
    from rich.text import Text

    columns = ["session", "user", "status", "turns", "last activity", "tokens", "cost"]
    # a listing names each row's parent (when any row has one); the forks of one session
    # name the checkpoint each started from
    lineage = not parent or any(row.parent_session_id for row in rows)
    if lineage:
        columns.append("forked from" if parent else "from checkpoint")
    table = _table(*columns)
    for row in rows:
        cells: list[Any] = [
            Text(row.session_id),
            Text(row.user_id or "-"),
            _status(row),
            str(row.turns),
            _time(row.updated_at),
            _tokens(row.usage),
            _cost(row.usage),
        ]
        if lineage:
            origin = row.parent_session_id if parent else row.parent_checkpoint_id
            cells.append(Text(origin or ""))
        table.add_row(*cells)
    return table


def _checkpoints_table(rows: Sequence[CheckpointRow]) -> Table:
    from rich.text import Text

    table = _table("checkpoint", "turn", "messages", "created", "tokens", "cost")
    for row in rows:
        table.add_row(
            Text(row.checkpoint_id),
            str(row.turn),
            str(row.message_count),
            _time(row.created_at),
            _tokens(row.cumulative_usage),
            _cost(row.cumulative_usage),
        )
    return table


def _short(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _transcript(messages: Sequence[Message]) -> Table:
    """Each message's role and text; a tool call or result on one line each."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    names: dict[str, str] = {}
    for message in messages:
        role = message.role.value
        if message.thinking:
            grid.add_row(role, Text(f"(reasoning: {len(message.thinking)} blocks)", style="dim"))
            role = ""
        if message.tool_call_id is not None:
            name = names.get(message.tool_call_id, message.tool_call_id)
            outcome = "failed" if message.is_error else "returned"
            grid.add_row(role, Text(_short(f"← {name} {outcome}: {message.content}")))
            continue
        if message.content or not message.tool_calls:
            grid.add_row(role, Text(message.content))
            role = ""
        for call in message.tool_calls:
            names[call.id] = call.name
            arguments = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
            grid.add_row(role, Text(_short(f"→ {call.name}({arguments})")))
            role = ""
    return grid
