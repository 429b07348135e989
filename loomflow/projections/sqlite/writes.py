"""Writes to the SQLite log and read model: a round of batches of events folded and
applied in one transaction (a savepoint each), and prune."""

from __future__ import annotations

import functools
import sqlite3
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from loomflow.errors import InvalidEventError, LoomflowError
from loomflow.projections.apply import NewRows, Seq, StoredRows, apply_batch
from loomflow.projections.fold import (
    AddTranscript,
    Change,
    DeleteCheckpoints,
    EraseSession,
    Mutation,
    PruneFilter,
    PutCheckpoint,
    PutStep,
    RetainCheckpoints,
)
from loomflow.projections.rows import control_json, control_parts, sig_json, stored_user
from loomflow.projections.sqlite.reads import event_ids_at, load_session
from loomflow.projections.sqlite.tables import (
    CHECKPOINT_COLUMNS,
    SESSION_COLUMNS,
    SESSION_USAGE_COLUMNS,
    stored_payload,
    ts,
    usage_values,
)
from loomflow.schemas import Event
from loomflow.schemas.scope import Scope
from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "INSERT_EVENT",
    "KNOWN_ROWS",
    "KnownRows",
    "SqliteDialect",
    "apply",
    "apply_events",
    "commit_round",
    "insert_event",
    "prune",
    "save_session",
]


_SAVED_COLUMNS = f"{SESSION_COLUMNS}, {SESSION_USAGE_COLUMNS}".split(", ")
_SAVE_SESSION = (
    f"INSERT INTO loomflow_sessions ({', '.join(_SAVED_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_SAVED_COLUMNS))}) "
    "ON CONFLICT (user_id, session_id) DO UPDATE SET "
    + ", ".join(
        f"{name} = excluded.{name}"
        for name in _SAVED_COLUMNS
        if name not in ("user_id", "session_id")
    )
)


def save_session(
    conn: sqlite3.Connection, row: SessionRecord, before: SessionRecord | None = None
) -> None:
    """Store a session's row. ``before`` is the row as stored (None: perhaps none yet):
    then only the columns that changed are written, so SQLite leaves alone the indexes
    of the others (an event changes three or four of fifteen)."""
    if before is None:
        conn.execute(
            # an upsert, not INSERT OR REPLACE: an update rewrites only the indexes whose
            # columns changed, where a replace deletes and re-inserts every index entry
            _SAVE_SESSION,
            (
                stored_user(row.user_id),
                row.session_id,
                row.status,
                row.last_seq,
                row.epoch,
                row.turns,
                row.usage.model_dump_json(),
                row.message_count,
                row.base_seq,
                row.parent_session_id,
                row.parent_checkpoint_id,
                row.last_run_id,
                ts(row.created_at),
                ts(row.updated_at),
                control_json(row),
                *usage_values(row.usage),
            ),
        )
        return
    names: list[str] = []
    values: list[Any] = []
    for name in _PLAIN_COLUMNS:
        value = getattr(row, name)
        if value != getattr(before, name):
            names.append(name)
            values.append(value)
    if row.usage is not before.usage and row.usage != before.usage:
        names += _USAGE_NAMES
        values += [row.usage.model_dump_json(), *usage_values(row.usage)]
    if row.created_at != before.created_at:
        names.append("created_at")
        values.append(ts(row.created_at))
    if row.updated_at != before.updated_at:
        names.append("updated_at")
        values.append(ts(row.updated_at))
    if control_parts(row) != control_parts(before):
        names.append("control")
        values.append(control_json(row))
    if names:
        conn.execute(
            _update_session(tuple(names)), (*values, stored_user(row.user_id), row.session_id)
        )


#: the columns a change of usage writes: its JSON, then its numbers
_USAGE_NAMES = ["usage", *SESSION_USAGE_COLUMNS.split(", ")]

#: the columns stored as they are in the row
_PLAIN_COLUMNS = (
    "status",
    "last_seq",
    "epoch",
    "turns",
    "message_count",
    "base_seq",
    "parent_session_id",
    "parent_checkpoint_id",
    "last_run_id",
)


@functools.cache
def _update_session(names: tuple[str, ...]) -> str:
    return (
        f"UPDATE loomflow_sessions SET {', '.join(f'{n} = ?' for n in names)} "
        "WHERE user_id = ? AND session_id = ?"
    )


#: a log row: the columns of EVENT_COLUMNS but its position, which SQLite assigns
INSERT_EVENT = (
    "INSERT INTO loomflow_events (user_id, session_id, seq, type, event_id, run_id, epoch, "
    "v, at, sig, payload) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)


def insert_event(conn: sqlite3.Connection, event: Event) -> None:
    payload = stored_payload(event.payload.model_dump_json(exclude_defaults=True))
    conn.execute(
        INSERT_EVENT,
        (
            stored_user(event.user_id),
            event.session_id,
            event.seq,
            event.type,
            event.event_id,
            event.run_id,
            event.epoch,
            event.v,
            ts(event.at),
            sig_json(event),
            payload,
        ),
    )


def apply(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, mutation: Mutation
) -> None:
    """Apply one fold mutation inside the caller's transaction."""
    scope = (stored_user(user_id), session_id)
    match mutation:
        case AddTranscript():
            pass  # the log row of this event is the transcript row
        case PutCheckpoint(row=r):
            conn.execute(
                f"INSERT INTO loomflow_checkpoints (user_id, session_id, {CHECKPOINT_COLUMNS}) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    *scope,
                    r.checkpoint_id,
                    r.seq,
                    r.base_seq,
                    r.turn,
                    r.message_count,
                    r.cumulative_usage.model_dump_json(),
                    r.cursor,
                    ts(r.created_at),
                ),
            )
        case RetainCheckpoints(keep=keep):
            conn.execute(
                "DELETE FROM loomflow_checkpoints WHERE user_id = ? AND session_id = ? AND seq < "
                "(SELECT min(seq) FROM (SELECT seq FROM loomflow_checkpoints WHERE user_id = ? "
                "AND session_id = ? ORDER BY seq DESC LIMIT ?))",
                (*scope, *scope, keep),
            )
        case DeleteCheckpoints(checkpoint_ids=ids):
            conn.executemany(
                "DELETE FROM loomflow_checkpoints WHERE user_id = ? AND session_id = ? "
                "AND checkpoint_id = ?",
                [(*scope, cid) for cid in ids],
            )
        case PutStep(row=r):
            conn.execute(
                "INSERT OR REPLACE INTO loomflow_steps (user_id, session_id, step_key, input_hash, "
                "seq, value, serializer, at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    *scope,
                    r.step_key,
                    r.input_hash,
                    r.seq,
                    orjson.dumps(r.value).decode(),
                    r.serializer,
                    ts(r.at),
                ),
            )
        case EraseSession():
            for table in ("loomflow_events", "loomflow_checkpoints", "loomflow_steps"):
                conn.execute(f"DELETE FROM {table} WHERE user_id = ? AND session_id = ?", scope)


#: how many sessions' rows a store's connection keeps from its commits (a worker with
#: many sessions in flight; beyond that they are read back from the file)
KNOWN_ROWS = 4096


class KnownRows:
    """The session rows this connection committed last, valid while no other connection
    wrote: ``PRAGMA data_version`` changes when another connection (of this process or
    another) commits, and only then. An append then folds from the row it already has
    instead of reading it back and decoding it."""

    def __init__(self) -> None:
        self.rows: dict[Scope, SessionRecord] = {}
        self._version: int | None = None

    def check(self, conn: sqlite3.Connection) -> None:
        """Inside the write transaction: forget every row if another connection wrote."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version:
            self.rows.clear()
            self._version = version

    def forget(self) -> None:
        self.rows.clear()
        self._version = None

    def remember(self, changed: Mapping[Scope, SessionRecord]) -> None:
        """Keep the rows a commit wrote, the latest ``KNOWN_ROWS`` sessions of them."""
        for key, row in changed.items():
            self.rows.pop(key, None)  # to the end: the least recently written go first
            self.rows[key] = row
        while len(self.rows) > KNOWN_ROWS:
            del self.rows[next(iter(self.rows))]

    def current(self, conn: sqlite3.Connection, scope: Scope) -> SessionRecord | None:
        """The session's row as this connection last committed it, if no other connection
        wrote since; None when it does not know (read it from the file)."""
        row = self.rows.get(scope)
        if row is None or conn.execute("PRAGMA data_version").fetchone()[0] != self._version:
            return None
        return row


def commit_round(
    conn: sqlite3.Connection,
    batches: list[list[Event]],
    known: KnownRows | None = None,
    verify: Callable[[], None] | None = None,
) -> list[LoomflowError | None]:
    """Apply each batch in one transaction; return each outcome. A refused batch fails
    alone: with several in the round, each has a savepoint of its own.

    ``known`` (the connection's rows of its last commit) saves reading back the rows of
    sessions that no other connection wrote since. ``verify`` runs once the write lock
    is held, before anything is written, and raises to refuse the whole round (the file
    was replaced: see OpenedFile).
    """
    outcomes: list[LoomflowError | None] = []
    rows = {} if known is None else known.rows
    conn.execute("BEGIN IMMEDIATE")
    try:
        if verify is not None:
            verify()
        if known is not None:
            known.check(conn)
        if len(batches) == 1:
            try:
                changed = apply_events(conn, batches[0], rows)
            except LoomflowError as exc:  # refused by the fold: nothing of it stays
                conn.execute("ROLLBACK")
                return [exc]
            conn.execute("COMMIT")
            if known is not None:
                known.remember(changed)
            return [None]
        updates: dict[Scope, SessionRecord] = {}
        for events in batches:
            conn.execute("SAVEPOINT batch")
            try:
                changed = apply_events(conn, events, ChainMap(updates, rows))
            except LoomflowError as exc:  # refused by the fold: only this batch fails
                conn.execute("ROLLBACK TO batch")
                outcomes.append(exc)
            else:
                updates.update(changed)
                outcomes.append(None)
            conn.execute("RELEASE batch")
        conn.execute("COMMIT")
        if known is not None:
            known.remember(updates)
    except BaseException:
        if known is not None:
            known.forget()
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return outcomes


def apply_events(
    conn: sqlite3.Connection,
    events: Sequence[Event],
    known: Mapping[Scope, SessionRecord] | None = None,
) -> dict[Scope, SessionRecord]:
    """Fold events into the read model and append them to the log, in the caller's
    transaction; a refused event raises and the caller rolls the batch back. Return the
    sessions' new rows. ``known`` holds rows that are current in this transaction."""
    return apply_batch(SqliteDialect(conn, known or {}), events)


class SqliteDialect:
    """The apply step's reads and writes in a SQLite file (see projections/apply.py), in
    the caller's transaction; ``known`` holds session rows current in it, which are not
    read back."""

    def __init__(self, conn: sqlite3.Connection, known: Mapping[Scope, SessionRecord]) -> None:
        self.conn = conn
        self.known = known

    def rows(self, scopes: Sequence[Scope]) -> dict[Scope, SessionRecord | None]:
        """The rows of these sessions, from ``known`` or the file; None where none is."""
        return {
            scope: row
            if (row := self.known.get(scope)) is not None
            else load_session(self.conn, scope.user_id, scope.session_id)
            for scope in scopes
        }

    def event_ids(self, wanted: Sequence[Seq]) -> dict[Seq, str]:
        """The id of the event the log holds at each of these seqs; missing where none."""
        return event_ids_at(self.conn, wanted)

    def write(self, changes: Sequence[Change], rows: NewRows, before: StoredRows) -> None:
        """Apply each change and insert its event's log row, then store the changed rows
        (only their changed columns where ``before`` has them)."""
        conn = self.conn
        for change in changes:
            event = change.event
            try:
                for mutation in change.mutations:
                    apply(conn, event.user_id, event.session_id, mutation)
                insert_event(conn, event)
            except sqlite3.IntegrityError as exc:
                # a stored row the read model does not know of holds its key (a row another
                # program wrote at the seq, a checkpoint id the session has): refused as an
                # event, as PostgreSQL refuses it, so only this append fails, not its round
                raise InvalidEventError(
                    f"{event.type} at seq {event.seq} of session {event.session_id!r} is "
                    f"refused by a row already stored: {exc}"
                ) from exc
        for scope, row in rows.items():
            save_session(conn, row, before.get(scope))


def prune(
    conn: sqlite3.Connection, match: PruneFilter, verify: Callable[[], None] | None = None
) -> tuple[int, int, int, int]:
    """Delete what ``match`` selects in one transaction; return the counts of
    (sessions, checkpoints, steps, events) deleted. ``verify``: as for commit_round."""
    before = match.before
    # an erasure's tombstone stays: it is what refuses the session's late events
    where, params = ["status <> 'erased'"], []
    if match.session_id is not None:
        where.append("session_id = ?")
        params.append(match.session_id)
    if not match.any_user:
        where.append("user_id = ?")
        params.append(stored_user(match.user_id))
    clause = " AND ".join(where)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if verify is not None:
            verify()
        sessions = checkpoints = steps = events = 0
        matched = conn.execute(
            f"SELECT user_id, session_id, updated_at FROM loomflow_sessions WHERE {clause}", params
        ).fetchall()
        for uid, sid, updated_at in matched:
            scope = (uid, sid)
            if before is None or datetime.fromisoformat(updated_at) < before:
                sessions += 1
                checkpoints += _delete(conn, "loomflow_checkpoints", scope)
                steps += _delete(conn, "loomflow_steps", scope)
                gone = _delete_events(conn, scope)
                _delete(conn, "loomflow_sessions", scope)
                if gone:
                    events += len(gone)
                    _note_pruned(conn, scope, max(gone), None)
                continue
            cutoff = ts(before)
            checkpoints += _delete(conn, "loomflow_checkpoints", scope, "created_at < ?", cutoff)
            steps += _delete(conn, "loomflow_steps", scope, "at < ?", cutoff)
            gone = _delete_events(conn, scope, "type = 'step.recorded' AND at < ?", cutoff)
            if gone:
                events += len(gone)
                _note_pruned(conn, scope, max(gone), sorted(gone))
        conn.execute("COMMIT")
        return sessions, checkpoints, steps, events
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _delete_events(
    conn: sqlite3.Connection, scope: tuple[str, str], extra: str = "", *args: Any
) -> list[int]:
    """Delete a session's log rows (those ``extra`` selects); return their seqs."""
    sql_text = "DELETE FROM loomflow_events WHERE user_id = ? AND session_id = ?"
    if extra:
        sql_text += f" AND {extra}"
    return [seq for (seq,) in conn.execute(sql_text + " RETURNING seq", (*scope, *args))]


def _note_pruned(
    conn: sqlite3.Connection, scope: tuple[str, str], through_seq: int, seqs: list[int] | None
) -> None:
    """Leave a note that prune deleted these log rows (``seqs`` None: all through
    ``through_seq``), at the next position of the log's own sequence."""
    (position,) = conn.execute(
        "UPDATE sqlite_sequence SET seq = seq + 1 WHERE name = 'loomflow_events' RETURNING seq"
    ).fetchone()  # rows were deleted, so an event was inserted once and the row exists
    conn.execute(
        "INSERT INTO loomflow_log_notes (position, user_id, session_id, kind, through_seq, seqs, "
        "at) VALUES (?,?,?,'pruned',?,?,?)",
        (
            position,
            *scope,
            through_seq,
            None if seqs is None else orjson.dumps(seqs).decode(),
            ts(datetime.now(UTC)),
        ),
    )


def _delete(
    conn: sqlite3.Connection, table: str, scope: tuple[str, str], extra: str = "", *args: Any
) -> int:
    sql_text = f"DELETE FROM {table} WHERE user_id = ? AND session_id = ?"
    if extra:
        sql_text += f" AND {extra}"
    return conn.execute(sql_text, (*scope, *args)).rowcount
