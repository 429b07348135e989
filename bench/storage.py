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

WORKLOADS = ("single", "big")


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
        transcript = asyncio.run(_write(directory, workload))
        disk = sum(p.stat().st_size for p in directory.glob("lf.db*"))
        return {"transcript": transcript, "disk": disk, **_account(directory / "lf.db")}


def _kb(value: int) -> str:
    return f"{value / 1000:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--page-sizes", default="4096,8192,16384")
    parser.add_argument("--json", type=Path, help="write each row's figures here (bytes)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.page_sizes.split(",") if s]
    print(
        "| workload | page | transcript KB | file KB | file / transcript | log pages KB "
        "(turn JSON / checkpoint JSON / envelope) | log index KB | checkpoints table "
        "KB | fixed KB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for workload in WORKLOADS:
        for size in sizes:
            r = _measure(workload, size)
            rows.append({"workload": workload, "passes": VARIANTS[workload][1], **r})
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
