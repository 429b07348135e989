"""What a resume after a crash costs a user: a new process imports loomflow, opens the
SQLite file and restores the session.

    .venv/bin/python -m bench.fresh_resume make /tmp/fresh.db [--passes 400]
    .venv/bin/python -m bench.fresh_resume run /tmp/fresh.db --tree . --tree /tmp/old [--runs 5]
    .venv/bin/python -m bench.fresh_resume imports [--runs 15]

``make`` writes one session with this checkout's code. ``run`` starts ``--runs`` new
interpreters per tree, alternating between the trees, each with the tree as its working
directory (so that tree's ``loomflow`` is the one imported; give a directory holding a
``loomflow`` package, e.g. from ``git archive <commit> loomflow``). Each process times its
imports and its ``runtime.restore``; the table gives medians and the min-max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SESSION = "s1"

# run in each new process: only the public API, so any tree of the project can run it
_PROBE = """
import json, sys, time
t0 = time.perf_counter()
import asyncio
from loomflow.runtime import Scope, SqliteRuntime
t1 = time.perf_counter()

async def restore():
    runtime = SqliteRuntime(sys.argv[1])
    try:
        return await runtime.restore(Scope(sys.argv[2]))
    finally:
        await runtime.close()

state = asyncio.run(restore())
t2 = time.perf_counter()
print(json.dumps({"import": (t1 - t0) * 1e3, "restore": (t2 - t1) * 1e3,
                  "messages": len(state.messages)}))
"""


async def _make(path: Path, passes: int) -> None:
    from loomflow.runtime import SqliteRuntime
    from loomflow.testing.scenario import Research

    async with SqliteRuntime(path) as runtime:
        research = Research(passes=passes)
        await research.agent(runtime).run("Research.", session_id=SESSION)


def _probe(tree: Path, db: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / db.name  # the restore reads a copy: every run starts equal
        shutil.copy(db, copy)
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(copy), SESSION],
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
    figures: dict[str, float] = json.loads(done.stdout)
    return figures


def _run(db: Path, trees: list[Path], runs: int) -> None:
    results: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for _ in range(runs):
        for tree in trees:
            results[tree].append(_probe(tree, db))
    print(f"resume in a new process: {runs} runs per tree, alternating; medians (min-max) ms\n")
    print("| tree | messages | import | restore | total |")
    print("|---|---|---|---|---|")
    for tree, rows in results.items():
        cells = []
        for key in ("import", "restore"):
            values = [row[key] for row in rows]
            cells.append(f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})")
        totals = [row["import"] + row["restore"] for row in rows]
        cells.append(f"{statistics.median(totals):.0f} ({min(totals):.0f}-{max(totals):.0f})")
        print(f"| {tree} | {int(rows[0]['messages'])} | {' | '.join(cells)} |")


#: what ``imports`` times, after an empty interpreter: the floor of any pydantic-based
#: package (pydantic and asyncio), then ours
_IMPORTS = (
    "import asyncio",
    "import asyncio, pydantic; from pydantic import BaseModel",
    "import loomflow",
    "from loomflow import Agent, SqliteRuntime",
)


def _wall_ms(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return (time.perf_counter() - started) * 1e3


def _imports(runs: int) -> None:
    empty = statistics.median(_wall_ms("pass") for _ in range(runs))
    print(f"new interpreters, median of {runs}, ms over an empty one ({empty:.0f} ms)\n")
    print("| statement | ms |")
    print("|---|---|")
    for statement in _IMPORTS:
        wall = statistics.median(_wall_ms(statement) for _ in range(runs))
        print(f"| `{statement}` | {wall - empty:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make", help="write the session to resume")
    make.add_argument("db", type=Path)
    make.add_argument("--passes", type=int, default=400)
    run = commands.add_parser("run", help="time a resume in new processes, per tree")
    run.add_argument("db", type=Path)
    run.add_argument("--tree", type=Path, action="append", required=True)
    run.add_argument("--runs", type=int, default=5)
    imports = commands.add_parser("imports", help="time imports in new interpreters")
    imports.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    if args.command == "imports":
        _imports(args.runs)
    elif args.command == "make":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{args.db}{suffix}").unlink(missing_ok=True)
        asyncio.run(_make(args.db, args.passes))
    else:
        _run(args.db.resolve(), [t.resolve() for t in args.tree], args.runs)


if __name__ == "__main__":
    main()
