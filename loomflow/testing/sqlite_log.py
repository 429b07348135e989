"""The embedded log as both log suites use it: a SQLite file that a SqliteStore writes and
``sqlite_reader`` reads, whose audit resumes at the position its trail keeps."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from loomflow.log import LogReader, sqlite_reader
from loomflow.projections.audit import Trail
from loomflow.projections.rows import stored_user
from loomflow.projections.sqlite import INSERT_EVENT
from loomflow.projections.sqlite.writes import insert_event
from loomflow.runtime import EventStore, Scope, SqliteStore
from loomflow.schemas import Event, utcnow
from loomflow.schemas.signing import NO_SIGNATURES, Signatures
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

    async def forge(self, event: Event) -> None:
        await self._tamper(lambda conn: insert_event(conn, event))

    async def cut(self, scope: Scope, seqs: Sequence[int]) -> None:
        await self._tamper(
            lambda conn: conn.executemany(
                "DELETE FROM loomflow_events WHERE user_id = ? AND session_id = ? AND seq = ?",
                [(stored_user(scope.user_id), scope.session_id, seq) for seq in seqs],
            )
        )

    async def rewrite(self, event: Event) -> None:
        def replace(conn: sqlite3.Connection) -> None:
            # the row keeps its position: the record is changed where it is
            (position,) = conn.execute(
                "DELETE FROM loomflow_events WHERE user_id = ? AND session_id = ? AND seq = ? "
                "RETURNING position",
                (stored_user(event.user_id), event.session_id, event.seq),
            ).fetchone()
            insert_event(conn, event)
            conn.execute(
                "UPDATE loomflow_events SET position = ? WHERE position = "
                "(SELECT max(position) FROM loomflow_events)",
                (position,),
            )

        await self._tamper(replace)

    async def _tamper(self, change: Callable[[sqlite3.Connection], Any]) -> None:
        def run() -> None:
            with closing(sqlite3.connect(self.path, timeout=30)) as conn, conn:
                change(conn)

        await asyncio.to_thread(run)

    async def audit_reader(self, trail: Trail, signatures: Signatures = NO_SIGNATURES) -> LogReader:
        kept = await trail.position()
        return sqlite_reader(self.path, start=kept or "beginning", signatures=signatures)

    async def audited(self, trail: Trail) -> dict[int, int]:
        return await trail.position() or {0: 1}
