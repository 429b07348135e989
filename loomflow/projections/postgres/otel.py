"""What ``loomflow otel`` keeps in the read model's schema: each session's state (JSON),
in ``otel_sessions`` (migration 6). Its position is the otel group's committed offsets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from loomflow.projections.postgres.schema import quoted

__all__ = ["otel_states", "put_otel"]


async def otel_states(
    conn: asyncpg.Connection, schema: str, users: Sequence[str], sessions: Sequence[str]
) -> list[Any]:
    """(user as stored, session, state) of each of these sessions that has a state."""
    return list(
        await conn.fetch(
            f"SELECT o.user_id, o.session_id, o.state FROM {quoted(schema)}.otel_sessions o "
            "JOIN unnest($1::text[], $2::text[]) AS w(u, s) "
            "ON o.user_id = w.u AND o.session_id = w.s",
            list(users),
            list(sessions),
        )
    )


async def put_otel(
    conn: asyncpg.Connection, schema: str, rows: Sequence[tuple[str, str, str]]
) -> None:
    """Store sessions' states (user as stored, session, JSON), in one transaction."""
    # sorted by key: two consumers saving the same sessions never wait on each other in turn
    async with conn.transaction():
        await conn.executemany(
            f"INSERT INTO {quoted(schema)}.otel_sessions (user_id, session_id, state) "
            "VALUES ($1, $2, $3::json) ON CONFLICT (user_id, session_id) "
            "DO UPDATE SET state = excluded.state",
            sorted(rows),
        )
