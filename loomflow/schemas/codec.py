"""JSON codec: events in and out, and tagged JSON for journal step values.

Tagged JSON keeps a few common Python types round-tripping through plain JSON:
``{"__lf__": "<tag>", "v": ...}``. Pickle is an opt-in of the journal only, and a
JSON store refuses to unpickle anything it finds.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import pickle
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from loomflow.errors import (
    CorruptRecordError,
    InvalidEventError,
    SerializationError,
    UnsafeDeserializationError,
)
from loomflow.schemas.events import MAX_EVENT_BYTES, Event, event_adapter
from loomflow.schemas.options import Serializer

__all__ = [
    "Serializer",
    "decode_event",
    "decode_value",
    "dumps",
    "dumps_plain",
    "encode_event",
    "encode_value",
    "input_hash",
    "loads",
]

_TAG = "__lf__"


def dumps(value: Any) -> bytes:
    """Encode plain JSON (str keys, no NaN or infinities); raise SerializationError
    otherwise."""
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:
        raise SerializationError(f"value is not JSON-serialisable: {exc}") from exc
    # orjson writes NaN and infinities as null: only a value whose JSON holds a null can
    # hold one, so the others skip the walk
    if b"null" in encoded and _non_finite(value):
        raise SerializationError("value holds NaN or an infinity, which JSON cannot hold")
    return encoded


def dumps_plain(value: Any) -> bytes:
    """Encode a value that is plain JSON already, as a signal payload or run metadata
    must be: what ``dumps`` takes, less what it converts by itself (dates, UUIDs,
    dataclasses), which a reader would get back as something else. Raise
    SerializationError otherwise."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"value is not JSON: {exc}") from exc
    return dumps(value)


def _non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def encode_event(event: BaseModel) -> bytes:
    return event.model_dump_json().encode()


def decode_event(data: bytes | str | dict[str, Any]) -> Event:
    """Validate one event strictly; raise InvalidEventError with the reason otherwise.

    JSON text is parsed by orjson, as the projector parses a record: every reader of the
    log takes and refuses the same events. (pydantic's own parser takes ints past 64
    bits, which orjson reads as floats and the int fields then refuse: an analytics
    consumer counted, and crashed on, an epoch the projector dead-lettered.)
    """
    if not isinstance(data, dict):
        if len(data) > MAX_EVENT_BYTES:
            raise InvalidEventError(f"event of {len(data)} bytes exceeds {MAX_EVENT_BYTES}")
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidEventError(f"invalid event: Invalid JSON: {exc}") from exc
    try:
        # the adapter's own validator: TypeAdapter.validate_python only passes its options on
        event: Event = event_adapter().validator.validate_python(data)
    except ValidationError as exc:
        raise InvalidEventError(f"invalid event: {_short(exc)}") from exc
    if max(event.seq, event.epoch) > _INT64_SIGNED:  # what SQLite and PostgreSQL store
        raise InvalidEventError(
            f"invalid event: seq {event.seq} or epoch {event.epoch} is past a 64-bit int"
        )
    _in_utc(event.at, "at")
    if event.type == "run.waiting":
        _in_utc(event.payload.until, "payload.until")
    return event


#: the largest integer of a SQLite or PostgreSQL column (the audit trail stores an
#: event's seq: a larger one raised OverflowError there)
_INT64_SIGNED = 2**63 - 1


#: the first and last times a store keeps as times: PostgreSQL (asyncpg) writes these
#: two as -infinity and infinity, and reads them back without a zone
_EARLIEST = dt.datetime.min.replace(tzinfo=dt.UTC)
_LATEST = dt.datetime.max.replace(tzinfo=dt.UTC)


def _in_utc(moment: dt.datetime | None, what: str) -> None:
    """Refuse a time without a zone, or one with no UTC time strictly inside the years
    1 to 9999 (year 1 at +01:00): the stores write times in UTC, and readers compare and
    convert them (a naive one made the analytics count raise TypeError, one out of range
    OverflowError)."""
    if moment is None:
        return
    offset = moment.utcoffset()
    if offset is None:
        raise InvalidEventError(f"invalid event: {what} {moment.isoformat()} has no time zone")
    if not offset:  # in UTC already, as writers date events: nothing to convert
        # the year alone settles it but at the two ends (cheaper than comparing times)
        inside = 1 < moment.year < 9999 or _EARLIEST < moment < _LATEST
    else:
        try:
            inside = _EARLIEST < moment.astimezone(dt.UTC) < _LATEST
        except OverflowError:
            inside = False
    if not inside:
        raise InvalidEventError(f"invalid event: {what} {moment.isoformat()} is out of range")


def _short(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{exc.error_count()} error(s), first at {where or '<root>'}: {first['msg']}"


# --- tagged JSON ----------------------------------------------------------------------


#: the ints orjson writes (and reads back as ints); wider ones are tagged, in hex (which
#: has no limit on digits, where decimal conversion stops at 4300)
_INT64 = (-(2**63), 2**64 - 1)


def _text(value: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(
                f"text {value[:40]!r} holds a lone surrogate, which JSON cannot hold"
            ) from exc
    return value


def _tag(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):  # JSON writers and readers keep 64 bits, not more
        return value if _INT64[0] <= value <= _INT64[1] else {_TAG: "int", "v": hex(value)}
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {_TAG: "float", "v": repr(value)}
        return value
    if isinstance(value, list):
        return [_tag(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SerializationError(
                    f"dict key {key!r} of type {type(key).__name__} is not a string"
                )
            out[_text(key)] = _tag(item)
        if _TAG in value:
            return {_TAG: "dict", "v": out}
        return out
    if isinstance(value, tuple):
        return {_TAG: "tuple", "v": [_tag(v) for v in value]}
    if isinstance(value, set | frozenset):
        return {_TAG: "set", "v": [_tag(v) for v in sorted(value, key=repr)]}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "v": base64.b64encode(value).decode()}
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, Decimal):
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, uuid.UUID):
        return {_TAG: "uuid", "v": str(value)}
    if isinstance(value, BaseModel):
        return _tag(value.model_dump(mode="json"))
    raise SerializationError(
        f"{type(value).__name__} is not JSON-serialisable; return JSON types "
        "(str, int, float, bool, None, list, dict) or opt into serializer='pickle'"
    )


_SCALARS: dict[str, Callable[[Any], Any]] = {
    "int": lambda text: int(text, 16),
    "float": float,
    "bytes": base64.b64decode,
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "decimal": Decimal,
    "uuid": uuid.UUID,
}


def _untag(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _untag(v) for k, v in value.items()}
    inner: Any = value.get("v")
    if tag == "pickle":
        raise UnsafeDeserializationError(
            "found a pickled journal value in a JSON store; refusing to unpickle it. "
            "Open the store with serializer='pickle' only if you trust who wrote it"
        )
    try:
        if tag == "dict":
            return {k: _untag(v) for k, v in inner.items()}
        if tag == "tuple":
            return tuple(_untag(v) for v in inner)
        if tag == "set":
            return {_frozen(_untag(v)) for v in inner}
        if tag in _SCALARS:
            return _SCALARS[tag](inner)
    except (TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        raise CorruptRecordError(f"tagged JSON value {tag!r} does not decode: {exc}") from exc
    raise CorruptRecordError(f"unknown tagged JSON type {tag!r}")


def _frozen(member: Any) -> Any:
    """A member of a set as the hashable value it was: a set in a set was a frozenset
    (and so was one in a tuple in a set), which decodes as a set."""
    if isinstance(member, set):
        return frozenset(member)
    if isinstance(member, tuple):
        return tuple(_frozen(item) for item in member)
    return member


def encode_value(value: Any, serializer: Serializer = "json") -> Any:
    """Turn a step's value into something JSON can hold."""
    if serializer == "pickle":
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return {_TAG: "pickle", "v": base64.b64encode(blob).decode()}
    return _tag(value)


def decode_value(stored: Any, serializer: Serializer = "json") -> Any:
    """Inverse of encode_value; a JSON store never unpickles."""
    if serializer == "pickle" and isinstance(stored, dict) and stored.get(_TAG) == "pickle":
        return pickle.loads(base64.b64decode(stored["v"]))
    return _untag(stored)


def input_hash(inputs: Any) -> str:
    """A stable digest of a step's inputs (tagged JSON with sorted keys)."""
    canonical = orjson.dumps(_tag(inputs), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:32]
