"""What a record of the events topic carries: its event, checked against the record's key."""

from __future__ import annotations

from typing import Any

import orjson

from loomflow.errors import InvalidEventError
from loomflow.producers import scope_key
from loomflow.schemas import Event
from loomflow.schemas.codec import decode_event
from loomflow.schemas.events import MAX_EVENT_BYTES

__all__ = ["decode_record"]


def decode_record(record: Any) -> tuple[Event, str | None]:
    """The event a record carries, checked against the record's key, and its payload as
    JSON text (None when the record left the payload to its default).

    The record is parsed once; the payload's text is kept for the log row, so the
    projector never serialises again what the writer already did.
    """
    value = record.value
    if value is None:
        raise InvalidEventError("a record without a value (a tombstone): not an event")
    if len(value) > MAX_EVENT_BYTES:
        raise InvalidEventError(f"event of {len(value)} bytes exceeds {MAX_EVENT_BYTES}")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidEventError(f"invalid event: Invalid JSON: {exc}") from exc
    event = decode_event(data) if isinstance(data, dict) else decode_event(value)
    if record.key != scope_key(event.user_id, event.session_id):
        raise InvalidEventError(
            f"record key {record.key!r} is not the scope of the event it carries "
            f"(session {event.session_id!r}, user {event.user_id!r})"
        )
    payload = data.get("payload")
    return event, None if payload is None else orjson.dumps(payload).decode()
