"""The audit trail at scale, in tables of the read model's PostgreSQL schema (made by its
migration 3, ``schema.py``): every statement of the trail."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import asyncpg

from loomflow.projections.chain import Chained, Entry, Head
from loomflow.projections.rows import stored_user
from loomflow.projections.trail import (
    ANY_USER,
    ENTRY_FIELDS,
    Reject,
    Trail,
    entry_from_row,
    entry_values,
)
from loomflow.schemas.scope import Scope

__all__ = ["PostgresTrail"]

Call = Callable[..., Awaitable[Any]]

_COLUMNS = ", ".join(ENTRY_FIELDS)


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

    async def write(
        self, chained: Chained, rejects: Sequence[Reject], position: dict[int, int] | None
    ) -> None:
        await self._call(_write, chained, list(rejects))

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


async def _write(
    conn: asyncpg.Connection, schema: str, chained: Chained, rejects: list[Reject]
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
