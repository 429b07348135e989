"""The hash of the transcript a model call was sent, carried from one run of a session to
the next so that a resume does not hash the whole transcript again."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loomflow.models.base import continues
from loomflow.schemas import Message

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ["TranscriptHash", "TranscriptHashes"]

_MAX_SESSIONS = 16


def _encoded(messages: Sequence[Message]) -> list[bytes]:
    return [message.model_dump_json().encode() for message in messages]


@dataclass(frozen=True)
class _Mark:
    """The hash of the first ``count`` messages of a transcript."""

    count: int
    state: _Hash


@dataclass(frozen=True)
class _Left:
    """Where a run left a session: its transcript and hashes of prefixes of it."""

    messages: list[Message]
    marks: tuple[_Mark, ...]


class TranscriptHash:
    """The sha256 of one run's transcript: each message's JSON, in order, as it grows.

    ``marks`` are hashes of prefixes of the transcript that a later run may start from:
    the one it was restored with and, once the run ends, the whole of it.
    """

    def __init__(self, state: _Hash, messages: list[Message]) -> None:
        self._state = state
        #: the transcript hashed: the run's own list, which ``extend`` grows
        self.messages = messages
        self._marks = [_Mark(len(messages), state.copy())]

    def extend(self, messages: Sequence[Message]) -> None:
        """Append ``messages`` to the transcript and to its hash."""
        encoded = _encoded(messages)  # first: a failure leaves both as they were
        self.messages.extend(messages)
        for data in encoded:
            self._state.update(data)

    def replace(self, messages: list[Message]) -> None:
        """Make ``messages`` (a compacted transcript) the transcript, hashed anew."""
        state = hashlib.sha256()
        for data in _encoded(messages):
            state.update(data)
        self._state, self.messages = state, messages
        self._marks = []  # none of them is a prefix of the new transcript

    def hexdigest(self, extra: bytes) -> str:
        """The hex digest of the transcript followed by ``extra``."""
        state = self._state.copy()
        state.update(extra)
        return state.hexdigest()

    def left(self) -> _Left:
        end = _Mark(len(self.messages), self._state.copy())
        return _Left(list(self.messages), (*self._marks, end))


class TranscriptHashes:
    """Where the runs of one Agent left their sessions' transcript hashes, by session.

    A run restores its session's transcript and hashes it for its model calls. Hashed
    from the start each time, that is a serialisation per message on every resume,
    growing with the session. Instead a run starts from the longest prefix that a run
    before it hashed and that is still the very same message objects (the runtimes hand
    back the objects they were given or last read; messages are frozen), and hashes only
    the messages after it. The digest is the same either way.
    """

    def __init__(self, max_sessions: int = _MAX_SESSIONS) -> None:
        self._max = max_sessions
        self._left: OrderedDict[tuple[str | None, str], _Left] = OrderedDict()

    def start(self, key: tuple[str | None, str], messages: list[Message]) -> TranscriptHash:
        """The hash of ``messages`` (the list the run goes on to grow) for session ``key``."""
        left = self._left.get(key)
        start, state = 0, hashlib.sha256()
        if left is not None:
            for mark in sorted(left.marks, key=lambda m: m.count, reverse=True):
                if continues(messages, left.messages[: mark.count]):
                    start, state = mark.count, mark.state.copy()
                    break
        for data in _encoded(messages[start:]):
            state.update(data)
        return TranscriptHash(state, messages)

    def keep(self, key: tuple[str | None, str], transcript: TranscriptHash) -> None:
        """Remember where a run of session ``key`` left its transcript."""
        self._left[key] = transcript.left()
        self._left.move_to_end(key)
        while len(self._left) > self._max:
            self._left.popitem(last=False)
