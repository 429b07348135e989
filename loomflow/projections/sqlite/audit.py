"""The audit trail of an embedded log, in a SQLite file of its own beside the journal
(``journal.audit.db``): its tables, their migrations and every statement of the trail."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loomflow.errors import StoreError
from loomflow.projections.chain import Chained, Entry, Head
from loomflow.projections.migrations import Migrations
from loomflow.projections.rows import stored_user
from loomflow.projections.sqlite.schema import connect_own, immediate
from loomflow.projections.sqlite.thread import SqliteThread
from loomflow.projections.trail import (
    ANY_USER,
    ENTRY_FIELDS,
    Reject,
    Trail,
    entry_from_row,
    entry_values,
)
from loomflow.schemas.scope import Scope

__all__ = ["TRAIL", "SqliteTrail"]

#: the trail file. Trails written before it had versions have the tables of step 1 and no
#: audit_meta: they are at version 0, and step 1 (IF NOT EXISTS) finds its tables made.
TRAIL = Migrations(
    meta="audit_meta",
    steps=(
        """
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
        """,
    ),
)

_TABLES = {"audit_entries", "audit_rejects", "audit_position"}
_COLUMNS = ", ".join(ENTRY_FIELDS)


class SqliteTrail(Trail):
    """The trail of an embedded log, in its own SQLite file."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.where = f"audit trail {self.path}"
        self.create = create  # False: verify an existing trail, and change nothing
        self._thread = SqliteThread(self._connect, f"the {self.where}")
        self._call = self._thread.call

    def _connect(self) -> sqlite3.Connection:
        conn = connect_own(self.path, TRAIL, "audit_", "loomflow audit trail", create=self.create)
        if self.create:
            return conn
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
        missing = sorted(_TABLES - tables)
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

    async def heads(self, scopes: Iterable[Scope]) -> dict[Scope, Head]:
        return await self._call(_heads, list(scopes))

    async def known(self, keys: Sequence[str]) -> dict[str, str]:
        return await self._call(_known, list(keys))

    async def write(
        self, chained: Chained, rejects: Sequence[Reject], position: dict[int, int] | None
    ) -> None:
        await self._call(_write, chained, list(rejects), position)

    async def position(self) -> dict[int, int] | None:
        return await self._call(_position)

    async def entries(self, user_id: Any = ANY_USER, session_id: str | None = None) -> list[Entry]:
        return await self._call(_entries, user_id, session_id)

    async def rejects(self) -> list[Reject]:
        return await self._call(_rejects)


def _heads(conn: sqlite3.Connection, scopes: list[Scope]) -> dict[Scope, Head]:
    heads = {}
    for scope in scopes:
        row = conn.execute(
            "SELECT n, hash FROM audit_entries WHERE user_id = ? AND session_id = ? "
            "ORDER BY n DESC LIMIT 1",
            (stored_user(scope.user_id), scope.session_id),
        ).fetchone()
        if row is not None:
            heads[scope] = Head(row[0], row[1])
    return heads


def _known(conn: sqlite3.Connection, keys: list[str]) -> dict[str, str]:
    known = {}
    for key in keys:
        row = conn.execute("SELECT position FROM audit_entries WHERE key = ?", (key,)).fetchone()
        if row is not None:
            known[key] = row[0]
    return known


def _write(
    conn: sqlite3.Connection,
    chained: Chained,
    rejects: list[Reject],
    position: dict[int, int] | None,
) -> None:
    now = datetime.now(UTC).isoformat()
    with immediate(conn):
        conn.executemany(
            f"INSERT INTO audit_entries ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [entry_values(e, e.at.astimezone(UTC).isoformat()) for e in chained.entries],
        )
        for scope, upto, seqs in chained.redactions:
            where = (stored_user(scope.user_id), scope.session_id, upto)
            if seqs is None:
                conn.execute(
                    "UPDATE audit_entries SET body = NULL WHERE user_id = ? AND session_id = ? "
                    "AND n <= ?",
                    where,
                )
            else:
                conn.executemany(
                    "UPDATE audit_entries SET body = NULL WHERE user_id = ? AND session_id = ? "
                    "AND n <= ? AND seq = ?",
                    [(*where, seq) for seq in seqs],
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


def _position(conn: sqlite3.Connection) -> dict[int, int] | None:
    row = conn.execute("SELECT next_position FROM audit_position WHERE id = 1").fetchone()
    return None if row is None else {0: int(row[0])}


def _entries(conn: sqlite3.Connection, user_id: Any, session_id: str | None) -> list[Entry]:
    where, args = [], []
    if user_id is not ANY_USER:
        where.append("user_id = ?")
        args.append(stored_user(user_id))
    if session_id is not None:
        where.append("session_id = ?")
        args.append(session_id)
    clause = " AND ".join(where) or "1"
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM audit_entries WHERE {clause} ORDER BY user_id, session_id, n",
        args,
    ).fetchall()
    return [entry_from_row(row, datetime.fromisoformat(row[7])) for row in rows]


def _rejects(conn: sqlite3.Connection) -> list[Reject]:
    rows = conn.execute(
        "SELECT position, reason, raw FROM audit_rejects ORDER BY recorded_at, position"
    ).fetchall()
    return [Reject(p, r, None if raw is None else bytes(raw)) for p, r, raw in rows]
