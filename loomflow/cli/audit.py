"""``loomflow audit`` and ``loomflow audit verify``: the tamper-evident trail of the log."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.cli.options import add_db_option, id_of, user_filter, user_of
from loomflow.cli.render import count, print_json
from loomflow.control.source import Source, quiet_kafka

if TYPE_CHECKING:
    from rich.console import Console

    from loomflow.audit.auditor import Verification

NAMES = ("audit",)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_db_option(common)
    common.add_argument(
        "--trail",
        type=Path,
        metavar="PATH",
        help="the audit trail of an embedded log (default: beside it, journal.db -> "
        "journal.audit.db); at scale the trail is in the LOOMFLOW_SCHEMA of PostgreSQL",
    )
    audit = commands.add_parser(
        "audit",
        parents=[common],
        help="chain every event of the log into a tamper-evident audit trail",
        description="Read the log (its own consumer group on Kafka, <processor id>-audit) "
        "and append each record to the trail, hash-chained to its session's previous "
        "entry. Replaying adds nothing. Then exit, or go on with --follow.",
    )
    audit.add_argument("--follow", action="store_true", help="keep auditing new events")
    audit.set_defaults(handler=_audit)
    actions = audit.add_subparsers(dest="audit_action", metavar="{verify}")
    verify = actions.add_parser(
        "verify",
        parents=[common],
        help="check the trail against the log",
        description="Re-read the log and check each session's chain: report a deleted, "
        "reordered, inserted or altered entry with the position where the chain breaks. "
        "Exit code 1 when anything is wrong. Erasures and prunes are shown as such.",
    )
    verify.add_argument(
        "--session", type=id_of("session id"), metavar="S", help="only this session"
    )
    verify.add_argument(
        "--user", type=user_filter, metavar="U", help="only this user's sessions ('' for none)"
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: each session's check and its findings (fields: see the README)",
    )
    verify.add_argument(
        "--wide", action="store_true", help="the table whole, however wide the terminal"
    )
    verify.set_defaults(handler=_verify)


def _console(wide: bool = False) -> Console:
    from loomflow.cli.render import console

    # a finding is one line, never broken, to grep; the table fits the terminal
    return console(wide=wide, soft_wrap=True)


def _audit(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    console = _console()
    source = Source.of(args.db)
    if source is None:
        return 2
    if not args.follow:
        quiet_kafka()
    try:
        done = asyncio.run(_run_audit(source, args.trail, args.follow, console))
    except LoomflowError as exc:
        print(f"loomflow audit: {exc}", file=sys.stderr)
        return 1
    console.print(done)
    return 0


async def _run_audit(source: Source, trail_path: Path | None, follow: bool, out: Console) -> str:
    from loomflow.audit.auditor import Auditor
    from loomflow.log.reader import require_log

    if source.db is not None:
        await require_log(source.db)  # before a trail is created beside something else
    async with source.trail(trail_path) as trail:
        # an embedded trail keeps its position in the log; at scale the group commits it
        if source.settings is None:
            reader = source.reader(start=await trail.position() or "beginning")
        else:
            reader = source.reader(group=source.settings.audit_group, start="committed")
        async with reader:
            auditor = Auditor(reader, trail)
            if follow:
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, stop.set)
                out.print(f"auditing {reader.source} into the {trail.where}; Ctrl-C stops")
                await auditor.follow(stop)
            else:
                await auditor.catch_up()
            done = auditor.done
            return (
                f"audited {count(done.records, 'new record')} of {reader.source} into the "
                f"{trail.where}: {count(done.entries, 'entry')} in "
                f"{count(len(done.sessions), 'session')}, {done.rejected} rejected"
            )


def _verify(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    console = _console(args.wide)
    source = Source.of(args.db)
    if source is None:
        return 2
    quiet_kafka()
    filters: dict[str, Any] = {}
    if args.user is not None:
        filters["user_id"] = user_of(args.user)
    if args.session is not None:
        filters["session_id"] = args.session
    try:
        result, log_name = asyncio.run(_run_verify(source, args.trail, filters))
    except LoomflowError as exc:
        print(f"loomflow audit verify: {exc}", file=sys.stderr)
        return 1
    unknown = bool(filters) and not result.sessions  # not found
    if args.json:
        print_json(_verification_json(result, log_name, ok=not (result.problems or unknown)))
        if unknown:
            what = ", ".join(f"{k}={v!r}" for k, v in filters.items())
            print(f"loomflow audit verify: no audited sessions matching {what}", file=sys.stderr)
    else:
        _print_verification(console, result, log_name, filters)
    return 1 if result.problems or unknown else 0


def _verification_json(result: Verification, source: str, *, ok: bool) -> dict[str, Any]:
    """What ``audit verify --json`` prints (fields: see the README); ``ok``: exit code 0."""
    return {
        "log": source,
        "ok": ok,
        "problems": result.problems,
        "unaudited": result.unaudited,
        "sessions": [
            {
                "session_id": check.session_id,
                "user_id": check.user_id,
                "entries": check.entries,
                "erased": check.erased,
                "pruned": check.pruned,
                "findings": [
                    {
                        "kind": finding.kind,
                        "entry": finding.n,
                        "position": finding.position or None,
                        "detail": finding.detail,
                    }
                    for finding in check.findings
                ],
            }
            for check in result.sessions
        ],
    }


async def _run_verify(
    source: Source, trail_path: Path | None, filters: dict[str, Any]
) -> tuple[Verification, str]:
    """The verification of the trail against the log, and the log's name."""
    from loomflow.audit.auditor import verify_trail
    from loomflow.log.reader import committed_offsets, require_log

    db = source.db
    if db is not None:
        await require_log(db)
        if not (trail_path or _default_trail(db)).exists():
            from loomflow.errors import StoreError

            raise StoreError(f"no audit trail for {db} yet: run `loomflow audit --db {db}` first")
    async with source.trail(trail_path, create=False) as trail:
        if source.settings is None:
            audited = await trail.position() or {0: 1}
        else:
            audited = await committed_offsets(source.settings, source.settings.audit_group)
        async with source.reader(start="beginning") as fresh:
            result = await verify_trail(trail, fresh, audited, **filters)
            return result, fresh.source


def _default_trail(db: Path) -> Path:
    from loomflow.projections.audit import default_trail_path

    return default_trail_path(db)


def _print_verification(
    console: Console, result: Verification, source: str, filters: dict[str, Any]
) -> None:
    from loomflow.cli.render import ID_CELLS, USER_CELLS, Cell, Column, Fitted

    if not result.sessions:
        what = " matching " + ", ".join(f"{k}={v!r}" for k, v in filters.items()) if filters else ""
        console.print(f"no audited sessions{what} in {source}")
        if filters:
            return  # not found
    rows: list[list[str | Cell]] = []
    for check in result.sessions:
        removed = "erased" if check.erased else f"pruned x{check.pruned}" if check.pruned else ""
        found = len(check.findings)
        rows.append(
            [
                check.session_id,
                check.user_id or "-",
                str(check.entries),
                removed,
                Cell(count(found, "problem"), style="red") if found else Cell("ok", style="green"),
            ]
        )
    if result.sessions:
        columns = [
            Column("session", cut=ID_CELLS),
            Column("user", cut=USER_CELLS),
            Column("entries", numeric=True),
            Column("erased / pruned"),
            Column("status"),
        ]
        console.print(Fitted(columns, rows))
        console.print()
    for check in result.sessions:
        for finding in check.findings:
            where = f"entry {finding.n}" if finding.n is not None else "no entry"
            log = f", log {finding.position}" if finding.position else ""
            console.print(
                f"[red]{finding.kind}[/] in session {check.session_id} "
                f"(user {check.user_id or '-'}) at {where}{log}: {finding.detail}"
            )
    if result.unaudited:
        console.print(
            f"{result.unaudited} records of the log were not audited yet and were not "
            "checked: run `loomflow audit` first"
        )
    entries = sum(c.entries for c in result.sessions)
    if result.problems:
        bad = sum(1 for c in result.sessions if c.findings)
        console.print(
            f"[red]verification failed:[/] {count(result.problems, 'problem')} in {bad} of "
            f"{count(len(result.sessions), 'session')}"
        )
    else:
        console.print(
            f"verified {count(len(result.sessions), 'session')}, {count(entries, 'entry')}: "
            "the trail matches the log"
        )
