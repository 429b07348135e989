"""Queries of the SQLite log and read model: sessions, checkpoints, journal steps, events
and transcripts, each scoped by (user, session)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from loomflow.errors import CorruptRecordError
from loomflow.projections.apply import Seq
from loomflow.projections.fold import TRANSCRIPT_TYPES, CheckpointRow, StepRow
from loomflow.projections.rows import (
    SESSION_FIELDS,
    checkpoint_from_row,
    decoded_events,
    session_from_row,
    stored_user,
    totals_from_row,
)
from loomflow.projections.sqlite.tables import (
    CHECKPOINT_COLUMNS,
    EVENT_COLUMNS,
    NOTE_COLUMNS,
    SESSION_USAGE_COLUMNS,
    decode_event_row,
    payload_text,
    ts,
)
from loomflow.projections.transcript import decode_transcript
from loomflow.schemas import Event, Message
from loomflow.schemas.sessions import SessionCursor, SessionRecord, SessionTotals

__all__ = [
    "event_ids_at",
    "fetch_log_rows",
    "get_checkpoint",
    "get_step",
    "last_position",
    "list_checkpoints",
    "list_sessions",
    "load_session",
    "log_rows_after",
    "read_events",
    "read_transcript",
    "session_totals",
    "sessions_in_flight",
]


def load_session(
    conn: sqlite3.Connection, user_id: str | None, session_id: str
) -> SessionRecord | None:
    row = conn.execute(
        f"SELECT {', '.join(SESSION_FIELDS)} FROM loomflow_sessions "
        "WHERE user_id = ? AND session_id = ?",
        (stored_user(user_id), session_id),
    ).fetchone()
    return None if row is None else session_from_row(row)


def _selecting(
    user_id: str | None,
    any_user: bool,
    status: Sequence[str] | None,
    since: datetime | None,
    agent: str | None,
    parent_session_id: str | None = None,
) -> tuple[list[str], list[Any]]:
    """The WHERE terms and their parameters of a listing's filters (see list_sessions)."""
    where: list[str] = ["status <> 'erased'"]
    params: list[Any] = []
    if status is not None:
        where.append(f"status IN ({', '.join('?' * len(status))})")
        params.extend(status)
    if not any_user:
        where.append("user_id = ?")
        params.append(stored_user(user_id))
    if parent_session_id is not None:
        where.append("parent_session_id = ?")
        params.append(parent_session_id)
    if since is not None:
        where.append("updated_at >= ?")
        params.append(ts(since))
    if agent is not None:
        where.append("json_extract(control, '$.agent') = ?")
        params.append(agent)
    return where, params


def list_sessions(
    conn: sqlite3.Connection,
    user_id: str | None,
    any_user: bool,
    status: Sequence[str] | None,
    parent_session_id: str | None,
    limit: int,
    since: datetime | None = None,
    agent: str | None = None,
    after: SessionCursor | None = None,
) -> list[SessionRecord]:
    """Up to ``limit`` live (not erased) sessions of ``user_id`` (of every user when
    ``any_user``), the most recently active first; with ``parent_session_id``, only the
    sessions forked from it; with ``status``, only the sessions in one of them; with
    ``since``, only those last active at or after it; with ``agent``, only those whose
    latest run is of that agent; with ``after``, only those after it in the order
    (updated_at DESC, user_id, session_id), which the listing indexes hold."""
    where, params = _selecting(user_id, any_user, status, since, agent, parent_session_id)
    if after is not None:
        moment = ts(after.updated_at)
        # the bound on updated_at alone is what the index seeks to; the rest drops the
        # rows of the cursor's own moment up to it
        where.append("updated_at <= ? AND (updated_at < ? OR (user_id, session_id) > (?, ?))")
        params += [moment, moment, stored_user(after.user_id), after.session_id]
    rows = conn.execute(
        f"SELECT {', '.join(SESSION_FIELDS)} FROM loomflow_sessions WHERE {' AND '.join(where)} "
        "ORDER BY updated_at DESC, user_id, session_id LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [session_from_row(row) for row in rows]


def session_totals(
    conn: sqlite3.Connection,
    user_id: str | None,
    any_user: bool,
    status: Sequence[str] | None,
    since: datetime | None = None,
    agent: str | None = None,
) -> SessionTotals:
    """How many sessions ``list_sessions`` selects with these filters, and their usage
    summed (from the usage columns, not the JSON: see the journal's step 5)."""
    where, params = _selecting(user_id, any_user, status, since, agent)
    row = conn.execute(
        "SELECT count(*), "
        + ", ".join(f"coalesce(sum({name}), 0)" for name in SESSION_USAGE_COLUMNS.split(", "))
        + f" FROM loomflow_sessions WHERE {' AND '.join(where)}",
        params,
    ).fetchone()
    return totals_from_row(row)


def sessions_in_flight(conn: sqlite3.Connection, now: datetime, limit: int) -> list[SessionRecord]:
    """Where a worker looks for runs to take over, up to ``limit`` of each kind: the
    running sessions, the longest silent first (their leases say which are abandoned);
    the signalled ones; the waiting ones whose wait timed out by ``now``. A fork that no
    run has continued has no run to take over: old ones would fill the first kind."""
    columns = ", ".join(SESSION_FIELDS)
    rows = conn.execute(
        f"SELECT {columns} FROM loomflow_sessions WHERE status IN ('running', 'signalled') "
        "AND last_run_id IS NOT NULL ORDER BY updated_at LIMIT ?",
        (limit,),
    ).fetchall()
    rows += conn.execute(
        f"SELECT {columns} FROM loomflow_sessions WHERE status = 'waiting' "
        "AND json_extract(control, '$.waiting.until') <= ? ORDER BY updated_at LIMIT ?",
        (ts(now), limit),
    ).fetchall()
    return [session_from_row(row) for row in rows]


def get_checkpoint(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, checkpoint_id: str | None
) -> CheckpointRow | None:
    if checkpoint_id is None:
        row = conn.execute(
            f"SELECT {CHECKPOINT_COLUMNS} FROM loomflow_checkpoints WHERE user_id = ? "
            "AND session_id = ? ORDER BY seq DESC LIMIT 1",
            (stored_user(user_id), session_id),
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT {CHECKPOINT_COLUMNS} FROM loomflow_checkpoints WHERE user_id = ? "
            "AND session_id = ? AND checkpoint_id = ?",
            (stored_user(user_id), session_id, checkpoint_id),
        ).fetchone()
    return None if row is None else checkpoint_from_row(row)


def list_checkpoints(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, limit: int
) -> list[CheckpointRow]:
    rows = conn.execute(
        f"SELECT {CHECKPOINT_COLUMNS} FROM loomflow_checkpoints WHERE user_id = ? "
        "AND session_id = ? ORDER BY seq DESC LIMIT ?",
        (stored_user(user_id), session_id, limit),
    ).fetchall()
    return [checkpoint_from_row(r) for r in rows]


def get_step(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, step_key: str
) -> StepRow | None:
    row = conn.execute(
        "SELECT input_hash, seq, value, serializer, at FROM loomflow_steps "
        "WHERE user_id = ? AND session_id = ? AND step_key = ?",
        (stored_user(user_id), session_id, step_key),
    ).fetchone()
    if row is None:
        return None
    try:
        return StepRow(
            step_key, row[0], row[1], orjson.loads(row[2]), row[3], datetime.fromisoformat(row[4])
        )
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise CorruptRecordError(f"journal step {step_key!r} does not decode: {exc}") from exc


def read_events(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[Event]:
    """The session's events with lo <= seq <= hi; a row that does not decode is skipped
    with a warning, so one bad row never stops a reader of the log."""
    rows = fetch_log_rows(
        conn,
        f"SELECT {EVENT_COLUMNS} FROM loomflow_events WHERE user_id = ? AND session_id = ? "
        "AND seq >= ? AND seq <= ? ORDER BY seq",
        (stored_user(user_id), session_id, lo, hi),
    )
    return decoded_events(rows, decode_event_row)


def log_rows_after(conn: sqlite3.Connection, after: int, limit: int) -> tuple[list[Any], list[Any]]:
    """The log's rows past position ``after``, each kind in position order and up to
    ``limit`` of it: events (EVENT_COLUMNS) and the notes prune left (NOTE_COLUMNS). The
    reader of the log merges the two by position."""
    events = fetch_log_rows(
        conn,
        f"SELECT {EVENT_COLUMNS} FROM loomflow_events WHERE position > ? ORDER BY position LIMIT ?",
        (after, limit),
    )
    notes = fetch_log_rows(
        conn,
        f"SELECT {NOTE_COLUMNS} FROM loomflow_log_notes WHERE position > ? "
        "ORDER BY position LIMIT ?",
        (after, limit),
    )
    return events, notes


def last_position(conn: sqlite3.Connection) -> int:
    """The position of the log's newest record (an event or a prune note); 0 when empty.

    Not the table's sqlite_sequence: it also counts positions no row holds (an insert
    another program made that was ignored, newest rows it deleted), and a reader that
    waited to reach one would never be at the end.
    """
    row = conn.execute(
        "SELECT max(coalesce((SELECT max(position) FROM loomflow_events), 0), "
        "coalesce((SELECT max(position) FROM loomflow_log_notes), 0))"
    ).fetchone()
    return int(row[0])


def fetch_log_rows(conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> list[Any]:
    """The rows of a query of the log, also when a text value in them is not UTF-8 (a
    damaged file, another program's write): those are read with escapes, so the row is
    one that does not decode instead of an error that stops every reader of the log at
    it. The escaping costs a call a value, so it is only used once SQLite fails."""
    try:
        return conn.execute(query, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    conn.text_factory = _escaped
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.text_factory = str


def _escaped(text: bytes) -> str:
    return text.decode("utf-8", "backslashreplace")


def read_transcript(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[Message]:
    """Messages of the transcript events with lo <= seq <= hi, validated in one pass.

    ``lo`` must be the transcript's base seq, so concatenation is the whole fold.
    """
    rows = conn.execute(
        "SELECT seq, payload FROM loomflow_events WHERE user_id = ? AND session_id = ? "
        f"AND seq >= ? AND seq <= ? AND type IN ({','.join('?' * len(TRANSCRIPT_TYPES))}) "
        "ORDER BY seq",
        (stored_user(user_id), session_id, lo, hi, *TRANSCRIPT_TYPES),
    ).fetchall()
    texts = [
        (
            seq,
            p
            if isinstance(p, str)
            else payload_text(p, f"log row of session {session_id!r}, seq {seq}"),
        )
        for seq, p in rows
    ]
    return decode_transcript(session_id, texts)


def event_ids_at(conn: sqlite3.Connection, wanted: Sequence[Seq]) -> dict[Seq, str]:
    """The id of the event the log holds at each of these (scope, seq); missing where
    it holds none."""
    found: dict[Seq, str] = {}
    for scope, seq in wanted:
        row = conn.execute(
            "SELECT event_id FROM loomflow_events WHERE user_id = ? AND session_id = ? AND seq = ?",
            (stored_user(scope.user_id), scope.session_id, seq),
        ).fetchone()
        if row is not None:
            found[(scope, seq)] = row[0]
    return found
