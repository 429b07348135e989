"""Transcripts kept in memory so that a read need not parse the log again."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loomflow.schemas.scope import Scope, scope_of

if TYPE_CHECKING:
    from loomflow.schemas import Event, Message

__all__ = ["TranscriptCache"]


@dataclass
class _CachedTranscript:
    base_seq: int
    seq: int
    messages: list[Message]


class TranscriptCache:
    """Transcripts this process read or wrote lately, so a read need not re-parse the log.

    An entry holds a session's transcript from its base up to ``seq``. Between two bases a
    transcript only grows, so any checkpoint with the same base is a prefix of it. Entries
    follow the appends of their own store and are dropped at any gap (another writer).
    """

    def __init__(self, max_sessions: int = 64) -> None:
        self._max = max_sessions
        self._entries: OrderedDict[Scope, _CachedTranscript] = OrderedDict()

    def lookup(self, key: Scope, base_seq: int) -> _CachedTranscript | None:
        entry = self._entries.get(key)
        if entry is None or entry.base_seq != base_seq:
            return None
        self._entries.move_to_end(key)
        return entry

    def store(self, key: Scope, base_seq: int, seq: int, messages: list[Message]) -> None:
        self._entries[key] = _CachedTranscript(base_seq, seq, messages)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def follow(self, events: Sequence[Event]) -> None:
        """Keep entries in step with events this store just appended."""
        from loomflow.schemas.events import (
            SessionErased,
            SessionForked,
            TranscriptCompacted,
            TurnAppended,
        )

        for event in events:
            key = scope_of(event)
            if isinstance(event, SessionForked | TranscriptCompacted):
                self.store(key, event.seq, event.seq, list(event.payload.messages))
                continue
            entry = self._entries.get(key)
            if entry is None:
                if event.seq == 1:  # a session this store starts: its writer will read it
                    first = list(event.payload.messages) if isinstance(event, TurnAppended) else []
                    self.store(key, 0, 1, first)
                continue
            if entry.seq != event.seq - 1 or isinstance(event, SessionErased):
                del self._entries[key]
                continue
            if isinstance(event, TurnAppended):
                entry.messages.extend(event.payload.messages)
            entry.seq = event.seq

    async def read(
        self,
        key: Scope,
        base_seq: int,
        upto_seq: int,
        message_count: int,
        fetch: Callable[[int, int], Awaitable[list[Message]]],
    ) -> list[Message]:
        """The transcript at ``upto_seq``: from memory, extended by what another writer
        added since (``fetch(lo, hi)`` reads the log's transcript rows lo..hi), or read
        whole from ``base_seq``."""
        cached = self.lookup(key, base_seq)
        if cached is None:
            messages = await fetch(base_seq, upto_seq)
            self.store(key, base_seq, upto_seq, list(messages))
            return messages
        if cached.seq < upto_seq:
            seq = cached.seq
            added = await fetch(seq + 1, upto_seq)
            if self.lookup(key, base_seq) is not cached or cached.seq != seq:
                return await fetch(base_seq, upto_seq)  # it changed while we read
            cached.messages.extend(added)
            cached.seq = upto_seq
        return cached.messages[:message_count]

    def forget(self, key: Scope | None = None) -> None:
        if key is None:
            self._entries.clear()
        else:
            self._entries.pop(key, None)
