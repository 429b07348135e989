"""PostgresRuntime: the event log and read model in one PostgreSQL schema."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from loomflow.errors import LoomflowError, StoreClosedError, StoreError
from loomflow.projections import postgres as pg
from loomflow.projections.fold import CheckpointRow, SessionRow, StepRow
from loomflow.projections.postgres import store_error
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
from loomflow.settings import Settings

__all__ = ["PostgresRuntime", "PostgresStore"]

T = TypeVar("T")

_HINT = "start a local server with `dev/postgres.sh start`, or check the DSN"


def _redact(dsn: str) -> str:
    """The DSN without its password, fit for messages and logs."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<a DSN that does not parse>"
    user, at, hosts = parts.netloc.rpartition("@")
    netloc = f"{user.partition(':')[0]}{at}{hosts}"
    query = "&".join(p for p in parts.query.split("&") if not p.startswith("password="))
    return urlunsplit(parts._replace(netloc=netloc, query=query))


async def _leave_session(conn: asyncpg.Connection) -> None:
    """Reset nothing when a connection goes back to the pool.

    The store leaves no session state behind (no SET, LISTEN, cursors or session-level
    locks; asyncpg still rolls back an unfinished transaction), and asyncpg's default
    reset would cost one more round trip on every release.
    """


async def _commit_round(
    conn: asyncpg.Connection, schema: str, appends: list[list[Event]]
) -> list[LoomflowError | None]:
    """Commit a round of appends in one transaction; return each append's outcome."""
    try:
        async with conn.transaction():
            await pg.apply_events(conn, schema, [e for events in appends for e in events])
        return [None] * len(appends)
    except LoomflowError as exc:
        if len(appends) == 1:
            return [exc]
    # one of them was refused: again, each in its own savepoint, so that it fails alone
    outcomes: list[LoomflowError | None] = []
    async with conn.transaction():
        for events in appends:
            try:
                async with conn.transaction():
                    await pg.apply_events(conn, schema, events)
            except LoomflowError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
    return outcomes


class PostgresStore(EventStore):
    """A PostgreSQL schema holding the log and its read model.

    Appends that arrive while a commit is in flight are committed together in the next
    round: one transaction that folds all of them as one batch (a few statements
    whatever the number of sessions). If the fold refuses any of them, the round is
    applied again with a savepoint per append, so a refused append fails alone. Sessions
    touched are row-locked, so several stores (processes) may share the schema; a writer
    that lost a race gets a typed refusal. The pool is created on first use (or by
    ``open``), and the schema is created and migrated then.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "loomflow",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise ValueError("dsn must be a postgresql:// URL")
        self.dsn = dsn
        self.schema = pg.check_schema(schema)
        self._pool_options = {"min_size": min_size, "max_size": max_size}
        self._connect_timeout = connect_timeout
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._cache = TranscriptCache()
        self._writes = GroupCommit(lambda batches: self._call(_commit_round, batches), self._cache)

    def __repr__(self) -> str:
        return f"PostgresStore({_redact(self.dsn)!r}, schema={self.schema!r})"

    # -- connections ---------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and migrate now instead of on first use."""
        await self._ready()

    async def _ready(self) -> asyncpg.Pool:
        if self._closed:
            raise StoreClosedError(f"the PostgreSQL store {self._where()} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            raise StoreError(
                f"the PostgreSQL store {self._where()} was opened on another event loop; "
                "create one runtime per event loop"
            )
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    self._pool = await self._connect()
                    self._loop = loop
        return self._pool

    async def _connect(self) -> asyncpg.Pool:
        password = urlsplit(self.dsn).password if "://" in self.dsn else None
        try:
            pool = await asyncpg.create_pool(
                self.dsn,
                timeout=self._connect_timeout,
                reset=_leave_session,
                **self._pool_options,
            )
        except (
            OSError,
            TimeoutError,
            ValueError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
        ) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if password:
                reason = reason.replace(password, "***")
            raise store_error(
                f"cannot connect to PostgreSQL at {_redact(self.dsn)} ({reason}); {_HINT}", exc
            ) from exc
        try:
            async with pool.acquire() as conn:
                await pg.migrate(conn, self.schema)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError | OSError):
                raise store_error(
                    f"cannot create or migrate schema {self.schema!r} in PostgreSQL at "
                    f"{_redact(self.dsn)}: {exc}",
                    exc,
                ) from exc
            raise
        return pool

    def _where(self) -> str:
        return f"{_redact(self.dsn)} (schema {self.schema})"

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        pool = await self._ready()
        try:
            async with pool.acquire() as conn:
                return await fn(conn, self.schema, *args)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise store_error(f"PostgreSQL store {self._where()}: {exc}", exc) from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._opening:  # let an opening in flight finish, then close its pool
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- writes ----------------------------------------------------------------------------

    async def append(self, events: Sequence[Event]) -> None:
        if not events:
            return
        await self._ready()  # fail here, not in the drainer, when the store cannot open
        await self._writes.append(list(events))

    def forget(self, scope: Scope) -> None:
        """Drop what the transcript cache holds of the session."""
        self._cache.forget((scope.user_id, scope.session_id))

    async def prune(
        self,
        *,
        before: datetime | None = None,
        session_id: str | None = None,
        user_id: Any = ANY_USER,
    ) -> PruneResult:
        _check_prune_filters(before, session_id, user_id)
        self._cache.forget()
        counts = await self._call(_prune, before, session_id, user_id)
        return PruneResult(*counts)

    # -- reads -------------------------------------------------------------------------------

    async def session(self, scope: Scope) -> SessionRow | None:
        return await self._call(pg.load_session, scope.user_id, scope.session_id)

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        return await self._call(pg.get_checkpoint, scope.user_id, scope.session_id, checkpoint_id)

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        return await self._call(pg.list_checkpoints, scope.user_id, scope.session_id, limit)

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        async def fetch(lo: int, hi: int) -> list[Message]:
            return await self._call(pg.read_transcript, scope.user_id, scope.session_id, lo, hi)

        key = (scope.user_id, scope.session_id)
        return await self._cache.read(key, base_seq, upto_seq, message_count, fetch)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        return await self._call(pg.get_step, scope.user_id, scope.session_id, step_key)

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        return await self._call(
            pg.read_events, scope.user_id, scope.session_id, after_seq + 1, 2**62
        )

    async def matching_sessions(self, session_id: str | None, user_id: Any) -> list[SessionRow]:
        """Live sessions matching the filters (``ANY_USER`` matches every user)."""
        return await self._call(
            functools.partial(
                pg.match_sessions,
                session_id=session_id,
                user_id=None if user_id is ANY_USER else user_id,
                any_user=user_id is ANY_USER,
            )
        )

    async def positions(self, consumer: str, topic: str) -> dict[int, int]:
        """partition -> next offset the projector group ``consumer`` committed."""
        return await self._call(pg.load_positions, consumer, topic)

    async def refusal(self, event_ids: Sequence[str]) -> tuple[str, str] | None:
        """(error type, reason) of a consumer's refusal of any of these events, or None."""
        return await self._call(pg.find_refusal, list(event_ids))

    async def processors(self) -> list[tuple[str, pg.ProcessorRow]]:
        """(schema, worker) of every processor that reported to a schema of this database."""

        async def read(conn: asyncpg.Connection, schema: str) -> list[tuple[str, pg.ProcessorRow]]:
            found: list[tuple[str, pg.ProcessorRow]] = []
            for other in await pg.schemas_with_processors(conn):
                try:
                    pg.check_schema(other)
                except ValueError:
                    continue  # not a name loomflow would have created
                found.extend((other, row) for row in await pg.list_processors(conn, other))
            found.sort(key=lambda item: (item[0] != schema, item[1].seen_seconds_ago))
            return found

        return await self._call(read)


async def _prune(
    conn: asyncpg.Connection,
    schema: str,
    before: datetime | None,
    session_id: str | None,
    user_id: Any,
) -> tuple[int, int, int, int]:
    async with conn.transaction():
        return await pg.prune(
            conn,
            schema,
            before=before,
            session_id=session_id,
            user_id=None if user_id is ANY_USER else user_id,
            any_user=user_id is ANY_USER,
        )


class PostgresRuntime(Runtime):
    """Durable runs in PostgreSQL: the same events and semantics as SqliteRuntime, with
    log and read model in one schema that many processes share.

    ``dsn`` and ``schema`` default to the ``LOOMFLOW_*`` settings (see
    :class:`loomflow.settings.Settings`), read the same way as by every other process.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        max_checkpoints_per_session: int = 20,
        schema: str | None = None,
        serializer: Serializer = "json",
        min_size: int = 1,
        max_size: int = 10,
        settings: Settings | None = None,
    ) -> None:
        resolved = Settings.resolve(settings, postgres_dsn=dsn, db_schema=schema)
        self._pg_store = PostgresStore(
            resolved.postgres_dsn,
            schema=resolved.db_schema,
            min_size=min_size,
            max_size=max_size,
            connect_timeout=resolved.connect_timeout,
        )
        super().__init__(
            self._pg_store,
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
        )

    @property
    def store(self) -> PostgresStore:
        return self._pg_store

    @classmethod
    async def connect(
        cls,
        dsn: str | None = None,
        *,
        max_checkpoints_per_session: int = 20,
        schema: str | None = None,
        serializer: Serializer = "json",
        min_size: int = 1,
        max_size: int = 10,
        settings: Settings | None = None,
    ) -> PostgresRuntime:
        """A runtime already connected, with its schema created and migrated."""
        runtime = cls(
            dsn,
            max_checkpoints_per_session=max_checkpoints_per_session,
            schema=schema,
            serializer=serializer,
            min_size=min_size,
            max_size=max_size,
            settings=settings,
        )
        try:
            await runtime.store.open()
        except BaseException:
            await runtime.close()
            raise
        return runtime
