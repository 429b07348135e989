"""Where a command's log is, and the one place the command line and the web console
open it from.

A :class:`Source` is built once from a command's arguments: ``--db PATH`` names an
embedded log (the SQLite file a ``SqliteRuntime`` writes, its read model in the same
file); without it, the Kafka topic and PostgreSQL schema the ``LOOMFLOW_*`` settings name
(``--dsn`` and ``--schema`` override theirs), as ``loomflow processor`` reads them. From it
come the runtime over the store, the reader of the log, the audit trail and the analytics
tables. Nothing opens, and nothing heavy loads, before a command asks.

A command given no ``--db`` and no ``--dsn`` falls back to the scaled path's PostgreSQL (the
DSN of ``LOOMFLOW_POSTGRES_DSN``, or the default one): it says so on stderr, one line, when
it first opens it, so that neither is a surprise and stdout stays the command's own.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from loomflow.control.refused import Refused

if TYPE_CHECKING:
    from loomflow.analytics.tally import Stats
    from loomflow.log.reader import LogReader
    from loomflow.projections.audit import Trail
    from loomflow.runtime import Runtime
    from loomflow.schemas.signing import Signatures
    from loomflow.settings import Settings

__all__ = ["Access", "Source", "quiet_kafka", "read_settings"]

#: what a command does to the store: reads it, writes into it, or appends through the
#: Kafka log that `loomflow processor` folds into it
Access = Literal["read", "write", "kafka"]


def read_settings() -> Settings | None:
    """The LOOMFLOW_* settings, or None after printing why they do not validate."""
    from pydantic import ValidationError

    from loomflow.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        # one line: each variable and what is wrong with it (not its value: a DSN or a
        # key may be among them), not pydantic's several lines and its link
        wrong = "; ".join(
            f"LOOMFLOW_{'_'.join(map(str, error['loc'])).upper()}: {error['msg']}"
            for error in exc.errors()
        )
        print(f"loomflow: invalid setting {wrong}", file=sys.stderr)
        return None


def quiet_kafka() -> None:
    """Keep aiokafka's own log lines (a reconnect, a missing topic) out of a one-shot
    command's output: the command says what went wrong itself, once."""
    import logging

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class Source:
    """The log of a command: the embedded log ``db``, or (``db`` None) the Kafka topic
    and PostgreSQL read model of ``settings``. Exactly one of them is set. ``fallback``:
    where the PostgreSQL DSN came from when no ``--dsn`` named it (``LOOMFLOW_POSTGRES_DSN``
    or ``the default DSN``), which the first opening of PostgreSQL notes on stderr."""

    db: Path | None = None
    settings: Settings | None = None
    fallback: str | None = None
    _noted: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.db is None) == (self.settings is None):
            raise ValueError("a Source is an embedded log or the settings of the scaled path")

    @classmethod
    def of(
        cls, db: Path | None, *, dsn: str | None = None, schema: str | None = None
    ) -> Source | None:
        """The embedded log ``db``, or the LOOMFLOW_* settings with ``--dsn`` and
        ``--schema`` over theirs; None after printing why those settings do not validate.
        Raises :class:`Refused` for ``--schema`` with ``--db``, or a bad ``--dsn`` or
        ``--schema``."""
        if db is not None:
            if schema is not None:
                raise Refused("--schema goes with a PostgreSQL read model, not with --db", 2)
            return cls(db=db)
        from pydantic import ValidationError

        from loomflow.settings import Settings

        environment = read_settings()
        if environment is None:
            return None
        try:
            settings = Settings.resolve(environment, postgres_dsn=dsn, db_schema=schema)
        except ValidationError as exc:
            problems = "; ".join(str(e["msg"]) for e in exc.errors())
            raise Refused(f"invalid --dsn or --schema: {problems}", 2) from None
        if dsn is not None:
            return cls(settings=settings)
        given = "postgres_dsn" in environment.model_fields_set
        return cls(
            settings=settings, fallback="LOOMFLOW_POSTGRES_DSN" if given else "the default DSN"
        )

    @property
    def _scaled(self) -> Settings:
        assert self.settings is not None, "an embedded log has no settings"
        return self.settings

    @property
    def name(self) -> str:
        """The store as a line says it: ``SQLite journal.db``, or ``the PostgreSQL read
        model at 127.0.0.1:5432/loomflow, schema loomflow`` (never the DSN's user or
        password), as the note of a command that fell back to it names it."""
        if self.db is not None:
            return f"SQLite {self.db}"
        return f"the PostgreSQL read model at {self._postgres_where()}"

    def _postgres_where(self) -> str:
        """``host:port/database, schema NAME`` of the settings' PostgreSQL."""
        settings = self._scaled
        return f"{_postgres_address(settings.postgres_dsn)}, schema {settings.db_schema}"

    def _note_postgres(self, what: str) -> None:
        """Say on stderr, once per ``what``, that ``what`` is the PostgreSQL the command
        fell back to (no --db, no --dsn)."""
        if self.fallback is None or what in self._noted:
            return
        self._noted.add(what)
        print(
            f"loomflow: {what} at {self._postgres_where()} (no --db given; {self.fallback})",
            file=sys.stderr,
            flush=True,
        )

    @asynccontextmanager
    async def runtime(self, access: Access = "read") -> AsyncIterator[Runtime]:
        """The runtime over the store, open: ``read`` and ``write`` never create a missing
        SQLite file or schema, ``kafka`` is a ``KafkaRuntime`` of the settings. Refused
        (:class:`Refused`): ``write`` into a read model a Kafka log feeds, ``kafka`` with
        an embedded log."""
        async with self._runtime(access) as runtime:
            if access == "write" and self.db is None:
                await _refuse_kafka_read_model(runtime)
            yield runtime

    def _runtime(self, access: Access) -> Runtime:
        if self.db is not None:
            if access == "kafka":
                raise Refused("--kafka goes with a PostgreSQL read model, not with --db", 2)
            from loomflow.runtime import Runtime, SqliteStore

            return Runtime(SqliteStore(self.db, create=False))
        if access == "kafka":
            from loomflow.runtime import KafkaRuntime

            settings = self._scaled
            self._note_postgres(
                f"appending through the Kafka log at {settings.kafka_bootstrap} "
                "to the PostgreSQL read model"
            )
            return KafkaRuntime(settings=settings)
        from loomflow.runtime import PostgresStore, Runtime

        self._note_postgres(
            f"{'reading' if access == 'read' else 'writing to'} the PostgreSQL read model"
        )
        return Runtime(PostgresStore.from_settings(self._scaled, max_size=2, create=False))

    def signatures(self) -> Signatures:
        """What this command's readers of the log do with events' signatures: the
        settings' ``signatures_policy()`` (an embedded log's from the ``LOOMFLOW_*``
        environment). Raises SigningKeyError for a keyring that cannot be read, or
        settings that do not validate (after printing why)."""
        from loomflow.errors import SigningKeyError

        settings = self.settings or read_settings()
        if settings is None:
            raise SigningKeyError(
                "the LOOMFLOW_* settings do not validate (see above), so which signatures "
                "to check is not known: fix them first"
            )
        return settings.signatures_policy()

    def reader(
        self,
        *,
        group: str | None = None,
        start: Literal["beginning", "end", "committed"] | dict[int, int] = "beginning",
        signatures: Signatures | None = None,
    ) -> LogReader:
        """The reader of the log, not open yet: of the embedded log from a position
        (``{0: next}``), or of the Kafka topic in ``group`` (None: in no group). It
        applies ``signatures`` (None: the settings', see ``signatures``; a reader of the
        raw records passes ``NO_SIGNATURES``)."""
        from loomflow.log.reader import kafka_reader, sqlite_reader

        rule = self.signatures() if signatures is None else signatures
        if self.db is not None:
            if start == "committed":
                raise ValueError("an embedded log keeps no group positions")
            return sqlite_reader(self.db, start=start, signatures=rule)
        if isinstance(start, dict):
            raise ValueError("a Kafka reader starts at its group's offsets")
        return kafka_reader(self._scaled, group=group, start=start, signatures=rule)

    def trail(self, path: Path | None = None, *, create: bool = True) -> Trail:
        """The audit trail, not open yet: of an embedded log, the file ``path`` (default:
        beside the log), which ``create=False`` only opens when it exists; at scale, the
        trail in the settings' PostgreSQL schema."""
        from loomflow.projections.audit import PostgresTrail, SqliteTrail, default_trail_path
        from loomflow.runtime.postgres import PostgresStore

        if self.db is not None:
            return SqliteTrail(path or default_trail_path(self.db), create=create)
        settings = self._scaled
        self._note_postgres("the audit trail in PostgreSQL")
        store = PostgresStore.from_settings(settings, max_size=2)
        where = f"audit trail in PostgreSQL schema {settings.db_schema}"
        return PostgresTrail(store._call, where, on_close=store.close)

    def trail_lock(self, path: Path | None = None) -> AbstractAsyncContextManager[bool]:
        """The lock whatever writes the audit trail (:meth:`trail` of the same ``path``)
        holds while it does, not taken yet: ``async with`` it yields True once this
        process holds it, False (holding nothing) while another does. Two audits writing
        one trail at once read the same records and heads of chains: one found them all
        chained and counted none, or both chained them and one failed on the trail's
        unique keys (and on Kafka they split the audit group's partitions). An embedded
        trail's lock is the file ``<trail>-lock`` beside it; at scale, a PostgreSQL
        advisory lock named by the schema."""
        from loomflow.control.exclusive import advisory_lock, file_lock
        from loomflow.projections.audit import default_trail_path

        if self.db is not None:
            trail = path or default_trail_path(self.db)
            return file_lock(trail.with_name(f"{trail.name}-lock"))
        settings = self._scaled
        return advisory_lock(
            settings.postgres_dsn,
            f"loomflow.audit:{settings.db_schema}",
            connect_timeout=settings.connect_timeout,
            where=self._postgres_where(),
        )

    def stats(self, stats_db: Path | None, *, warn: Callable[[str], None]) -> Stats:
        """Every hour of the analytics tables: an embedded log's (in ``stats_db``, default
        beside it), brought up to date with the log first, or the Kafka tables `loomflow
        analytics` keeps. ``warn`` is told what they leave uncounted. For a command: it
        runs its own event loop (:meth:`read_stats` is the same, awaited)."""
        import asyncio

        return asyncio.run(self.read_stats(stats_db, warn=warn))

    async def read_stats(self, stats_db: Path | None, *, warn: Callable[[str], None]) -> Stats:
        """:meth:`stats`, in a running event loop (the web console's)."""
        import asyncio

        if self.db is not None:
            from loomflow.analytics import embedded

            progress = await embedded.update(self.db, stats_db, signatures=self.signatures())
            if progress.skipped:
                warn(
                    f"{progress.skipped} of {progress.records} new log records were not "
                    "counted (see the warnings above)"
                )
            if progress.unverified:
                warn(
                    f"{progress.unverified} of {progress.records} new log records were "
                    "counted with a signature that does not hold (LOOMFLOW_SIGNATURES=check)"
                )
            path = stats_db or embedded.stats_path(self.db)
            return await asyncio.to_thread(embedded.load, path, source=f"journal {self.db}")
        from loomflow.analytics.app import lag, read_stats

        settings = self._scaled
        stats = await read_stats(settings)
        behind = await lag(settings)
        if behind:
            warn(
                f"group {settings.analytics_group} has {behind} records of "
                f"{settings.events_topic} left to count"
            )
        return stats


def _postgres_address(dsn: str) -> str:
    """``host:port/database`` of a PostgreSQL URL, without its user or password."""
    try:
        url = urlsplit(dsn)
        host, port = url.hostname or "localhost", url.port or 5432
    except ValueError:  # a port that is no number, which the connection will refuse
        return "(a DSN with an invalid port)"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"{host}:{port}/{url.path.lstrip('/') or url.username or ''}"


async def _refuse_kafka_read_model(runtime: Runtime) -> None:
    """Refuse to write into a read model that a Kafka log feeds: what is not in the log
    is lost to a rebuild, and the projector would then refuse the session's later events."""
    from loomflow.runtime import PostgresStore

    store = runtime.store
    if not isinstance(store, PostgresStore):
        return
    feeds = await store.kafka_feeds()
    if feeds:
        raise Refused(
            f"schema {store.schema!r} is the read model of a Kafka log ({feeds}): pass "
            "--kafka so this goes through the log",
            2,
        )
