"""``loomflow tail``: the live log, one readable line (or one JSON object) per event."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from loomflow.cli.options import add_db_option, id_of, user_filter, user_of
from loomflow.cli.render import iso, who
from loomflow.control.source import Source, quiet_kafka
from loomflow.log.describe import describe, event_types

if TYPE_CHECKING:
    from loomflow.log.reader import LogRecord

NAMES = ("tail",)

#: characters of a message shown on an event's line


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tail = commands.add_parser(
        "tail",
        help="follow the log live, one line per event",
        description="Print each event of the log as it is appended, from now on (or from "
        "the beginning), as one readable line or as JSON; with --no-follow, the log as it "
        "is and exit. Reads with no consumer group, so it moves no one's positions. Ctrl-C "
        "stops. Exit codes: 0 done, 1 the log cannot be read (or, with --no-follow, "
        "--session has no events), 2 a usage error.",
    )
    add_db_option(tail)
    tail.add_argument("--session", type=id_of("session id"), metavar="S", help="only this session")
    tail.add_argument(
        "--user", type=user_filter, metavar="U", help="only this user's sessions ('' for none)"
    )
    tail.add_argument(
        "--type",
        type=_event_type,
        metavar="T",
        action="append",
        help="only events of this type, or of a family ending in '.*' (run.*); repeatable",
    )
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument(
        "--wide",
        action="store_true",
        help="every line whole, however wide the terminal (a pipe or a file with COLUMNS "
        "unset gets them whole anyway)",
    )
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning", action="store_true", help="the whole log first, then follow"
    )
    start.add_argument(
        "--no-follow",
        action="store_true",
        help="print the whole log as it is now, then exit (kcat's -e)",
    )
    tail.set_defaults(handler=_tail)


def _event_type(text: str) -> str:
    """A --type value: an event's type, or a family of them (``run.*``)."""
    kinds = event_types()
    if text in kinds or (text.endswith(".*") and any(_type_matches(k, text) for k in kinds)):
        return text
    families = sorted({kind.split(".")[0] + ".*" for kind in kinds})
    raise argparse.ArgumentTypeError(
        f"unknown event type {text!r}: the types are {', '.join(kinds)}; the families "
        f"{', '.join(families)}"
    )


def _tail(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    source = Source.of(args.db)
    if source is None:
        return 2
    quiet_kafka()
    try:
        return asyncio.run(_read(args, source))
    except LoomflowError as exc:
        print(f"loomflow tail: {exc}", file=sys.stderr)
        return 1
    # a reader of stdout gone (| head) raises BrokenPipeError: main() ends quietly with 0


async def _read(args: argparse.Namespace, source: Source) -> int:
    """Print the log's records that pass the filters: to its end (--no-follow), or as
    they come until Ctrl-C, or until the reader of stdout is gone."""
    from loomflow.cli.render import output_width, quiet_stdout, stdout_gone
    from loomflow.log.reader import drain

    wanted = _Filter(args.session, args.user, args.type)
    width = None if args.json else output_width(args.wide)
    start: Literal["beginning", "end"] = "end"
    if args.from_beginning or args.no_follow:
        start = "beginning"
    shown = 0

    def show(batch: list[LogRecord]) -> None:
        nonlocal shown
        for record in _in_order(batch):
            line = _line(record, args.json, width) if wanted(record) else None
            if line is not None:
                print(line, flush=True)
                shown += 1

    async with source.reader(start=start) as reader:
        if args.no_follow:
            async for batch in drain(reader):
                show(batch)
            if args.session is not None and not shown:
                user = "" if args.user is None else f" of {who(user_of(args.user))}"
                print(
                    f"loomflow tail: no events of session {args.session}{user} in {reader.source}",
                    file=sys.stderr,
                )
                return 1
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        print(f"following {reader.source}; Ctrl-C stops", file=sys.stderr, flush=True)
        while not stop.is_set():
            batch = await reader.read(wait=0.5)
            show(batch)
            if not batch and stdout_gone():
                quiet_stdout()
                break
    return 0


def _in_order(batch: list[LogRecord]) -> list[LogRecord]:
    """A read's records in the order to show them: by time, as one read may bring several
    partitions' records, but each partition's in its own order. A record without a time
    (one that does not decode, or whose signature is refused) goes where its partition
    has it, after the record before it: it sorted first, ahead of the whole read."""
    timed: list[tuple[datetime, LogRecord]] = []
    last: dict[int, datetime] = {}
    for record in batch:
        when = _when(record)
        # never before the partition's previous record, so the (stable) sort keeps it there
        after = last.get(record.partition)
        if when is None or (after is not None and when < after):
            when = after or _EARLIEST
        last[record.partition] = when
        timed.append((when, record))
    return [record for _, record in sorted(timed, key=lambda pair: pair[0])]


_EARLIEST = datetime.min.replace(tzinfo=UTC)


def _when(record: LogRecord) -> datetime | None:
    if record.event is not None:
        return record.event.at
    return record.note.at if record.note is not None else None


class _Filter:
    def __init__(self, session: str | None, user: str | None, types: list[str] | None) -> None:
        self.session = session
        self.user = user
        self.types = types or []

    def __call__(self, record: LogRecord) -> bool:
        event = record.event
        if event is None:  # a bad record or a prune note: shown unless filtered away
            return not (self.session or self.user is not None or self.types)
        if self.session is not None and event.session_id != self.session:
            return False
        if self.user is not None and event.user_id != user_of(self.user):
            return False
        return not self.types or any(_type_matches(event.type, t) for t in self.types)


def _type_matches(kind: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        return kind.startswith(pattern[:-1])
    return kind == pattern


def _line(record: LogRecord, as_json: bool, width: int | None = None) -> str:
    """The record as a line: JSON, or words fitted to ``width`` (None: whole)."""
    import orjson

    if as_json:
        if record.event is not None:
            body: dict[str, Any] = record.event.model_dump(mode="json")
            if record.signature_problem is not None:  # LOOMFLOW_SIGNATURES=check
                body["signature_problem"] = record.signature_problem
        elif record.note is not None:
            note = record.note
            body = {
                "type": "log.pruned",
                "user_id": note.user_id,
                "session_id": note.session_id,
                "seqs": note.seqs,
                "through_seq": note.through_seq,
                "at": iso(note.at),
            }
        else:
            body = {"type": "invalid", "error": record.error}
        return orjson.dumps({"position": record.position, **body}).decode()
    if record.event is None:
        if record.note is not None:
            note = record.note
            seqs = "all events" if note.seqs is None else f"{len(note.seqs)} step events"
            return _fitted(
                f"{note.at:%H:%M:%S.%f}"[:-3],
                note.session_id,
                note.user_id or "-",
                "log.pruned",
                f"{seqs} through seq {note.through_seq}",
                width,
            )
        return f"{record.position}  invalid record: {record.error}"
    event = record.event
    detail = describe(event)
    if record.signature_problem is not None:  # LOOMFLOW_SIGNATURES=check: shown, marked
        detail = f"[signature does not hold] {detail}"
    return _fitted(
        f"{event.at:%H:%M:%S.%f}"[:-3],
        event.session_id,
        event.user_id or "-",
        f"#{event.seq}  {event.type}",
        detail,
        width,
    )


#: below this width, a line's session and user are cut in the middle (sess01jx…4k2p)
_NARROW = 120


def _fitted(at: str, session: str, user: str, what: str, detail: str, width: int | None) -> str:
    """An event's line fitted to ``width`` (None: whole): in a narrow one, the session
    and user cut in the middle; then the detail cut at the end to what is left."""
    from loomflow.cli.render import ID_CELLS, USER_CELLS, middle

    def line(session: str, user: str, detail: str) -> str:
        return "  ".join(part for part in (at, session, user, what, detail) if part)

    if width is None:
        return line(session, user, detail)
    if width < _NARROW:
        session, user = middle(session, ID_CELLS), middle(user, USER_CELLS)
    if len(line(session, user, detail)) <= width:
        return line(session, user, detail)
    room = width - len(line(session, user, "")) - 2
    if len(detail) > room:
        detail = detail[: room - 1] + "…" if room > 1 else ""
    return line(session, user, detail)
