"""What consumers of the log keep in PostgreSQL: positions, dead letters, heartbeats, and
the notifications that tell writers what was projected."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from loomflow.projections.postgres.schema import check_schema, quoted

__all__ = [
    "DeadLetterRow",
    "Positions",
    "ProcessorRow",
    "add_dead_letters",
    "consumed_topics",
    "find_refusal",
    "forget_processor",
    "list_processors",
    "load_positions",
    "notify_sessions",
    "positions_channel",
    "preview",
    "printable",
    "report_processor",
    "save_position",
    "save_positions",
    "schemas_with_processors",
    "sessions_channel",
]


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
        f"SELECT partition, next_offset FROM {quoted(schema)}.positions "
        "WHERE consumer = $1 AND topic = $2",
        consumer,
        topic,
    )
    return {int(r[0]): int(r[1]) for r in rows}


async def consumed_topics(conn: asyncpg.Connection, schema: str) -> list[tuple[str, str]]:
    """(consumer, topic) of every consumer that recorded positions in the schema, or
    that reports to it as running (a processor that has applied nothing yet): a schema
    with any is the read model of a Kafka log, which writes must go through."""
    rows = await conn.fetch(
        f"SELECT consumer, topic FROM {quoted(schema)}.positions "
        f"UNION SELECT consumer, topic FROM {quoted(schema)}.processors ORDER BY 1, 2"
    )
    return [(r[0], r[1]) for r in rows]


@dataclass(frozen=True)
class Positions:
    """Next offsets of one topic's partitions to record for ``consumer``, and the notes
    that go with them on ``sessions_channel`` (see :func:`save_positions`)."""

    consumer: str
    topic: str
    next_offsets: Mapping[int, int]
    notes: Sequence[str] = ()

    def statement(self, schema: str, first: int, where: str = "") -> tuple[str, str, list[object]]:
        """The upsert of the positions and the SELECT that sends the notifications, as
        parts of a statement whose parameters number from ``first``, each part only
        ``where`` (an SQL condition) holds; and those parameters.

        The notes go first, then ``consumer:topic:partition:offset`` of each partition on
        ``positions_channel``, all when the transaction commits (PostgreSQL evaluates a
        volatile output after ORDER BY)."""
        c, t, ps, os_, pos, ses, notes, n = (f"${first + i}" for i in range(8))
        when = f" WHERE {where}" if where else ""
        upsert = (
            f"INSERT INTO {quoted(schema)}.positions (consumer, topic, partition, next_offset) "
            f"SELECT {c}, {t}, p, o FROM unnest({ps}::int[], {os_}::bigint[]) AS x(p, o){when} "
            "ON CONFLICT (consumer, topic, partition) "
            "DO UPDATE SET next_offset = greatest(positions.next_offset, excluded.next_offset)"
        )
        notify = (
            f"SELECT pg_notify(c, n) FROM (SELECT {ses} AS c, n, i FROM unnest({notes}::text[]) "
            f"WITH ORDINALITY AS t(n, i) UNION ALL SELECT {pos}, {c} || ':' || {t} || ':' || "
            f"p::text || ':' || o::text, {n}::bigint + i FROM unnest({ps}::int[], "
            f"{os_}::bigint[]) WITH ORDINALITY AS x(p, o, i)) AS sent{when} ORDER BY i"
        )
        partitions = sorted(self.next_offsets)
        args: list[object] = [
            self.consumer,
            self.topic,
            partitions,
            [self.next_offsets[p] for p in partitions],
            positions_channel(schema),
            sessions_channel(schema),
            list(self.notes),
            len(self.notes),
        ]
        return upsert, notify, args


async def save_positions(
    conn: asyncpg.Connection,
    schema: str,
    consumer: str,
    topic: str,
    next_offsets: Mapping[int, int],
    notes: Sequence[str] = (),
) -> None:
    """Record the next offset to consume of each partition, in the caller's transaction,
    in one statement.

    Listeners of ``positions_channel(schema)`` hear ``consumer:topic:partition:offset``
    for each when the transaction commits (never before, never if it rolls back). Given
    ``notes``, the same statement sends them on ``sessions_channel(schema)`` first, as
    ``notify_sessions`` does: a projector's batch that holds a claim saves a round trip.
    """
    upsert, notify, args = Positions(consumer, topic, next_offsets, notes).statement(schema, 1)
    await conn.execute(f"WITH saved AS ({upsert}) {notify}", *args)


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
        f"INSERT INTO {quoted(schema)}.dead_letters (source, reason, raw, event_id, error_type, "
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
        "SELECT coalesce(error_type, 'InvalidEventError'), reason "
        f"FROM {quoted(schema)}.dead_letters WHERE event_id = ANY($1::text[]) ORDER BY id LIMIT 1",
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
        f"INSERT INTO {quoted(schema)}.processors (consumer, topic, worker, partitions) "
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
        f"DELETE FROM {quoted(schema)}.processors "
        "WHERE consumer = $1 AND topic = $2 AND worker = $3",
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
        f"FROM {quoted(schema)}.processors ORDER BY seen_at DESC"
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
