"""The SQLite dialect of the log and read model: schema, migrations, mutations, queries.

Functions here are synchronous and take a ``sqlite3.Connection``; the SQLite store
calls them on its own thread. The transcript is not copied into the read model: the
log table in the same file already holds every turn's messages.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import time
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from loomflow.errors import (
    CorruptRecordError,
    InvalidEventError,
    LoomflowError,
    StoreError,
    StoreFileReplacedError,
)
from loomflow.projections.fold import (
    TRANSCRIPT_TYPES,
    AddTranscript,
    CheckpointRow,
    DeleteCheckpoints,
    EraseSession,
    Mutation,
    PruneFilter,
    PutCheckpoint,
    PutStep,
    RetainCheckpoints,
    StepRow,
    maybe_redelivered,
    project,
)
from loomflow.projections.rows import (
    CHECKPOINT_FIELDS,
    SESSION_FIELDS,
    checkpoint_from_row,
    control_json,
    control_parts,
    decoded_events,
    event_from_row,
    session_from_row,
)
from loomflow.projections.transcript import decode_transcript
from loomflow.schemas import Event, Message
from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "SCHEMA_VERSION",
    "KnownRows",
    "apply",
    "decode_event_row",
    "fetch_log_rows",
    "insert_event",
    "list_sessions",
    "load_session",
    "migrate",
    "save_session",
    "ts",
]

logger = logging.getLogger("loomflow.projections.sqlite")

SCHEMA_VERSION = 3

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE loomflow_events (
        position INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        event_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        v INTEGER NOT NULL,
        at TEXT NOT NULL,
        payload TEXT NOT NULL
    );
    CREATE UNIQUE INDEX loomflow_events_scope ON loomflow_events (user_id, session_id, seq);
    CREATE TABLE loomflow_sessions (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        status TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        turns INTEGER NOT NULL,
        usage TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        base_seq INTEGER NOT NULL,
        parent_session_id TEXT,
        parent_checkpoint_id TEXT,
        last_run_id TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (user_id, session_id)
    ) WITHOUT ROWID;
    CREATE INDEX loomflow_sessions_updated ON loomflow_sessions (updated_at);
    CREATE TABLE loomflow_checkpoints (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        checkpoint_id TEXT NOT NULL,
        base_seq INTEGER NOT NULL,
        turn INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        usage TEXT NOT NULL,
        cursor TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (user_id, session_id, seq)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX loomflow_checkpoints_id
        ON loomflow_checkpoints (user_id, session_id, checkpoint_id);
    CREATE TABLE loomflow_steps (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        step_key TEXT NOT NULL,
        input_hash TEXT NOT NULL,
        seq INTEGER NOT NULL,
        value TEXT NOT NULL,
        serializer TEXT NOT NULL,
        at TEXT NOT NULL,
        PRIMARY KEY (user_id, session_id, step_key)
    ) WITHOUT ROWID;
    """,
    # Positions never go back, so a reader that has passed one misses nothing: without
    # AUTOINCREMENT an erasure that deletes the newest rows would hand their positions to
    # the next events. Prune deletes rows with no event to say so; it leaves a note at
    # a position of the same sequence, so the log's readers (audit) see it in order.
    2: """
    CREATE TABLE loomflow_events_v2 (
        position INTEGER PRIMARY KEY AUTOINCREMENT,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        event_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        v INTEGER NOT NULL,
        at TEXT NOT NULL,
        payload TEXT NOT NULL
    );
    INSERT INTO loomflow_events_v2 SELECT * FROM loomflow_events ORDER BY position;
    DROP TABLE loomflow_events;
    ALTER TABLE loomflow_events_v2 RENAME TO loomflow_events;
    CREATE UNIQUE INDEX loomflow_events_scope ON loomflow_events (user_id, session_id, seq);
    CREATE TABLE loomflow_log_notes (
        position INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        through_seq INTEGER NOT NULL,
        seqs TEXT,
        at TEXT NOT NULL
    );
    CREATE INDEX loomflow_sessions_user_updated ON loomflow_sessions (user_id, updated_at);
    CREATE INDEX loomflow_sessions_parent ON loomflow_sessions (user_id, parent_session_id)
        WHERE parent_session_id IS NOT NULL;
    """,
    # what a worker needs of a session (projections/rows.py: control_json), and the runs
    # in flight it looks for
    3: """
    ALTER TABLE loomflow_sessions ADD COLUMN control TEXT;
    CREATE INDEX loomflow_sessions_in_flight ON loomflow_sessions (status)
        WHERE status IN ('running', 'waiting', 'signalled');
    """,
}


def _version(conn: sqlite3.Connection) -> int | None:
    """The schema version loomflow recorded in the file; None when it is not a loomflow
    store (another application's database, an empty file)."""
    try:
        row = conn.execute(
            "SELECT value FROM loomflow_meta WHERE key = 'schema_version'"
        ).fetchone()
    except sqlite3.OperationalError:  # no such table
        return None
    return None if row is None else int(row[0])


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the file to SCHEMA_VERSION; safe when several processes open it at once."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS loomflow_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        current = _version(conn) or 0
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"this store has schema version {current}, newer than {SCHEMA_VERSION}: "
                "upgrade loomflow to open it"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
        if current != SCHEMA_VERSION:  # a store at the version is opened without a write
            conn.execute(
                "INSERT OR REPLACE INTO loomflow_meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def connect(path: Path, busy_timeout_ms: int, *, create: bool = True) -> sqlite3.Connection:
    """Open the file in WAL mode, creating or migrating its tables.

    ``create=False`` opens only an existing loomflow store: a missing file, or one that
    loomflow did not create, is refused before anything is written to it.
    """
    if not create and not path.is_file():
        raise StoreError(f"no loomflow store at {path}: the file does not exist")
    try:
        if create:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        else:  # mode=rw: never create the file, even if it vanishes after the check above
            target = f"{path.resolve().as_uri()}?mode=rw"
            conn = sqlite3.connect(target, isolation_level=None, check_same_thread=True, uri=True)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if not create and _version(conn) is None:
            conn.close()
            raise StoreError(f"{path} is not a loomflow store (it has no loomflow tables)")
        mode = _wal(conn, busy_timeout_ms)
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open {path} as a loomflow SQLite store: {exc}") from exc
    if str(mode).lower() != "wal":
        conn.close()
        raise StoreError(f"{path}: SQLite refused WAL mode (got {mode})")
    return conn


def connect_direct(path: Path) -> sqlite3.Connection:
    """A second connection to a store that ``connect`` opened, for commits made on the
    event loop's own thread (see SqliteStore): it never waits for a lock (a busy file
    raises at once, and the caller commits on the store's thread instead, which waits)
    and never checkpoints the WAL itself (the store's thread does)."""
    target = f"{path.resolve().as_uri()}?mode=rw"
    conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False, uri=True)
    conn.execute("PRAGMA busy_timeout = 0")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    return conn


class OpenedFile:
    """The file a store opened at ``path``, told apart from whatever the path names later.

    A file removed (with its -wal and -shm) or replaced under open connections keeps
    taking their commits, into an inode nobody will open again: the runs they record are
    lost without an error. ``check`` compares the path's (st_dev, st_ino) with the file's
    at open, one ``os.stat`` (a few microseconds); the open connections keep that inode
    allocated, so no new file at the path can have the same identity.
    """

    def __init__(self, path: Path) -> None:
        self.path = os.path.abspath(path)  # as SQLite resolved it, whatever the cwd is later
        opened = os.stat(self.path)
        self._identity = (opened.st_dev, opened.st_ino)

    def check(self) -> None:
        """Raise StoreFileReplacedError when the path no longer names the file opened."""
        try:
            now = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            raise StoreFileReplacedError(
                f"the SQLite store {self.path} was removed while this store had it open (no "
                "file is at that path now), so nothing more is written to it: restore the "
                "file from a backup, or open a new SqliteRuntime there to start an empty store"
            ) from None
        except OSError as exc:
            raise StoreError(f"the SQLite store {self.path}: cannot stat it: {exc}") from exc
        if (now.st_dev, now.st_ino) != self._identity:
            raise StoreFileReplacedError(
                f"the SQLite store {self.path} was replaced by another file while this store "
                "had it open, so nothing more is written to either: what it wrote is in the "
                "file it opened, not the one at that path now; put that one back, or open a "
                "new SqliteRuntime to use the one there"
            )


def checkpoint_wal(conn: sqlite3.Connection) -> None:
    """Copy what the WAL holds into the database file, so that the next commit writes
    the WAL from its start again. It holds the write lock meanwhile (a passive checkpoint
    would not: with appends going on it never catches up, and the WAL grows forever)."""
    conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused because another connection holds the lock it needs."""
    return "locked" in str(exc) or "busy" in str(exc)


def _wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> str:
    """Switch the file to WAL mode; the journal mode of the database, as SQLite says.

    SQLite does not wait (busy_timeout) for a journal mode change: two processes opening
    the same new file at once would see "database is locked". So this tries again, with
    backoff, for up to the busy timeout. It runs on the store's own thread.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    delay = 0.005
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)  # backoff while another connection switches the file
        delay = min(delay * 2, 0.1)


def ts(moment: datetime) -> str:
    """A timestamp as fixed-width UTC ISO text, so text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _uid(user_id: str | None) -> str:
    return "" if user_id is None else user_id


def load_session(
    conn: sqlite3.Connection, user_id: str | None, session_id: str
) -> SessionRecord | None:
    row = conn.execute(
        f"SELECT {', '.join(SESSION_FIELDS)} FROM loomflow_sessions "
        "WHERE user_id = ? AND session_id = ?",
        (_uid(user_id), session_id),
    ).fetchone()
    return None if row is None else session_from_row(row)


def list_sessions(
    conn: sqlite3.Connection,
    user_id: str | None,
    any_user: bool,
    parent_session_id: str | None,
    limit: int,
    status: str | None = None,
) -> list[SessionRecord]:
    """Up to ``limit`` live (not erased) sessions of ``user_id`` (of every user when
    ``any_user``), the most recently active first; with ``parent_session_id``, only the
    sessions forked from it; with ``status``, only the sessions in it."""
    where, params = ["status <> 'erased'"], []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if not any_user:
        where.append("user_id = ?")
        params.append(_uid(user_id))
    if parent_session_id is not None:
        where.append("parent_session_id = ?")
        params.append(parent_session_id)
    rows = conn.execute(
        f"SELECT {', '.join(SESSION_FIELDS)} FROM loomflow_sessions WHERE {' AND '.join(where)} "
        "ORDER BY updated_at DESC, user_id, session_id LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [session_from_row(row) for row in rows]


def sessions_in_flight(conn: sqlite3.Connection, now: datetime, limit: int) -> list[SessionRecord]:
    """Where a worker looks for runs to take over, up to ``limit`` of each kind: the
    running sessions, the longest silent first (their leases say which are abandoned);
    the signalled ones; the waiting ones whose wait timed out by ``now``."""
    columns = ", ".join(SESSION_FIELDS)
    rows = conn.execute(
        f"SELECT {columns} FROM loomflow_sessions WHERE status IN ('running', 'signalled') "
        "ORDER BY updated_at LIMIT ?",
        (limit,),
    ).fetchall()
    rows += conn.execute(
        f"SELECT {columns} FROM loomflow_sessions WHERE status = 'waiting' "
        "AND json_extract(control, '$.waiting.until') <= ? ORDER BY updated_at LIMIT ?",
        (ts(now), limit),
    ).fetchall()
    return [session_from_row(row) for row in rows]


_SESSION_COLUMNS = (
    "user_id, session_id, status, last_seq, epoch, turns, usage, message_count, base_seq, "
    "parent_session_id, parent_checkpoint_id, last_run_id, created_at, updated_at, control"
)
_SAVE_SESSION = (
    f"INSERT INTO loomflow_sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT (user_id, session_id) DO UPDATE SET "
    + ", ".join(
        f"{name} = excluded.{name}"
        for name in _SESSION_COLUMNS.split(", ")
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
                _uid(row.user_id),
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
        names.append("usage")
        values.append(row.usage.model_dump_json())
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
        conn.execute(_update_session(tuple(names)), (*values, _uid(row.user_id), row.session_id))


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


def insert_event(conn: sqlite3.Connection, event: Event) -> None:
    payload = event.payload.model_dump_json(exclude_defaults=True)
    conn.execute(
        "INSERT INTO loomflow_events (user_id, session_id, seq, type, event_id, run_id, epoch, "
        "v, at, payload) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (
            _uid(event.user_id),
            event.session_id,
            event.seq,
            event.type,
            event.event_id,
            event.run_id,
            event.epoch,
            event.v,
            ts(event.at),
            payload,
        ),
    )


EVENT_COLUMNS = "position, user_id, session_id, seq, type, event_id, run_id, epoch, v, at, payload"


def decode_event_row(row: Sequence[Any]) -> Event:
    """Rebuild the event stored in one log row (position, EVENT_FIELDS, payload)."""
    position, *fields, payload = row
    where = f"log row {position} (session {fields[1]!r}, seq {fields[2]})"
    return event_from_row(fields, payload, where)


CHECKPOINT_COLUMNS = ", ".join(CHECKPOINT_FIELDS)


def get_checkpoint(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, checkpoint_id: str | None
) -> CheckpointRow | None:
    if checkpoint_id is None:
        row = conn.execute(
            f"SELECT {CHECKPOINT_COLUMNS} FROM loomflow_checkpoints WHERE user_id = ? "
            "AND session_id = ? ORDER BY seq DESC LIMIT 1",
            (_uid(user_id), session_id),
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT {CHECKPOINT_COLUMNS} FROM loomflow_checkpoints WHERE user_id = ? "
            "AND session_id = ? AND checkpoint_id = ?",
            (_uid(user_id), session_id, checkpoint_id),
        ).fetchone()
    return None if row is None else checkpoint_from_row(row)


def list_checkpoints(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, limit: int
) -> list[CheckpointRow]:
    rows = conn.execute(
        f"SELECT {CHECKPOINT_COLUMNS} FROM loomflow_checkpoints WHERE user_id = ? "
        "AND session_id = ? ORDER BY seq DESC LIMIT ?",
        (_uid(user_id), session_id, limit),
    ).fetchall()
    return [checkpoint_from_row(r) for r in rows]


def get_step(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, step_key: str
) -> StepRow | None:
    row = conn.execute(
        "SELECT input_hash, seq, value, serializer, at FROM loomflow_steps "
        "WHERE user_id = ? AND session_id = ? AND step_key = ?",
        (_uid(user_id), session_id, step_key),
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
        (_uid(user_id), session_id, lo, hi),
    )
    return decoded_events(rows, decode_event_row)


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
        (_uid(user_id), session_id, lo, hi, *TRANSCRIPT_TYPES),
    ).fetchall()
    return decode_transcript(session_id, [(row[0], row[1]) for row in rows])


def apply(
    conn: sqlite3.Connection, user_id: str | None, session_id: str, mutation: Mutation
) -> None:
    """Apply one fold mutation inside the caller's transaction."""
    scope = (_uid(user_id), session_id)
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
        self.rows: dict[tuple[str | None, str], SessionRecord] = {}
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

    def remember(self, changed: Mapping[tuple[str | None, str], SessionRecord]) -> None:
        """Keep the rows a commit wrote, the latest ``KNOWN_ROWS`` sessions of them."""
        for key, row in changed.items():
            self.rows.pop(key, None)  # to the end: the least recently written go first
            self.rows[key] = row
        while len(self.rows) > KNOWN_ROWS:
            del self.rows[next(iter(self.rows))]

    def current(
        self, conn: sqlite3.Connection, user_id: str | None, session_id: str
    ) -> SessionRecord | None:
        """The session's row as this connection last committed it, if no other connection
        wrote since; None when it does not know (read it from the file)."""
        row = self.rows.get((user_id, session_id))
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
        updates: dict[tuple[str | None, str], SessionRecord] = {}
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
    known: Mapping[tuple[str | None, str], SessionRecord] | None = None,
) -> dict[tuple[str | None, str], SessionRecord]:
    """Fold events into the read model and append them to the log, in the caller's
    transaction; a refused event raises and the caller rolls the batch back. Return the
    sessions' new rows. ``known`` holds rows that are current in this transaction."""
    known = known or {}
    rows = {
        key: known[key] if key in known else load_session(conn, *key)
        for key in {(e.user_id, e.session_id) for e in events}
    }
    stored = _stored_event_ids(conn, maybe_redelivered(rows, events))
    changed, changes = project(rows, events, stored)
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
                f"{event.type} at seq {event.seq} of session {event.session_id!r} is refused "
                f"by a row already stored: {exc}"
            ) from exc
    for key, row in changed.items():
        save_session(conn, row, rows.get(key))
    return changed


def _stored_event_ids(
    conn: sqlite3.Connection, wanted: list[tuple[str | None, str, int]]
) -> dict[tuple[str | None, str, int], str]:
    stored: dict[tuple[str | None, str, int], str] = {}
    for user_id, session_id, seq in wanted:
        row = conn.execute(
            "SELECT event_id FROM loomflow_events WHERE user_id = ? AND session_id = ? AND seq = ?",
            (_uid(user_id), session_id, seq),
        ).fetchone()
        if row is not None:
            stored[(user_id, session_id, seq)] = row[0]
    return stored


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
        params.append(_uid(match.user_id))
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
