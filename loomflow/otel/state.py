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
from typing import Any

from loomflow.lifecycle import Resource
from loomflow.otel.fold import SessionTrace, decode_state, encode_state
from loomflow.projections.rows import stored_user
from loomflow.projections.sqlite import SqliteThread
from loomflow.projections.sqlite.otel import connect_otel, otel_positions, otel_states, put_otel

__all__ = ["PostgresState", "ScopeKey", "SqliteState", "TraceState", "default_state_path"]

#: a session as the state keys it: (user id, session id)
ScopeKey = tuple[str | None, str]


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
        return connect_otel(self.path, self.where)

    async def open(self) -> None:
        await self._thread.call(lambda conn: None)

    async def close(self) -> None:
        await self._thread.close()

    async def load(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, SessionTrace]:
        keys = {(stored_user(u), s): (u, s) for u, s in scopes}
        stored = await self._thread.call(otel_states, list(keys))
        return {keys[key]: decode_state(state) for key, state in stored.items()}

    async def save(
        self, states: Mapping[ScopeKey, SessionTrace], position: dict[int, int] | None
    ) -> None:
        rows = [(stored_user(u), s, encode_state(state)) for (u, s), state in states.items()]
        await self._thread.call(put_otel, rows, position)

    async def position(self) -> dict[int, int] | None:
        return await self._thread.call(otel_positions) or None


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
        await self._call(_connected)

    async def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()

    async def load(self, scopes: Iterable[ScopeKey]) -> dict[ScopeKey, SessionTrace]:
        keys = list(scopes)
        if not keys:
            return {}
        from loomflow.projections.postgres.otel import otel_states as pg_states

        rows = await self._call(pg_states, [stored_user(u) for u, _ in keys], [s for _, s in keys])
        return {(r[0] or None, r[1]): decode_state(r[2]) for r in rows}

    async def save(
        self, states: Mapping[ScopeKey, SessionTrace], position: dict[int, int] | None
    ) -> None:
        rows = [(stored_user(u), s, encode_state(state)) for (u, s), state in states.items()]
        if rows:
            from loomflow.projections.postgres.otel import put_otel as pg_put

            await self._call(pg_put, rows)

    async def position(self) -> dict[int, int] | None:
        return None  # the otel group's committed offsets


async def _connected(conn: Any, schema: str) -> None:
    """Nothing: getting a connection (the store connects and migrates first) is the check."""
