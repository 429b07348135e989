"""The embedded log as both log suites use it: a SQLite file that a SqliteStore writes and
``sqlite_reader`` reads, whose audit resumes at the position its trail keeps."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from loomflow.log import LogReader, sqlite_reader
from loomflow.projections.audit import Trail
from loomflow.projections.sqlite import INSERT_EVENT
from loomflow.runtime import EventStore, Scope, SqliteStore
from loomflow.schemas import utcnow
from loomflow.testing.log import AuditedLog, Start

__all__ = ["SqliteLog"]


class SqliteLog(AuditedLog):
    """The SQLite log at ``path``: the log of :class:`~loomflow.runtime.SqliteRuntime`.

    Its consumers keep their position themselves (there are no groups), and ``erase``
    and ``prune`` delete rows from it, ``prune`` leaving a note where it did.
    """

    deletes_records = True
    starts_at_end = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._undecodable = 0

    def store(self) -> EventStore:
        return SqliteStore(self.path)

    def reader(self, start: Start) -> LogReader:
        if start == "committed":
            raise ValueError("a SQLite log has no consumer groups: start at the kept positions")
        return sqlite_reader(self.path, start=start)

    async def write_undecodable(self, scope: Scope) -> None:
        # a row of an event type no version of loomflow writes; seqs below 1 are no
        # writer's, so the row takes no seq a store appends at
        self._undecodable += 1
        await asyncio.to_thread(self._insert, scope, -self._undecodable)

    def _insert(self, scope: Scope, seq: int) -> None:
        with closing(sqlite3.connect(self.path, timeout=30)) as conn, conn:
            conn.execute(
                INSERT_EVENT,
                (
                    scope.user_id or "",
                    scope.session_id,
                    seq,
                    "no.such.type",
                    f"evt_undecodable_{-seq}",
                    "run_x",
                    0,
                    1,
                    utcnow().isoformat(),
                    None,
                    "{}",
                ),
            )

    async def audit_reader(self, trail: Trail) -> LogReader:
        return sqlite_reader(self.path, start=await trail.position() or "beginning")

    async def audited(self, trail: Trail) -> dict[int, int]:
        return await trail.position() or {0: 1}
