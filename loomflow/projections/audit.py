"""Where the audit trail is kept: a SQLite file beside an embedded log, or tables of the
read model's PostgreSQL schema at scale. Both hold the same entries (see
``audit/auditor.py``) and keep what could not be chained among the rejects.

The trail is append-only but for one update: an erasure or prune sets the bodies of the
entries it removed to NULL (their digests and hashes stay, so the chain still verifies).
"""

from __future__ import annotations

import sqlite3
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from loomflow.errors import StoreError
from loomflow.lifecycle import Resource
from loomflow.projections.chain import Chained, Entry, Head, ScopeKey
from loomflow.projections.rows import stored_user as _uid
from loomflow.projections.sqlite import SqliteThread, open_own

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresTrail", "Reject", "SqliteTrail", "Trail", "default_trail_path"]

T = TypeVar("T")

#: every user's sessions (``user`` of :meth:`Trail.entries`)
ANY_USER: Any = ...


@dataclass(frozen=True)
class Reject:
    """A record the audit could not chain (it does not decode, or claims another scope
    than its key, or repeats an event already audited), kept as it was."""

    position: str
    reason: str
    raw: bytes | None


def default_trail_path(log: Path) -> Path:
    """The trail file of an embedded log: ``journal.db`` -> ``journal.audit.db``."""
    return log.with_name(f"{log.stem}.audit{log.suffix or '.db'}")


def _entry(row: Sequence[Any], at: datetime) -> Entry:
    user_id, session_id, n, position, key, seq, type_, _, digest, body, prev, hash_ = row
    return Entry(
        user_id or None,
        session_id,
        n,
        position,
        key,
        seq,
        type_,
        at,
        digest,
        None if body is None else body.encode() if isinstance(body, str) else bytes(body),
        prev,
        hash_,
    )


_COLUMNS = "user_id, session_id, n, position, key, seq, type, at, digest, body, prev, hash"


def _row(e: Entry, at: object) -> tuple[object, ...]:
    """An entry as the values of _COLUMNS, with ``at`` as the dialect takes it."""
    return (
        _uid(e.user_id),
        e.session_id,
        e.n,
        e.position,
        e.key,
        e.seq,
        e.type,
        at,
        e.digest,
        e.body,
        e.prev,
        e.hash,
    )


class Trail(Resource):
    """The audit trail: chains per session, the rejects, and (embedded) the position."""

    #: where it is, for messages
    where: str

    @abstractmethod
    async def heads(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, Head]:
        """The newest entry of each session that has one."""

    @abstractmethod
    async def known(self, keys: Sequence[str]) -> dict[str, str]:
        """Of these entry keys (event ids), those already in the trail, with the position
        they were audited at."""

    @abstractmethod
    async def write(
        self, chained: Chained, rejects: Sequence[Reject], position: dict[int, int] | None
    ) -> None:
        """Add the entries, apply their redactions, keep the rejects and (embedded) the
        log position reached, in one transaction."""

    @abstractmethod
    async def position(self) -> dict[int, int] | None:
        """The embedded log's position the trail has reached (None at scale: Kafka keeps
        the audit group's offsets)."""

    @abstractmethod
    async def entries(self, user_id: Any = ANY_USER, session_id: str | None = None) -> list[Entry]:
        """Entries of the sessions selected, by session then ``n``."""

    @abstractmethod
    async def rejects(self) -> list[Reject]:
        """The records that could not be chained, in the order they were met."""


# -- SQLite -----------------------------------------------------------------------------

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_entries (
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    position TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    at TEXT NOT NULL,
    digest TEXT NOT NULL,
    body BLOB,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (user_id, session_id, n)
);
CREATE UNIQUE INDEX IF NOT EXISTS audit_entries_key ON audit_entries (key);
CREATE TABLE IF NOT EXISTS audit_rejects (
    position TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    raw BLOB,
    recorded_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_position (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    next_position INTEGER NOT NULL
);
"""


class SqliteTrail(Trail):
    """The trail of an embedded log, in its own SQLite file."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.where = f"audit trail {self.path}"
        self.create = create  # False: verify an existing trail, and change nothing
        self._thread = SqliteThread(self._connect, f"the {self.where}")
        self._call = self._thread.call

    def _connect(self) -> sqlite3.Connection:
        conn = open_own(self.path, "audit_", "loomflow audit trail", create=self.create)
        if self.create:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SQLITE_SCHEMA)
            return conn
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
        missing = sorted({"audit_entries", "audit_rejects", "audit_position"} - tables)
        if missing:
            conn.close()
            raise StoreError(
                f"the {self.where} has no {', '.join(missing)} table: it was dropped, or "
                "this is not a trail; verification cannot go on"
            )
        return conn

    async def open(self) -> None:
        await self._call(lambda conn: None)

    async def close(self) -> None:
        await self._thread.close()

    async def heads(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, Head]:
        return await self._call(_sqlite_heads, list(scopes))

    async def known(self, keys: Sequence[str]) -> dict[str, str]:
        return await self._call(_sqlite_known, list(keys))

    async def write(
        self, chained: Chained, rejects: Sequence[Reject], position: dict[int, int] | None
    ) -> None:
        await self._call(_sqlite_write, chained, list(rejects), position)

    async def position(self) -> dict[int, int] | None:
        return await self._call(_sqlite_position)

    async def entries(self, user_id: Any = ANY_USER, session_id: str | None = None) -> list[Entry]:
        return await self._call(_sqlite_entries, user_id, session_id)

    async def rejects(self) -> list[Reject]:
        rows = await self._call(
            lambda conn: conn.execute(
                "SELECT position, reason, raw FROM audit_rejects ORDER BY recorded_at, position"
            ).fetchall()
        )
        return [Reject(p, r, None if raw is None else bytes(raw)) for p, r, raw in rows]


def _sqlite_heads(conn: sqlite3.Connection, scopes: list[ScopeKey]) -> dict[ScopeKey, Head]:
    heads = {}
    for user_id, session_id in scopes:
        row = conn.execute(
            "SELECT n, hash FROM audit_entries WHERE user_id = ? AND session_id = ? "
            "ORDER BY n DESC LIMIT 1",
            (_uid(user_id), session_id),
        ).fetchone()
        if row is not None:
            heads[(user_id, session_id)] = Head(row[0], row[1])
    return heads


def _sqlite_known(conn: sqlite3.Connection, keys: list[str]) -> dict[str, str]:
    known = {}
    for key in keys:
        row = conn.execute("SELECT position FROM audit_entries WHERE key = ?", (key,)).fetchone()
        if row is not None:
            known[key] = row[0]
    return known


def _sqlite_write(
    conn: sqlite3.Connection,
    chained: Chained,
    rejects: list[Reject],
    position: dict[int, int] | None,
) -> None:
    now = datetime.now(UTC).isoformat()
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(
            f"INSERT INTO audit_entries ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [_row(e, e.at.astimezone(UTC).isoformat()) for e in chained.entries],
        )
        for (user_id, session_id), upto, seqs in chained.redactions:
            scope = (_uid(user_id), session_id, upto)
            if seqs is None:
                conn.execute(
                    "UPDATE audit_entries SET body = NULL WHERE user_id = ? AND session_id = ? "
                    "AND n <= ?",
                    scope,
                )
            else:
                conn.executemany(
                    "UPDATE audit_entries SET body = NULL WHERE user_id = ? AND session_id = ? "
                    "AND n <= ? AND seq = ?",
                    [(*scope, seq) for seq in seqs],
                )
        conn.executemany(
            "INSERT OR IGNORE INTO audit_rejects (position, reason, raw, recorded_at) "
            "VALUES (?,?,?,?)",
            [(r.position, r.reason, r.raw, now) for r in rejects],
        )
        if position is not None:
            conn.execute(
                "INSERT OR REPLACE INTO audit_position (id, next_position) VALUES (1, ?)",
                (position.get(0, 1),),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _sqlite_position(conn: sqlite3.Connection) -> dict[int, int] | None:
    row = conn.execute("SELECT next_position FROM audit_position WHERE id = 1").fetchone()
    return None if row is None else {0: int(row[0])}


def _sqlite_entries(conn: sqlite3.Connection, user_id: Any, session_id: str | None) -> list[Entry]:
    where, args = [], []
    if user_id is not ANY_USER:
        where.append("user_id = ?")
        args.append(_uid(user_id))
    if session_id is not None:
        where.append("session_id = ?")
        args.append(session_id)
    clause = " AND ".join(where) or "1"
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM audit_entries WHERE {clause} ORDER BY user_id, session_id, n",
        args,
    ).fetchall()
    return [_entry(row, datetime.fromisoformat(row[7])) for row in rows]


# -- PostgreSQL --------------------------------------------------------------------------

#: the trail's tables, created by the read model's migration 3 (projections/postgres/schema.py)
POSTGRES_DDL = """
    CREATE TABLE {s}.audit_entries (
        user_id text NOT NULL,
        session_id text NOT NULL,
        n bigint NOT NULL,
        position text NOT NULL,
        key text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        at timestamptz NOT NULL,
        digest text NOT NULL,
        body bytea,
        prev text NOT NULL,
        hash text NOT NULL,
        PRIMARY KEY (user_id, session_id, n)
    );
    CREATE UNIQUE INDEX audit_entries_key ON {s}.audit_entries (key);
    CREATE TABLE {s}.audit_rejects (
        position text PRIMARY KEY,
        reason text NOT NULL,
        raw bytea,
        recorded_at timestamptz NOT NULL DEFAULT now()
    );
"""

Call = Callable[..., Awaitable[Any]]


class PostgresTrail(Trail):
    """The trail at scale, in the read model's schema; ``call(fn, *args)`` runs
    ``fn(conn, schema, *args)`` on a pooled connection (``PostgresStore._call``)."""

    def __init__(
        self, call: Call, where: str, on_close: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._call = call
        self.where = where
        self._on_close = on_close

    async def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()

    async def heads(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, Head]:
        keys = list(scopes)
        if not keys:
            return {}
        rows = await self._call(_pg_heads, [_uid(u) for u, _ in keys], [s for _, s in keys])
        return {(r[0] or None, r[1]): Head(r[2], r[3]) for r in rows}

    async def known(self, keys: Sequence[str]) -> dict[str, str]:
        rows = await self._call(
            lambda conn, s, k: conn.fetch(
                f'SELECT key, position FROM "{s}".audit_entries WHERE key = any($1::text[])', k
            ),
            list(keys),
        )
        return {r[0]: r[1] for r in rows}

    async def write(
        self, chained: Chained, rejects: Sequence[Reject], position: dict[int, int] | None
    ) -> None:
        await self._call(_pg_write, chained, list(rejects))

    async def position(self) -> dict[int, int] | None:
        return None

    async def entries(self, user_id: Any = ANY_USER, session_id: str | None = None) -> list[Entry]:
        rows = await self._call(_pg_entries, user_id, session_id)
        return [_entry(tuple(row), row["at"]) for row in rows]

    async def rejects(self) -> list[Reject]:
        rows = await self._call(
            lambda conn, s: conn.fetch(
                f'SELECT position, reason, raw FROM "{s}".audit_rejects ORDER BY recorded_at'
            )
        )
        return [Reject(r[0], r[1], r[2]) for r in rows]


async def _pg_heads(
    conn: asyncpg.Connection, schema: str, users: list[str], sessions: list[str]
) -> list[Any]:
    return list(
        await conn.fetch(
            f"SELECT DISTINCT ON (e.user_id, e.session_id) e.user_id, e.session_id, e.n, e.hash "
            f'FROM "{schema}".audit_entries e JOIN unnest($1::text[], $2::text[]) AS w(u, s) '
            "ON e.user_id = w.u AND e.session_id = w.s ORDER BY e.user_id, e.session_id, e.n DESC",
            users,
            sessions,
        )
    )


async def _pg_write(
    conn: asyncpg.Connection, schema: str, chained: Chained, rejects: list[Reject]
) -> None:
    s = f'"{schema}"'
    async with conn.transaction():
        await conn.executemany(
            f"INSERT INTO {s}.audit_entries ({_COLUMNS}) "
            "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)",
            [_row(e, e.at) for e in chained.entries],
        )
        for (user_id, session_id), upto, seqs in chained.redactions:
            await conn.execute(
                f"UPDATE {s}.audit_entries SET body = NULL WHERE user_id = $1 AND session_id = $2 "
                "AND n <= $3 AND ($4::bigint[] IS NULL OR seq = any($4::bigint[]))",
                _uid(user_id),
                session_id,
                upto,
                None if seqs is None else list(seqs),
            )
        await conn.executemany(
            f"INSERT INTO {s}.audit_rejects (position, reason, raw) VALUES ($1,$2,$3) "
            "ON CONFLICT (position) DO NOTHING",
            [(r.position, r.reason, r.raw) for r in rejects],
        )


async def _pg_entries(
    conn: asyncpg.Connection, schema: str, user_id: Any, session_id: str | None
) -> list[Any]:
    where, args = [], []
    if user_id is not ANY_USER:
        args.append(_uid(user_id))
        where.append(f"user_id = ${len(args)}")
    if session_id is not None:
        args.append(session_id)
        where.append(f"session_id = ${len(args)}")
    clause = " AND ".join(where) or "true"
    return list(
        await conn.fetch(
            f'SELECT {_COLUMNS} FROM "{schema}".audit_entries WHERE {clause} '
            "ORDER BY user_id, session_id, n",
            *args,
        )
    )
