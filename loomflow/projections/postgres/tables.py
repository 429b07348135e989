"""How rows of the log and the sessions table map to columns, and the SQL built from them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from loomflow.projections.fold import (
    PruneFilter,
)
from loomflow.projections.rows import control_json, sig_json, stored_user
from loomflow.schemas import Event
from loomflow.schemas.scope import Scoped

__all__ = [
    "LOG_COLUMNS",
    "SESSION_COLUMNS",
    "SESSION_KEY",
    "SESSION_ROW_COLUMNS",
    "Columns",
    "StoredKey",
    "arrays",
    "by_scope",
    "insert_sql",
    "matching",
    "payload_json",
]


# -- sessions and the log ------------------------------------------------------------------


def payload_json(event: Event) -> str:
    return event.payload.model_dump_json(exclude_defaults=True)


#: (column, element type of its array parameter, its value for one row); json and jsonb
#: columns take text that SQL casts, so json codecs a caller set on its connection never
#: encode again what the models already serialised.
Columns = tuple[tuple[str, str, Callable[[Any], object]], ...]

LOG_COLUMNS: Columns = (
    ("user_id", "text", lambda e: stored_user(e.user_id)),
    ("session_id", "text", lambda e: e.session_id),
    ("seq", "bigint", lambda e: e.seq),
    ("type", "text", lambda e: e.type),
    ("event_id", "text", lambda e: e.event_id),
    ("run_id", "text", lambda e: e.run_id),
    ("epoch", "bigint", lambda e: e.epoch),
    ("v", "int", lambda e: e.v),
    ("at", "timestamptz", lambda e: e.at),
    ("sig", "json", sig_json),
    ("payload", "json", lambda e: payload_json(e)),  # last: _write may pass it as given
)
SESSION_ROW_COLUMNS: Columns = (
    ("user_id", "text", lambda r: stored_user(r.user_id)),
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
    ("control", "json", control_json),
)
SESSION_KEY = ("user_id", "session_id")
_JSON = ("json", "jsonb")


def _select(columns: Columns) -> str:
    # json read back as text: a caller's json codecs never see it, the models parse it
    return ", ".join(f"{n}::text" if t in _JSON else n for n, t, _ in columns)


SESSION_COLUMNS = _select(SESSION_ROW_COLUMNS)


@lru_cache(maxsize=256)
def insert_sql(
    table: str, columns: Columns, first: int = 1, key: tuple[str, ...] = (), where: str = ""
) -> str:
    """An INSERT of one row per element of the array parameters $first, $first + 1, ...;
    with ``key``, a row whose key exists replaces it; with ``where``, only if that
    condition holds."""
    names = ", ".join(name for name, _, _ in columns)
    values = ", ".join(f"{n}::{t}" if t in _JSON else n for n, t, _ in columns)
    arrays = ", ".join(
        f"${first + i}::{'text' if t in _JSON else t}[]" for i, (_, t, _) in enumerate(columns)
    )
    sql = f"INSERT INTO {table} ({names}) SELECT {values} FROM unnest({arrays}) AS x({names})"
    if where:
        sql += f" WHERE {where}"
    if key:
        updates = ", ".join(f"{n} = excluded.{n}" for n, _, _ in columns if n not in key)
        sql += f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    return sql


def arrays(columns: Columns, rows: Sequence[Any]) -> list[list[object]]:
    return [[value(row) for row in rows] for _, _, value in columns]


#: a session as the tables key it: (user as stored, session id)
StoredKey = tuple[str, str]


def by_scope(row: Scoped) -> StoredKey:
    # rows written in key order: two batches creating the same new sessions wait on each
    # other in the same order instead of deadlocking
    return stored_user(row.user_id), row.session_id


def matching(match: PruneFilter, args: list[Any]) -> str:
    """The WHERE condition selecting ``match``'s sessions; appends its parameters."""
    where = ["true"]
    if match.session_id is not None:
        args.append(match.session_id)
        where.append(f"session_id = ${len(args)}")
    if not match.any_user:
        args.append(stored_user(match.user_id))
        where.append(f"user_id = ${len(args)}")
    return " AND ".join(where)
