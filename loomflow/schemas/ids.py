"""Time-sortable identifiers and validation of user-supplied ids."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Annotated

from pydantic import Field

from loomflow.errors import InvalidIdError

__all__ = ["MAX_ID_LENGTH", "Id", "new_id", "validate_id"]

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=\-]*$"
_ID_RE = re.compile(_ID_PATTERN)
MAX_ID_LENGTH = 200

#: An id as events carry it: what ``validate_id`` accepts, checked whenever an event is read.
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=_ID_PATTERN)]

_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


#: every pair of base32 digits, so that an id takes 13 lookups instead of 26 (ids are
#: made for every event a run writes)
_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)


_SHIFTS = tuple(range(120, -1, -10))


def _b32(value: int) -> str:
    """``value`` (130 bits) as 26 base32 digits, most significant first."""
    return "".join([_PAIRS[value >> shift & 1023] for shift in _SHIFTS])


def new_id(prefix: str) -> str:
    """Return ``prefix`` + a 26-char id that sorts by creation time.

    48 bits of milliseconds then 80 random bits; ids made in the same millisecond
    by this process increase monotonically, so lexical order is creation order.
    """
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            rand = _last_rand + 1
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 1  # leave room to increment
        _last_ms, _last_rand = ms, rand
    return prefix + _b32(ms << 80 | rand)


def validate_id(value: object, what: str) -> str:
    """Return ``value`` if it is usable as a session, user or checkpoint id, else raise."""
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a string, got {type(value).__name__}")
    # fullmatch, not match: ``$`` also matches before a trailing newline ("s1\n")
    if not value or len(value) > MAX_ID_LENGTH or not _ID_RE.fullmatch(value):
        raise InvalidIdError(
            f"invalid {what} {value[:60]!r}: use 1-{MAX_ID_LENGTH} characters from "
            "letters, digits and . _ : @ + = - (starting with a letter or digit)"
        )
    return value
