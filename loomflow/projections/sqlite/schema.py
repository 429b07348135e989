"""The SQLite files: opening them (WAL mode), their migrations (one runner for the
journal, the audit trail and the stats database), the journal's tables, the WAL's
checkpoints, and telling the file opened apart from whatever its path names later."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loomflow.errors import StoreError, StoreFileReplacedError
from loomflow.projections.migrations import Migrations

__all__ = [
    "JOURNAL",
    "SCHEMA_VERSION",
    "OpenedFile",
    "checkpoint_wal",
    "connect",
    "connect_direct",
    "connect_own",
    "immediate",
    "is_busy",
    "migrate",
    "open_own",
    "stored_version",
]

#: the journal: the log and the read model in one file
JOURNAL = Migrations(
    meta="loomflow_meta",
    steps=(
        """
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
        """
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
        """
    ALTER TABLE loomflow_sessions ADD COLUMN control TEXT;
    CREATE INDEX loomflow_sessions_in_flight ON loomflow_sessions (status)
        WHERE status IN ('running', 'waiting', 'signalled');
    """,
        # the listing's order (list_sessions and its pages after a cursor: updated_at newest
        # first, then user and session), so a page reads only its rows and sorts nothing;
        # they replace the indexes of updated_at, whose reverse scan orders the sessions of
        # one moment by user and session descending
        """
    CREATE INDEX loomflow_sessions_listing
        ON loomflow_sessions (updated_at DESC, user_id, session_id);
    CREATE INDEX loomflow_sessions_user_listing
        ON loomflow_sessions (user_id, updated_at DESC, session_id);
    DROP INDEX loomflow_sessions_updated;
    DROP INDEX loomflow_sessions_user_updated;
    """,
        # a session's usage as numbers beside its JSON, for session_totals to sum: reading
        # five keys of the JSON of every row cost ~12 ms of CPU at 10k sessions, the
        # columns ~3 (bench/bigjournal.py)
        """
    ALTER TABLE loomflow_sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE loomflow_sessions ADD COLUMN cached_input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE loomflow_sessions ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE loomflow_sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE loomflow_sessions ADD COLUMN cost_usd REAL NOT NULL DEFAULT 0;
    UPDATE loomflow_sessions SET
        input_tokens = coalesce(json_extract(usage, '$.input_tokens'), 0),
        cached_input_tokens = coalesce(json_extract(usage, '$.cached_input_tokens'), 0),
        cache_write_tokens = coalesce(json_extract(usage, '$.cache_write_tokens'), 0),
        output_tokens = coalesce(json_extract(usage, '$.output_tokens'), 0),
        cost_usd = coalesce(json_extract(usage, '$.cost_usd'), 0);
    """,
        # a writer's signature of the event (schemas/signing.py) as JSON, so that a reader
        # of the log can check it; NULL for an unsigned event
        """
    ALTER TABLE loomflow_events ADD COLUMN sig TEXT;
    """,
        # from here on a large payload is stored as its zlib stream, a BLOB beside the
        # JSON text of the others (projections/sqlite/tables.py: stored_payload); the
        # version says so to an older loomflow, which refuses the file instead of reading
        # those rows as damaged ones
        """
    INSERT OR REPLACE INTO loomflow_meta (key, value) VALUES ('payload_codec', 'zlib');
    """,
    ),
)

SCHEMA_VERSION = JOURNAL.version


def stored_version(conn: sqlite3.Connection, meta: str) -> int | None:
    """The schema version loomflow recorded in the file's ``meta`` table; None when the
    file has none (another application's database, an empty file, a trail written before
    its tables were versioned)."""
    try:
        row = conn.execute(f"SELECT value FROM {meta} WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:  # no such table
        return None
    return None if row is None else int(row[0])


def migrate(conn: sqlite3.Connection, migrations: Migrations, where: str) -> None:
    """Bring the file to ``migrations.version``, the steps and the version they reach in
    one transaction; ``where`` names the file in the refusal of a newer one.

    Safe when several processes open the file at once: BEGIN IMMEDIATE takes the write
    lock before the version is read, so the second waits (busy_timeout) and then finds
    nothing left to do. A file at the version is opened without a write.
    """
    with immediate(conn):
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {migrations.meta} "
            "(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        pending = migrations.pending(stored_version(conn, migrations.meta) or 0, where)
        for _, step in pending:
            for statement in _statements(step):
                conn.execute(statement)
        if pending:
            conn.execute(
                f"INSERT OR REPLACE INTO {migrations.meta} (key, value) "
                "VALUES ('schema_version', ?)",
                (str(migrations.version),),
            )


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One transaction that holds the file's write lock from its start (BEGIN IMMEDIATE:
    what it reads cannot change before it writes), committed at the end of the block and
    rolled back when the block raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _statements(step: str) -> list[str]:
    """The statements of a step, one by one (``execute`` runs one; ``executescript``
    would commit the migration's transaction first)."""
    statements, statement = [], ""
    for piece in step.split(";"):
        statement += piece + ";"
        if sqlite3.complete_statement(statement):  # not a ';' inside a literal
            if statement.strip(" \n;"):
                statements.append(statement)
            statement = ""
    if statement.strip(" \n;"):
        statements.append(statement)  # not complete: execute says what is wrong with it
    return statements


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
        if not create and stored_version(conn, JOURNAL.meta) is None:
            conn.close()
            raise StoreError(f"{path} is not a loomflow store (it has no loomflow tables)")
        mode = _wal(conn, busy_timeout_ms)
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn, JOURNAL, f"the SQLite store {path}")
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


def open_own(path: Path, prefix: str, what: str, *, create: bool) -> sqlite3.Connection:
    """Open a SQLite file of loomflow's that holds only tables named ``prefix*`` (a trail,
    a stats database), creating it when ``create``. A file with other tables (a journal,
    another program's database) or that is not SQLite is refused before anything is
    written to it."""
    if path.exists() and not path.is_file():
        raise StoreError(f"{path} is not a file, so it cannot be a {what}")
    if not create and not path.is_file():
        raise StoreError(f"no {what} at {path}")
    target = str(path) if create else f"{path.resolve().as_uri()}?mode=rw"
    conn = sqlite3.connect(target, isolation_level=None, uri=not create)
    try:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{path} is not a {what}: {exc}") from exc
    foreign = sorted(n for n in names if not n.startswith((prefix, "sqlite_")))
    if foreign or (not create and not names):
        conn.close()
        holds = f"it holds other tables ({', '.join(foreign[:3])})" if foreign else "it is empty"
        raise StoreError(f"{path} is not a {what}: {holds}")
    return conn


def connect_own(
    path: Path,
    migrations: Migrations,
    prefix: str,
    what: str,
    *,
    create: bool,
    busy_timeout_ms: int = 30_000,
) -> sqlite3.Connection:
    """Open a file of ``open_own``'s beside a journal in WAL mode, migrated by ``migrate``
    as the journal is, so that several processes opening a new one at once all get it.

    ``create=False`` opens an existing file to read it and writes nothing: it is not
    migrated, only refused when it is newer than this code.
    """
    conn = open_own(path, prefix, what, create=create)
    where = f"the {what} {path}"
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if create:
            _wal(conn, busy_timeout_ms)
            migrate(conn, migrations, where)
        else:
            migrations.check(stored_version(conn, migrations.meta) or 0, where)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{where}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
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
