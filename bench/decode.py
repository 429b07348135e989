"""Decoders for a cold resume's transcript, measured on the same log rows.

    .venv/bin/python -m bench.decode [--passes 200] [--repeat 30]

A resume in a fresh process reads the session's transcript rows (one per
``turn.appended`` event: ``{"messages": [...], ...}``) and turns them into ``Message``
objects. This writes a session of the checkpoint workload (``bench.workload``) to a
SqliteRuntime, reads its rows back as the store does, and times each way of decoding
them, in this process, after one untimed call of each (so validators are built):

- ``ours``: ``decode_transcript``, what the stores run: the rows joined into one JSON array
  and validated in one pass by a pydantic TypeAdapter;
- ``pydantic validate_json of the rows``: what ``decode_transcript`` did before issue 12,
  pydantic parsing and validating the array (the rows' other fields parsed and dropped);
- ``orjson + validate_python``: orjson parses the array, pydantic validates the objects;
- ``list[Message] validate_json``: pydantic on the messages alone, pre-extracted (the
  payloads' other fields not parsed: a floor for validating from JSON);
- ``msgspec typed``: msgspec decoding into TypedDicts of the same shape (when msgspec is
  installed; not a dependency): what a faster validating decoder gives before the
  objects are made into the ``Message`` models the API returns;
- ``orjson untyped``: parsing alone, no validation and no models: the floor.

The log stores a large payload compressed (``projections/sqlite/tables.py``); the rows
are inflated first, as the store's read does, and that inflation is timed as a line of
its own. Each figure is the median of ``--repeat`` calls, in ms, with the transcript's
size; the decoders take turns call by call.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import SYSTEM_PROMPT, pass_content

try:  # not a dependency: without it, its row is left out
    _MSGSPEC: Any = importlib.import_module("msgspec")
except ImportError:
    _MSGSPEC = None


# the transcript's shape, for msgspec's typed decoder (it validates into these dicts)
class _Call(TypedDict):
    id: str
    name: str
    arguments: NotRequired[dict[str, Any]]


class _Msg(TypedDict):
    role: Literal["system", "user", "assistant", "tool"]
    content: NotRequired[str]
    tool_calls: NotRequired[list[_Call]]
    tool_call_id: NotRequired[str | None]
    is_error: NotRequired[bool]


class _Part(TypedDict):
    messages: list[_Msg]


async def _write(path: Path, passes: int) -> str:
    from loomflow.runtime import Scope, SqliteRuntime
    from loomflow.schemas import Message, ToolCall, TurnAppended, Usage, new_id
    from loomflow.schemas.events import TurnAppendedPayload

    runtime = SqliteRuntime(path, max_checkpoints_per_session=0)
    scope = Scope(new_id("sess"), None)
    writer = await runtime.open_session(scope, run_id=new_id("run"))
    system = Message.system(SYSTEM_PROMPT)
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[system]))
    for k in range(1, passes + 1):
        c = pass_content(0, k)
        call = ToolCall(id=c.call_id, name=c.tool_name, arguments=c.tool_args)
        for message, usage in (
            (Message.user(c.user), Usage()),
            (Message.assistant(c.assistant, [call]), Usage(output_tokens=c.output_tokens)),
            (Message.tool(c.call_id, c.tool_result), Usage()),
        ):
            await writer.emit(TurnAppended, TurnAppendedPayload(messages=[message], usage=usage))
    await writer.confirm()
    await runtime.close()
    return scope.session_id


def _stored(path: Path, session_id: str) -> list[tuple[int, str | bytes]]:
    """The transcript rows as the log stores them (a large payload as its zlib stream)."""
    import sqlite3

    from loomflow.projections.fold import TRANSCRIPT_TYPES

    with sqlite3.connect(path) as conn:
        marks = ",".join("?" * len(TRANSCRIPT_TYPES))
        return conn.execute(
            "SELECT seq, payload FROM loomflow_events WHERE user_id = '' AND session_id = ? "
            f"AND type IN ({marks}) ORDER BY seq",
            (session_id, *TRANSCRIPT_TYPES),
        ).fetchall()


def _inflated(stored: list[tuple[int, str | bytes]]) -> list[tuple[int, str]]:
    """The rows' payload JSON, as read_transcript hands them to decode_transcript."""
    from loomflow.projections.sqlite.tables import payload_text

    return [(seq, payload_text(payload, f"seq {seq}")) for seq, payload in stored]


def _decoders(session_id: str, rows: list[tuple[int, str]]) -> dict[str, Callable[[], Any]]:
    import orjson
    from pydantic import TypeAdapter

    from loomflow.projections.transcript import decode_transcript
    from loomflow.schemas import Message

    array = "[" + ",".join(payload for _, payload in rows) + "]"
    parts: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
    messages_only = orjson.dumps([m for p in orjson.loads(array) for m in p["messages"]])

    def with_orjson() -> list[Message]:
        return parts.validate_python([m for p in orjson.loads(array) for m in p["messages"]])

    from loomflow.projections.transcript import _parts

    def parts_json() -> list[Message]:
        return [m for part in _parts().validate_json(array) for m in part.messages]

    found: dict[str, Callable[[], Any]] = {
        "ours (decode_transcript)": lambda: decode_transcript(session_id, rows),
        "pydantic validate_json of the rows (ours before)": parts_json,
        "orjson + validate_python": with_orjson,
        "list[Message] validate_json": lambda: parts.validate_json(messages_only),
    }
    if _MSGSPEC is not None:
        decoder = _MSGSPEC.json.Decoder(list[_Part])
        found["msgspec typed (dicts, not Messages)"] = lambda: decoder.decode(array)
    found["orjson untyped (no validation)"] = lambda: orjson.loads(array)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lf-decode-") as tmp:
        path = Path(tmp) / "journal.db"
        session_id = asyncio.run(_write(path, args.passes))
        stored = _stored(path, session_id)
    rows = _inflated(stored)
    size = sum(len(payload.encode()) for _, payload in rows)
    packed = sum(1 for _, payload in stored if isinstance(payload, bytes))
    print(f"# {len(rows)} transcript rows, {size:,} B of payload JSON; median of {args.repeat}")
    print(f"# ({packed} of the rows stored compressed: their inflation is timed on its own)")
    print("# (the decoders take turns, one call each per round, so drift hits them alike)\n")
    decoders: dict[str, Callable[[], Any]] = {
        "inflating the stored rows (zlib)": lambda: _inflated(stored),
        **_decoders(session_id, rows),
    }
    for decode in decoders.values():
        decode()  # validators built, caches warm
    gc.collect()
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.repeat):
        for name, decode in decoders.items():
            started = time.perf_counter_ns()
            decode()
            times[name].append((time.perf_counter_ns() - started) / 1e6)
    print("| decoder | ms |")
    print("|---|---|")
    for name, taken in times.items():
        print(f"| {name} | {statistics.median(taken):.2f} |")


if __name__ == "__main__":
    main()
