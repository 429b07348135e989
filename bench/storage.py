"""Where a SqliteRuntime file's bytes go, and what SQLite's page size changes about it.

    .venv/bin/python -m bench.storage [--page-sizes 4096,8192,16384] [--json out.json]

For each workload of bench.checkpoints with one session (``single``: 200 passes of
200/600/400-character messages; ``big``: 100 passes of ~2 KB messages) and each page
size, this writes the session as that benchmark does (``lf-sqlite-keepall``: every
checkpoint kept), closes the runtime, and reports the file's size over the final
transcript's JSON, then SQLite's own account of the pages (the ``dbstat`` table): the
log's rows (the transcript events' JSON, the checkpoint events' JSON, and the columns
every event carries), its index, the checkpoints table and its index, and the tables
and indexes that hold one page each whatever the sessions (fixed cost of a file).

The ``agent-*`` workloads write the session through the public API instead, as the
issue's "3.2x" was measured: ``Agent(model=ScriptedModel(...), runtime=SqliteRuntime(path,
max_checkpoints_per_session=0), tuning=Tuning(checkpoint=True))``, one ``agent.run(prompt,
session_id=...)`` per pass (so each pass also writes the run's start and end).
``agent-big``: 100 passes of a ~2 KB prompt and a ~2 KB answer; ``agent-single``: 200
passes of a 200-character prompt and a 600-character answer. Their transcript is the one
``runtime.restore`` reads back.

``turn JSON`` and ``checkpoint JSON`` are the bytes the ``payload`` column stores, so a
compressed payload counts as its compressed size.

The page size is set on the new file before its tables are made (``PRAGMA page_size``,
which SQLite takes only then); a runtime opens the file with loomflow's own settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoints import LoomflowAdapter
from bench.workload import ASSISTANT_CHARS, SIZES, TOOL_CHARS, USER_CHARS, VARIANTS, pass_content

WORKLOADS = ("single", "big", "agent-single", "agent-big")
#: agent workload -> passes, characters of a prompt, characters of an answer
AGENT_WORKLOADS = {"agent-single": (200, 200, 600), "agent-big": (100, 2000, 2000)}


@contextmanager
def _page_size(size: int) -> Iterator[None]:
    """New store files get ``size`` as their page size while this is open."""
    from loomflow.projections.sqlite import schema

    wal = schema._wal

    def sized(conn: sqlite3.Connection, busy_timeout_ms: int) -> str:
        conn.execute(f"PRAGMA page_size = {int(size)}")  # before WAL mode and any table
        return wal(conn, busy_timeout_ms)

    schema._wal = sized
    try:
        yield
    finally:
        schema._wal = wal


async def _write(directory: Path, workload: str) -> int:
    """Write the workload's session; return its final transcript's JSON bytes."""
    _, passes = VARIANTS[workload]
    sizes = SIZES.get(workload, (USER_CHARS, ASSISTANT_CHARS, TOOL_CHARS))
    adapter = LoomflowAdapter("lf-sqlite-keepall", directory)
    await adapter.open()
    handle = await adapter.seed(0)
    for k in range(1, passes + 1):
        await adapter.put(handle, k, adapter.add(handle, k, pass_content(0, k, sizes)))
    await adapter.finish(handle)
    transcript = adapter.transcript_json_bytes(adapter.written(handle))
    await adapter.close()
    return transcript


async def _write_agent(directory: Path, workload: str) -> int:
    """Write the agent workload's session; return its final transcript's JSON bytes."""
    import random

    import orjson

    from bench.workload import SYSTEM_PROMPT, _text
    from loomflow import Agent, Tuning
    from loomflow.models import ScriptedModel
    from loomflow.runtime import Scope, SqliteRuntime

    passes, prompt_chars, answer_chars = AGENT_WORKLOADS[workload]
    rng = random.Random(7)
    prompts = [_text(rng, prompt_chars) for _ in range(passes)]
    answers = [_text(rng, answer_chars) for _ in range(passes)]
    runtime = SqliteRuntime(directory / "lf.db", max_checkpoints_per_session=0)
    agent = Agent(
        SYSTEM_PROMPT,
        model=ScriptedModel(answers),
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
    )
    for prompt in prompts:
        await agent.run(prompt, session_id="sess_storage")
    state = await runtime.restore(Scope("sess_storage"))
    assert state is not None and len(state.messages) == 1 + 2 * passes, "the session is short"
    transcript = len(orjson.dumps([m.model_dump(mode="json") for m in state.messages]))
    await runtime.close()
    return transcript


def _account(path: Path) -> dict[str, Any]:
    with sqlite3.connect(path) as conn:
        pages = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        turns, checkpoints, envelope = conn.execute(
            "SELECT sum(CASE WHEN type = 'turn.appended' THEN length(payload) END), "
            "sum(CASE WHEN type = 'checkpoint.written' THEN length(payload) END), "
            "sum(length(user_id) + length(session_id) + length(type) + length(event_id) "
            "+ length(run_id) + length(at) + 12) FROM loomflow_events"
        ).fetchone()
    log = pages.pop("loomflow_events", 0)
    index = pages.pop("loomflow_events_scope", 0)
    table = pages.pop("loomflow_checkpoints", 0) + pages.pop("loomflow_checkpoints_id", 0)
    return {
        "page": page,
        "log": log,
        "turn_json": turns or 0,
        "checkpoint_json": checkpoints or 0,
        "envelope": envelope or 0,
        "index": index,
        "checkpoints": table,
        "fixed": sum(pages.values()),
    }


def _measure(workload: str, size: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lf-storage-") as tmp, _page_size(size):
        directory = Path(tmp)
        write = _write_agent if workload in AGENT_WORKLOADS else _write
        transcript = asyncio.run(write(directory, workload))
        disk = sum(p.stat().st_size for p in directory.glob("lf.db*"))
        return {"transcript": transcript, "disk": disk, **_account(directory / "lf.db")}


def _kb(value: int) -> str:
    return f"{value / 1000:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--page-sizes", default="4096,8192,16384")
    parser.add_argument("--json", type=Path, help="write each row's figures here (bytes)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {', '.join(unknown)}: choose from {', '.join(WORKLOADS)}")
    sizes = [int(s) for s in args.page_sizes.split(",") if s]
    print(
        "| workload | page | transcript KB | file KB | file / transcript | log pages KB "
        "(turn JSON / checkpoint JSON / envelope) | log index KB | checkpoints table "
        "KB | fixed KB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for workload in workloads:
        for size in sizes:
            r = _measure(workload, size)
            agent = AGENT_WORKLOADS.get(workload)
            passes = agent[0] if agent is not None else VARIANTS[workload][1]
            rows.append({"workload": workload, "passes": passes, **r})
            print(
                f"| {workload} | {r['page']} | {_kb(r['transcript'])} | {_kb(r['disk'])} | "
                f"{r['disk'] / r['transcript']:.2f}x | {_kb(r['log'])} ({_kb(r['turn_json'])} / "
                f"{_kb(r['checkpoint_json'])} / {_kb(r['envelope'])}) | {_kb(r['index'])} | "
                f"{_kb(r['checkpoints'])} | {_kb(r['fixed'])} |"
            )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
