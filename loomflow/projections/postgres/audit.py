"""The audit trail at scale, in tables of the read model's PostgreSQL schema (made by its
migration 3, ``schema.py``): every statement of the trail."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import asyncpg

from loomflow.projections.admission import Standing
from loomflow.projections.chain import Chained, Entry, Head
from loomflow.projections.rows import stored_user
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

__all__ = ["PostgresTrail"]

Call = Callable[..., Awaitable[Any]]

_COLUMNS = ", ".join(ENTRY_FIELDS)
_STANDING = ", ".join(STANDING_FIELDS)


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

    async def heads(self, scopes: Iterable[Scope]) -> dict[Scope, Head]:
        by_ids = {(stored_user(s.user_id), s.session_id): s for s in scopes}
        if not by_ids:
            return {}
        users, sessions = zip(*by_ids, strict=True)
        rows = await self._call(_heads, list(users), list(sessions))
        return {by_ids[(r[0], r[1])]: Head(r[2], r[3]) for r in rows}

    async def known(self, keys: Sequence[str]) -> dict[str, str]:
        rows = await self._call(_known, list(keys))
        return {r[0]: r[1] for r in rows}

    async def standings(self, scopes: Iterable[Scope]) -> dict[Scope, Standing]:
        by_ids = {(stored_user(s.user_id), s.session_id): s for s in scopes}
        if not by_ids:
            return {}
        users, sessions = zip(*by_ids, strict=True)
        rows = await self._call(_standings, list(users), list(sessions))
        return {by_ids[(r[0], r[1])]: Standing(*r[2:]) for r in rows}

    async def write(
        self,
        chained: Chained,
        rejects: Sequence[Reject],
        position: dict[int, int] | None,
        standings: Mapping[Scope, Standing],
    ) -> None:
        await self._call(_write, chained, list(rejects), dict(standings))

    async def digested(self) -> Digested | None:
        digested: Digested | None = await self._call(_digested)
        return digested

    async def entry_count(self) -> int:
        return int(await self._call(_entry_count))

    async def write_digest(self, make: MakeDigest) -> Digested:
        digested: Digested = await self._call(_write_digest, make)
        return digested

    async def position(self) -> dict[int, int] | None:
        return None

    async def entries(self, user_id: Any = ANY_USER, session_id: str | None = None) -> list[Entry]:
        rows = await self._call(_entries, user_id, session_id)
        return [entry_from_row(tuple(row), row["at"]) for row in rows]

    async def rejects(self) -> list[Reject]:
        rows = await self._call(_rejects)
        return [Reject(r[0], r[1], r[2]) for r in rows]


async def _heads(
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


async def _known(conn: asyncpg.Connection, schema: str, keys: list[str]) -> list[Any]:
    return list(
        await conn.fetch(
            f'SELECT key, position FROM "{schema}".audit_entries WHERE key = any($1::text[])',
            keys,
        )
    )


async def _standings(
    conn: asyncpg.Connection, schema: str, users: list[str], sessions: list[str]
) -> list[Any]:
    return list(
        await conn.fetch(
            f"SELECT a.user_id, a.session_id, {_STANDING} "
            f'FROM "{schema}".audit_sessions a JOIN unnest($1::text[], $2::text[]) AS w(u, s) '
            "ON a.user_id = w.u AND a.session_id = w.s",
            users,
            sessions,
        )
    )


async def _digested(conn: asyncpg.Connection, schema: str) -> Digested | None:
    row = await conn.fetchrow(
        f'SELECT n, hash, at, records FROM "{schema}".audit_digests ORDER BY n DESC LIMIT 1'
    )
    return None if row is None else Digested(row[0], row[1], row[2], row[3])


async def _undigested(conn: asyncpg.Connection, schema: str) -> list[SessionHead]:
    s = f'"{schema}"'
    rows = await conn.fetch(
        f"SELECT h.user_id, h.session_id, h.n, h.seq, h.hash FROM {s}.audit_sessions a "
        "CROSS JOIN LATERAL (SELECT user_id, session_id, n, seq, hash "
        f"FROM {s}.audit_entries e WHERE e.user_id = a.user_id "
        "AND e.session_id = a.session_id ORDER BY n DESC LIMIT 1) h "
        "WHERE h.n > a.digested_n ORDER BY h.user_id, h.session_id"
    )
    return [SessionHead(r[0] or None, r[1], r[2], r[3], r[4]) for r in rows]


async def _entry_count(conn: asyncpg.Connection, schema: str) -> Any:
    return await conn.fetchval(f'SELECT count(*) FROM "{schema}".audit_entries')


async def _write_digest(conn: asyncpg.Connection, schema: str, make: MakeDigest) -> Digested:
    """The digest lock is a transaction-scoped advisory lock named by the schema's digest
    table: held while ``make`` writes to the place, released by the commit."""
    s = f'"{schema}"'
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"{s}.audit_digests")
        heads = await _undigested(conn, schema)
        digested, body = await make(
            await _digested(conn, schema), heads, int(await _entry_count(conn, schema))
        )
        await conn.execute(
            f"INSERT INTO {s}.audit_digests (n, at, hash, records, body) VALUES ($1,$2,$3,$4,$5)",
            digested.n,
            digested.at,
            digested.hash,
            digested.records,
            body,
        )
        await conn.executemany(
            f"UPDATE {s}.audit_sessions SET digested_n = greatest(digested_n, $1) "
            "WHERE user_id = $2 AND session_id = $3",
            [(h.n, stored_user(h.user_id), h.session_id) for h in heads],
        )
    return digested


async def _write(
    conn: asyncpg.Connection,
    schema: str,
    chained: Chained,
    rejects: list[Reject],
    standings: dict[Scope, Standing],
) -> None:
    s = f'"{schema}"'
    async with conn.transaction():
        await conn.executemany(
            f"INSERT INTO {s}.audit_entries ({_COLUMNS}) "
            "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)",
            [entry_values(e, e.at) for e in chained.entries],
        )
        for scope, upto, seqs in chained.redactions:
            await conn.execute(
                f"UPDATE {s}.audit_entries SET body = NULL WHERE user_id = $1 AND session_id = $2 "
                "AND n <= $3 AND ($4::bigint[] IS NULL OR seq = any($4::bigint[]))",
                stored_user(scope.user_id),
                scope.session_id,
                upto,
                None if seqs is None else list(seqs),
            )
        await conn.executemany(
            f"INSERT INTO {s}.audit_rejects (position, reason, raw) VALUES ($1,$2,$3) "
            "ON CONFLICT (position) DO NOTHING",
            [(r.position, r.reason, r.raw) for r in rejects],
        )
        await conn.executemany(
            f"INSERT INTO {s}.audit_sessions (user_id, session_id, {_STANDING}) "
            "VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (user_id, session_id) DO UPDATE SET "
            + ", ".join(f"{name} = excluded.{name}" for name in STANDING_FIELDS),
            [standing_values(scope, st) for scope, st in standings.items()],
        )


async def _entries(
    conn: asyncpg.Connection, schema: str, user_id: Any, session_id: str | None
) -> list[Any]:
    where, args = [], []
    if user_id is not ANY_USER:
        args.append(stored_user(user_id))
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


async def _rejects(conn: asyncpg.Connection, schema: str) -> list[Any]:
    return list(
        await conn.fetch(
            f'SELECT position, reason, raw FROM "{schema}".audit_rejects ORDER BY recorded_at'
        )
    )
