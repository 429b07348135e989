"""The PostgreSQL schema of the log and read model: its tables, their migrations (the
read model's steps and their runner, ``projections/migrations.py``'s scheme) and its name.

Every table lives in one PostgreSQL schema (``loomflow`` unless configured), so nothing
collides with other tools' tables in ``public``.

Event payloads and journal values are ``json``, not ``jsonb``: ``json`` keeps the text the
writer produced byte for byte (key order, e.g. of tool-call arguments, so a resumed
transcript is the same prompt prefix) and accepts ``\\u0000``, which ``jsonb`` refuses.
Usage is ``jsonb``: it is read-model data that queries aggregate.
"""

from __future__ import annotations

import hashlib
import logging
import re
from functools import lru_cache
from urllib.parse import urlsplit

import asyncpg

from loomflow.errors import (
    StoreError,
    StoreUnavailableError,
)
from loomflow.projections.migrations import Migrations

__all__ = [
    "READ_MODEL",
    "SCHEMA_VERSION",
    "check_schema",
    "check_version",
    "migrate",
    "quoted",
    "schema_version",
    "store_error",
]


logger = logging.getLogger("loomflow.projections.postgres")

# Lower case only, so the quoted name is the name a user types unquoted in psql; 48
# characters leave room for the positions channel name within PostgreSQL's 63.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")

#: the read model's schema, ``{s}`` its quoted name; the versions reached are rows of
#: its schema_migrations
READ_MODEL = Migrations(
    meta="schema_migrations",
    steps=(
        """
    CREATE TABLE {s}.events (
        user_id text NOT NULL,
        session_id text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        event_id text NOT NULL,
        run_id text NOT NULL,
        epoch bigint NOT NULL,
        v integer NOT NULL,
        at timestamptz NOT NULL,
        payload json NOT NULL,
        PRIMARY KEY (user_id, session_id, seq)
    );
    CREATE TABLE {s}.sessions (
        user_id text NOT NULL,
        session_id text NOT NULL,
        status text NOT NULL,
        last_seq bigint NOT NULL,
        epoch bigint NOT NULL,
        turns integer NOT NULL,
        usage jsonb NOT NULL,
        message_count integer NOT NULL,
        base_seq bigint NOT NULL,
        parent_session_id text,
        parent_checkpoint_id text,
        last_run_id text,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        PRIMARY KEY (user_id, session_id)
    );
    CREATE INDEX sessions_updated ON {s}.sessions (updated_at);
    CREATE TABLE {s}.checkpoints (
        user_id text NOT NULL,
        session_id text NOT NULL,
        checkpoint_id text NOT NULL,
        seq bigint NOT NULL,
        base_seq bigint NOT NULL,
        turn integer NOT NULL,
        message_count integer NOT NULL,
        usage jsonb NOT NULL,
        cursor text,
        created_at timestamptz NOT NULL,
        PRIMARY KEY (user_id, session_id, checkpoint_id)
    );
    CREATE UNIQUE INDEX checkpoints_newest ON {s}.checkpoints (user_id, session_id, seq DESC);
    CREATE TABLE {s}.steps (
        user_id text NOT NULL,
        session_id text NOT NULL,
        step_key text NOT NULL,
        input_hash text NOT NULL,
        seq bigint NOT NULL,
        value json NOT NULL,
        serializer text NOT NULL,
        at timestamptz NOT NULL,
        PRIMARY KEY (user_id, session_id, step_key)
    );
    CREATE TABLE {s}.positions (
        consumer text NOT NULL,
        topic text NOT NULL,
        partition integer NOT NULL,
        next_offset bigint NOT NULL,
        PRIMARY KEY (consumer, topic, partition)
    );
    CREATE TABLE {s}.dead_letters (
        id bigserial PRIMARY KEY,
        at timestamptz NOT NULL DEFAULT now(),
        source text NOT NULL,
        reason text NOT NULL,
        raw text,
        event_id text,
        error_type text
    );
    CREATE INDEX dead_letters_event ON {s}.dead_letters (event_id) WHERE event_id IS NOT NULL;
    """,
        # the record as it was (any bytes, NUL included) beside a readable text preview; the
        # processors that project into the schema, so a runtime can say which one it waits for
        """
    ALTER TABLE {s}.dead_letters ADD COLUMN record bytea, ADD COLUMN record_key bytea,
        ADD COLUMN null_value boolean NOT NULL DEFAULT false;
    DELETE FROM {s}.dead_letters a USING {s}.dead_letters b
        WHERE a.source = b.source AND a.id > b.id;
    CREATE UNIQUE INDEX dead_letters_source ON {s}.dead_letters (source);
    CREATE TABLE {s}.processors (
        consumer text NOT NULL,
        topic text NOT NULL,
        worker text NOT NULL,
        partitions integer[] NOT NULL,
        started_at timestamptz NOT NULL DEFAULT now(),
        seen_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, topic, worker)
    );
    """,
        # the audit trail of `loomflow audit` (postgres/audit.py); one user's sessions by
        # activity, and the forks of a session (`loomflow sessions ls / show`)
        """
    CREATE TABLE {s}.audit_entries (
        user_id text NOT NULL,
        session_id text NOT NULL,
        n bigint NOT NULL,
        position text NOT NULL,
        key text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        at timestamptz NOT NULL,
        digest text NOT NULL,
        body bytea,
        prev text NOT NULL,
        hash text NOT NULL,
        PRIMARY KEY (user_id, session_id, n)
    );
    CREATE UNIQUE INDEX audit_entries_key ON {s}.audit_entries (key);
    CREATE TABLE {s}.audit_rejects (
        position text PRIMARY KEY,
        reason text NOT NULL,
        raw bytea,
        recorded_at timestamptz NOT NULL DEFAULT now()
    );

    CREATE INDEX sessions_user_updated ON {s}.sessions (user_id, updated_at);
    CREATE INDEX sessions_parent ON {s}.sessions (user_id, parent_session_id)
        WHERE parent_session_id IS NOT NULL;
    """,
        # what a worker needs of a session (projections/rows.py: control_json), and the runs
        # in flight it looks for
        """
    ALTER TABLE {s}.sessions ADD COLUMN control jsonb;
    CREATE INDEX sessions_in_flight ON {s}.sessions (status, updated_at)
        WHERE status IN ('running', 'waiting', 'signalled');
    """,
        # control holds a run's metadata and its signals' payloads as they were sent: jsonb
        # rewrote a float such as 5.279742886759849e+16 as the integer 52797428867598490
        # (found by the log fuzzer), and refuses \u0000
        """
    ALTER TABLE {s}.sessions ALTER COLUMN control TYPE json USING control::json;
    """,
        # what `loomflow otel` keeps of each session between two batches (loomflow/otel/state.py:
        # how far it read the session, the span of its run in flight); its position is the
        # otel group's committed offsets
        """
    CREATE TABLE {s}.otel_sessions (
        user_id text NOT NULL,
        session_id text NOT NULL,
        state json NOT NULL,
        PRIMARY KEY (user_id, session_id)
    );
    """,
        # the listing's order (list_sessions and its pages after a cursor: updated_at newest
        # first, then user and session), so a page reads only its rows and sorts nothing;
        # they replace the indexes of updated_at, whose backward scan orders the sessions of
        # one moment by user and session descending
        """
    CREATE INDEX sessions_listing ON {s}.sessions (updated_at DESC, user_id, session_id);
    CREATE INDEX sessions_user_listing ON {s}.sessions (user_id, updated_at DESC, session_id);
    DROP INDEX {s}.sessions_updated;
    DROP INDEX {s}.sessions_user_updated;
    """,
        # the audit's standing of each session (projections/admission.py), what the last
        # digest committed of its chain, and the digests written; a trail audited before
        # gets each session's standing off its newest entry, gaps allowed (the epoch read
        # off its bytes, whatever they hold: a migration never fails on a trail's content)
        """
    CREATE TABLE {s}.audit_sessions (
        user_id text NOT NULL,
        session_id text NOT NULL,
        epoch bigint NOT NULL,
        last_seq bigint NOT NULL,
        message_count bigint NOT NULL,
        cancelled boolean NOT NULL,
        erased boolean NOT NULL,
        gapped boolean NOT NULL,
        digested_n bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (user_id, session_id)
    );
    INSERT INTO {s}.audit_sessions
        (user_id, session_id, epoch, last_seq, message_count, cancelled, erased, gapped)
    SELECT DISTINCT ON (user_id, session_id) user_id, session_id,
        coalesce(substring(encode(body, 'escape') from '"epoch":([0-9]{{1,18}})')::bigint, 0),
        seq, 0,
        type = 'run.cancelled', type = 'session.erased', true
    FROM {s}.audit_entries ORDER BY user_id, session_id, n DESC;
    CREATE TABLE {s}.audit_digests (
        n bigint PRIMARY KEY,
        at timestamptz NOT NULL,
        hash text NOT NULL,
        records bigint NOT NULL,
        body bytea NOT NULL
    );
    """,
        # a writer's signature of the event (schemas/signing.py), so that a reader of the
        # log can check it; NULL for an unsigned event
        """
    ALTER TABLE {s}.events ADD COLUMN sig json;
    """,
    ),
)

SCHEMA_VERSION = READ_MODEL.version


#: what says the server is away (or going), not that the request was wrong
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,  # among them: the connection was closed under us
    # a connection the server dropped mid-operation (a restart) is left in a state the
    # driver refuses to go on from: the pool replaces it, and the write is tried again
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.OperatorInterventionError,  # e.g. the server is shutting down
    asyncpg.InsufficientResourcesError,
)


def store_error(message: str, exc: BaseException) -> StoreError:
    """The StoreError for a driver's exception: retriable when PostgreSQL is away."""
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailableError(message)
    return StoreError(message)


def connect_error(dsn: str, where: str, exc: BaseException, hint: str) -> StoreError:
    """The StoreError of a connection to the PostgreSQL of ``dsn`` (named ``where``) that
    failed: the driver's reason, never the DSN's password, and ``hint``."""
    reason = f"{type(exc).__name__}: {exc}"
    password = urlsplit(dsn).password if "://" in dsn else None
    if password:
        reason = reason.replace(password, "***")
    return store_error(f"cannot connect to PostgreSQL at {where} ({reason}); {hint}", exc)


# -- schema and migrations ------------------------------------------------------------


def check_schema(schema: str) -> str:
    """Validate a schema name as a plain lower-case identifier; return it unchanged."""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(
            f"invalid PostgreSQL schema name {schema!r}: use 1-48 characters from a-z, 0-9 "
            "and _, not starting with a digit"
        )
    if schema.startswith("pg_"):
        raise ValueError(f"schema name {schema!r} is reserved: PostgreSQL owns pg_* schemas")
    return schema


@lru_cache(maxsize=64)
def quoted(schema: str) -> str:
    return '"' + check_schema(schema) + '"'


def _lock_key(schema: str) -> int:
    # a stable 64-bit key per schema: migrations of different schemas never wait on each other
    digest = hashlib.sha256(f"loomflow.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def schema_version(conn: asyncpg.Connection, schema: str) -> int:
    """The version the schema was migrated to; 0 when it does not exist yet."""
    meta = f"{quoted(schema)}.{READ_MODEL.meta}"
    if await conn.fetchval("SELECT to_regclass($1)", meta) is None:
        return 0
    return int(await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {meta}"))


async def check_version(conn: asyncpg.Connection, schema: str) -> None:
    """Refuse a schema that is not at SCHEMA_VERSION, saying how to migrate it (for stores
    that do not migrate on their own: ``auto_migrate`` off), or to upgrade loomflow when
    it is newer."""
    current = await schema_version(conn, schema)
    READ_MODEL.check(current, f"PostgreSQL schema {schema!r}")
    if current != SCHEMA_VERSION:
        raise StoreError(
            f"PostgreSQL schema {schema!r} is at version {current}, and this loomflow needs "
            f"version {SCHEMA_VERSION}; automatic migration is off (LOOMFLOW_AUTO_MIGRATE): "
            "run `loomflow setup` or `await runtime.setup()` first"
        )


async def migrate(
    conn: asyncpg.Connection, schema: str = "loomflow", migrations: Migrations = READ_MODEL
) -> None:
    """Create the schema if needed and bring it to ``migrations.version`` (the read
    model's), the steps and their versions in one transaction.

    Safe when several processes start at once: the transaction holds an advisory lock of
    the schema, so the second waits and then finds nothing left to do. Needs the default
    READ COMMITTED isolation, so that the waiter sees what the first one committed.
    """
    s = quoted(schema)
    meta = f"{s}.{migrations.meta}"
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            await conn.execute(f"CREATE SCHEMA {s}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {meta} ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = int(await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {meta}"))
        for version, step in migrations.pending(current, f"PostgreSQL schema {schema!r}"):
            await conn.execute(step.format(s=s))
            await conn.execute(f"INSERT INTO {meta} (version) VALUES ($1)", version)
            logger.info("migrated PostgreSQL schema %r to version %d", schema, version)
