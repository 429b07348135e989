"""How rows of the log and the read model map to SQLite columns: timestamps as text, the
column lists the reads, the writes and the log's reader share, a payload as stored
(compressed when large), a log row decoded."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from loomflow.errors import CorruptRecordError
from loomflow.projections.rows import CHECKPOINT_FIELDS, USAGE_FIELDS, event_from_row
from loomflow.schemas import Event, Usage
from loomflow.schemas.events import MAX_EVENT_BYTES

__all__ = [
    "CHECKPOINT_COLUMNS",
    "EVENT_COLUMNS",
    "NOTE_COLUMNS",
    "SESSION_COLUMNS",
    "SESSION_USAGE_COLUMNS",
    "decode_event_row",
    "payload_text",
    "stored_payload",
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


#: a payload's JSON of at least this many bytes is stored compressed; shorter ones stay
#: text, which compression barely shrinks (a checkpoint's, a run's start: ~200 bytes)
COMPRESS_FROM = 512
#: zlib's fastest level: on bench/storage.py's "big" session it saves 97% of what level 6
#: saves, and compresses a 2 KB payload in two thirds of level 6's CPU
_LEVEL = 1


def stored_payload(payload: str) -> str | bytes:
    """What the log's ``payload`` column holds for an event's payload JSON: the text, or,
    from COMPRESS_FROM bytes on, its zlib stream (RFC 1950) as a BLOB where that is
    smaller.

    Why zlib: it comes with Python (no dependency on the embedded path), its stream
    carries a checksum (a damaged row is refused, never misread), and it shrinks a
    transcript's ~2 KB rows to about half (1.8x on 2 KB of the README, 2.5x on the
    benchmarks' text) for tens of microseconds of CPU each. zstandard and lz4 would be
    a dependency of the embedded install, for rows too small to give a codec much
    history to use.
    """
    data = payload.encode()
    if len(data) < COMPRESS_FROM:
        return payload
    packed = zlib.compress(data, _LEVEL)
    return packed if len(packed) < len(data) else payload


def payload_text(value: object, where: str) -> str:
    """The payload JSON of a log row's ``payload`` column (``stored_payload``): text as
    it is, a BLOB inflated, refused (CorruptRecordError naming ``where``) when it is
    neither, does not inflate, or inflates past MAX_EVENT_BYTES."""
    if isinstance(value, str):
        return value
    if not isinstance(value, bytes):
        raise CorruptRecordError(
            f"{where} does not decode: its payload is {type(value).__name__}, not JSON"
        )
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(value, MAX_EVENT_BYTES + 1)
        if len(data) > MAX_EVENT_BYTES:
            raise CorruptRecordError(
                f"{where} does not decode: its payload inflates past {MAX_EVENT_BYTES} bytes"
            )
        if not inflate.eof or inflate.unused_data:
            raise CorruptRecordError(
                f"{where} does not decode: its payload is a BLOB that is no whole zlib stream"
            )
        return data.decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"{where} does not decode: its compressed payload: {exc}") from exc


def decode_event_row(row: Sequence[Any]) -> Event:
    """Rebuild the event stored in one log row (position, EVENT_FIELDS, payload)."""
    position, *fields, payload = row
    where = f"log row {position} (session {fields[1]!r}, seq {fields[2]})"
    return event_from_row(fields, payload_text(payload, where), where)


def usage_values(usage: Usage) -> tuple[int, int, int, int, float]:
    """The values of SESSION_USAGE_COLUMNS for ``usage``."""
    return (
        usage.input_tokens,
        usage.cached_input_tokens,
        usage.cache_write_tokens,
        usage.output_tokens,
        usage.cost_usd,
    )
