"""PostgresRuntime: the event log and read model in one PostgreSQL schema."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from loomflow.errors import StoreClosedError, StoreError
from loomflow.projections import postgres as pg
from loomflow.projections.fold import PruneFilter
from loomflow.projections.postgres import connect_error, store_error
from loomflow.runtime.base import Runtime
from loomflow.runtime.group_commit import GroupCommit
from loomflow.runtime.store import DatabaseStore, PruneResult
from loomflow.schemas import Event
from loomflow.schemas.codec import Serializer
from loomflow.schemas.scope import Scope
from loomflow.schemas.sessions import SessionRecord
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


class PostgresStore(DatabaseStore):
    """A PostgreSQL schema holding the log and its read model.

    Appends that arrive while a commit is in flight are committed together in the next
    round: one transaction that folds all of them as one batch (a few statements
    whatever the number of sessions). If the fold refuses any of them, the round is
    applied again with a savepoint per append, so a refused append fails alone. Sessions
    touched are row-locked, so several stores (processes) may share the schema; a writer
    that lost a race gets a typed refusal. The pool is created on first use (or by
    ``open``), and the schema is created and migrated then. ``create=False`` opens only
    a schema that exists (for tools that inspect one): a missing one raises StoreError
    and is not created. The settings' signing key signs what it appends.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        connect_timeout: float | None = None,
        auto_migrate: bool | None = None,
        create: bool = True,
        settings: Settings | None = None,
    ) -> None:
        if dsn is not None and (not isinstance(dsn, str) or not dsn):
            raise ValueError("dsn must be a postgresql:// URL")
        resolved = Settings.resolve(
            settings,
            postgres_dsn=dsn,
            db_schema=schema,
            pool_min_size=min_size,
            pool_max_size=max_size,
            connect_timeout=connect_timeout,
            auto_migrate=auto_migrate,
        )
        self.dsn = resolved.postgres_dsn
        self.schema = pg.check_schema(resolved.db_schema)
        self._pool_options = {
            "min_size": resolved.pool_min_size,
            "max_size": resolved.pool_max_size,
        }
        self._connect_timeout = resolved.connect_timeout
        self.auto_migrate = resolved.auto_migrate
        self.create = create
        self.signer, self.signing_refused = resolved.writer_key()
        self._pool: asyncpg.Pool | None = None
        #: the Kafka consumers that project into the schema, read before the first write
        #: of each connection (see ``_writable``)
        self._fed_by: list[tuple[str, str]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        super().__init__()
        #: the session rows of this store's own last commits (see pg.commit_round)
        self._known: dict[Scope, SessionRecord] = {}
        self._writes = GroupCommit(
            lambda batches: self._call(pg.commit_round, batches, self._known), self._cache
        )

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> PostgresStore:
        """The store of the settings' DSN, schema, pool, timeout and migration policy;
        ``options`` override any of the constructor's (e.g. a smaller pool, ``create``)."""
        return cls(settings=settings, **options)

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
                    self._fed_by = None
                    self._pool = await self._connect()
                    self._loop = loop
        return self._pool

    async def _writable(self) -> None:
        """Refuse to write into a read model that a Kafka log feeds (a consumer's
        positions in the schema, or a processor reporting to it: ``loomflow processor``
        with the default settings, which PostgresRuntime and KafkaRuntime share): what
        this store wrote would be in no log, so a rebuild, ``loomflow tail`` and the audit
        would never see it, and the projector would refuse the session's later events."""
        feeds = await self.kafka_feeds()
        if feeds:
            raise StoreError(
                f"schema {self.schema!r} in PostgreSQL at {_redact(self.dsn)} is the read "
                f"model of a Kafka log ({feeds}): write through the log with KafkaRuntime, "
                "or give PostgresRuntime a schema of its own (schema=, or LOOMFLOW_SCHEMA)"
            )

    async def kafka_feeds(self) -> str | None:
        """Which Kafka consumers project into the schema ("consumers GROUP of TOPIC,
        ..."), read once a connection; None for PostgresRuntime's own log."""
        if self._fed_by is None:
            self._fed_by = await self.consumed_topics()
        if not self._fed_by:
            return None
        groups = ", ".join(sorted({f"{group} of {topic}" for group, topic in self._fed_by}))
        return f"consumers {groups}"

    async def _connect(self) -> asyncpg.Pool:
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
            raise connect_error(self.dsn, _redact(self.dsn), exc, _HINT) from exc
        try:
            async with pool.acquire() as conn:
                if not self.create and not await pg.schema_version(conn, self.schema):
                    raise StoreError(
                        f"no loomflow schema {self.schema!r} in PostgreSQL at "
                        f"{_redact(self.dsn)}: check the schema name (LOOMFLOW_SCHEMA); if "
                        "it is right, nothing has created it yet: `loomflow processor` "
                        "creates a Kafka log's read model, a PostgresRuntime its schema on "
                        "first use, and `loomflow setup` either ahead of them "
                        "(`--postgres-only` without Kafka)"
                    )
                if self.auto_migrate:
                    await pg.migrate(conn, self.schema)
                else:
                    await pg.check_version(conn, self.schema)
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

    async def setup(self) -> None:
        """Create or migrate the schema now, whatever ``auto_migrate`` says: for deploys
        that migrate ahead of the processes, which then run with it off."""
        auto, self.auto_migrate = self.auto_migrate, True
        try:
            await self._ready()  # connecting migrates (an open pool found it current)
        finally:
            self.auto_migrate = auto

    def _where(self) -> str:
        return f"{_redact(self.dsn)} (schema {self.schema})"

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        pool = await self._ready()
        try:
            async with pool.acquire() as conn:
                return await fn(conn, self.schema, *args)
        except (
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,
            OSError,
        ) as exc:
            raise store_error(f"PostgreSQL store {self._where()}: {exc}", exc) from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.disconnect()

    async def disconnect(self) -> None:
        """Close the pool but not the store: the next use connects again (for an owner
        whose own start failed after this store had connected)."""
        async with self._opening:  # let an opening in flight finish, then close its pool
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # -- writes ----------------------------------------------------------------------------

    async def _append(self, events: Sequence[Event]) -> None:
        if not events:
            return
        await self._ready()  # fail here, not in the drainer, when the store cannot open
        await self._writable()
        await self._writes.append(list(events))

    async def claim_head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None]:
        """``head`` without a round trip when this store's last commit to the session left
        its row: a claim made of it is written only if the session still ends there (the
        claim's seq and epoch), else it is refused and made again of a read
        (``open_session``). The newest checkpoint (a resume's claim) is read: a prune
        deletes checkpoints without moving the session on, so no row says it is stale."""
        row = self._known.get(scope)
        if row is None or checkpoint:
            return await self.head(scope, checkpoint=checkpoint)
        return row, None

    async def _prune(self, match: PruneFilter) -> PruneResult:
        await self._writable()
        self.forget()
        self._known.clear()
        return PruneResult(*await self._call(_prune, match))

    # -- reads -------------------------------------------------------------------------------

    queries: ClassVar[Any] = pg.reads

    async def _query(self, query: Callable[..., Any], *args: Any) -> Any:
        return await self._call(query, *args)

    async def head(
        self, scope: Scope, *, checkpoint: bool = False
    ) -> tuple[SessionRecord | None, str | None]:
        """The session's row and (``checkpoint``) its newest checkpoint's id, in one
        round trip."""
        row, latest, _ = await self.head_at(scope, checkpoint=checkpoint)
        return row, latest

    async def head_at(
        self,
        scope: Scope,
        *,
        checkpoint: bool = False,
        position: tuple[str, str, int] | None = None,
    ) -> tuple[SessionRecord | None, str | None, int]:
        """``head``, and the next offset of ``position`` (consumer, topic, partition) read
        in the same snapshot (0 when none is stored, or no position is asked for)."""
        found: tuple[SessionRecord | None, str | None, int] = await self._read(
            pg.reads.load_head, scope, checkpoint, position
        )
        return found

    async def consumed_topics(self) -> list[tuple[str, str]]:
        """(consumer group, topic) of the Kafka consumers that project into this schema;
        empty when it is PostgresRuntime's own log."""
        return await self._call(pg.consumed_topics)

    async def matching_sessions(self, match: PruneFilter) -> list[SessionRecord]:
        """The live sessions that ``match`` selects."""
        return await self._call(pg.match_sessions, match)

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
                    rows = await pg.list_processors(conn, other)
                except ValueError:
                    continue  # not a name loomflow would have created
                except asyncpg.UndefinedTableError:
                    continue  # dropped since it was listed
                found.extend((other, row) for row in rows)
            found.sort(key=lambda item: (item[0] != schema, item[1].seen_seconds_ago))
            return found

        return await self._call(read)


async def _prune(
    conn: asyncpg.Connection, schema: str, match: PruneFilter
) -> tuple[int, int, int, int]:
    async with conn.transaction():
        return await pg.prune(conn, schema, match)


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
        max_checkpoints_per_session: int | None = None,
        schema: str | None = None,
        serializer: Serializer | None = None,
        lease_seconds: float | None = None,
        retry_seconds: float | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        settings: Settings | None = None,
    ) -> None:
        if dsn is not None and (not isinstance(dsn, str) or not dsn):
            raise ValueError("dsn must be a postgresql:// URL")
        resolved = Settings.resolve(
            settings,
            postgres_dsn=dsn,
            db_schema=schema,
            pool_min_size=min_size,
            pool_max_size=max_size,
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
        )
        self._pg_store = PostgresStore(settings=resolved)
        super().__init__(self._pg_store, settings=resolved)

    @property
    def store(self) -> PostgresStore:
        return self._pg_store
