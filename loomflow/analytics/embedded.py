"""The embedded analytics: materialised tables in a SQLite file beside the journal.

``journal.db`` gets ``journal.stats.db``. :func:`update` reads the journal's log by
position (``log.reader``) from where it stopped, counts each batch with
:class:`~loomflow.analytics.tally.Tally` and commits the new aggregates together with
the next position, in one transaction: running it again adds nothing, and a crash between
two batches loses nothing. A record that does not decode, or that :func:`admit` refuses,
is counted as skipped and its reason logged (and kept in ``stats_skipped``); it never stops
the update. :func:`load` reads the tables back as :class:`Stats`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from loomflow.analytics.tally import (
    COUNTS,
    SUMS,
    Counters,
    Mark,
    Row,
    ScopeKey,
    SessionStats,
    Stats,
    Tally,
)
from loomflow.errors import StoreError
from loomflow.log.reader import LogRecord, drain, require_log, sqlite_reader
from loomflow.projections.rows import stored_user as _uid
from loomflow.projections.sqlite import SqliteThread, open_own
from loomflow.schemas.clock import utcnow

__all__ = ["Progress", "load", "stats_path", "update"]

logger = logging.getLogger("loomflow.analytics.embedded")

T = TypeVar("T")

SCHEMA_VERSION = 1

_COUNTER_COLUMNS = (*COUNTS, *SUMS)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS stats_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- where the next read of the log starts (SQLite's log has one partition, 0)
CREATE TABLE IF NOT EXISTS stats_positions (
    partition INTEGER PRIMARY KEY,
    next_offset INTEGER NOT NULL
);
-- per UTC hour, model and user; latency is a log-scale histogram (JSON: bucket -> count),
-- tools maps each tool's name to its calls
CREATE TABLE IF NOT EXISTS stats_hourly (
    hour TEXT NOT NULL,
    model TEXT NOT NULL,
    user_id TEXT NOT NULL,
    {", ".join(f"{c} {'REAL' if c in SUMS else 'INTEGER'} NOT NULL" for c in _COUNTER_COLUMNS)},
    latency TEXT NOT NULL,
    tools TEXT NOT NULL,
    PRIMARY KEY (hour, model, user_id)
) WITHOUT ROWID;
-- per session: how far it was counted (the rules of admit) and its totals; an erased
-- session keeps its mark and loses its totals
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
"""


def stats_path(journal: Path) -> Path:
    """Where the tables of ``journal`` live by default: ``journal.db`` -> ``journal.stats.db``."""
    return journal.with_name(f"{journal.stem if journal.suffix else journal.name}.stats.db")


@dataclass(frozen=True)
class Progress:
    """What one :func:`update` did."""

    records: int
    counted: int
    skipped: int


def _connect(path: Path) -> sqlite3.Connection:
    if not path.parent.exists():
        raise StoreError(f"directory {path.parent} does not exist for the stats database {path}")
    try:
        # a file holding other tables (the journal, its trail, another program's) is
        # refused before the stats tables are written into it
        conn = open_own(path, "stats_", "loomflow stats database", create=True)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.executescript(_SCHEMA)  # IF NOT EXISTS: safe when two processes open it at once
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"stats database {path}: {exc}") from exc
    try:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT value FROM stats_meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO stats_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(
                f"stats database {path} has schema version {row[0]}, this loomflow reads "
                f"{SCHEMA_VERSION}: delete it and run loomflow stats again to rebuild it"
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn


def _load_state(conn: sqlite3.Connection, tally: Tally, scopes: Iterable[ScopeKey]) -> None:
    """Marks and totals of ``scopes``, for the batch about to be counted."""
    for user_id, session_id in scopes:
        row = conn.execute(
            "SELECT last_seq, epoch, erased, totals FROM stats_sessions "
            "WHERE user_id = ? AND session_id = ?",
            (_uid(user_id), session_id),
        ).fetchone()
        if row is None:
            continue
        tally.marks[(user_id, session_id)] = Mark(row[0], row[1], bool(row[2]))
        if row[3] is not None:
            tally.sessions[(user_id, session_id)] = SessionStats.from_json(orjson.loads(row[3]))


def _save(
    conn: sqlite3.Connection,
    tally: Tally,
    skips: list[tuple[str, str, str]],
    positions: dict[int, int],
) -> None:
    """The batch's aggregates, skips and next positions: one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for (hour, model, user), added in tally.rows.items():
            stored = conn.execute(
                f"SELECT {', '.join(_COUNTER_COLUMNS)}, latency, tools FROM stats_hourly "
                "WHERE hour = ? AND model = ? AND user_id = ?",
                (hour, model, user),
            ).fetchone()
            total = added if stored is None else _counters(stored) + added
            conn.execute(
                f"INSERT OR REPLACE INTO stats_hourly VALUES "
                f"(?, ?, ?, {', '.join('?' for _ in _COUNTER_COLUMNS)}, ?, ?)",
                (hour, model, user, *_columns(total)),
            )
        for (user_id, session_id), mark in tally.marks.items():
            session = tally.sessions.get((user_id, session_id))
            conn.execute(
                "INSERT OR REPLACE INTO stats_sessions VALUES (?, ?, ?, ?, ?, ?)",
                (
                    _uid(user_id),
                    session_id,
                    mark.last_seq,
                    mark.epoch,
                    int(mark.erased),
                    None if session is None else orjson.dumps(session.to_json()).decode(),
                ),
            )
        conn.executemany(
            "INSERT OR REPLACE INTO stats_skipped VALUES (?, ?, ?, ?)",
            [(position, kind, reason, utcnow().isoformat()) for position, kind, reason in skips],
        )
        conn.executemany(
            "INSERT OR REPLACE INTO stats_positions VALUES (?, ?)", sorted(positions.items())
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _columns(counters: Counters) -> tuple[Any, ...]:
    return (
        *(getattr(counters, c) for c in _COUNTER_COLUMNS),
        orjson.dumps(counters.latency.to_json()).decode(),
        orjson.dumps(dict(sorted(counters.tools.items()))).decode(),
    )


def _counters(row: tuple[Any, ...]) -> Counters:
    n = len(_COUNTER_COLUMNS)
    return Counters.from_json(
        {
            **dict(zip(_COUNTER_COLUMNS, row[:n], strict=True)),
            "latency": orjson.loads(row[n]),
            "tools": orjson.loads(row[n + 1]),
        }
    )


def _count(
    conn: sqlite3.Connection, batch: list[LogRecord]
) -> tuple[Tally, list[tuple[str, str, str]]]:
    """Count one batch of records against the stored marks; nothing is written yet."""
    tally = Tally()
    _load_state(
        conn,
        tally,
        {(r.event.user_id, r.event.session_id) for r in batch if r.event is not None},
    )
    skips: list[tuple[str, str, str]] = []
    for record in batch:
        if record.note is not None:
            continue  # a mark left by prune: no event, nothing to count
        if record.event is None:
            reason = record.error or "does not decode"
            logger.warning("stats: log record %s skipped: %s", record.position, reason)
            tally.skip("undecodable")
            skips.append((record.position, "undecodable", reason))
            continue
        # the embedded log may have gaps where prune removed old journal steps
        verdict = tally.add(record.event, contiguous=False)
        if verdict.refused is not None:
            kind = "duplicate" if verdict.duplicate else "refused"
            logger.warning("stats: log record %s skipped: %s", record.position, verdict.refused)
            skips.append((record.position, kind, verdict.refused))
    return tally, skips


async def update(
    journal: Path, stats: Path | None = None, *, on_batch: Callable[[int], None] | None = None
) -> Progress:
    """Bring the tables in ``stats`` (default :func:`stats_path`) up to the end of the
    journal's log; return how many records this call read, counted and skipped."""
    if not await asyncio.to_thread(journal.exists):
        raise StoreError(f"no journal at {journal}: pass the SQLite file your runtime writes")
    await require_log(journal)  # before a stats database is made beside something else
    path = stats or stats_path(journal)
    tables = SqliteThread(lambda: _connect(path), f"the stats database {path}")
    try:
        start = dict(await tables.call(_positions))
        reader = sqlite_reader(journal, start=start or "beginning")
        records = counted = skipped = 0
        async with reader:
            async for batch in drain(reader):
                tally, skips = await tables.call(_count, batch)
                await tables.call(_save, tally, skips, reader.next_positions())
                records += len(batch)
                skipped += len(skips)
                counted += sum(1 for r in batch if r.note is None) - len(skips)
                if on_batch is not None:
                    on_batch(records)
        return Progress(records, counted, skipped)
    finally:
        await tables.close()


def _positions(conn: sqlite3.Connection) -> list[tuple[int, int]]:
    return list(conn.execute("SELECT partition, next_offset FROM stats_positions"))


def load(path: Path, *, source: str = "") -> Stats:
    """The tables of a stats database as :class:`Stats` (all hours; cut with ``since``)."""
    conn = _connect(path)
    try:
        rows = [
            Row(hour, model, user, _counters(tuple(rest)))
            for hour, model, user, *rest in conn.execute(
                f"SELECT hour, model, user_id, {', '.join(_COUNTER_COLUMNS)}, latency, tools "
                "FROM stats_hourly ORDER BY hour, model, user_id"
            )
        ]
        sessions = [
            SessionStats.from_json(orjson.loads(totals))
            for (totals,) in conn.execute(
                "SELECT totals FROM stats_sessions WHERE totals IS NOT NULL"
            )
        ]
        skipped = dict(conn.execute("SELECT kind, count(*) FROM stats_skipped GROUP BY kind"))
    finally:
        conn.close()
    return Stats.gather(rows, sessions, skipped, source or f"SQLite {path}")
