"""Where ``loomflow otel`` keeps what it knows of each session between two batches.

Two halves of one interface, :class:`TraceState`:

- :class:`SqliteState`, for an embedded log: a SQLite file of its own beside the log
  (``journal.db`` -> ``journal.otel.db``) holding each session's state and the position
  in the log, written in one transaction, so a crash between two batches loses nothing
  and adds nothing.
- :class:`PostgresState`, at scale: the ``otel_sessions`` table of the read model's schema
  (migration 6); the position is the otel group's committed offsets, moved after the
  states are written. A record read again after a crash between the two is one whose seq
  the session's state has passed: it adds nothing.
"""

from __future__ import annotations

import sqlite3
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.errors import StoreError
from loomflow.lifecycle import Resource
from loomflow.otel.fold import SessionTrace, decode_state, encode_state
from loomflow.projections.rows import stored_user
from loomflow.projections.sqlite import SqliteThread, open_own

if TYPE_CHECKING:
    import asyncpg  # the [postgres] extra: an embedded log's consumer does without it

__all__ = ["PostgresState", "ScopeKey", "SqliteState", "TraceState", "default_state_path"]

#: a session as the state keys it: (user id, session id)
ScopeKey = tuple[str | None, str]

SCHEMA_VERSION = 1

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS otel_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- where the next read of the log starts (an embedded log has one partition, 0)
CREATE TABLE IF NOT EXISTS otel_positions (
    partition INTEGER PRIMARY KEY,
    next_offset INTEGER NOT NULL
);
-- per session: how far it was read, its run in flight (the span so far), its last run
CREATE TABLE IF NOT EXISTS otel_sessions (
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (user_id, session_id)
) WITHOUT ROWID;
"""


def default_state_path(log: Path) -> Path:
    """The state file of an embedded log: ``journal.db`` -> ``journal.otel.db``."""
    return log.with_name(f"{log.stem}.otel{log.suffix or '.db'}")


class TraceState(Resource):
    """Each session's trace state, and (embedded) the position in the log."""

    #: what it is, for messages: "otel state journal.otel.db"
    where: str

    @abstractmethod
    async def load(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, SessionTrace]:
        """The stored states of ``scopes`` (a session not yet seen is left out)."""

    @abstractmethod
    async def save(
        self, states: Mapping[ScopeKey, SessionTrace], position: dict[int, int] | None
    ) -> None:
        """Store ``states`` and, when given, the position reached, in one transaction."""

    @abstractmethod
    async def position(self) -> dict[int, int] | None:
        """Partition -> next offset, as the last ``save`` left it; None when none was
        saved (or the position is kept elsewhere: a Kafka group's offsets)."""


class SqliteState(TraceState):
    """The state of an embedded log's consumer, in a SQLite file of its own."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = f"otel state {self.path}"
        self._thread = SqliteThread(self._connect, f"the {self.where}")

    def _connect(self) -> sqlite3.Connection:
        if not self.path.parent.exists():
            raise StoreError(f"directory {self.path.parent} does not exist for the {self.where}")
        # a file holding other tables (the journal, its trail) is refused untouched
        conn = open_own(self.path, "otel_", "loomflow otel state", create=True)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.executescript(_SQLITE_SCHEMA)  # IF NOT EXISTS: two processes may open it
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT value FROM otel_meta WHERE key = 'schema_version'"
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO otel_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif row[0] != str(SCHEMA_VERSION):
                raise StoreError(
                    f"the {self.where} has schema version {row[0]}, this loomflow reads "
                    f"{SCHEMA_VERSION}: move it away to export the log again from its start"
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return conn

    async def open(self) -> None:
        await self._thread.call(lambda conn: None)

    async def close(self) -> None:
        await self._thread.close()

    async def load(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, SessionTrace]:
        return await self._thread.call(_sqlite_load, list(scopes))

    async def save(
        self, states: Mapping[ScopeKey, SessionTrace], position: dict[int, int] | None
    ) -> None:
        rows = [(stored_user(u), s, encode_state(state)) for (u, s), state in states.items()]
        await self._thread.call(_sqlite_save, rows, position)

    async def position(self) -> dict[int, int] | None:
        rows = await self._thread.call(
            lambda conn: conn.execute(
                "SELECT partition, next_offset FROM otel_positions"
            ).fetchall()
        )
        return {int(p): int(o) for p, o in rows} or None


def _sqlite_load(conn: sqlite3.Connection, scopes: list[ScopeKey]) -> dict[ScopeKey, SessionTrace]:
    states = {}
    for user_id, session_id in scopes:
        row = conn.execute(
            "SELECT state FROM otel_sessions WHERE user_id = ? AND session_id = ?",
            (stored_user(user_id), session_id),
        ).fetchone()
        if row is not None:
            states[(user_id, session_id)] = decode_state(row[0])
    return states


def _sqlite_save(
    conn: sqlite3.Connection, rows: list[tuple[str, str, str]], position: dict[int, int] | None
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("INSERT OR REPLACE INTO otel_sessions VALUES (?, ?, ?)", rows)
        if position:
            conn.executemany(
                "INSERT OR REPLACE INTO otel_positions VALUES (?, ?)", sorted(position.items())
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


Call = Callable[..., Awaitable[Any]]


class PostgresState(TraceState):
    """The state at scale, in the read model's schema; ``call(fn, *args)`` runs
    ``fn(conn, schema, *args)`` on a pooled connection (``PostgresStore._call``)."""

    def __init__(
        self, call: Call, where: str, on_close: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._call = call
        self.where = where
        self._on_close = on_close

    async def open(self) -> None:
        await self._call(lambda conn, schema: conn.execute("SELECT 1"))

    async def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()

    async def load(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, SessionTrace]:
        keys = list(scopes)
        if not keys:
            return {}
        rows = await self._call(_pg_load, [stored_user(u) for u, _ in keys], [s for _, s in keys])
        return {(r[0] or None, r[1]): decode_state(r[2]) for r in rows}

    async def save(
        self, states: Mapping[ScopeKey, SessionTrace], position: dict[int, int] | None
    ) -> None:
        rows = [(stored_user(u), s, encode_state(state)) for (u, s), state in states.items()]
        if rows:
            await self._call(_pg_save, rows)

    async def position(self) -> dict[int, int] | None:
        return None  # the otel group's committed offsets


async def _pg_load(
    conn: asyncpg.Connection, schema: str, users: list[str], sessions: list[str]
) -> list[Any]:
    return list(
        await conn.fetch(
            f'SELECT o.user_id, o.session_id, o.state FROM "{schema}".otel_sessions o '
            "JOIN unnest($1::text[], $2::text[]) AS w(u, s) "
            "ON o.user_id = w.u AND o.session_id = w.s",
            users,
            sessions,
        )
    )


async def _pg_save(conn: asyncpg.Connection, schema: str, rows: list[tuple[str, str, str]]) -> None:
    # sorted by key: two consumers saving the same sessions never wait on each other in turn
    async with conn.transaction():
        await conn.executemany(
            f'INSERT INTO "{schema}".otel_sessions (user_id, session_id, state) '
            "VALUES ($1, $2, $3::json) ON CONFLICT (user_id, session_id) "
            "DO UPDATE SET state = excluded.state",
            sorted(rows),
        )
