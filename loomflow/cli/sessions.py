"""``loomflow sessions``, ``checkpoints``, ``prune`` and ``signal``: look into a store,
fork, resume, retry, cancel, erase, prune, signal; their parsers and handlers.

Every command reads one store: the SQLite file of a ``SqliteRuntime`` (``--db``), or a
PostgreSQL read model (``--dsn``, ``--schema``; by default the ``LOOMFLOW_*`` settings,
as every other process reads them): ``PostgresRuntime``'s, or the one ``loomflow
processor`` folds a Kafka log into. ``stores.Source`` opens it (reading never creates
a store); ``render`` draws its rows.

Sessions are scoped by user as in the library: ``--user U`` names the user, no
``--user`` means the sessions run without one (``user_id=None``), and only ``ls`` and
``prune`` take ``--all-users``. Another user's session is "not found", as a missing one.

The lifecycle verbs: ``resume`` continues a session as ``agent.resume`` does (a person's
run, with a prompt or the continuation nudge; any session whose run is not live), and
``retry`` runs a parked (stuck) run once more as a worker's take-over would (no prompt,
a failure parks it again); both import ``--agent module:factory`` as ``loomflow worker``
does and run in this process. ``cancel`` stops a run (``runtime.cancel``), ``erase``
erases a session (``runtime.store.erase``), after asking.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.cli.options import id_of, parse_when, positive_int
from loomflow.cli.render import (
    checkpoint_json,
    checkpoints_table,
    console,
    cost,
    count,
    print_json,
    session_head,
    session_json,
    sessions_table,
    timestamp,
    transcript,
    who,
)
from loomflow.control import verbs
from loomflow.control.refused import Missing, Refused
from loomflow.control.source import Access, Source, quiet_kafka
from loomflow.control.status import STATUSES

if TYPE_CHECKING:
    from rich.console import Console

    from loomflow.runtime import DatabaseStore, Runtime, Scope
    from loomflow.schemas import RunResult
    from loomflow.schemas.sessions import SessionRecord

__all__ = ["NAMES", "add_parser"]

NAMES = ("sessions", "checkpoints", "prune", "signal")

Action = Callable[[argparse.Namespace, "Runtime", "Console"], Awaitable[int]]


# -- arguments -------------------------------------------------------------------------


def _statuses(text: str) -> list[str]:
    """A --status value: one status or several, comma-separated (stuck,failed)."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in STATUSES:
            raise argparse.ArgumentTypeError(
                f"unknown status {name!r}: the statuses are {', '.join(STATUSES)}"
            )
    return names


def _prompt(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a prompt needs some text; leave --prompt out for none")
    return text


def _payload(text: str) -> Any:
    """A --json value: the signal's payload, parsed here so that text that is not JSON
    is a bad argument as a malformed --since is (argparse's usage, then what is wrong)."""
    try:
        return verbs.parse_payload(text)
    except Refused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parents() -> dict[str, argparse.ArgumentParser]:
    """Option sets the commands share: the store, one user or every user, writes, and
    the ``--yes`` of a command that asks first."""
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
        type=id_of("user id"),
        metavar="U",
        help="the user the session belongs to (default: none, as user_id=None)",
    )
    users = argparse.ArgumentParser(add_help=False)
    whose = users.add_mutually_exclusive_group()
    whose.add_argument(
        "--user",
        type=id_of("user id"),
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
    confirm = argparse.ArgumentParser(add_help=False)
    confirm.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return {"store": store, "user": user, "users": users, "writes": writes, "confirm": confirm}


def _session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "session",
        type=id_of("session id"),
        metavar="SESSION",
        help="a session id, as `loomflow sessions ls` lists them",
    )


def _agent_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        required=True,
        metavar="module:factory",
        help="what gives the Agents (as for `loomflow worker`, e.g. myapp.agents:build); "
        "the one named as the session's run recorded runs it",
    )


def _limit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=50,
        metavar="N",
        help="at most N rows, counted after the filters (default: 50)",
    )


def _view_options(parser: argparse.ArgumentParser, json_help: str) -> None:
    """``--json`` and ``--wide``: what a list or a show prints."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every column whole (ids, times), however wide the terminal; a pipe or a "
        "file with COLUMNS unset gets them whole anyway",
    )


def _since_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--since",
        type=parse_when,
        metavar="WHEN",
        help=f"only {what} at or after WHEN: an ISO date or datetime (UTC unless it names a "
        "zone) or an age (30d, 12h, 45m, 2w), as prune --before takes",
    )


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sessions`` (ls, show, fork, resume, retry, cancel, erase), ``checkpoints``
    (ls), ``prune`` and ``signal``."""
    p = _parents()
    sessions = commands.add_parser(
        "sessions",
        help="list sessions, show, fork, resume, retry, cancel or erase one",
        description="Inspect the sessions of a store; fork one from a checkpoint; resume, "
        "retry or cancel its run; erase it. Exit codes: 0 done, 1 not found, refused or "
        "the run failed, 2 a usage error.",
    )
    verbs = sessions.add_subparsers(
        dest="verb", required=True, metavar="{ls,show,fork,resume,retry,cancel,erase}"
    )
    ls = verbs.add_parser(
        "ls",
        parents=[p["users"], p["store"]],
        help="one row per session, the most recently active first",
        description="One row per session: id, user, status, turns, last activity, tokens "
        "and cost, the session it was forked from. Erased sessions are not listed.",
    )
    _limit_option(ls)
    only = ls.add_mutually_exclusive_group()
    only.add_argument(
        "--stuck",
        action="store_true",
        help="only the sessions a worker gave up on (parked), with their last error",
    )
    only.add_argument(
        "--status",
        type=_statuses,
        action="append",
        metavar="S",
        help=f"only sessions in status S ({', '.join(STATUSES)}); repeatable, or "
        "comma-separated: stuck,failed",
    )
    _since_option(ls, "the sessions last active")
    ls.add_argument(
        "--agent",
        metavar="NAME",
        help="only the sessions whose latest run is of the agent NAME (Agent(name=...))",
    )
    _view_options(ls, "one JSON object per session, a line each (fields: see the README)")
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
    _view_options(show, "one JSON object: the session, its transcript, checkpoints and forks")
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
        type=id_of("checkpoint id"),
        metavar="CKPT",
        help="the checkpoint to start from (`loomflow checkpoints ls SESSION`, with the "
        "same --db and --user, lists them)",
    )
    fork.add_argument(
        "--as",
        dest="new_id",
        type=id_of("session id"),
        metavar="NEW_ID",
        help="the new session's id (default: a new sess… id)",
    )
    fork.set_defaults(handler=_handler("sessions fork", _fork, writes=True))

    resume = verbs.add_parser(
        "resume",
        parents=[p["user"], p["store"], p["writes"]],
        help="continue a session in this process, as agent.resume does",
        description="Continue SESSION from its latest checkpoint with the options its "
        "run recorded, as agent.resume(PROMPT, session_id=SESSION) does, in this process: "
        "a stuck, cancelled, failed, finished, waiting or abandoned session (not one whose "
        "run is live). Without --prompt the run gets the continuation nudge, or goes on "
        "where it waited; with one, that message (a wait in a tool ends). It is a "
        "person's run: a failure is recorded as failed, and a worker's budget starts over. "
        "The Agent comes from module:factory, imported as `loomflow worker` does, by the "
        "name the run recorded; it runs on the store named here.",
    )
    _session_argument(resume)
    _agent_option(resume)
    resume.add_argument(
        "--prompt",
        type=_prompt,
        metavar="TEXT",
        help="a new message to continue with (default: none)",
    )
    resume.set_defaults(
        handler=_handler("sessions resume", _resume, writes=True),
        on_interrupt=(
            ": the run is left as a crash leaves it; `loomflow sessions resume` again goes "
            "on from there"
        ),
    )

    retry = verbs.add_parser(
        "retry",
        parents=[p["user"], p["store"], p["writes"]],
        help="run a stuck (parked) run once more, in this process",
        description="Take over the run a worker parked (status stuck), as a worker "
        "would, in this process: from its latest checkpoint, with the options it "
        "recorded and no new prompt (a run that waited goes on in its wait). A failure "
        "parks it again, with the new error. Only for stuck sessions; `sessions resume` "
        "continues the others. The Agent comes from module:factory, as for `resume`.",
    )
    _session_argument(retry)
    _agent_option(retry)
    retry.set_defaults(handler=_handler("sessions retry", _retry, writes=True))

    cancel = verbs.add_parser(
        "cancel",
        parents=[p["user"], p["store"], p["writes"]],
        help="stop a session's run; no worker resumes it",
        description="Append run.cancelled, as runtime.cancel does: a live run stops at its "
        "next step (its next write is refused, with RunCancelledError), a waiting or "
        "stuck one stays where it is; no worker resumes the session and it takes no "
        "signal, until `sessions resume` (or agent.resume) continues it.",
    )
    _session_argument(cancel)
    cancel.add_argument(
        "--reason", default="", metavar="TEXT", help="why, kept in the log (at most 2000 chars)"
    )
    cancel.set_defaults(handler=_handler("sessions cancel", _cancel, writes=True))

    erase = verbs.add_parser(
        "erase",
        parents=[p["user"], p["store"], p["writes"], p["confirm"]],
        help="erase a session everywhere, leaving a tombstone",
        description="runtime.store.erase: the session's events, transcript, checkpoints "
        "and journal go from every projection; a tombstone keeps its id from being "
        "reused, and a run still writing to it is refused. Asks first unless --yes.",
    )
    _session_argument(erase)
    erase.set_defaults(handler=_handler("sessions erase", _erase, writes=True))

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
    _since_option(ckpt_ls, "the checkpoints written")
    _view_options(ckpt_ls, "one JSON object per checkpoint, a line each")
    ckpt_ls.set_defaults(handler=_handler("checkpoints ls", _list_checkpoints))

    prune = commands.add_parser(
        "prune",
        parents=[p["users"], p["store"], p["writes"], p["confirm"]],
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
    prune.add_argument("--session", type=id_of("session id"), metavar="S", help="only this session")
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
        "--json",
        dest="payload",
        type=_payload,
        default=None,
        metavar="JSON",
        help="the payload, as JSON (default: null)",
    )
    send.add_argument(
        "--later",
        action="store_true",
        help="send it even though the run waits for another signal now: it stays in the "
        "inbox for a later wait of this name (without it, that is refused as a likely typo)",
    )
    send.set_defaults(handler=_handler("signal", _signal, writes=True))


# -- running a command -----------------------------------------------------------------


def _handler(name: str, action: Action, *, writes: bool = False) -> Callable[..., int]:
    """``action`` run on the store the arguments name; errors become a message on
    stderr and an exit code."""

    def handle(args: argparse.Namespace) -> int:
        from loomflow.errors import InvalidIdError, LoomflowError

        out = console(wide=getattr(args, "wide", False))
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


def _command(args: argparse.Namespace, *words: str) -> str:
    """``loomflow WORDS`` with the store and user options of ``args``, to run as a hint
    says; a --dsn is named, not shown (its URL may hold a password)."""
    import shlex

    line = ["loomflow", *words]
    if args.db is not None:
        line += ["--db", str(args.db)]
    elif args.dsn is not None:
        line += ["--dsn", "URL"]
    if args.schema is not None:
        line += ["--schema", args.schema]
    if args.user is not None:
        line += ["--user", args.user]
    return shlex.join(line)


def _whose(args: argparse.Namespace) -> Any:
    """The user_id a listing or prune is scoped to: ANY_USER, a user, or None."""
    from loomflow.runtime import ANY_USER

    return ANY_USER if getattr(args, "all_users", False) else args.user


def _none_of(user_id: Any, filters: str = "") -> str:
    """What ``sessions ls`` says when it lists nothing, and where else to look."""
    from loomflow.runtime import ANY_USER

    if filters:
        whose = {ANY_USER: "of any user", None: "run without a user"}.get(
            user_id, f"of user {user_id}"
        )
        return f"no sessions {whose} {filters}"
    if user_id is ANY_USER:
        return "no sessions of any user"
    if user_id is not None:
        return f"no sessions of user {user_id}; --all-users lists everyone's"
    return "no sessions run without a user; --user U lists a user's, --all-users everyone's"


def _wanted(args: argparse.Namespace) -> list[str]:
    """The statuses ``sessions ls`` keeps (none: every one)."""
    if args.stuck:
        return ["stuck"]
    return sorted({name for names in args.status or [] for name in names})


def _filters(args: argparse.Namespace) -> str:
    """The filters of ``sessions ls``, as words: ``in status stuck, active since …``."""
    said = []
    statuses = _wanted(args)
    if statuses:
        said.append(f"in status {' or '.join(statuses)}")
    if args.since is not None:
        said.append(f"active since {timestamp(args.since)}")
    if args.agent is not None:
        said.append(f"of agent {args.agent!r}")
    return ", ".join(said)


async def _matching(store: DatabaseStore, args: argparse.Namespace) -> list[SessionRecord]:
    """Up to ``--limit`` + 1 sessions that pass every filter, the most recently active
    first (one more than shown, to say that there are more)."""
    return await verbs.matching(
        store,
        user_id=_whose(args),
        statuses=_wanted(args),
        since=args.since,
        agent=args.agent,
        limit=args.limit + 1,
    )


async def _session(runtime: Runtime, args: argparse.Namespace) -> SessionRecord:
    """The row of ``args.session`` for ``args.user``; another user's is "not found"."""
    from loomflow.runtime import Scope

    return await verbs.session(runtime, Scope(args.session, args.user))


# -- the commands ----------------------------------------------------------------------


async def _list_sessions(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    user_id = _whose(args)
    rows = await _matching(_store(runtime), args)
    shown = rows[: args.limit]
    more = f"the {args.limit} most recently active shown; --limit N for more"
    if args.json:
        for row in shown:
            print_json(session_json(row))
        if len(rows) > args.limit:
            print(more, file=sys.stderr)
        return 0
    if not rows:
        out.print("no stuck sessions" if args.stuck else _none_of(user_id, _filters(args)))
        return 0
    out.print(sessions_table(shown, parent=True))
    if args.stuck:
        for row in shown:
            out.print(f"{row.session_id}: {row.last_error}", markup=False, highlight=False)
    if len(rows) > args.limit:
        out.print(more)
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
    if args.json:
        print_json(
            {
                **session_json(row),
                "transcript": [message.model_dump(mode="json") for message in messages],
                "checkpoints": [checkpoint_json(c, scope) for c in checkpoints],
                "forks": [session_json(fork) for fork in forks],
            }
        )
        return 0

    out.print(session_head(row))
    out.print()
    out.print(Text(f"transcript ({count(len(messages), 'message')})", style="bold"))
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
    if args.since is not None:  # newest first: the ones since WHEN are the first ones
        rows = [r for r in rows if r.created_at >= args.since]
    shown = rows[: args.limit]
    more = f"the {args.limit} newest shown; --limit N for more"
    if args.json:
        for checkpoint in shown:
            print_json(checkpoint_json(checkpoint, scope))
        if len(rows) > args.limit:
            print(more, file=sys.stderr)
        return 0
    if not rows:
        since = "" if args.since is None else f" since {timestamp(args.since)}"
        out.print(f"{scope.describe()} has no checkpoints{since}")
        return 0
    out.print(checkpoints_table(shown))
    if len(rows) > args.limit:
        out.print(more)
    return 0


async def _fork(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    scope = Scope(args.session, args.user)
    await _session(runtime, args)  # a missing session is its own error, not the checkpoint's
    try:
        child = await verbs.fork(runtime, scope, args.checkpoint, new_id=args.new_id)
    except Missing:
        # the hint names this command's store and user: `checkpoints ls S` alone reads
        # the sessions run without a user, in no store
        listing = _command(args, "checkpoints", "ls", args.session)
        raise Missing(
            f"no checkpoint {args.checkpoint} for {scope.describe()}; list them with `{listing}`"
        ) from None
    print(child)  # alone on stdout, for NEW=$(loomflow sessions fork ...)
    return 0


async def _signal(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    scope = Scope(args.session, args.user)
    row = None if args.later else await runtime.session(scope)
    waiting = None if row is None or row.waiting is None else row.waiting.signal
    if waiting is not None and waiting != args.name:
        raise Refused(
            f"{scope.describe()} waits for signal {waiting!r}, not {args.name!r}: nothing "
            f"sent. Send {waiting!r}, or pass --later to send {args.name!r} for a later wait "
            "of that name",
            2,
        )
    seq = await verbs.signal(runtime, scope, args.name, args.payload)
    print(f"sent {args.name} to {args.session} (seq {seq})")
    return 0


async def _prune(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    user_id = _whose(args)
    what = f"sessions of {who(user_id)}"
    if args.session is not None:
        what = f"session {args.session} of {who(user_id)}"
    before = timestamp(args.before)
    plan = (
        f"{what}: delete those last active before {before} whole, and in the others the "
        "checkpoints and journal steps recorded before it"
    )
    if not _confirmed(args, out, "prune", plan):
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


def _confirmed(args: argparse.Namespace, out: Console, verb: str, plan: str) -> bool:
    """Whether to do what ``plan`` says: ``--yes``, or a person's yes at a terminal.
    Without a terminal and without ``--yes``, Refused (exit code 2)."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise Refused(f"would {verb} {plan}; pass --yes to do it without asking", 2)
    from rich.prompt import Confirm

    return bool(Confirm.ask(f"{verb.capitalize()} {plan}?", console=out, default=False))


async def _erase(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    row = await _session(runtime, args)
    scope = Scope(row.session_id, row.user_id)
    if not _confirmed(args, out, "erase", verbs.erase_plan(row, scope)):
        out.print("nothing erased")
        return 0
    await verbs.erase(runtime, scope)
    out.print(f"erased {scope.describe()}")
    return 0


async def _cancel(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    scope = Scope(args.session, args.user)
    row, seq = await verbs.cancel(runtime, scope, args.reason)
    scope = Scope(row.session_id, row.user_id)
    out.print(
        f"cancelled run {row.last_run_id} of {scope.describe()} (seq {seq}); no worker "
        f"resumes it: `loomflow sessions resume {scope.session_id} --agent module:factory` "
        "continues it",
        markup=False,
        highlight=False,
    )
    return 0


async def _resume(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    scope = Scope(args.session, args.user)
    return _ran(out, scope, await verbs.resume(runtime, scope, args.agent, args.prompt))


async def _retry(args: argparse.Namespace, runtime: Runtime, out: Console) -> int:
    from loomflow.runtime import Scope

    scope = Scope(args.session, args.user)
    result = await verbs.retry(runtime, scope, args.agent, by="loomflow sessions retry")
    return _ran(out, scope, result)


def _ran(out: Console, scope: Scope, result: RunResult) -> int:
    """Print what became of the run (its output on the lines after)."""
    calls = count(result.model_calls, "model call")
    if result.waiting_for is not None:
        out.print(
            f"run {result.run_id} of {scope.describe()} waits for signal "
            f"{result.waiting_for!r} ({calls}); send it with `loomflow signal "
            f"{scope.session_id} {result.waiting_for}`",
            markup=False,
            highlight=False,
        )
        return 0
    out.print(
        f"run {result.run_id} of {scope.describe()}: {result.stop_reason} ({calls}, "
        f"{count(result.turns, 'turn')} in all, {cost(result.usage)})",
        markup=False,
        highlight=False,
    )
    out.print(result.output, markup=False, highlight=False)
    return 0
