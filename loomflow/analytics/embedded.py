"""The embedded analytics: materialised tables in a SQLite file beside the journal.

``journal.db`` gets ``journal.stats.db``. :func:`update` reads the journal's log by
position (``log.reader``) from where it stopped, counts each batch with
:class:`~loomflow.analytics.tally.Tally` and commits the new aggregates together with
the next position, in one transaction: running it again adds nothing, and a crash between
two batches loses nothing. A record that does not decode, or that :func:`admit` refuses,
is counted as skipped and its reason logged (and kept in ``stats_skipped``); it never stops
the update. So is an event whose signature the reader's rule refuses (kind
``unverified``); one it only marks (``check``) is counted, and tallied in ``Progress``.
:func:`load` reads the tables back as :class:`Stats`. The file's tables, their
migrations and statements are the SQLite dialect's (``projections/sqlite/stats.py``).
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
from loomflow.projections.sqlite import SqliteThread, immediate
from loomflow.projections.sqlite import stats as sql
from loomflow.schemas.clock import utcnow
from loomflow.schemas.signing import NO_SIGNATURES, Signatures

__all__ = ["Progress", "load", "stats_path", "update"]

logger = logging.getLogger("loomflow.analytics.embedded")

T = TypeVar("T")

#: the counter columns of stats_hourly, as projections/sqlite/stats.py's migrations made them
_COUNTER_COLUMNS = (*COUNTS, *SUMS)


def stats_path(journal: Path) -> Path:
    """Where the tables of ``journal`` live by default: ``journal.db`` -> ``journal.stats.db``."""
    return journal.with_name(f"{journal.stem if journal.suffix else journal.name}.stats.db")


@dataclass(frozen=True)
class Progress:
    """What one :func:`update` did."""

    records: int
    counted: int
    skipped: int
    #: counted although their signature does not hold (signatures in ``check`` mode)
    unverified: int = 0


def _load_state(conn: sqlite3.Connection, tally: Tally, scopes: Iterable[ScopeKey]) -> None:
    """Marks and totals of ``scopes``, for the batch about to be counted."""
    for user_id, session_id in scopes:
        row = sql.session_mark(conn, _uid(user_id), session_id)
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
    with immediate(conn):
        hourly = []
        for (hour, model, user), added in tally.rows.items():
            stored = sql.hourly_row(conn, _COUNTER_COLUMNS, hour, model, user)
            total = added if stored is None else _counters(stored) + added
            hourly.append((hour, model, user, *_columns(total)))
        sql.put_hourly(conn, _COUNTER_COLUMNS, hourly)
        sessions = []
        for (user_id, session_id), mark in tally.marks.items():
            session = tally.sessions.get((user_id, session_id))
            sessions.append(
                (
                    _uid(user_id),
                    session_id,
                    mark.last_seq,
                    mark.epoch,
                    int(mark.erased),
                    None if session is None else orjson.dumps(session.to_json()).decode(),
                )
            )
        sql.put_sessions(conn, sessions)
        sql.put_skipped(
            conn,
            [(position, kind, reason, utcnow().isoformat()) for position, kind, reason in skips],
        )
        sql.put_positions(conn, sorted(positions.items()))


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
            kind = "undecodable" if record.signature_problem is None else "unverified"
            logger.warning("stats: log record %s skipped: %s", record.position, reason)
            tally.skip(kind)
            skips.append((record.position, kind, reason))
            continue
        if record.signature_problem is not None:
            logger.warning(
                "stats: log record %s counted, but %s", record.position, record.signature_problem
            )
        # the embedded log may have gaps where prune removed old journal steps
        verdict = tally.add(record.event, contiguous=False)
        if verdict.refused is not None:
            kind = "duplicate" if verdict.duplicate else "refused"
            logger.warning("stats: log record %s skipped: %s", record.position, verdict.refused)
            skips.append((record.position, kind, verdict.refused))
    return tally, skips


async def update(
    journal: Path,
    stats: Path | None = None,
    *,
    on_batch: Callable[[int], None] | None = None,
    signatures: Signatures = NO_SIGNATURES,
) -> Progress:
    """Bring the tables in ``stats`` (default :func:`stats_path`) up to the end of the
    journal's log, reading it with the rule of ``signatures``; return how many records
    this call read, counted and skipped."""
    if not await asyncio.to_thread(journal.exists):
        raise StoreError(f"no journal at {journal}: pass the SQLite file your runtime writes")
    await require_log(journal)  # before a stats database is made beside something else
    path = stats or stats_path(journal)
    tables = SqliteThread(lambda: sql.connect_stats(path), f"the stats database {path}")
    try:
        start = dict(await tables.call(sql.positions))
        reader = sqlite_reader(journal, start=start or "beginning", signatures=signatures)
        records = counted = skipped = unverified = 0
        async with reader:
            async for batch in drain(reader):
                tally, skips = await tables.call(_count, batch)
                await tables.call(_save, tally, skips, reader.next_positions())
                records += len(batch)
                skipped += len(skips)
                counted += sum(1 for r in batch if r.note is None) - len(skips)
                unverified += sum(1 for r in batch if r.event and r.signature_problem)
                if on_batch is not None:
                    on_batch(records)
        return Progress(records, counted, skipped, unverified)
    finally:
        await tables.close()


def load(path: Path, *, source: str = "") -> Stats:
    """The tables of a stats database as :class:`Stats` (all hours; cut with ``since``)."""
    conn = sql.connect_stats(path)
    try:
        rows = [
            Row(hour, model, user, _counters(tuple(rest)))
            for hour, model, user, *rest in sql.hourly_rows(conn, _COUNTER_COLUMNS)
        ]
        sessions = [
            SessionStats.from_json(orjson.loads(totals)) for totals in sql.session_totals(conn)
        ]
        skipped = sql.skipped_counts(conn)
    finally:
        conn.close()
    return Stats.gather(rows, sessions, skipped, source or f"SQLite {path}")
