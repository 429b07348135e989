"""The audit trail of an embedded log, in a SQLite file of its own beside the journal
(``journal.audit.db``): its tables, their migrations and every statement of the trail."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loomflow.errors import StoreError
from loomflow.projections.admission import Standing
from loomflow.projections.chain import Chained, Entry, Head
from loomflow.projections.migrations import Migrations
from loomflow.projections.rows import stored_user
from loomflow.projections.sqlite.schema import connect_own, immediate
from loomflow.projections.sqlite.thread import SqliteThread
from loomflow.projections.trail import (
    ANY_USER,
    ENTRY_FIELDS,
    STANDING_FIELDS,
    Digested,
    MakeDigest,
    Reject,
    SessionHead,
    Trail,
    entry_from_row,
    entry_values,
    standing_values,
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
        # each session's standing (projections/admission.py), so the audit refuses what
        # the read model refuses; what the last digest committed of its chain; the
        # digests written. A trail audited before has no standings: each session's is
        # read off its newest entry, with gaps allowed (its message count is not known).
        """
        CREATE TABLE audit_sessions (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            last_seq INTEGER NOT NULL,
            message_count INTEGER NOT NULL,
            cancelled INTEGER NOT NULL,
            erased INTEGER NOT NULL,
            gapped INTEGER NOT NULL,
            digested_n INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (user_id, session_id)
        ) WITHOUT ROWID;
        INSERT INTO audit_sessions
            (user_id, session_id, epoch, last_seq, message_count, cancelled, erased, gapped)
        SELECT user_id, session_id,
            CASE WHEN json_valid(CAST(body AS TEXT))
                THEN CAST(coalesce(json_extract(CAST(body AS TEXT), '$.epoch'), 0) AS INTEGER)
                ELSE 0 END,
            seq, 0,
            type = 'run.cancelled', type = 'session.erased', 1
        FROM audit_entries e
        WHERE n = (SELECT max(n) FROM audit_entries h
                   WHERE h.user_id = e.user_id AND h.session_id = e.session_id);
        CREATE TABLE audit_digests (
            n INTEGER PRIMARY KEY,
            at TEXT NOT NULL,
            hash TEXT NOT NULL,
            records INTEGER NOT NULL,
            body BLOB NOT NULL
        );
        """,
    ),
)

#: what verification reads (the standings and the digests written are the writing
#: audit's; a trail from before them verifies unchanged)
_TABLES = {"audit_entries", "audit_rejects", "audit_position"}
_STANDING = ", ".join(STANDING_FIELDS)
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

    async def standings(self, scopes: Iterable[Scope]) -> dict[Scope, Standing]:
        return await self._call(_standings, list(scopes))

    async def write(
        self,
        chained: Chained,
        rejects: Sequence[Reject],
        position: dict[int, int] | None,
        standings: Mapping[Scope, Standing],
    ) -> None:
        await self._call(_write, chained, list(rejects), position, dict(standings))

    async def digested(self) -> Digested | None:
        return await self._call(_digested)

    async def entry_count(self) -> int:
        return await self._call(_entry_count)

    async def write_digest(self, make: MakeDigest) -> Digested:
        # the file's write lock is the digest lock: the transaction stays open on the
        # trail's one connection while ``make`` writes to the place
        last, heads, count = await self._call(_begin_digest)
        try:
            digested, body = await make(last, heads, count)
            await self._call(_record_digest, digested, body, heads)
        except BaseException:
            await self._call(_rollback)
            raise
        return digested

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


def _standings(conn: sqlite3.Connection, scopes: list[Scope]) -> dict[Scope, Standing]:
    standings = {}
    for scope in scopes:
        row = conn.execute(
            f"SELECT {_STANDING} FROM audit_sessions WHERE user_id = ? AND session_id = ?",
            (stored_user(scope.user_id), scope.session_id),
        ).fetchone()
        if row is not None:
            epoch, last_seq, count, cancelled, erased, gapped = row
            standings[scope] = Standing(
                epoch, last_seq, count, bool(cancelled), bool(erased), bool(gapped)
            )
    return standings


def _entry_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM audit_entries").fetchone()[0])


def _begin_digest(conn: sqlite3.Connection) -> tuple[Digested | None, list[SessionHead], int]:
    conn.execute("BEGIN IMMEDIATE")
    return _digested(conn), _undigested(conn), _entry_count(conn)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _digested(conn: sqlite3.Connection) -> Digested | None:
    row = conn.execute(
        "SELECT n, hash, at, records FROM audit_digests ORDER BY n DESC LIMIT 1"
    ).fetchone()
    return None if row is None else Digested(row[0], row[1], datetime.fromisoformat(row[2]), row[3])


def _undigested(conn: sqlite3.Connection) -> list[SessionHead]:
    rows = conn.execute(
        "SELECT e.user_id, e.session_id, e.n, e.seq, e.hash FROM audit_sessions s "
        "JOIN audit_entries e ON e.user_id = s.user_id AND e.session_id = s.session_id "
        "AND e.n = (SELECT max(n) FROM audit_entries h WHERE h.user_id = s.user_id "
        "AND h.session_id = s.session_id) "
        "WHERE e.n > s.digested_n ORDER BY e.user_id, e.session_id"
    ).fetchall()
    return [SessionHead(u or None, sid, n, seq, h) for u, sid, n, seq, h in rows]


def _record_digest(
    conn: sqlite3.Connection, digested: Digested, body: bytes, heads: list[SessionHead]
) -> None:
    """Keep the digest and what it committed, and end the transaction _begin_digest began."""
    conn.execute(
        "INSERT INTO audit_digests (n, at, hash, records, body) VALUES (?,?,?,?,?)",
        (
            digested.n,
            digested.at.astimezone(UTC).isoformat(),
            digested.hash,
            digested.records,
            body,
        ),
    )
    conn.executemany(
        "UPDATE audit_sessions SET digested_n = max(digested_n, ?) "
        "WHERE user_id = ? AND session_id = ?",
        [(h.n, stored_user(h.user_id), h.session_id) for h in heads],
    )
    conn.execute("COMMIT")


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
    standings: dict[Scope, Standing],
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
        conn.executemany(
            f"INSERT INTO audit_sessions (user_id, session_id, {_STANDING}) "
            "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (user_id, session_id) DO UPDATE SET "
            + ", ".join(f"{name} = excluded.{name}" for name in STANDING_FIELDS),
            [standing_values(scope, st) for scope, st in standings.items()],
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
