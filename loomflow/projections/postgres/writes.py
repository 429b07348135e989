"""Writes to the PostgreSQL log and read model: a batch of events folded and applied in a
few statements whatever its size, and prune."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import asyncpg
import orjson

from loomflow.errors import (
    InvalidEventError,
    LoomflowError,
    SequenceConflictError,
)
from loomflow.projections.apply import NewRows, Seq, StoredRows, apply_batch_async, scopes
from loomflow.projections.fold import (
    AddTranscript,
    Change,
    DeleteCheckpoints,
    EraseSession,
    Mutation,
    PruneFilter,
    PutCheckpoint,
    PutStep,
    RetainCheckpoints,
    maybe_redelivered,
    project,
)
from loomflow.projections.postgres.consumers import Positions
from loomflow.projections.postgres.schema import quoted
from loomflow.projections.postgres.tables import (
    LOG_COLUMNS,
    SESSION_COLUMNS,
    SESSION_KEY,
    SESSION_ROW_COLUMNS,
    Columns,
    StoredKey,
    arrays,
    by_scope,
    insert_sql,
    matching,
    payload_json,
)
from loomflow.projections.rows import session_from_row, sig_json, stored_user
from loomflow.schemas import Event
from loomflow.schemas.scope import Scope, scope_of
from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "KNOWN_ROWS",
    "PostgresDialect",
    "apply",
    "apply_events",
    "apply_known",
    "commit_round",
    "prune",
    "remember",
    "save_sessions",
]


#: batches of at least this many events write their log rows (and waves of at least
#: this many new checkpoints, their rows) by COPY
_COPY_FROM = 64
_LOG_NAMES = [name for name, _, _ in LOG_COLUMNS]


async def _lock_sessions(
    conn: asyncpg.Connection, schema: str, scopes: Sequence[Scope]
) -> dict[Scope, SessionRecord]:
    # locked in key order: two batches touching the same sessions cannot deadlock
    keys = sorted(by_scope(scope) for scope in scopes)
    rows = await conn.fetch(
        f"SELECT {SESSION_COLUMNS} FROM {quoted(schema)}.sessions "
        "WHERE (user_id, session_id) IN (SELECT * FROM unnest($1::text[], $2::text[])) "
        "ORDER BY user_id, session_id FOR UPDATE",
        [k[0] for k in keys],
        [k[1] for k in keys],
    )
    loaded = (session_from_row(row) for row in rows)
    return {scope_of(r): r for r in loaded}


async def save_sessions(
    conn: asyncpg.Connection, schema: str, rows: Iterable[SessionRecord]
) -> None:
    """Insert or replace session rows, in one statement."""
    ordered = sorted(rows, key=by_scope)
    if ordered:
        sql = insert_sql(f"{quoted(schema)}.sessions", SESSION_ROW_COLUMNS, key=SESSION_KEY)
        await conn.execute(sql, *arrays(SESSION_ROW_COLUMNS, ordered))


async def _write(
    conn: asyncpg.Connection,
    schema: str,
    events: list[Event],
    sessions: list[SessionRecord],
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
    s = quoted(schema)
    save_sessions = sorted(sessions, key=by_scope)
    try:
        if len(events) >= _COPY_FROM:
            await conn.copy_records_to_table(
                "events",
                schema_name=schema,
                columns=_LOG_NAMES,
                records=[
                    (
                        "" if e.user_id is None else e.user_id,
                        e.session_id,
                        e.seq,
                        e.type,
                        e.event_id,
                        e.run_id,
                        e.epoch,
                        e.v,
                        e.at,
                        None if e.sig is None else sig_json(e),
                        payloads.get(id(e)) or payload_json(e),
                    )
                    for e in events
                ],
            )
            sql = insert_sql(f"{s}.sessions", SESSION_ROW_COLUMNS, key=SESSION_KEY)
            await conn.execute(sql, *arrays(SESSION_ROW_COLUMNS, save_sessions))
            return
        log = insert_sql(f"{s}.events", LOG_COLUMNS)
        save = insert_sql(f"{s}.sessions", SESSION_ROW_COLUMNS, len(LOG_COLUMNS) + 1, SESSION_KEY)
        await conn.execute(
            f"WITH log AS ({log}) {save}",
            *arrays(LOG_COLUMNS[:-1], events),
            [payloads.get(id(e)) or payload_json(e) for e in events],
            *arrays(SESSION_ROW_COLUMNS, save_sessions),
        )
    except asyncpg.UniqueViolationError as exc:
        raise _conflict(exc) from exc


def _conflict(exc: asyncpg.UniqueViolationError) -> SequenceConflictError:
    # a concurrent writer committed the same seq of a session that had no row to lock
    return SequenceConflictError(
        f"another writer appended first: {exc.detail or exc}; read the session again"
    )


async def _write_guarded(
    conn: asyncpg.Connection,
    schema: str,
    events: list[Event],
    sessions: list[SessionRecord],
    guard: Sequence[SessionRecord],
    checkpoints: _Wave,
    payloads: Mapping[int, str] | None = None,
    positions: Positions | None = None,
) -> bool:
    """Append log rows, save session rows and write the sessions' new ``checkpoints`` (a
    PutCheckpoint each, at most one per session, then at most one RetainCheckpoints), in
    one statement outside any transaction of the caller's, and only if every session's
    stored row still has the last seq and epoch of its ``guard`` row; return whether it
    wrote. The statement locks those rows first: a writer that folded from rows it
    remembers (not read in a transaction) learns from the result whether another writer
    moved a session on or pruned it meanwhile. With ``positions`` (a projector's), the
    same statement records them and sends their notifications, also only if it wrote."""
    s = quoted(schema)
    args: list[Any] = []

    def take(values: Sequence[object]) -> int:
        """Add parameters; the number of the first one."""
        args.extend(values)
        return len(args) - len(values) + 1

    held = "(SELECT held FROM still)"
    g = take(
        [
            [stored_user(row.user_id) for row in guard],
            [row.session_id for row in guard],
            [row.last_seq for row in guard],
            [row.epoch for row in guard],
            len(guard),
        ]
    )
    ctes = [
        f"locked AS (SELECT 1 FROM {s}.sessions t JOIN unnest(${g}::text[], ${g + 1}::text[], "
        f"${g + 2}::bigint[], ${g + 3}::bigint[]) AS g(u, s, last, epoch) ON t.user_id = g.u "
        "AND t.session_id = g.s AND t.last_seq = g.last AND t.epoch = g.epoch "
        "ORDER BY t.user_id, t.session_id FOR UPDATE OF t)",
        f"still AS (SELECT count(*) = ${g + 4} AS held FROM locked)",
    ]
    puts = [(key, m) for key, m in checkpoints if isinstance(m, PutCheckpoint)]
    if puts:
        first = take(arrays(_CHECKPOINT_ROW_COLUMNS, puts))
        rows = insert_sql(f"{s}.checkpoints", _CHECKPOINT_ROW_COLUMNS, first, where=held)
        ctes.append(f"ckpt AS ({rows})")
    keeps = [(key, m.keep) for key, m in checkpoints if isinstance(m, RetainCheckpoints)]
    if keeps:
        # one statement sees the checkpoints as they were before its insert: the new one
        # (newer than all of them) is one of the ``keep`` kept, so keep - 1 of these stay
        r = take([[k[0] for k, _ in keeps], [k[1] for k, _ in keeps], [n for _, n in keeps]])
        ctes.append(
            f"cut AS (DELETE FROM {s}.checkpoints c USING (SELECT r.u, r.s, (SELECT o.seq "
            f"FROM {s}.checkpoints o WHERE o.user_id = r.u AND o.session_id = r.s ORDER BY "
            f"o.seq DESC OFFSET r.keep - 1 LIMIT 1) AS cut FROM unnest(${r}::text[], "
            f"${r + 1}::text[], ${r + 2}::bigint[]) AS r(u, s, keep)) AS x WHERE {held} "
            "AND x.cut IS NOT NULL AND c.user_id = x.u AND c.session_id = x.s "
            "AND c.seq <= x.cut)"
        )
    events = sorted(events, key=lambda e: (*by_scope(e), e.seq))
    texts = payloads or {}
    first = take(
        [*arrays(LOG_COLUMNS[:-1], events), [texts.get(id(e)) or payload_json(e) for e in events]]
    )
    ctes.append(f"log AS ({insert_sql(f'{s}.events', LOG_COLUMNS, first, where=held)})")
    ordered = sorted(sessions, key=by_scope)
    first = take(arrays(SESSION_ROW_COLUMNS, ordered))
    save = insert_sql(f"{s}.sessions", SESSION_ROW_COLUMNS, first, SESSION_KEY, held)
    try:
        if positions is None:
            saved = len(await conn.fetch(f"WITH {', '.join(ctes)} {save} RETURNING 1", *args))
        else:
            upsert, notify, more = positions.statement(schema, len(args) + 1, held)
            args.extend(more)
            # a SELECT in a WITH runs only where the statement reads it: ``sent`` is read
            ctes += [f"saved AS ({save} RETURNING 1)", f"moved AS ({upsert})"]
            ctes.append(f"sent AS ({notify})")
            saved, _ = await conn.fetchrow(
                f"WITH {', '.join(ctes)} SELECT (SELECT count(*) FROM saved), "
                "(SELECT count(*) FROM sent)",
                *args,
            )
    except asyncpg.UniqueViolationError as exc:
        raise _conflict(exc) from exc
    return saved == len(ordered)


async def _stored_event_ids(
    conn: asyncpg.Connection, schema: str, wanted: Sequence[Seq]
) -> dict[Seq, str]:
    rows = await conn.fetch(
        f"SELECT user_id, session_id, seq, event_id FROM {quoted(schema)}.events "
        "WHERE (user_id, session_id, seq) IN "
        "(SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]))",
        [stored_user(scope.user_id) for scope, _ in wanted],
        [scope.session_id for scope, _ in wanted],
        [seq for _, seq in wanted],
    )
    asked = {
        (stored_user(scope.user_id), scope.session_id, seq): (scope, seq) for scope, seq in wanted
    }
    return {asked[(r[0], r[1], r[2])]: r[3] for r in rows}


async def apply_events(
    conn: asyncpg.Connection,
    schema: str,
    events: Sequence[Event],
    payloads: Mapping[int, str] | None = None,
) -> dict[Scope, SessionRecord]:
    """Fold events into the read model and append them to the log, in the caller's
    transaction; return the session rows it wrote.

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
    if not events:
        return {}
    return await apply_batch_async(PostgresDialect(conn, schema, payloads or {}), events)


class PostgresDialect:
    """The apply step's reads and writes in a PostgreSQL schema (see projections/apply.py),
    in the caller's transaction: the rows read are locked, a batch's mutations go in waves
    of one statement per kind, its log rows by COPY once it is large."""

    def __init__(self, conn: asyncpg.Connection, schema: str, payloads: Mapping[int, str]) -> None:
        self.conn = conn
        self.schema = schema
        self.payloads = payloads

    async def rows(self, scopes: Sequence[Scope]) -> dict[Scope, SessionRecord]:
        """The rows of these sessions, locked (FOR UPDATE) in key order."""
        return await _lock_sessions(self.conn, self.schema, scopes)

    async def event_ids(self, wanted: Sequence[Seq]) -> dict[Seq, str]:
        """The id of the event the log holds at each of these seqs, in one query."""
        return await _stored_event_ids(self.conn, self.schema, wanted)

    async def write(self, changes: Sequence[Change], rows: NewRows, before: StoredRows) -> None:
        """The batch's mutations in waves, then its log rows and session rows together."""
        # each session's events in seq order (the fold accepts them so), the sessions in
        # key order: two transactions creating the same sessions' rows wait on each other
        # in the same order instead of deadlocking. Sorting the sessions, not the events,
        # costs a batch of thousands of events a few hundred comparisons.
        written: dict[StoredKey, list[Event]] = {}
        pending: dict[StoredKey, list[Mutation]] = {}
        for change in changes:
            event = change.event
            key = ("" if event.user_id is None else event.user_id, event.session_id)
            queue = pending.get(key)
            if queue is None:
                queue = pending[key] = []
                written[key] = []
            for mutation in change.mutations:
                if isinstance(mutation, EraseSession):  # all of the session goes, written or not
                    written[key].clear()
                    queue.clear()
                if not isinstance(mutation, AddTranscript):  # the log row is the transcript
                    queue.append(mutation)
            written[key].append(event)
        await _apply_in_waves(self.conn, self.schema, pending)
        events = [event for key in sorted(written) for event in written[key]]
        await _write(self.conn, self.schema, events, list(rows.values()), self.payloads)


#: how many sessions' rows a PostgresStore keeps from its own commits
KNOWN_ROWS = 4096


async def commit_round(
    conn: asyncpg.Connection,
    schema: str,
    appends: list[list[Event]],
    known: dict[Scope, SessionRecord] | None = None,
) -> list[LoomflowError | None]:
    """Commit a round of appends in one transaction; return each append's outcome.

    ``known`` holds the session rows of the caller's own last commits, and is kept up to
    date. A lone append whose sessions are all known, and which only adds to the log
    (no checkpoint, step or erasure to write besides), is folded from them and written
    in one guarded statement (``_write``): one round trip instead of a transaction's
    four. If another writer moved a session on meanwhile, nothing is written and the
    append goes the usual way, which reads the rows it locks.
    """
    events = [e for batch in appends for e in batch]
    if known is not None:
        if len(appends) == 1 and await apply_known(conn, schema, events, known):
            return [None]
        for scope in scopes(events):  # the round decides their rows anew
            known.pop(scope, None)
    try:
        async with conn.transaction():
            changed = await apply_batch_async(PostgresDialect(conn, schema, {}), events)
        remember(known, changed)
        return [None] * len(appends)
    except LoomflowError as exc:
        if len(appends) == 1:
            return [exc]
    # one of them was refused: again, each in its own savepoint, so that it fails alone
    outcomes: list[LoomflowError | None] = []
    updates: dict[Scope, SessionRecord] = {}
    async with conn.transaction():
        for batch in appends:
            try:
                async with conn.transaction():
                    updates.update(
                        await apply_batch_async(PostgresDialect(conn, schema, {}), batch)
                    )
            except LoomflowError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
    remember(known, updates)
    return outcomes


async def apply_known(
    conn: asyncpg.Connection,
    schema: str,
    events: list[Event],
    known: dict[Scope, SessionRecord],
    payloads: Mapping[int, str] | None = None,
    positions: Positions | None = None,
) -> bool:
    """Write ``events`` folded from the ``known`` rows of their sessions, in one guarded
    statement (and ``positions`` with them); False (nothing written) when it cannot: a
    session not known, an event that may be a redelivery or that the fold refuses, a
    change beyond the log, the session rows and a checkpoint, or a session that another
    writer moved on. ``known`` keeps the rows written, as ``commit_round`` keeps them.

    A writer that is its sessions' only writer while it holds them (a projector, for its
    partitions) applies a lone event in one round trip instead of a transaction's five;
    the guard makes a row it remembers wrongly cost a fallback, never a wrong write.
    """
    rows: dict[Scope, SessionRecord | None] = {}
    for scope in scopes(events):
        rows[scope] = known.get(scope)
        if rows[scope] is None:
            return False
    if maybe_redelivered(rows, events):
        return False
    try:
        changed, changes = project(rows, events, {})
    except InvalidEventError:
        return False  # the rows it locks say whether it is refused
    checkpoints = _checkpoint_wave(changes)
    if checkpoints is None:
        return False
    guard = [row for row in rows.values() if row is not None]
    try:
        written = await _write_guarded(
            conn,
            schema,
            [c.event for c in changes],
            list(changed.values()),
            guard,
            checkpoints,
            payloads,
            positions,
        )
    except SequenceConflictError:
        return False
    if written:
        remember(known, changed)
    return written


def _checkpoint_wave(changes: Sequence[Change]) -> _Wave | None:
    """The changes' mutations beyond the log as one statement can write them: per session
    at most one new checkpoint, then at most one retention; None for anything else."""
    wave: _Wave = []
    seen: dict[StoredKey, list[Mutation]] = {}
    for change in changes:
        key = by_scope(change.event)
        for mutation in change.mutations:
            if isinstance(mutation, AddTranscript):
                continue
            done = seen.setdefault(key, [])
            first = isinstance(mutation, PutCheckpoint) and not done
            if not (first or (isinstance(mutation, RetainCheckpoints) and len(done) == 1)):
                return None
            done.append(mutation)
            wave.append((key, mutation))
    return wave


def remember(
    known: dict[Scope, SessionRecord] | None, changed: Mapping[Scope, SessionRecord]
) -> None:
    """Keep the rows a commit wrote, the latest ``KNOWN_ROWS`` sessions of them (for
    ``apply_known`` / ``commit_round``)."""
    if known is None:
        return
    for scope, row in changed.items():
        known.pop(scope, None)  # to the end: the least recently written go first
        known[scope] = row
    while len(known) > KNOWN_ROWS:
        del known[next(iter(known))]


# -- mutations -----------------------------------------------------------------------

#: mutations of one kind, each of a session's (user as stored, session id)
_Wave = list[tuple[StoredKey, Mutation]]


async def apply(
    conn: asyncpg.Connection,
    schema: str,
    user_id: str | None,
    session_id: str,
    mutation: Mutation,
) -> None:
    """Apply one fold mutation inside the caller's transaction."""
    await _apply_wave(conn, schema, [((stored_user(user_id), session_id), mutation)])


async def _apply_in_waves(
    conn: asyncpg.Connection, schema: str, pending: dict[StoredKey, list[Mutation]]
) -> None:
    # Mutations of different sessions commute; only each session's own order matters. So
    # a wave takes the next mutations of every session whose next one is of the same kind,
    # and applies them in one statement: a batch of a thousand sessions that each wrote a
    # checkpoint costs two statements (insert, retention), not two thousand. A session's
    # run of new checkpoints goes in one wave, and its retentions with the same ``keep``
    # collapse into the last one: keeping the newest k after each insert leaves what
    # keeping them once after the last insert does.
    queues = {key: deque(_collapse(queue)) for key, queue in sorted(pending.items()) if queue}
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


#: rows of a wave are ((user as stored, session id), mutation)
_CHECKPOINT_ROW_COLUMNS: Columns = (
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
_CHECKPOINT_NAMES = [name for name, _, _ in _CHECKPOINT_ROW_COLUMNS]


def _checkpoint_record(key: StoredKey, mutation: Mutation) -> tuple[Any, ...]:
    """A row of ``_CHECKPOINT_ROW_COLUMNS`` for COPY (its usage as JSON text: the column's
    codec is asyncpg's text one)."""
    assert isinstance(mutation, PutCheckpoint)
    row = mutation.row
    return (
        key[0],
        key[1],
        row.checkpoint_id,
        row.seq,
        row.base_seq,
        row.turn,
        row.message_count,
        row.cumulative_usage.model_dump_json(),
        row.cursor,
        row.created_at,
    )


_STEP_ROW_COLUMNS: Columns = (
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
    s = quoted(schema)
    users = [key[0] for key, _ in wave]
    sessions = [key[1] for key, _ in wave]
    match wave[0][1]:
        case PutCheckpoint():
            try:
                if len(wave) >= _COPY_FROM:  # as the log rows, for what asyncpg's arrays cost
                    await conn.copy_records_to_table(
                        "checkpoints",
                        schema_name=schema,
                        columns=_CHECKPOINT_NAMES,
                        records=[_checkpoint_record(key, m) for key, m in wave],
                    )
                else:
                    await conn.execute(
                        insert_sql(f"{s}.checkpoints", _CHECKPOINT_ROW_COLUMNS),
                        *arrays(_CHECKPOINT_ROW_COLUMNS, wave),
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
            sql = insert_sql(
                f"{s}.steps", _STEP_ROW_COLUMNS, key=("user_id", "session_id", "step_key")
            )
            await conn.execute(sql, *arrays(_STEP_ROW_COLUMNS, wave))
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


async def prune(
    conn: asyncpg.Connection, schema: str, match: PruneFilter
) -> tuple[int, int, int, int]:
    """Delete what ``match`` selects, in one statement of the caller's transaction;
    return the counts of (sessions, checkpoints, steps, events) deleted."""
    s = quoted(schema)
    args: list[Any] = [match.before]
    # an erasure's tombstone stays: it is what refuses the session's late events
    where = [matching(match, args), "status <> 'erased'"]
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
