"""SqliteRuntime: the event log and read model in one SQLite file (WAL mode)."""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from loomflow.errors import LoomflowError, StoreClosedError, StoreError
from loomflow.projections import sqlite as sql
from loomflow.projections.fold import CheckpointRow, SessionRow, StepRow, fold
from loomflow.runtime.base import (
    ANY_USER,
    EventStore,
    GroupCommit,
    PruneResult,
    Runtime,
    Scope,
    Serializer,
    TranscriptCache,
    _check_prune_filters,
)
from loomflow.schemas import Event, Message

__all__ = ["SqliteRuntime", "SqliteStore"]

T = TypeVar("T")


class SqliteStore(EventStore):
    """A SQLite file holding the log and its read model.

    All SQLite work runs on one thread owned by this store, so the event loop never
    blocks on disk. Appends that arrive while the thread is busy are committed together
    in one transaction (each in its own savepoint, so a refused append fails alone):
    many concurrent sessions cost one commit per round instead of one each. Several
    stores (in one process or several) may share a file: WAL lets readers run beside
    the one writer, and each commit is a ``BEGIN IMMEDIATE`` transaction that waits its
    turn (``busy_timeout``).
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 30_000) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loomflow-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._cache = TranscriptCache()
        self._writes = GroupCommit(
            lambda batches: self._call(_append_batches, batches), self._cache
        )

    # -- thread plumbing ---------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreClosedError(f"the SQLite store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._run, fn, *args))

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._conn or self._open()
        try:
            return fn(conn, *args)
        except sqlite3.DatabaseError as exc:
            if conn.in_transaction:
                conn.rollback()
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    def _open(self) -> sqlite3.Connection:
        if self.path.parent and not self.path.parent.exists():
            raise StoreError(f"directory {self.path.parent} does not exist for store {self.path}")
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = NORMAL")
            sql.migrate(conn)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open {self.path} as a loomflow SQLite store: {exc}") from exc
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: SQLite refused WAL mode (got {mode})")
        self._conn = conn
        return conn

    async def open(self) -> None:
        """Open (creating or migrating) the file now instead of on first use."""
        await self._call(_no_op)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_conn)
        self._executor.shutdown(wait=False)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the last connection to close checkpoints and removes the WAL
            self._conn = None

    # -- writes ------------------------------------------------------------------------

    async def append(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self._closed:
            raise StoreClosedError(f"the SQLite store {self.path} is closed")
        await self._writes.append(list(events))

    async def prune(
        self,
        *,
        before: datetime | None = None,
        session_id: str | None = None,
        user_id: Any = ANY_USER,
    ) -> PruneResult:
        _check_prune_filters(before, session_id, user_id)
        self._cache.forget()
        return await self._call(_prune, before, session_id, user_id)

    # -- reads -------------------------------------------------------------------------

    async def session(self, scope: Scope) -> SessionRow | None:
        return await self._call(sql.load_session, scope.user_id, scope.session_id)

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        return await self._call(sql.get_checkpoint, scope.user_id, scope.session_id, checkpoint_id)

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        return await self._call(sql.list_checkpoints, scope.user_id, scope.session_id, limit)

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        async def fetch(lo: int, hi: int) -> list[Message]:
            return await self._call(sql.read_transcript, scope.user_id, scope.session_id, lo, hi)

        key = (scope.user_id, scope.session_id)
        return await self._cache.read(key, base_seq, upto_seq, message_count, fetch)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        return await self._call(sql.get_step, scope.user_id, scope.session_id, step_key)

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        return await self._call(
            sql.read_events, scope.user_id, scope.session_id, after_seq + 1, 2**62
        )


def _append_batches(
    conn: sqlite3.Connection, batches: list[list[Event]]
) -> list[LoomflowError | None]:
    """Apply each batch in its own savepoint of one transaction; return each outcome."""
    outcomes: list[LoomflowError | None] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for events in batches:
            conn.execute("SAVEPOINT batch")
            try:
                _apply_events(conn, events)
            except LoomflowError as exc:  # refused by the fold: only this batch fails
                conn.execute("ROLLBACK TO batch")
                outcomes.append(exc)
            else:
                outcomes.append(None)
            conn.execute("RELEASE batch")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return outcomes


def _apply_events(conn: sqlite3.Connection, events: list[Event]) -> None:
    rows: dict[tuple[str | None, str], SessionRow | None] = {}
    for event in events:
        key = (event.user_id, event.session_id)
        if key not in rows:
            rows[key] = sql.load_session(conn, *key)
        current = rows[key]
        if current is not None and event.seq <= current.last_seq:
            stored = conn.execute(
                "SELECT event_id FROM loomflow_events WHERE user_id = ? AND session_id = ? "
                "AND seq = ?",
                ("" if key[0] is None else key[0], key[1], event.seq),
            ).fetchone()
            if stored is not None and stored[0] == event.event_id:
                continue  # a retried append of an event already stored
        folded, mutations = fold(current, event)
        for mutation in mutations:
            sql.apply(conn, event.user_id, event.session_id, mutation)
        sql.insert_event(conn, event)
        rows[key] = folded
    for row in rows.values():
        if row is not None:
            sql.save_session(conn, row)


def _prune(
    conn: sqlite3.Connection, before: datetime | None, session_id: str | None, user_id: Any
) -> PruneResult:
    where, params = [], []
    if session_id is not None:
        where.append("session_id = ?")
        params.append(session_id)
    if user_id is not ANY_USER:
        where.append("user_id = ?")
        params.append("" if user_id is None else user_id)
    clause = " AND ".join(where) or "1"
    conn.execute("BEGIN IMMEDIATE")
    try:
        sessions = checkpoints = steps = events = 0
        matched = conn.execute(
            f"SELECT user_id, session_id, updated_at FROM loomflow_sessions WHERE {clause}", params
        ).fetchall()
        for uid, sid, updated_at in matched:
            scope = (uid, sid)
            if before is None or datetime.fromisoformat(updated_at) < before:
                sessions += 1
                checkpoints += _delete(conn, "loomflow_checkpoints", scope)
                steps += _delete(conn, "loomflow_steps", scope)
                events += _delete(conn, "loomflow_events", scope)
                _delete(conn, "loomflow_sessions", scope)
                continue
            cutoff = sql.ts(before)
            checkpoints += _delete(conn, "loomflow_checkpoints", scope, "created_at < ?", cutoff)
            steps += _delete(conn, "loomflow_steps", scope, "at < ?", cutoff)
            events += _delete(
                conn, "loomflow_events", scope, "type = 'step.recorded' AND at < ?", cutoff
            )
        conn.execute("COMMIT")
        return PruneResult(sessions, checkpoints, steps, events)
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _delete(
    conn: sqlite3.Connection, table: str, scope: tuple[str, str], extra: str = "", *args: Any
) -> int:
    sql_text = f"DELETE FROM {table} WHERE user_id = ? AND session_id = ?"
    if extra:
        sql_text += f" AND {extra}"
    return conn.execute(sql_text, (*scope, *args)).rowcount


class SqliteRuntime(Runtime):
    """Durable runs in one local SQLite file: nothing to install, the same semantics."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_checkpoints_per_session: int = 20,
        serializer: Serializer = "json",
    ) -> None:
        super().__init__(
            SqliteStore(path),
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
        )


def _no_op(conn: sqlite3.Connection) -> None:
    """What ``open`` runs on the store's thread: opening the connection is the point."""
