"""A process that opens loomflow's SQLite files when told to, for tests of several
processes opening one new file at once.

``python -m tests.support.file_opener``: for each line ``KIND PATH`` read from stdin, opens
the file at PATH as loomflow opens a ``journal`` (SqliteStore), a ``trail`` (SqliteTrail),
a ``stats`` database or an ``otel`` state file, closes it and prints ``ok``, or ``error
<message>``. Blocked on its next line, every such process starts its open as soon as the
line arrives.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from loomflow.projections.audit import SqliteTrail
from loomflow.projections.sqlite.otel import connect_otel
from loomflow.projections.sqlite.stats import connect_stats
from loomflow.runtime import SqliteStore


def open_journal(path: Path) -> None:
    async def opened() -> None:
        async with SqliteStore(path):
            pass

    asyncio.run(opened())


def open_trail(path: Path) -> None:
    async def opened() -> None:
        async with SqliteTrail(path):
            pass

    asyncio.run(opened())


def open_stats(path: Path) -> None:
    connect_stats(path).close()


def open_otel(path: Path) -> None:
    connect_otel(path, f"otel state {path}").close()


OPENERS: dict[str, Callable[[Path], None]] = {
    "journal": open_journal,
    "trail": open_trail,
    "stats": open_stats,
    "otel": open_otel,
}


def main() -> None:
    for line in sys.stdin:
        kind, path = line.split(maxsplit=1)
        try:
            OPENERS[kind](Path(path.strip()))
        except Exception as exc:
            print(f"error {type(exc).__name__}: {exc}", flush=True)
        else:
            print("ok", flush=True)


if __name__ == "__main__":
    main()
