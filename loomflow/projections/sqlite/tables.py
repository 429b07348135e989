"""How rows of the log and the read model map to SQLite columns: timestamps as text, the
column lists the reads, the writes and the log's reader share, a log row decoded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from loomflow.projections.rows import CHECKPOINT_FIELDS, USAGE_FIELDS, event_from_row
from loomflow.schemas import Event, Usage

__all__ = [
    "CHECKPOINT_COLUMNS",
    "EVENT_COLUMNS",
    "NOTE_COLUMNS",
    "SESSION_COLUMNS",
    "SESSION_USAGE_COLUMNS",
    "decode_event_row",
    "ts",
    "usage_values",
]


def ts(moment: datetime) -> str:
    """A timestamp as fixed-width UTC ISO text, so text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


SESSION_COLUMNS = (
    "user_id, session_id, status, last_seq, epoch, turns, usage, message_count, base_seq, "
    "parent_session_id, parent_checkpoint_id, last_run_id, created_at, updated_at, control"
)
#: the columns that hold a session's usage as numbers, beside ``usage`` (its JSON, which
#: reads decode): what session_totals sums, one column a field of Usage, in its order
SESSION_USAGE_COLUMNS = ", ".join(USAGE_FIELDS)
CHECKPOINT_COLUMNS = ", ".join(CHECKPOINT_FIELDS)
#: a log row: its position, the columns of EVENT_FIELDS, its payload
EVENT_COLUMNS = (
    "position, user_id, session_id, seq, type, event_id, run_id, epoch, v, at, sig, payload"
)
#: a note prune left in the log where it deleted rows (the log's readers decode it)
NOTE_COLUMNS = "position, user_id, session_id, seqs, through_seq, at"


def decode_event_row(row: Sequence[Any]) -> Event:
    """Rebuild the event stored in one log row (position, EVENT_FIELDS, payload)."""
    position, *fields, payload = row
    where = f"log row {position} (session {fields[1]!r}, seq {fields[2]})"
    return event_from_row(fields, payload, where)


def usage_values(usage: Usage) -> tuple[int, int, int, int, float]:
    """The values of SESSION_USAGE_COLUMNS for ``usage``."""
    return (
        usage.input_tokens,
        usage.cached_input_tokens,
        usage.cache_write_tokens,
        usage.output_tokens,
        usage.cost_usd,
    )
