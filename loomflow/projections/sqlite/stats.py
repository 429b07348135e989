"""The stats database of the embedded analytics (``journal.stats.db``): its tables, their
migrations and every statement of it. What the rows add up to is
``analytics/embedded.py``'s; the counter columns of ``stats_hourly`` are analytics'
counters (``analytics.tally.COUNTS`` then ``SUMS``), which the caller names."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loomflow.errors import StoreError
from loomflow.projections.migrations import Migrations
from loomflow.projections.sqlite.schema import connect_own

__all__ = [
    "STATS",
    "connect_stats",
    "hourly_row",
    "hourly_rows",
    "positions",
    "put_hourly",
    "put_positions",
    "put_sessions",
    "put_skipped",
    "session_mark",
    "session_totals",
    "skipped_counts",
]

#: the stats file. Step 1 is the tables stats databases had before this scheme, whose
#: version row already said 1 (written after the tables, so a file without it is at 0).
STATS = Migrations(
    meta="stats_meta",
    steps=(
        """
        -- where the next read of the log starts (SQLite's log has one partition, 0)
        CREATE TABLE IF NOT EXISTS stats_positions (
            partition INTEGER PRIMARY KEY,
            next_offset INTEGER NOT NULL
        );
        -- per UTC hour, model and user; latency is a log-scale histogram (JSON: bucket ->
        -- count), tools maps each tool's name to its calls
        CREATE TABLE IF NOT EXISTS stats_hourly (
            hour TEXT NOT NULL,
            model TEXT NOT NULL,
            user_id TEXT NOT NULL,
            runs_started INTEGER NOT NULL,
            runs_finished INTEGER NOT NULL,
            runs_failed INTEGER NOT NULL,
            turns INTEGER NOT NULL,
            model_calls INTEGER NOT NULL,
            input_tokens INTEGER NOT NULL,
            cached_input_tokens INTEGER NOT NULL,
            cache_write_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            cost_usd REAL NOT NULL,
            latency_ms_total REAL NOT NULL,
            latency TEXT NOT NULL,
            tools TEXT NOT NULL,
            PRIMARY KEY (hour, model, user_id)
        ) WITHOUT ROWID;
        -- per session: how far it was counted (the rules of admit) and its totals; an
        -- erased session keeps its mark and loses its totals
        CREATE TABLE IF NOT EXISTS stats_sessions (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            last_seq INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            erased INTEGER NOT NULL,
            totals TEXT,
            PRIMARY KEY (user_id, session_id)
        ) WITHOUT ROWID;
        -- every record that did not count, with why
        CREATE TABLE IF NOT EXISTS stats_skipped (
            position TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            reason TEXT NOT NULL,
            at TEXT NOT NULL
        ) WITHOUT ROWID;
        """,
    ),
)

#: a row of stats_hourly before and after its counters
_KEY = ("hour", "model", "user_id")
_AFTER = ("latency", "tools")


def connect_stats(path: Path) -> sqlite3.Connection:
    """Open (or create) the stats database at ``path``, migrated; a file holding other
    tables (the journal, its trail, another program's) is refused before the stats
    tables are written into it."""
    if not path.parent.exists():
        raise StoreError(f"directory {path.parent} does not exist for the stats database {path}")
    return connect_own(path, STATS, "stats_", "loomflow stats database", create=True)


def positions(conn: sqlite3.Connection) -> list[tuple[int, int]]:
    """Partition -> the log position the next update reads from."""
    return list(conn.execute("SELECT partition, next_offset FROM stats_positions"))


def session_mark(conn: sqlite3.Connection, user_id: str, session_id: str) -> tuple[Any, ...] | None:
    """A session's (last_seq, epoch, erased, totals as JSON or None); None when it was
    never counted. ``user_id`` as stored (``rows.stored_user``)."""
    row = conn.execute(
        "SELECT last_seq, epoch, erased, totals FROM stats_sessions "
        "WHERE user_id = ? AND session_id = ?",
        (user_id, session_id),
    ).fetchone()
    return None if row is None else tuple(row)


def hourly_row(
    conn: sqlite3.Connection, counters: Sequence[str], hour: str, model: str, user: str
) -> tuple[Any, ...] | None:
    """One row of stats_hourly: its ``counters`` then latency and tools; None when the
    hour has none for this model and user."""
    row = conn.execute(
        f"SELECT {', '.join((*counters, *_AFTER))} FROM stats_hourly "
        "WHERE hour = ? AND model = ? AND user_id = ?",
        (hour, model, user),
    ).fetchone()
    return None if row is None else tuple(row)


def hourly_rows(conn: sqlite3.Connection, counters: Sequence[str]) -> list[tuple[Any, ...]]:
    """Every row of stats_hourly (hour, model, user, ``counters``, latency, tools), by hour,
    model and user."""
    return [
        tuple(row)
        for row in conn.execute(
            f"SELECT {', '.join((*_KEY, *counters, *_AFTER))} FROM stats_hourly "
            "ORDER BY hour, model, user_id"
        )
    ]


def put_hourly(
    conn: sqlite3.Connection, counters: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Write rows of stats_hourly (hour, model, user, ``counters``, latency, tools), each
    replacing the one of its hour, model and user."""
    columns = (*_KEY, *counters, *_AFTER)
    conn.executemany(
        f"INSERT OR REPLACE INTO stats_hourly ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' for _ in columns)})",
        rows,
    )


def put_sessions(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
    """Write sessions' marks: (user as stored, session, last_seq, epoch, erased, totals)."""
    conn.executemany(
        "INSERT OR REPLACE INTO stats_sessions "
        "(user_id, session_id, last_seq, epoch, erased, totals) VALUES (?, ?, ?, ?, ?, ?)",
        rows,
    )


def put_skipped(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
    """Keep records that did not count: (position, kind, reason, at)."""
    conn.executemany(
        "INSERT OR REPLACE INTO stats_skipped (position, kind, reason, at) VALUES (?, ?, ?, ?)",
        rows,
    )


def put_positions(conn: sqlite3.Connection, rows: Sequence[tuple[int, int]]) -> None:
    """Where the next update reads from: (partition, next position)."""
    conn.executemany(
        "INSERT OR REPLACE INTO stats_positions (partition, next_offset) VALUES (?, ?)", rows
    )


def session_totals(conn: sqlite3.Connection) -> list[str]:
    """The totals (JSON) of every session that still has them."""
    return [
        totals
        for (totals,) in conn.execute("SELECT totals FROM stats_sessions WHERE totals IS NOT NULL")
    ]


def skipped_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """How many records were skipped, by kind."""
    return dict(conn.execute("SELECT kind, count(*) FROM stats_skipped GROUP BY kind"))
