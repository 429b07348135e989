"""Decoding a transcript from the payloads of its events, for every dialect."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from loomflow.errors import CorruptRecordError
from loomflow.schemas import Message

__all__ = ["decode_transcript"]


class _TranscriptPart(BaseModel):
    """The part of a transcript event that a transcript read needs: its messages."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)
    messages: list[Message]


@functools.cache
def _parts() -> TypeAdapter[list[_TranscriptPart]]:
    return TypeAdapter(list[_TranscriptPart])  # built on first use, not at import


@functools.cache
def _messages() -> TypeAdapter[list[Message]]:
    return TypeAdapter(list[Message])


def decode_transcript(session_id: str, rows: Sequence[tuple[int, str]]) -> list[Message]:
    """Messages of (seq, payload JSON) rows in seq order, validated in one pass.

    The first row must be the transcript's base (or the session's first event), so
    concatenation is the whole fold. A row that does not decode is named by its seq.

    orjson parses the rows as one array and pydantic validates the messages from the
    objects: a quarter faster than pydantic parsing and validating the rows' JSON itself,
    whose other fields it parses only to drop (``python -m bench.decode``). What orjson
    does not take (an int past 64 bits, a damaged row) goes the whole way through
    pydantic, which decodes it or names the row.
    """
    for seq, payload in rows:
        if not isinstance(payload, str):  # a BLOB another program wrote, say
            raise CorruptRecordError(
                f"log row of session {session_id!r}, seq {seq} does not decode: its payload "
                f"is {type(payload).__name__}, not JSON text"
            )
    array = "[" + ",".join(row[1] for row in rows) + "]"
    try:
        found = [message for part in orjson.loads(array) for message in part["messages"]]
        return _messages().validate_python(found)
    except (orjson.JSONDecodeError, TypeError, KeyError, ValidationError):
        return _decode_json(session_id, rows, array)


def _decode_json(session_id: str, rows: Sequence[tuple[int, str]], array: str) -> list[Message]:
    try:
        parts = _parts().validate_json(array)
    except ValidationError as failed:
        for seq, payload in rows:  # find the row to blame
            try:
                _TranscriptPart.model_validate_json(payload)
            except ValidationError as exc:
                raise CorruptRecordError(
                    f"log row of session {session_id!r}, seq {seq} does not decode: "
                    f"{exc.errors()[0]['msg']}"
                ) from exc
        # each row alone decodes, their concatenation not: a row's text ends early
        raise CorruptRecordError(
            f"the transcript rows of session {session_id!r} do not decode together: "
            f"{failed.errors()[0]['msg']}"
        ) from failed
    return [message for part in parts for message in part.messages]
