"""``loomflow tail``: the live log, one readable line (or one JSON object) per event."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from loomflow.cli.options import add_db_option, user_of
from loomflow.cli.stores import Source, quiet_kafka

if TYPE_CHECKING:
    from loomflow.log.reader import LogRecord
    from loomflow.schemas import Event

NAMES = ("tail",)

#: characters of a message shown on an event's line
_PREVIEW = 80


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tail = commands.add_parser(
        "tail",
        help="follow the log live, one line per event",
        description="Print each event of the log as it is appended, from now on (or from "
        "the beginning), as one readable line or as JSON. Reads with no consumer group, so "
        "it moves no one's positions. Ctrl-C stops.",
    )
    add_db_option(tail)
    tail.add_argument("--session", metavar="S", help="only this session")
    tail.add_argument("--user", metavar="U", help="only this user's sessions ('' for none)")
    tail.add_argument(
        "--type",
        metavar="T",
        action="append",
        help="only events of this type, or of a family ending in '.*' (run.*); repeatable",
    )
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument(
        "--from-beginning", action="store_true", help="the whole log first, then follow"
    )
    tail.set_defaults(handler=_tail)


def _tail(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError

    source = Source.of(args.db)
    if source is None:
        return 2
    quiet_kafka()
    start = "beginning" if args.from_beginning else "end"
    try:
        asyncio.run(_follow(args, source, start))
    except LoomflowError as exc:
        print(f"loomflow tail: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (| head): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


async def _follow(args: argparse.Namespace, source: Source, start: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    wanted = _Filter(args.session, args.user, args.type)
    async with source.reader(start=start) as reader:
        print(f"following {reader.source}; Ctrl-C stops", file=sys.stderr, flush=True)
        while not stop.is_set():
            # one poll may bring several partitions' records: show them in time order
            for record in sorted(await reader.read(wait=0.5), key=_when):
                line = _line(record, args.json) if wanted(record) else None
                if line is not None:
                    print(line, flush=True)


def _when(record: LogRecord) -> datetime:
    if record.event is not None:
        return record.event.at
    return record.note.at if record.note is not None else datetime.min.replace(tzinfo=UTC)


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


def _line(record: LogRecord, as_json: bool) -> str:
    import orjson

    if as_json:
        if record.event is not None:
            body: dict[str, Any] = record.event.model_dump(mode="json")
        elif record.note is not None:
            note = record.note
            body = {
                "type": "log.pruned",
                "user_id": note.user_id,
                "session_id": note.session_id,
                "seqs": note.seqs,
                "through_seq": note.through_seq,
                "at": note.at.isoformat(),
            }
        else:
            body = {"type": "invalid", "error": record.error}
        return orjson.dumps({"position": record.position, **body}).decode()
    if record.event is None:
        if record.note is not None:
            note = record.note
            seqs = "all events" if note.seqs is None else f"{len(note.seqs)} step events"
            return (
                f"{note.at:%H:%M:%S.%f}"[:-3]
                + f"  {note.session_id}  {note.user_id or '-'}  log.pruned  {seqs} through "
                f"seq {note.through_seq}"
            )
        return f"{record.position}  invalid record: {record.error}"
    event = record.event
    head = (
        f"{event.at:%H:%M:%S.%f}"[:-3]
        + f"  {event.session_id}  {event.user_id or '-'}  #{event.seq}  {event.type}"
    )
    detail = describe(event)
    return f"{head}  {detail}" if detail else head


def describe(event: Event) -> str:
    """What an event says, in a few words."""
    import orjson

    from loomflow.schemas import (
        CheckpointWritten,
        RunCancelled,
        RunFailed,
        RunFinished,
        RunStarted,
        RunWaiting,
        SessionForked,
        SignalSent,
        StepRecorded,
        TurnAppended,
    )

    match event:
        case TurnAppended(payload=p):
            parts = []
            for m in p.messages:
                text = _short(m.content)
                calls = ", ".join(f"{c.name}({_args(c.arguments)})" for c in m.tool_calls)
                said = f"{m.role.value}: {text}" if text else m.role.value
                parts.append(f"{said} -> {calls}" if calls else said)
            usage = p.usage
            if p.model_call:
                parts.append(
                    f"[{usage.input_tokens} in / {usage.output_tokens} out tokens, "
                    f"${usage.cost_usd:.4f}]"
                )
            return " | ".join(parts)
        case RunStarted(payload=p):
            text = p.mode + (f" from {p.from_checkpoint}" if p.from_checkpoint else "")
            text += f" by worker {p.worker}" if p.worker else ""
            return text + (f", interrupting run {p.interrupted}" if p.interrupted else "")
        case RunWaiting(payload=p):
            until = f" until {p.until:%Y-%m-%d %H:%M:%S} UTC" if p.until else ""
            return f"for signal {p.signal!r} in a {p.where.replace('_', ' ')}{until}"
        case SignalSent(payload=p):
            return f"{p.name}: {_short(orjson.dumps(p.data).decode())}"
        case RunFinished(payload=p):
            turns = "1 turn" if p.turns == 1 else f"{p.turns} turns"
            return (
                f"{p.stop_reason} after {turns}, {p.usage.total_tokens} tokens, "
                f"${p.usage.cost_usd:.4f}: {_short(p.output)}"
            )
        case RunFailed(payload=p):
            return ("parked: " if p.parked else "") + f"{p.error_type}: {_short(p.error)}"
        case RunCancelled(payload=p):
            return _short(p.reason) if p.reason else "no reason given"
        case CheckpointWritten(payload=p):
            return f"{p.checkpoint_id} at turn {p.turn}, {p.message_count} messages"
        case SessionForked(payload=p):
            return f"from {p.parent_session_id} at {p.parent_checkpoint_id}"
        case StepRecorded(payload=p):
            received = f" (received signal #{p.signal_seq})" if p.signal_seq else ""
            return p.step_key + received
    return ""


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _PREVIEW else flat[: _PREVIEW - 1] + "…"


def _args(arguments: dict[str, Any]) -> str:
    return _short(", ".join(f"{k}={v!r}" for k, v in arguments.items()))
