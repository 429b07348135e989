"""``loomflow audit``, ``audit digest`` and ``audit verify``: the tamper-evident trail of
the log, its signed digests, and its verification (exit code 3: checked, but newer than
what the digests commit to, or not audited yet)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.cli.options import add_db_option, id_of, user_filter, user_of
from loomflow.cli.render import count, print_json, settle
from loomflow.control.refused import Refused
from loomflow.control.source import Source, quiet_kafka, read_settings

if TYPE_CHECKING:
    from rich.console import Console

    from loomflow.audit.auditor import Verification
    from loomflow.settings import Settings

NAMES = ("audit",)

#: the exit code of a verification that found nothing wrong but could not prove all:
#: records not audited yet, or newer than the last digest
PENDING = 3


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
    digests = argparse.ArgumentParser(add_help=False)
    digests.add_argument(
        "--digests",
        metavar="PLACE",
        help="where the signed digests are: a directory, kafka:<topic>, or - (standard "
        "output; for verify, standard input); default LOOMFLOW_AUDIT_DIGESTS",
    )
    audit = commands.add_parser(
        "audit",
        parents=[common, digests],
        help="chain every event of the log into a tamper-evident audit trail",
        description="Read the log (its own consumer group on Kafka, <processor id>-audit) "
        "and append each record the read model accepts to the trail, hash-chained to its "
        "session's previous entry; the others are kept as refused, with the reason. "
        "Replaying adds nothing. With a digest place (--digests, LOOMFLOW_AUDIT_DIGESTS), "
        "a signed digest is written every LOOMFLOW_AUDIT_DIGEST_EVENTS records or "
        "LOOMFLOW_AUDIT_DIGEST_SECONDS. Then exit, or go on with --follow. One audit writes "
        "a trail at a time: one started beside it is refused (exit code 1).",
    )
    audit.add_argument("--follow", action="store_true", help="keep auditing new events")
    audit.set_defaults(handler=_audit)
    actions = audit.add_subparsers(dest="audit_action", metavar="{verify,digest}")
    digest = actions.add_parser(
        "digest",
        parents=[common, digests],
        help="audit what is new, then write a signed digest now",
        description="Bring the trail up to date with the log, then write a digest signed "
        "by the signing key (LOOMFLOW_SIGNING_KEY_FILE): the head of every session's chain "
        "since the last digest, the count of entries, the previous digest's hash. Write it "
        "where the log's writers cannot.",
    )
    digest.set_defaults(handler=_digest)
    verify = actions.add_parser(
        "verify",
        parents=[common, digests],
        help="check the trail against the log (and the digests)",
        description="Re-read the log and check each session's chain: report a deleted, "
        "reordered, inserted or altered entry with the position where the chain breaks, "
        "and an event whose signature does not hold. With digests, also a session cut "
        "short, deleted whole, or rewritten since a digest committed to it. Exit code 1 "
        "when anything is wrong, 3 when nothing is but some records are not audited yet "
        "or newer than the last digest. Erasures and prunes are shown as such.",
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


def _console(wide: bool = False, *, stderr: bool = False) -> Console:
    from loomflow.cli.render import console

    # a finding is one line, never broken, to grep; the table fits the terminal
    return console(wide=wide, soft_wrap=True, stderr=stderr)


def _audit(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    console = _console()
    source = Source.of(args.db)
    settings = read_settings()
    if source is None or settings is None:
        return 2
    if not args.follow:
        quiet_kafka()
    try:
        done = asyncio.run(
            _run_audit(source, settings, args.trail, args.follow, console, args.digests)
        )
    except (LoomflowError, Refused) as exc:
        print(f"loomflow audit: {exc}", file=sys.stderr)
        return exc.code if isinstance(exc, Refused) else 1
    console.print(done)
    return 0


def _digest(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    source = Source.of(args.db)
    settings = read_settings()
    if source is None or settings is None:
        return 2
    if (args.digests or settings.audit_digests) is None:
        print(
            "loomflow audit digest: no digest place: give --digests (a directory, "
            "kafka:<topic>, or -) or set LOOMFLOW_AUDIT_DIGESTS",
            file=sys.stderr,
        )
        return 2
    quiet_kafka()
    # with - the digest itself is the standard output: the summary goes to stderr
    console = _console(stderr=args.digests == "-" or settings.audit_digests == "-")
    try:
        done = asyncio.run(
            _run_audit(source, settings, args.trail, False, console, args.digests, now=True)
        )
    except (LoomflowError, Refused) as exc:
        print(f"loomflow audit digest: {exc}", file=sys.stderr)
        return exc.code if isinstance(exc, Refused) else 1
    console.print(done)
    return 0


async def _run_audit(
    source: Source,
    settings: Settings,
    trail_path: Path | None,
    follow: bool,
    out: Console,
    place: str | None,
    *,
    now: bool = False,
) -> str:
    """Audit the log (and go on with ``follow``), writing digests to ``place`` (or the
    settings') as they fall due, and one at the end with ``now``; what was done. Refused
    while another audit writes the trail (it audits what this one would)."""
    from loomflow.audit.auditor import Auditor
    from loomflow.audit.digests import digest_writer
    from loomflow.log.reader import require_log

    if source.db is not None:
        await require_log(source.db)  # before a trail is created beside something else
    trail = source.trail(trail_path)
    # taken before the trail opens, so that a refused audit opens (or makes) nothing
    async with source.trail_lock(trail_path) as held:
        if not held:
            raise Refused(_busy(trail.where, digest=now))
        async with trail:
            # an embedded trail keeps its position in the log; at scale the group commits it
            if source.settings is None:
                reader = source.reader(start=await trail.position() or "beginning")
            else:
                reader = source.reader(group=source.settings.audit_group, start="committed")
            async with reader:
                digests = digest_writer(trail, settings, reader.source, place)
                # `audit digest` writes one digest, when it has caught up: none as it goes
                auditor = Auditor(reader, trail, None if now else digests)
                if follow:
                    stop = asyncio.Event()
                    loop = asyncio.get_running_loop()
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        loop.add_signal_handler(signum, stop.set)
                    out.print(f"auditing {reader.source} into the {trail.where}; Ctrl-C stops")
                    await auditor.follow(stop)
                else:
                    await auditor.catch_up()
                if now and digests is not None:
                    await digests.write()
                done = auditor.done
                said = (
                    f"audited {count(done.records, 'new record')} of {reader.source} into the "
                    f"{trail.where}: {count(done.entries, 'entry')} in "
                    f"{count(len(done.sessions), 'session')}, {done.rejected} rejected"
                )
                if digests is not None and digests.written:
                    said += (
                        f"; wrote {count(len(digests.written), 'digest')}, the last to "
                        + (digests.written[-1])
                    )
                return said


def _busy(trail: str, *, digest: bool) -> str:
    """Why an audit leaves alone the trail another audit writes, and what to do instead."""
    said = f"another `loomflow audit` is writing the {trail} now (one at a time)"
    if digest:
        return (
            f"{said}: run this once it has ended (stop an `audit --follow` first; it writes "
            "digests as they fall due)"
        )
    return f"{said}, and audits what this one would: run this again once it has ended"


def _verify(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    console = _console(args.wide)
    source = Source.of(args.db)
    settings = read_settings()
    if source is None or settings is None:
        return 2
    quiet_kafka()
    filters: dict[str, Any] = {}
    if args.user is not None:
        filters["user_id"] = user_of(args.user)
    if args.session is not None:
        filters["session_id"] = args.session
    place = args.digests or settings.audit_digests
    try:
        result, log_name = asyncio.run(_run_verify(source, settings, args.trail, filters, place))
    except LoomflowError as exc:
        print(f"loomflow audit verify: {exc}", file=sys.stderr)
        return 1
    unknown = bool(filters) and not result.sessions  # not found
    code = 1 if result.problems or unknown else PENDING if result.pending else 0
    settle(code)
    if args.json:
        print_json(_verification_json(result, log_name, code=code))
        if unknown:
            what = ", ".join(f"{k}={v!r}" for k, v in filters.items())
            print(f"loomflow audit verify: no audited sessions matching {what}", file=sys.stderr)
    else:
        _print_verification(console, result, log_name, filters)
    return code


def _verification_json(result: Verification, source: str, *, code: int) -> dict[str, Any]:
    """What ``audit verify --json`` prints (fields: see the README); ``code``: the exit code."""
    digests = result.digests
    return {
        "log": source,
        "ok": code == 0,
        "pending": result.pending,
        "problems": result.problems,
        "unaudited": result.unaudited,
        "unsigned": result.unsigned,
        "refused": result.refused,
        "signatures": result.signatures,
        "digests": None
        if digests is None
        else {
            "place": digests.where,
            "count": digests.count,
            "last": None if digests.last is None else digests.last.n,
            "last_at": None if digests.last is None else digests.last.at.isoformat(),
            "findings": [{"where": f.where, "detail": f.detail} for f in digests.findings],
        },
        "sessions": [
            {
                "session_id": check.session_id,
                "user_id": check.user_id,
                "entries": check.entries,
                "erased": check.erased,
                "pruned": check.pruned,
                "pending": check.pending,
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
    source: Source,
    settings: Settings,
    trail_path: Path | None,
    filters: dict[str, Any],
    place: str | None,
) -> tuple[Verification, str]:
    """The verification of the trail against the log (and the digests at ``place``),
    and the log's name."""
    from loomflow.audit.auditor import verify_trail
    from loomflow.audit.digests import check_digests, place_of
    from loomflow.errors import SigningKeyError, StoreError
    from loomflow.log.reader import committed_offsets, require_log
    from loomflow.schemas.signing import NO_SIGNATURES

    signatures = settings.signatures_policy()
    digests = None
    if place is not None:
        keyring = settings.trusted_keys()
        if keyring is None:
            raise SigningKeyError(
                "checking signed digests needs the keys they were signed with: set "
                "LOOMFLOW_KEYRING (or LOOMFLOW_SIGNING_KEY_FILE)"
            )
        where = place_of(place, settings)
        digests = check_digests(where.source, await where.read(), keyring)
    db = source.db
    if db is not None:
        await require_log(db)
        if not (trail_path or _default_trail(db)).exists():
            raise StoreError(f"no audit trail for {db} yet: run `loomflow audit --db {db}` first")
    async with source.trail(trail_path, create=False) as trail:
        if source.settings is None:
            audited = await trail.position() or {0: 1}
        else:
            audited = await committed_offsets(source.settings, source.settings.audit_group)
        # read as it is: a record whose signature fails is named in its session, not
        # refused by the reader
        async with source.reader(start="beginning", signatures=NO_SIGNATURES) as fresh:
            result = await verify_trail(
                trail, fresh, audited, signatures=signatures, digests=digests, **filters
            )
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
    digests = result.digests
    if digests is not None:
        for problem in digests.findings:
            console.print(
                f"[red]digest[/] in the {digests.where}: {problem.where}: {problem.detail}"
            )
    if result.unsigned:
        console.print(
            f"{count(result.unsigned, 'event')} of the log not signed by a key of the keyring "
            "(LOOMFLOW_SIGNATURES=check counts them; require refuses them)"
        )
    if result.refused:
        console.print(
            f"{count(result.refused, 'record')} of the log refused by the audit (kept among "
            "the trail's rejects, with the reason: not valid for the read model, not signed, "
            "not decoded, a second copy)"
        )
    if result.unaudited:
        console.print(
            f"{count(result.unaudited, 'record')} of the log not audited yet, so not checked: "
            "run `loomflow audit` first"
        )
    newer = result.pending - result.unaudited
    if newer:
        last = digests.last if digests is not None else None
        since = f"digest {last.n} ({last.at.isoformat()})" if last else "any digest"
        console.print(
            f"{count(newer, 'entry')} of the trail newer than {since}: checked, not yet "
            "committed by a digest (`loomflow audit digest`)"
        )
    entries = sum(c.entries for c in result.sessions)
    against = (
        f" and {count(digests.count, 'digest')} of the {digests.where}"
        if digests is not None
        else ""
    )
    for line in _checked(result):
        console.print(line, soft_wrap=False)  # prose: folded to the terminal
    if result.problems:
        bad = sum(1 for c in result.sessions if c.findings)
        console.print(
            f"[red]verification failed:[/] {count(result.problems, 'problem')} in {bad} of "
            f"{count(len(result.sessions), 'session')}"
        )
    elif result.pending:
        console.print(
            f"[yellow]verification pending:[/] {count(len(result.sessions), 'session')}, "
            f"{count(entries, 'entry')} match the log{against}, but "
            f"{count(result.pending, 'record')} are not proven yet (exit code {PENDING})"
        )
    else:
        console.print(
            f"verified {count(len(result.sessions), 'session')}, {count(entries, 'entry')}: "
            f"the trail matches the log{against}"
        )


def _checked(result: Verification) -> list[str]:
    """What the verification could check, and what it could not: a success is a success
    of these checks only."""
    digests = result.digests
    if digests is None:
        against = "none given (a session cut short or deleted whole goes unseen without them)"
    elif digests.last is None:
        against = f"none in the {digests.where}"
    else:
        last = digests.last
        against = (
            f"{count(digests.count, 'digest')} of the {digests.where}, the last "
            f"({last.n}) of {last.at.isoformat(timespec='seconds')}"
        )
    signatures = {
        "off": "not checked (no keyring, or LOOMFLOW_SIGNATURES=off)",
        "check": "checked, and those that fail counted (LOOMFLOW_SIGNATURES=check)",
        "require": "required, and checked against the keyring",
    }[result.signatures]
    return [
        "checked: every session's chain against the log",
        f"digests: {against}",
        f"signatures: {signatures}",
    ]
