"""The SQLite file: opening it (WAL mode), its tables and their migrations, the WAL's
checkpoints, and telling the file opened apart from whatever its path names later."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from loomflow.errors import StoreError, StoreFileReplacedError

__all__ = [
    "SCHEMA_VERSION",
    "OpenedFile",
    "checkpoint_wal",
    "connect",
    "connect_direct",
    "is_busy",
    "migrate",
]

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
