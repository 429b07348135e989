"""The state file of ``loomflow otel`` beside an embedded log (``journal.otel.db``): its
tables, their migrations and every statement of it. What a state holds is
``loomflow/otel``'s; here it is JSON text per session."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from loomflow.errors import StoreError
from loomflow.projections.migrations import Migrations
from loomflow.projections.sqlite.schema import connect_own, immediate

__all__ = ["OTEL", "connect_otel", "otel_positions", "otel_states", "put_otel"]

#: the state file. Step 1 is the tables the first state files had (their version row
#: already said 1).
OTEL = Migrations(
    meta="otel_meta",
    steps=(
        """
        -- where the next read of the log starts (an embedded log has one partition, 0)
        CREATE TABLE IF NOT EXISTS otel_positions (
            partition INTEGER PRIMARY KEY,
            next_offset INTEGER NOT NULL
        );
        -- per session: how far it was read, its run in flight (the span so far), its
        -- last run
        CREATE TABLE IF NOT EXISTS otel_sessions (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (user_id, session_id)
        ) WITHOUT ROWID;
        """,
    ),
)


def connect_otel(path: Path, where: str) -> sqlite3.Connection:
    """Open (or create) the state file at ``path``, migrated; a file holding other tables
    (the journal, its trail) is refused untouched."""
    if not path.parent.exists():
        raise StoreError(f"directory {path.parent} does not exist for the {where}")
    return connect_own(path, OTEL, "otel_", "loomflow otel state", create=True)


def otel_states(
    conn: sqlite3.Connection, scopes: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """The stored state (JSON) of each of these sessions that has one, keyed by (user as
    stored, session)."""
    states = {}
    for user_id, session_id in scopes:
        row = conn.execute(
            "SELECT state FROM otel_sessions WHERE user_id = ? AND session_id = ?",
            (user_id, session_id),
        ).fetchone()
        if row is not None:
            states[(user_id, session_id)] = str(row[0])
    return states


def put_otel(
    conn: sqlite3.Connection,
    rows: Sequence[tuple[str, str, str]],
    position: dict[int, int] | None,
) -> None:
    """Store sessions' states (user as stored, session, JSON) and, when given, the
    position reached, in one transaction."""
    with immediate(conn):
        conn.executemany(
            "INSERT OR REPLACE INTO otel_sessions (user_id, session_id, state) VALUES (?, ?, ?)",
            rows,
        )
        if position:
            conn.executemany(
                "INSERT OR REPLACE INTO otel_positions (partition, next_offset) VALUES (?, ?)",
                sorted(position.items()),
            )


def otel_positions(conn: sqlite3.Connection) -> dict[int, int]:
    """Partition -> the next position to read, as the last save left it."""
    rows = conn.execute("SELECT partition, next_offset FROM otel_positions").fetchall()
    return {int(p): int(o) for p, o in rows}
