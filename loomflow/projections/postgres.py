"""The PostgreSQL dialect of the log and read model: schema, migrations, mutations, queries.

Functions here are coroutines taking an asyncpg connection and run inside the caller's
transaction; the PostgreSQL store and the Kafka projector both call them. Every table
lives in one PostgreSQL schema (``loomflow`` unless configured), so nothing collides with
other tools' tables in ``public``.

Event payloads and journal values are ``json``, not ``jsonb``: ``json`` keeps the text the
writer produced byte for byte (key order, e.g. of tool-call arguments, so a resumed
transcript is the same prompt prefix) and accepts ``\\u0000``, which ``jsonb`` refuses.
Usage is ``jsonb``: it is read-model data that queries aggregate.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import asyncpg
import orjson
from pydantic import ValidationError

from loomflow.errors import (
    CorruptRecordError,
    InvalidEventError,
    LoomflowError,
    SequenceConflictError,
    StoreError,
    StoreUnavailableError,
)
from loomflow.projections.fold import (
    TRANSCRIPT_TYPES,
    AddTranscript,
    CheckpointRow,
    DeleteCheckpoints,
    EraseSession,
    Mutation,
    PruneFilter,
    PutCheckpoint,
    PutStep,
    RetainCheckpoints,
    SessionRow,
    StepRow,
    maybe_redelivered,
    project,
)
from loomflow.projections.transcript import decode_transcript
from loomflow.schemas import Event, Message, Usage
from loomflow.schemas.codec import decode_event

__all__ = [
    "SCHEMA_VERSION",
    "DeadLetterRow",
    "ProcessorRow",
    "add_dead_letters",
    "apply",
    "apply_events",
    "check_schema",
    "commit_round",
    "find_refusal",
    "forget_processor",
    "get_checkpoint",
    "get_step",
    "latest_snapshots",
    "list_checkpoints",
    "list_processors",
    "load_positions",
    "load_session",
    "migrate",
    "notify_sessions",
    "positions_channel",
    "preview",
    "printable",
    "prune",
    "read_events",
    "read_transcript",
    "report_processor",
    "save_position",
    "save_positions",
    "save_sessions",
    "schemas_with_processors",
    "sessions_channel",
    "store_error",
]

logger = logging.getLogger("loomflow.projections.postgres")

SCHEMA_VERSION = 2

# Lower case only, so the quoted name is the name a user types unquoted in psql; 48
# characters leave room for the positions channel name within PostgreSQL's 63.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")

_MIGRATIONS: dict[int, str] = {
    1: """
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
    2: """
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
}


#: what says the server is away (or going), not that the request was wrong
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,  # among them: the connection was closed under us
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
def _q(schema: str) -> str:
    return '"' + check_schema(schema) + '"'


def _lock_key(schema: str) -> int:
    # a stable 64-bit key per schema: migrations of different schemas never wait on each other
    digest = hashlib.sha256(f"loomflow.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def migrate(conn: asyncpg.Connection, schema: str = "loomflow") -> None:
    """Create the schema if needed and bring it to SCHEMA_VERSION, in one transaction.

    Safe when several processes start at once: the transaction holds an advisory lock of
    the schema, so the second waits and then finds nothing left to do. Needs the default
    READ COMMITTED isolation, so that the waiter sees what the first one committed.
    """
    s = _q(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            await conn.execute(f"CREATE SCHEMA {s}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.schema_migrations ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = int(
            await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {s}.schema_migrations")
        )
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL schema {schema!r} is at version {current}, newer than version "
                f"{SCHEMA_VERSION} that this loomflow knows: upgrade loomflow to use it"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await conn.execute(_MIGRATIONS[version].format(s=s))
            await conn.execute(f"INSERT INTO {s}.schema_migrations (version) VALUES ($1)", version)
            logger.info("migrated PostgreSQL schema %r to version %d", schema, version)


# -- sessions and the log ------------------------------------------------------------------


#: a session as the fold sees it: (user id or None, session id)
_Key = tuple[str | None, str]


def _uid(user_id: str | None) -> str:
    return "" if user_id is None else user_id


#: batches of at least this many events write their log rows by COPY
_COPY_FROM = 64


def _payload_json(event: Event) -> str:
    return event.payload.model_dump_json(exclude_defaults=True)


#: (column, element type of its array parameter, its value for one row); json and jsonb
#: columns take text that SQL casts, so json codecs a caller set on its connection never
#: encode again what the models already serialised.
_Columns = tuple[tuple[str, str, Callable[[Any], object]], ...]

_LOG_COLUMNS: _Columns = (
    ("user_id", "text", lambda e: _uid(e.user_id)),
    ("session_id", "text", lambda e: e.session_id),
    ("seq", "bigint", lambda e: e.seq),
    ("type", "text", lambda e: e.type),
    ("event_id", "text", lambda e: e.event_id),
    ("run_id", "text", lambda e: e.run_id),
    ("epoch", "bigint", lambda e: e.epoch),
    ("v", "int", lambda e: e.v),
    ("at", "timestamptz", lambda e: e.at),
    ("payload", "json", lambda e: _payload_json(e)),  # last: _write may pass it as given
)
_SESSION_ROW_COLUMNS: _Columns = (
    ("user_id", "text", lambda r: _uid(r.user_id)),
    ("session_id", "text", lambda r: r.session_id),
    ("status", "text", lambda r: r.status),
    ("last_seq", "bigint", lambda r: r.last_seq),
    ("epoch", "bigint", lambda r: r.epoch),
    ("turns", "int", lambda r: r.turns),
    ("usage", "jsonb", lambda r: r.usage.model_dump_json()),
    ("message_count", "int", lambda r: r.message_count),
    ("base_seq", "bigint", lambda r: r.base_seq),
    ("parent_session_id", "text", lambda r: r.parent_session_id),
    ("parent_checkpoint_id", "text", lambda r: r.parent_checkpoint_id),
    ("last_run_id", "text", lambda r: r.last_run_id),
    ("created_at", "timestamptz", lambda r: r.created_at),
    ("updated_at", "timestamptz", lambda r: r.updated_at),
)
_SESSION_KEY = ("user_id", "session_id")
_JSON = ("json", "jsonb")


def _select(columns: _Columns) -> str:
    # json read back as text: a caller's json codecs never see it, the models parse it
    return ", ".join(f"{n}::text" if t in _JSON else n for n, t, _ in columns)


_SESSION_COLUMNS = _select(_SESSION_ROW_COLUMNS)


def _session_row(row: Any) -> SessionRow:
    try:
        return SessionRow(
            user_id=row[0] or None,
            session_id=row[1],
            status=row[2],
            last_seq=row[3],
            epoch=row[4],
            turns=row[5],
            usage=Usage.model_validate_json(row[6]),
            message_count=row[7],
            base_seq=row[8],
            parent_session_id=row[9],
            parent_checkpoint_id=row[10],
            last_run_id=row[11],
            created_at=row[12],
            updated_at=row[13],
        )
    except ValidationError as exc:
        raise CorruptRecordError(f"session row {row[1]!r} does not decode: {exc}") from exc


async def load_session(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str
) -> SessionRow | None:
    """The session's row, or None when it has no events."""
    row = await conn.fetchrow(
        f"SELECT {_SESSION_COLUMNS} FROM {_q(schema)}.sessions "
        "WHERE user_id = $1 AND session_id = $2",
        _uid(user_id),
        session_id,
    )
    return None if row is None else _session_row(row)


def _matching(match: PruneFilter, args: list[Any]) -> str:
    """The WHERE condition selecting ``match``'s sessions; appends its parameters."""
    where = ["true"]
    if match.session_id is not None:
        args.append(match.session_id)
        where.append(f"session_id = ${len(args)}")
    if not match.any_user:
        args.append(_uid(match.user_id))
        where.append(f"user_id = ${len(args)}")
    return " AND ".join(where)


async def match_sessions(
    conn: asyncpg.Connection, schema: str, match: PruneFilter
) -> list[SessionRow]:
    """Rows of the live (not erased) sessions that ``match`` selects."""
    args: list[Any] = []
    where = [_matching(match, args), "status <> 'erased'"]
    rows = await conn.fetch(
        f"SELECT {_SESSION_COLUMNS} FROM {_q(schema)}.sessions WHERE {' AND '.join(where)} "
        "ORDER BY user_id, session_id",
        *args,
    )
    return [_session_row(row) for row in rows]


async def _lock_sessions(
    conn: asyncpg.Connection, schema: str, keys: list[tuple[str, str]]
) -> dict[_Key, SessionRow]:
    # locked in key order: two batches touching the same sessions cannot deadlock
    rows = await conn.fetch(
        f"SELECT {_SESSION_COLUMNS} FROM {_q(schema)}.sessions "
        "WHERE (user_id, session_id) IN (SELECT * FROM unnest($1::text[], $2::text[])) "
        "ORDER BY user_id, session_id FOR UPDATE",
        [k[0] for k in keys],
        [k[1] for k in keys],
    )
    loaded = (_session_row(row) for row in rows)
    return {(r.user_id, r.session_id): r for r in loaded}


@lru_cache(maxsize=256)
def _insert(table: str, columns: _Columns, first: int = 1, key: tuple[str, ...] = ()) -> str:
    """An INSERT of one row per element of the array parameters $first, $first + 1, ...;
    with ``key``, a row whose key exists replaces it."""
    names = ", ".join(name for name, _, _ in columns)
    values = ", ".join(f"{n}::{t}" if t in _JSON else n for n, t, _ in columns)
    arrays = ", ".join(
        f"${first + i}::{'text' if t in _JSON else t}[]" for i, (_, t, _) in enumerate(columns)
    )
    sql = f"INSERT INTO {table} ({names}) SELECT {values} FROM unnest({arrays}) AS x({names})"
    if key:
        updates = ", ".join(f"{n} = excluded.{n}" for n, _, _ in columns if n not in key)
        sql += f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    return sql


def _arrays(columns: _Columns, rows: Sequence[Any]) -> list[list[object]]:
    return [[value(row) for row in rows] for _, _, value in columns]


def _by_scope(row: Event | SessionRow) -> tuple[str, str]:
    # rows written in key order: two batches creating the same new sessions wait on each
    # other in the same order instead of deadlocking
    return _uid(row.user_id), row.session_id


async def save_sessions(conn: asyncpg.Connection, schema: str, rows: Iterable[SessionRow]) -> None:
    """Insert or replace session rows, in one statement."""
    ordered = sorted(rows, key=_by_scope)
    if ordered:
        sql = _insert(f"{_q(schema)}.sessions", _SESSION_ROW_COLUMNS, key=_SESSION_KEY)
        await conn.execute(sql, *_arrays(_SESSION_ROW_COLUMNS, ordered))


async def _write(
    conn: asyncpg.Connection,
    schema: str,
    events: list[Event],
    sessions: list[SessionRow],
    payloads: Mapping[int, str],
) -> None:
    """Append log rows and save session rows.

    A few rows go in one statement (one round trip). A projector's batch of thousands
    goes by binary COPY, which costs PostgreSQL and asyncpg a fraction of array
    parameters (asyncpg checks every array element's type), then one upsert of the
    session rows.
    """
    if not events:
        return  # every event was a redelivery: nothing changed
    s = _q(schema)
    events = sorted(events, key=lambda e: (*_by_scope(e), e.seq))
    save_sessions = sorted(sessions, key=_by_scope)
    try:
        if len(events) >= _COPY_FROM:
            await conn.copy_records_to_table(
                "events",
                schema_name=schema,
                columns=[name for name, _, _ in _LOG_COLUMNS],
                records=[
                    (
                        _uid(e.user_id),
                        e.session_id,
                        e.seq,
                        e.type,
                        e.event_id,
                        e.run_id,
                        e.epoch,
                        e.v,
                        e.at,
                        payloads.get(id(e)) or _payload_json(e),
                    )
                    for e in events
                ],
            )
            sql = _insert(f"{s}.sessions", _SESSION_ROW_COLUMNS, key=_SESSION_KEY)
            await conn.execute(sql, *_arrays(_SESSION_ROW_COLUMNS, save_sessions))
            return
        log = _insert(f"{s}.events", _LOG_COLUMNS)
        save = _insert(f"{s}.sessions", _SESSION_ROW_COLUMNS, len(_LOG_COLUMNS) + 1, _SESSION_KEY)
        await conn.execute(
            f"WITH log AS ({log}) {save}",
            *_arrays(_LOG_COLUMNS[:-1], events),
            [payloads.get(id(e)) or _payload_json(e) for e in events],
            *_arrays(_SESSION_ROW_COLUMNS, save_sessions),
        )
    except asyncpg.UniqueViolationError as exc:
        # a concurrent writer committed the same seq of a session that had no row to lock
        raise SequenceConflictError(
            f"another writer appended first: {exc.detail or exc}; read the session again"
        ) from exc


async def _stored_event_ids(
    conn: asyncpg.Connection, schema: str, wanted: list[tuple[str | None, str, int]]
) -> dict[tuple[str | None, str, int], str]:
    if not wanted:
        return {}
    rows = await conn.fetch(
        f"SELECT user_id, session_id, seq, event_id FROM {_q(schema)}.events "
        "WHERE (user_id, session_id, seq) IN "
        "(SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))",
        [_uid(w[0]) for w in wanted],
        [w[1] for w in wanted],
        [w[2] for w in wanted],
    )
    return {(r[0] or None, r[1], r[2]): r[3] for r in rows}


async def apply_events(
    conn: asyncpg.Connection,
    schema: str,
    events: Sequence[Event],
    payloads: Mapping[int, str] | None = None,
) -> None:
    """Fold events into the read model and append them to the log, in the caller's transaction.

    ``payloads`` maps ``id(event)`` to the payload JSON as the record carried it: a
    consumer that decoded the record keeps its text instead of serialising it again.

    Each session touched is locked first, so concurrent writers of one session serialise.
    Re-appending an event already stored at its seq (same event id) is a no-op; anything
    else the fold refuses raises an InvalidEventError subclass, and the caller rolls back
    (the whole batch: apply a refused batch again event by event, each in a savepoint, to
    keep the others). A batch may span sessions and costs a few statements whatever its
    size: the log rows, the session rows and each kind of read-model change are written
    in one statement each.
    """
    keys = sorted({(_uid(e.user_id), e.session_id) for e in events})
    if not keys:
        return
    rows = await _lock_sessions(conn, schema, keys)
    stored = await _stored_event_ids(conn, schema, maybe_redelivered(rows, events))
    changed, changes = project(rows, events, stored)
    written: list[Event] = []
    pending: dict[_Key, list[Mutation]] = {}
    for change in changes:
        key = (change.event.user_id, change.event.session_id)
        queue = pending.setdefault(key, [])
        for mutation in change.mutations:
            if isinstance(mutation, EraseSession):  # all of the session goes, written or not
                written = [e for e in written if (e.user_id, e.session_id) != key]
                queue.clear()
            if not isinstance(mutation, AddTranscript):  # the log row is the transcript
                queue.append(mutation)
        written.append(change.event)
    await _apply_in_waves(conn, schema, pending)
    await _write(conn, schema, written, list(changed.values()), payloads or {})


async def commit_round(
    conn: asyncpg.Connection, schema: str, appends: list[list[Event]]
) -> list[LoomflowError | None]:
    """Commit a round of appends in one transaction; return each append's outcome."""
    try:
        async with conn.transaction():
            await apply_events(conn, schema, [e for events in appends for e in events])
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
                    await apply_events(conn, schema, events)
            except LoomflowError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
    return outcomes


# -- mutations -----------------------------------------------------------------------

_Wave = list[tuple[tuple[str, str], Mutation]]


async def apply(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    session_id: str,
    mutation: Mutation,
) -> None:
    """Apply one fold mutation inside the caller's transaction."""
    await _apply_wave(conn, schema, [((_uid(user_id), session_id), mutation)])


async def _apply_in_waves(
    conn: asyncpg.Connection, schema: str, pending: dict[_Key, list[Mutation]]
) -> None:
    # Mutations of different sessions commute; only each session's own order matters. So
    # a wave takes the next mutations of every session whose next one is of the same kind,
    # and applies them in one statement: a batch of a thousand sessions that each wrote a
    # checkpoint costs two statements (insert, retention), not two thousand. A session's
    # run of new checkpoints goes in one wave, and its retentions with the same ``keep``
    # collapse into the last one: keeping the newest k after each insert leaves what
    # keeping them once after the last insert does.
    queues = {
        (_uid(user), sid): deque(_collapse(queue))
        for (user, sid), queue in sorted(pending.items(), key=lambda item: _by_key(item[0]))
        if queue
    }
    while queues:
        kind = Counter(type(q[0]) for q in queues.values()).most_common(1)[0][0]
        wave: _Wave = []
        for key, q in queues.items():
            if type(q[0]) is not kind:
                continue
            wave.append((key, q.popleft()))
            while kind is PutCheckpoint and q and type(q[0]) is kind:
                wave.append((key, q.popleft()))  # distinct rows: one insert takes them all
        await _apply_wave(conn, schema, wave)
        queues = {key: q for key, q in queues.items() if q}


def _by_key(key: _Key) -> tuple[str, str]:
    return _uid(key[0]), key[1]


def _collapse(queue: list[Mutation]) -> list[Mutation]:
    """A session's mutations with every retention that a later equal one (with only new
    checkpoints between) makes redundant taken out."""
    out: list[Mutation] = []
    last_retain: int | None = None  # index in out of the retention still open to collapse
    for mutation in queue:
        if isinstance(mutation, RetainCheckpoints):
            previous = out[last_retain] if last_retain is not None else None
            if isinstance(previous, RetainCheckpoints) and previous.keep == mutation.keep:
                del out[last_retain]  # type: ignore[arg-type]
            out.append(mutation)
            last_retain = len(out) - 1
        elif isinstance(mutation, PutCheckpoint):
            out.append(mutation)
        else:
            out.append(mutation)
            last_retain = None
    return out


#: rows of a wave are ((user id, session id), mutation)
_CHECKPOINT_ROW_COLUMNS: _Columns = (
    ("user_id", "text", lambda w: w[0][0]),
    ("session_id", "text", lambda w: w[0][1]),
    ("checkpoint_id", "text", lambda w: w[1].row.checkpoint_id),
    ("seq", "bigint", lambda w: w[1].row.seq),
    ("base_seq", "bigint", lambda w: w[1].row.base_seq),
    ("turn", "int", lambda w: w[1].row.turn),
    ("message_count", "int", lambda w: w[1].row.message_count),
    ("usage", "jsonb", lambda w: w[1].row.cumulative_usage.model_dump_json()),
    ("cursor", "text", lambda w: w[1].row.cursor),
    ("created_at", "timestamptz", lambda w: w[1].row.created_at),
)
_STEP_ROW_COLUMNS: _Columns = (
    ("user_id", "text", lambda w: w[0][0]),
    ("session_id", "text", lambda w: w[0][1]),
    ("step_key", "text", lambda w: w[1].row.step_key),
    ("input_hash", "text", lambda w: w[1].row.input_hash),
    ("seq", "bigint", lambda w: w[1].row.seq),
    ("value", "json", lambda w: orjson.dumps(w[1].row.value).decode()),
    ("serializer", "text", lambda w: w[1].row.serializer),
    ("at", "timestamptz", lambda w: w[1].row.at),
)


async def _apply_wave(conn: asyncpg.Connection, schema: str, wave: _Wave) -> None:
    """Apply mutations of one kind, at most one per session, in one statement."""
    s = _q(schema)
    users = [key[0] for key, _ in wave]
    sessions = [key[1] for key, _ in wave]
    match wave[0][1]:
        case PutCheckpoint():
            try:
                await conn.execute(
                    _insert(f"{s}.checkpoints", _CHECKPOINT_ROW_COLUMNS),
                    *_arrays(_CHECKPOINT_ROW_COLUMNS, wave),
                )
            except asyncpg.UniqueViolationError as exc:
                # refused as an event, so a projector dead-letters it instead of stopping
                raise InvalidEventError(
                    f"a checkpoint id that the session already has: {exc.detail or exc}"
                ) from exc
        case RetainCheckpoints():
            # the cut (the newest seq that goes) is found once per session, from the index;
            # sessions that hold no more than they keep delete nothing and scan nothing
            await conn.execute(
                f"DELETE FROM {s}.checkpoints c USING (SELECT r.u, r.s, (SELECT o.seq FROM "
                f"{s}.checkpoints o WHERE o.user_id = r.u AND o.session_id = r.s ORDER BY "
                "o.seq DESC OFFSET r.keep LIMIT 1) AS cut FROM unnest($1::text[], $2::text[], "
                "$3::bigint[]) AS r(u, s, keep)) AS x WHERE x.cut IS NOT NULL "
                "AND c.user_id = x.u AND c.session_id = x.s AND c.seq <= x.cut",
                users,
                sessions,
                [m.keep for _, m in wave if isinstance(m, RetainCheckpoints)],
            )
        case DeleteCheckpoints():
            dropped = [
                (key, cid)
                for key, m in wave
                if isinstance(m, DeleteCheckpoints)
                for cid in m.checkpoint_ids
            ]
            await conn.execute(
                f"DELETE FROM {s}.checkpoints c USING unnest($1::text[], $2::text[], "
                "$3::text[]) AS d(u, s, id) WHERE c.user_id = d.u AND c.session_id = d.s "
                "AND c.checkpoint_id = d.id",
                [key[0] for key, _ in dropped],
                [key[1] for key, _ in dropped],
                [cid for _, cid in dropped],
            )
        case PutStep():
            sql = _insert(
                f"{s}.steps", _STEP_ROW_COLUMNS, key=("user_id", "session_id", "step_key")
            )
            await conn.execute(sql, *_arrays(_STEP_ROW_COLUMNS, wave))
        case EraseSession():
            gone = "gone g WHERE t.user_id = g.u AND t.session_id = g.s"
            await conn.execute(
                "WITH gone AS (SELECT * FROM unnest($1::text[], $2::text[]) AS g(u, s)), "
                f"e AS (DELETE FROM {s}.events t USING {gone}), "
                f"c AS (DELETE FROM {s}.checkpoints t USING {gone}) "
                f"DELETE FROM {s}.steps t USING {gone}",
                users,
                sessions,
            )
        case AddTranscript():
            pass  # the log row of this event is the transcript row


# -- queries -------------------------------------------------------------------------

_CHECKPOINT_NAMES = (
    "checkpoint_id",
    "seq",
    "base_seq",
    "turn",
    "message_count",
    "usage::text",
    "cursor",
    "created_at",
)
_CHECKPOINT_COLUMNS = ", ".join(_CHECKPOINT_NAMES)


def _checkpoint_row(row: Any) -> CheckpointRow:
    try:
        return CheckpointRow(
            checkpoint_id=row[0],
            seq=row[1],
            base_seq=row[2],
            turn=row[3],
            message_count=row[4],
            cumulative_usage=Usage.model_validate_json(row[5]),
            cursor=row[6],
            created_at=row[7],
        )
    except ValidationError as exc:
        raise CorruptRecordError(f"checkpoint row {row[0]!r} does not decode: {exc}") from exc


async def get_checkpoint(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    session_id: str,
    checkpoint_id: str | None,
) -> CheckpointRow | None:
    """The named checkpoint (the newest when id is None), or None."""
    s = _q(schema)
    if checkpoint_id is None:
        row = await conn.fetchrow(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {s}.checkpoints WHERE user_id = $1 "
            "AND session_id = $2 ORDER BY seq DESC LIMIT 1",
            _uid(user_id),
            session_id,
        )
    else:
        row = await conn.fetchrow(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {s}.checkpoints WHERE user_id = $1 "
            "AND session_id = $2 AND checkpoint_id = $3",
            _uid(user_id),
            session_id,
            checkpoint_id,
        )
    return None if row is None else _checkpoint_row(row)


async def list_checkpoints(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, limit: int
) -> list[CheckpointRow]:
    """Up to ``limit`` checkpoints, newest first (metadata only: no transcript is read)."""
    rows = await conn.fetch(
        f"SELECT {_CHECKPOINT_COLUMNS} FROM {_q(schema)}.checkpoints WHERE user_id = $1 "
        "AND session_id = $2 ORDER BY seq DESC LIMIT $3",
        _uid(user_id),
        session_id,
        limit,
    )
    return [_checkpoint_row(r) for r in rows]


async def get_step(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, step_key: str
) -> StepRow | None:
    """The journal entry recorded under ``step_key``, or None."""
    row = await conn.fetchrow(
        f"SELECT input_hash, seq, value::text, serializer, at FROM {_q(schema)}.steps "
        "WHERE user_id = $1 AND session_id = $2 AND step_key = $3",
        _uid(user_id),
        session_id,
        step_key,
    )
    if row is None:
        return None
    try:
        return StepRow(step_key, row[0], row[1], orjson.loads(row[2]), row[3], row[4])
    except orjson.JSONDecodeError as exc:
        raise CorruptRecordError(f"journal step {step_key!r} does not decode: {exc}") from exc


def _decode_event_row(row: Any) -> Event:
    user_id, session_id, seq, type_, event_id, run_id, epoch, v, at, payload = row
    try:
        return decode_event(
            {
                "user_id": user_id or None,
                "session_id": session_id,
                "seq": seq,
                "type": type_,
                "event_id": event_id,
                "run_id": run_id,
                "epoch": epoch,
                "v": v,
                "at": at,
                "payload": orjson.loads(payload),
            }
        )
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise CorruptRecordError(
            f"log row of session {session_id!r}, seq {seq} does not decode: {exc}"
        ) from exc


async def read_events(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[Event]:
    """The session's events with lo <= seq <= hi; a row that does not decode is skipped
    with a warning, so one bad row never stops a reader of the log."""
    rows = await conn.fetch(
        f"SELECT user_id, session_id, seq, type, event_id, run_id, epoch, v, at, payload::text "
        f"FROM {_q(schema)}.events WHERE user_id = $1 AND session_id = $2 "
        "AND seq >= $3 AND seq <= $4 ORDER BY seq",
        _uid(user_id),
        session_id,
        lo,
        hi,
    )
    events: list[Event] = []
    for row in rows:
        try:
            events.append(_decode_event_row(row))
        except CorruptRecordError as exc:
            logger.warning("skipping a log row: %s", exc)
    return events


async def transcript_payloads(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[tuple[int, str]]:
    """(seq, payload JSON) of the transcript events with lo <= seq <= hi, in seq order."""
    rows = await conn.fetch(
        f"SELECT seq, payload::text FROM {_q(schema)}.events WHERE user_id = $1 "
        "AND session_id = $2 AND seq >= $3 AND seq <= $4 AND type = ANY($5::text[]) "
        "ORDER BY seq",
        _uid(user_id),
        session_id,
        lo,
        hi,
        TRANSCRIPT_TYPES,
    )
    return [(row[0], row[1]) for row in rows]


async def latest_snapshots(
    conn: asyncpg.Connection, schema: str, wanted: Sequence[tuple[str | None, str, str]]
) -> list[tuple[str | None, str, CheckpointRow, list[str]]]:
    """For each (user, session, checkpoint id) that still exists: the checkpoint row and
    the payload JSON of its transcript events in seq order. Two statements for them all.
    """
    if not wanted:
        return []
    s = _q(schema)
    rows = await conn.fetch(
        f"SELECT c.user_id, c.session_id, {', '.join('c.' + n for n in _CHECKPOINT_NAMES)} "
        f"FROM {s}.checkpoints c JOIN unnest($1::text[], $2::text[], $3::text[]) AS w(u, s, id) "
        "ON c.user_id = w.u AND c.session_id = w.s AND c.checkpoint_id = w.id",
        [_uid(w[0]) for w in wanted],
        [w[1] for w in wanted],
        [w[2] for w in wanted],
    )
    found = {(r[0], r[1]): _checkpoint_row(r[2:]) for r in rows}
    if not found:
        return []
    keys = sorted(found)
    parts = await conn.fetch(
        f"SELECT e.user_id, e.session_id, e.payload::text FROM {s}.events e "
        "JOIN unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS w(u, s, lo, hi) "
        "ON e.user_id = w.u AND e.session_id = w.s AND e.seq >= w.lo AND e.seq <= w.hi "
        "WHERE e.type = ANY($5::text[]) ORDER BY e.user_id, e.session_id, e.seq",
        [k[0] for k in keys],
        [k[1] for k in keys],
        [found[k].base_seq for k in keys],
        [found[k].seq for k in keys],
        TRANSCRIPT_TYPES,
    )
    payloads: dict[tuple[str, str], list[str]] = {k: [] for k in keys}
    for part in parts:
        payloads[(part[0], part[1])].append(part[2])
    return [(k[0] or None, k[1], found[k], payloads[k]) for k in keys]


async def read_transcript(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[Message]:
    """Messages of the transcript events with lo <= seq <= hi, validated in one pass.

    ``lo`` must be the transcript's base seq, so concatenation is the whole fold.
    """
    rows = await transcript_payloads(conn, schema, user_id, session_id, lo, hi)
    return decode_transcript(session_id, rows)


async def prune(
    conn: asyncpg.Connection, schema: str, match: PruneFilter
) -> tuple[int, int, int, int]:
    """Delete what ``match`` selects, in one statement of the caller's transaction;
    return the counts of (sessions, checkpoints, steps, events) deleted."""
    s = _q(schema)
    args: list[Any] = [match.before]
    where = [_matching(match, args)]
    joined = "t.user_id = m.user_id AND t.session_id = m.session_id"
    row = await conn.fetchrow(
        f"WITH matched AS (SELECT user_id, session_id, "
        f"($1::timestamptz IS NULL OR updated_at < $1) AS whole FROM {s}.sessions "
        f"WHERE {' AND '.join(where)} ORDER BY user_id, session_id FOR UPDATE), "
        f"c AS (DELETE FROM {s}.checkpoints t USING matched m WHERE {joined} "
        "AND (m.whole OR t.created_at < $1) RETURNING 1), "
        f"st AS (DELETE FROM {s}.steps t USING matched m WHERE {joined} "
        "AND (m.whole OR t.at < $1) RETURNING 1), "
        f"e AS (DELETE FROM {s}.events t USING matched m WHERE {joined} "
        "AND (m.whole OR (t.type = 'step.recorded' AND t.at < $1)) RETURNING 1), "
        f"ss AS (DELETE FROM {s}.sessions t USING matched m WHERE {joined} AND m.whole "
        "RETURNING 1) "
        "SELECT (SELECT count(*) FROM ss), (SELECT count(*) FROM c), "
        "(SELECT count(*) FROM st), (SELECT count(*) FROM e)",
        *args,
    )
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


# -- projector bookkeeping: consumed positions and dead letters ------------------------


@dataclass(frozen=True)
class DeadLetterRow:
    """A record a consumer refused: where it was, why, and its bytes as they were."""

    source: str
    reason: str
    record: bytes | None
    key: bytes | None = None
    event_id: str | None = None
    error_type: str = "InvalidEventError"


def positions_channel(schema: str) -> str:
    """The NOTIFY channel on which ``save_position`` announces committed positions."""
    return f"{check_schema(schema)}_positions"


async def load_positions(
    conn: asyncpg.Connection, schema: str, consumer: str, topic: str
) -> dict[int, int]:
    """partition -> next offset to consume, for one consumer of one topic."""
    rows = await conn.fetch(
        f"SELECT partition, next_offset FROM {_q(schema)}.positions "
        "WHERE consumer = $1 AND topic = $2",
        consumer,
        topic,
    )
    return {int(r[0]): int(r[1]) for r in rows}


async def save_positions(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    topic: str,
    next_offsets: Mapping[int, int],
) -> None:
    """Record the next offset to consume of each partition, in the caller's transaction,
    in one statement.

    Listeners of ``positions_channel(schema)`` hear ``consumer:topic:partition:offset``
    for each when the transaction commits (never before, never if it rolls back).
    """
    partitions = sorted(next_offsets)
    await conn.execute(
        f"WITH saved AS (INSERT INTO {_q(schema)}.positions (consumer, topic, partition, "
        "next_offset) SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS x(p, o) "
        "ON CONFLICT (consumer, topic, partition) "
        "DO UPDATE SET next_offset = greatest(positions.next_offset, excluded.next_offset)) "
        "SELECT pg_notify($5, $1 || ':' || $2 || ':' || p::text || ':' || o::text) "
        "FROM unnest($3::int[], $4::bigint[]) AS x(p, o)",
        consumer,
        topic,
        partitions,
        [next_offsets[p] for p in partitions],
        positions_channel(schema),
    )


async def save_position(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    topic: str,
    partition: int,
    next_offset: int,
) -> None:
    """``save_positions`` for one partition."""
    await save_positions(conn, schema, consumer, topic, {partition: next_offset})


def printable(text: str, limit: int | None = None) -> str:
    """Text PostgreSQL accepts: NUL and lone surrogates escaped; cut to ``limit`` characters."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")


def preview(raw: bytes | None, limit: int = 4096) -> str | None:
    """A readable rendering of a record's bytes: UTF-8 where it is, escapes elsewhere."""
    if raw is None:
        return None
    return printable(raw[: limit * 4].decode("utf-8", "backslashreplace"), limit)


async def add_dead_letters(
    conn: asyncpg.Connection, schema: str, letters: Sequence[DeadLetterRow]
) -> list[DeadLetterRow]:
    """Keep records a consumer could not apply, with why, so processing can go on; return
    those that were not kept already (a record consumed again is dead-lettered once).

    The record's bytes are kept whole in ``record`` (bytea takes any byte); ``raw`` is a
    text preview for people reading the table.
    """
    if not letters:
        return []
    sources = [printable(d.source, 500) for d in letters]
    rows = await conn.fetch(
        f"INSERT INTO {_q(schema)}.dead_letters (source, reason, raw, event_id, error_type, "
        "record, record_key, null_value) SELECT * FROM unnest($1::text[], $2::text[], "
        "$3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], $8::bool[]) "
        "ON CONFLICT (source) DO NOTHING RETURNING source",
        sources,
        [printable(d.reason, 4000) for d in letters],
        [preview(d.record) for d in letters],
        [d.event_id for d in letters],
        [d.error_type for d in letters],
        [d.record for d in letters],
        [d.key for d in letters],
        [d.record is None for d in letters],
    )
    added = {row[0] for row in rows}
    return [d for d, source in zip(letters, sources, strict=True) if source in added]


async def find_refusal(
    conn: asyncpg.Connection, schema: str, event_ids: Sequence[str]
) -> tuple[str, str] | None:
    """(error type, reason) of the first dead letter of any of these events, or None.

    The first: once one event of a session is refused, every later one of the same writer
    is refused for its seq, and the first refusal is the one that says why.
    """
    row = await conn.fetchrow(
        f"SELECT coalesce(error_type, 'InvalidEventError'), reason FROM {_q(schema)}.dead_letters "
        "WHERE event_id = ANY($1::text[]) ORDER BY id LIMIT 1",
        list(event_ids),
    )
    return None if row is None else (str(row[0]), str(row[1]))


def sessions_channel(schema: str) -> str:
    """The NOTIFY channel on which a projector announces claims and refusals (JSON)."""
    return f"{check_schema(schema)}_sessions"


async def notify_sessions(conn: asyncpg.Connection, schema: str, notes: Sequence[str]) -> None:
    """Send ``notes`` on ``sessions_channel(schema)`` when the caller's transaction commits."""
    if notes:
        await conn.execute(
            "SELECT pg_notify($1, n) FROM unnest($2::text[]) WITH ORDINALITY AS t(n, i) ORDER BY i",
            sessions_channel(schema),
            list(notes),
        )


async def report_processor(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    topic: str,
    worker: str,
    partitions: Sequence[int],
) -> None:
    """Record that ``worker`` of group ``consumer`` is alive and which partitions it holds."""
    await conn.execute(
        f"INSERT INTO {_q(schema)}.processors (consumer, topic, worker, partitions) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, topic, worker) "
        "DO UPDATE SET partitions = excluded.partitions, seen_at = now()",
        consumer,
        topic,
        worker,
        sorted(partitions),
    )


async def forget_processor(
    conn: asyncpg.Connection, schema: str, consumer: str, topic: str, worker: str
) -> None:
    await conn.execute(
        f"DELETE FROM {_q(schema)}.processors WHERE consumer = $1 AND topic = $2 AND worker = $3",
        consumer,
        topic,
        worker,
    )


@dataclass(frozen=True)
class ProcessorRow:
    """A projector worker as it last reported itself."""

    consumer: str
    topic: str
    worker: str
    partitions: list[int]
    seen_seconds_ago: float


async def list_processors(conn: asyncpg.Connection, schema: str) -> list[ProcessorRow]:
    """Every worker that reported to the schema, most recently seen first."""
    rows = await conn.fetch(
        "SELECT consumer, topic, worker, partitions, extract(epoch FROM now() - seen_at) "
        f"FROM {_q(schema)}.processors ORDER BY seen_at DESC"
    )
    return [ProcessorRow(r[0], r[1], r[2], list(r[3]), float(r[4])) for r in rows]


async def schemas_with_processors(conn: asyncpg.Connection) -> list[str]:
    """Schemas of this database that hold a loomflow processors table."""
    rows = await conn.fetch(
        "SELECT table_schema FROM information_schema.tables WHERE table_name = 'processors' "
        "AND table_schema IN (SELECT table_schema FROM information_schema.tables "
        "WHERE table_name = 'schema_migrations') ORDER BY table_schema"
    )
    return [str(r[0]) for r in rows]
