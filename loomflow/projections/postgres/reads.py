"""Queries of the PostgreSQL read model: sessions, checkpoints, journal steps, transcripts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from loomflow.errors import (
    CorruptRecordError,
)
from loomflow.projections.fold import (
    TRANSCRIPT_TYPES,
    CheckpointRow,
    PruneFilter,
    StepRow,
)
from loomflow.projections.postgres.schema import quoted
from loomflow.projections.postgres.tables import (
    SESSION_COLUMNS,
    matching,
)
from loomflow.projections.rows import (
    USAGE_FIELDS,
    checkpoint_from_row,
    decoded_events,
    event_from_row,
    session_from_row,
    stored_user,
    totals_from_row,
)
from loomflow.projections.transcript import decode_transcript
from loomflow.schemas import Event, Message
from loomflow.schemas.sessions import SessionCursor, SessionRecord, SessionTotals

__all__ = [
    "get_checkpoint",
    "get_step",
    "holds_events",
    "latest_snapshots",
    "list_checkpoints",
    "list_sessions",
    "load_head",
    "load_session",
    "match_sessions",
    "read_events",
    "read_transcript",
    "session_totals",
    "sessions_in_flight",
    "transcript_payloads",
]


logger = logging.getLogger("loomflow.projections.postgres")


async def holds_events(conn: asyncpg.Connection, schema: str) -> bool:
    """Whether the schema's log holds any event (a rebuild goes only into an empty one)."""
    return bool(await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {quoted(schema)}.events)"))


async def load_session(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str
) -> SessionRecord | None:
    """The session's row, or None when it has no events."""
    row = await conn.fetchrow(
        f"SELECT {SESSION_COLUMNS} FROM {quoted(schema)}.sessions "
        "WHERE user_id = $1 AND session_id = $2",
        stored_user(user_id),
        session_id,
    )
    return None if row is None else session_from_row(row)


async def load_head(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    session_id: str,
    checkpoint: bool,
    position: tuple[str, str, int] | None = None,
) -> tuple[SessionRecord | None, str | None, int]:
    """What a claim reads of a session, in one statement (one round trip): its row, the
    id of its newest checkpoint when ``checkpoint`` (else None), and, given ``position``
    (consumer, topic, partition), that consumer's next offset in the partition (else 0).

    One statement reads one snapshot, and a projector commits its rows with its
    positions: the row holds exactly the partition's events below that offset.
    """
    s = quoted(schema)
    latest = (
        f"(SELECT c.checkpoint_id FROM {s}.checkpoints c WHERE c.user_id = $1 "
        "AND c.session_id = $2 ORDER BY c.seq DESC LIMIT 1)"
        if checkpoint
        else "NULL::text"
    )
    offset = (
        f"(SELECT p.next_offset FROM {s}.positions p WHERE p.consumer = $3 "
        "AND p.topic = $4 AND p.partition = $5)"
        if position is not None
        else "NULL::bigint"
    )
    args: list[Any] = [stored_user(user_id), session_id]
    if position is not None:
        args.extend(position)
    row = await conn.fetchrow(
        f"SELECT {SESSION_COLUMNS}, {latest}, {offset} FROM (SELECT) AS one "
        f"LEFT JOIN {s}.sessions ON user_id = $1 AND session_id = $2",
        *args,
    )
    assert row is not None  # the outer side of the join is one row
    found = None if row[1] is None else session_from_row(row)
    return found, (row[-2] if found is not None else None), int(row[-1] or 0)


def _selecting(
    args: list[Any],
    user_id: str | None,
    any_user: bool,
    status: Sequence[str] | None,
    since: datetime | None,
    agent: str | None,
    parent_session_id: str | None = None,
) -> list[str]:
    """The WHERE terms of a listing's filters (see list_sessions), their parameters
    appended to ``args``."""
    where = ["status <> 'erased'"]
    if status is not None:
        args.append(list(status))
        where.append(f"status = ANY(${len(args)}::text[])")
    if not any_user:
        args.append(stored_user(user_id))
        where.append(f"user_id = ${len(args)}")
    if parent_session_id is not None:
        args.append(parent_session_id)
        where.append(f"parent_session_id = ${len(args)}")
    if since is not None:
        args.append(since)
        where.append(f"updated_at >= ${len(args)}")
    if agent is not None:
        args.append(agent)
        where.append(f"control->>'agent' = ${len(args)}")
    return where


async def list_sessions(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    any_user: bool,
    status: Sequence[str] | None,
    parent_session_id: str | None,
    limit: int,
    since: datetime | None = None,
    agent: str | None = None,
    after: SessionCursor | None = None,
) -> list[SessionRecord]:
    """Up to ``limit`` live (not erased) sessions of ``user_id`` (of every user when
    ``any_user``), the most recently active first; with ``parent_session_id``, only the
    sessions forked from it; with ``status``, only the sessions in one of them; with
    ``since``, only those last active at or after it; with ``agent``, only those whose
    latest run is of that agent; with ``after``, only those after it in the order
    (updated_at DESC, user_id, session_id), which the listing indexes hold."""
    args: list[Any] = []
    where = _selecting(args, user_id, any_user, status, since, agent, parent_session_id)
    if after is not None:
        args += [after.updated_at, stored_user(after.user_id), after.session_id]
        t, u, sid = (f"${n}" for n in range(len(args) - 2, len(args) + 1))
        # the bound on updated_at alone is what the index scan starts from; the rest
        # drops the rows of the cursor's own moment up to it
        where.append(
            f"updated_at <= {t} AND (updated_at < {t} OR (user_id, session_id) > ({u}, {sid}))"
        )
    args.append(limit)
    rows = await conn.fetch(
        f"SELECT {SESSION_COLUMNS} FROM {quoted(schema)}.sessions WHERE {' AND '.join(where)} "
        f"ORDER BY updated_at DESC, user_id, session_id LIMIT ${len(args)}",
        *args,
    )
    return [session_from_row(row) for row in rows]


async def session_totals(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    any_user: bool,
    status: Sequence[str] | None,
    since: datetime | None = None,
    agent: str | None = None,
) -> SessionTotals:
    """How many sessions ``list_sessions`` selects with these filters, and their usage
    summed."""
    args: list[Any] = []
    where = _selecting(args, user_id, any_user, status, since, agent)
    sums = ", ".join(
        f"coalesce(sum((usage->>'{name}')::float8), 0)"
        if name == "cost_usd"
        else f"coalesce(sum((usage->>'{name}')::bigint), 0)::bigint"
        for name in USAGE_FIELDS
    )
    row = await conn.fetchrow(
        f"SELECT count(*), {sums} FROM {quoted(schema)}.sessions WHERE {' AND '.join(where)}",
        *args,
    )
    return totals_from_row(row)


async def sessions_in_flight(
    conn: asyncpg.Connection, schema: str, now: datetime, limit: int
) -> list[SessionRecord]:
    """Where a worker looks for runs to take over, up to ``limit`` of each kind: the
    running sessions, the longest silent first (their leases say which are abandoned);
    the signalled ones; the waiting ones whose wait timed out by ``now``. A fork that no
    run has continued has no run to take over: old ones would fill the first kind."""
    table = f"{quoted(schema)}.sessions"
    rows = list(
        await conn.fetch(
            f"SELECT {SESSION_COLUMNS} FROM {table} WHERE status IN ('running', 'signalled') "
            "AND last_run_id IS NOT NULL ORDER BY updated_at LIMIT $1",
            limit,
        )
    )
    rows += await conn.fetch(
        f"SELECT {SESSION_COLUMNS} FROM {table} WHERE status = 'waiting' "
        "AND (control->'waiting'->>'until')::timestamptz <= $1 ORDER BY updated_at LIMIT $2",
        now,
        limit,
    )
    return [session_from_row(row) for row in rows]


async def match_sessions(
    conn: asyncpg.Connection, schema: str, match: PruneFilter
) -> list[SessionRecord]:
    """Rows of the live (not erased) sessions that ``match`` selects."""
    args: list[Any] = []
    where = [matching(match, args), "status <> 'erased'"]
    rows = await conn.fetch(
        f"SELECT {SESSION_COLUMNS} FROM {quoted(schema)}.sessions WHERE {' AND '.join(where)} "
        "ORDER BY user_id, session_id",
        *args,
    )
    return [session_from_row(row) for row in rows]


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


async def get_checkpoint(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    session_id: str,
    checkpoint_id: str | None,
) -> CheckpointRow | None:
    """The named checkpoint (the newest when id is None), or None."""
    s = quoted(schema)
    if checkpoint_id is None:
        row = await conn.fetchrow(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {s}.checkpoints WHERE user_id = $1 "
            "AND session_id = $2 ORDER BY seq DESC LIMIT 1",
            stored_user(user_id),
            session_id,
        )
    else:
        row = await conn.fetchrow(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {s}.checkpoints WHERE user_id = $1 "
            "AND session_id = $2 AND checkpoint_id = $3",
            stored_user(user_id),
            session_id,
            checkpoint_id,
        )
    return None if row is None else checkpoint_from_row(row)


async def list_checkpoints(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, limit: int
) -> list[CheckpointRow]:
    """Up to ``limit`` checkpoints, newest first (metadata only: no transcript is read)."""
    rows = await conn.fetch(
        f"SELECT {_CHECKPOINT_COLUMNS} FROM {quoted(schema)}.checkpoints WHERE user_id = $1 "
        "AND session_id = $2 ORDER BY seq DESC LIMIT $3",
        stored_user(user_id),
        session_id,
        limit,
    )
    return [checkpoint_from_row(r) for r in rows]


async def get_step(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, step_key: str
) -> StepRow | None:
    """The journal entry recorded under ``step_key``, or None."""
    row = await conn.fetchrow(
        f"SELECT input_hash, seq, value::text, serializer, at FROM {quoted(schema)}.steps "
        "WHERE user_id = $1 AND session_id = $2 AND step_key = $3",
        stored_user(user_id),
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
    *fields, payload = row
    return event_from_row(fields, payload, f"log row of session {fields[1]!r}, seq {fields[2]}")


async def read_events(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[Event]:
    """The session's events with lo <= seq <= hi; a row that does not decode is skipped
    with a warning, so one bad row never stops a reader of the log."""
    rows = await conn.fetch(
        "SELECT user_id, session_id, seq, type, event_id, run_id, epoch, v, at, sig::text, "
        f"payload::text FROM {quoted(schema)}.events WHERE user_id = $1 AND session_id = $2 "
        "AND seq >= $3 AND seq <= $4 ORDER BY seq",
        stored_user(user_id),
        session_id,
        lo,
        hi,
    )
    return decoded_events(rows, _decode_event_row)


async def transcript_payloads(
    conn: asyncpg.Connection, schema: str, user_id: str | None, session_id: str, lo: int, hi: int
) -> list[tuple[int, str]]:
    """(seq, payload JSON) of the transcript events with lo <= seq <= hi, in seq order."""
    rows = await conn.fetch(
        f"SELECT seq, payload::text FROM {quoted(schema)}.events WHERE user_id = $1 "
        "AND session_id = $2 AND seq >= $3 AND seq <= $4 AND type = ANY($5::text[]) "
        "ORDER BY seq",
        stored_user(user_id),
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
    the JSON of its transcript events' message arrays in seq order, as their payloads
    hold it. Two statements for them all.

    PostgreSQL cuts each array out of its payload (the column is ``json``: the text is
    the stored one), so a snapshot is made by joining them, without parsing every
    message of a transcript again here.
    """
    if not wanted:
        return []
    s = quoted(schema)
    rows = await conn.fetch(
        f"SELECT c.user_id, c.session_id, {', '.join('c.' + n for n in _CHECKPOINT_NAMES)} "
        f"FROM {s}.checkpoints c JOIN unnest($1::text[], $2::text[], $3::text[]) AS w(u, s, id) "
        "ON c.user_id = w.u AND c.session_id = w.s AND c.checkpoint_id = w.id",
        [stored_user(w[0]) for w in wanted],
        [w[1] for w in wanted],
        [w[2] for w in wanted],
    )
    found = {(r[0], r[1]): checkpoint_from_row(r[2:]) for r in rows}
    if not found:
        return []
    keys = sorted(found)
    parts = await conn.fetch(
        f"SELECT e.user_id, e.session_id, (e.payload -> 'messages')::text FROM {s}.events e "
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
