"""InProcRuntime: the event log and read model in this process's memory."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loomflow.projections.fold import (
    AddTranscript,
    CheckpointRow,
    EraseSession,
    PruneFilter,
    StepRow,
    materialise,
    maybe_redelivered,
    project,
)
from loomflow.projections.memory import MemorySession, apply
from loomflow.runtime.base import Runtime
from loomflow.runtime.store import EventStore, PruneResult
from loomflow.schemas import Event, Message, StepRecorded, utcnow
from loomflow.schemas.codec import Serializer
from loomflow.schemas.scope import Scope
from loomflow.schemas.sessions import SessionRecord

if TYPE_CHECKING:
    from loomflow.settings import Settings

__all__ = ["InProcRuntime", "InProcStore"]


@dataclass
class _Entry:
    row: SessionRecord
    log: list[Event] = field(default_factory=list)
    model: MemorySession = field(default_factory=MemorySession)
    #: the transcript from its latest base (``base_seq``) through the last event, kept as
    #: events are appended: a resume reads a prefix of it instead of the whole log
    messages: list[Message] = field(default_factory=list)
    base_seq: int = 0

    def follow(self, mutation: AddTranscript) -> None:
        if mutation.base:
            self.messages, self.base_seq = list(mutation.messages), mutation.seq
        else:
            self.messages.extend(mutation.messages)


class InProcStore(EventStore):
    """Events and read model in dicts; gone when the process ends."""

    appends_bounded = True

    def __init__(self) -> None:
        self._sessions: dict[tuple[str | None, str], _Entry] = {}
        self._lock = asyncio.Lock()

    async def append(self, events: Sequence[Event]) -> None:
        async with self._lock:
            keys = {(e.user_id, e.session_id) for e in events}
            rows = {key: entry.row for key in keys if (entry := self._sessions.get(key))}
            wanted = maybe_redelivered(rows, events)
            stored = {
                (user, session, seq): found.event_id
                for user, session, seq in wanted
                if (found := _at_seq(self._sessions[(user, session)].log, seq)) is not None
            }
            changed, changes = project(rows, events, stored)  # raises before any change
            for change in changes:
                event = change.event
                key = (event.user_id, event.session_id)
                entry = self._sessions.setdefault(key, _Entry(changed[key]))
                if any(isinstance(m, EraseSession) for m in change.mutations):
                    entry.log.clear()
                    entry.messages, entry.base_seq = [], 0
                entry.log.append(event)
                for mutation in change.mutations:
                    apply(entry.model, mutation)
                    if isinstance(mutation, AddTranscript):
                        entry.follow(mutation)
            for key, row in changed.items():
                self._sessions[key].row = row

    def _entry(self, scope: Scope) -> _Entry | None:
        return self._sessions.get((scope.user_id, scope.session_id))

    async def session(self, scope: Scope) -> SessionRecord | None:
        entry = self._entry(scope)
        return entry.row if entry else None

    async def sessions_in_flight(self, limit: int = 500) -> list[SessionRecord]:
        now = utcnow()
        rows = sorted((e.row for e in self._sessions.values()), key=lambda r: r.updated_at)
        live = [r for r in rows if r.status in ("running", "signalled")][:limit]
        timed_out = [
            r
            for r in rows
            if r.status == "waiting" and r.waiting and r.waiting.until and r.waiting.until <= now
        ]
        return live + timed_out[:limit]

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        entry = self._entry(scope)
        if entry is None or not entry.model.checkpoints:
            return None
        if checkpoint_id is None:
            return entry.model.checkpoints[-1]
        for row in entry.model.checkpoints:
            if row.checkpoint_id == checkpoint_id:
                return row
        return None

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        entry = self._entry(scope)
        return list(reversed(entry.model.checkpoints))[:limit] if entry else []

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        entry = self._entry(scope)
        if entry is None:
            return []
        if base_seq == entry.base_seq and message_count <= len(entry.messages):
            return entry.messages[:message_count]  # a checkpoint since the latest base
        return materialise(e for e in entry.log if base_seq <= e.seq <= upto_seq)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        entry = self._entry(scope)
        return entry.model.steps.get(step_key) if entry else None

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        entry = self._entry(scope)
        return [e for e in entry.log if e.seq > after_seq] if entry else []

    async def _prune(self, match: PruneFilter) -> PruneResult:
        before = match.before
        sessions = checkpoints = steps = events = 0
        async with self._lock:
            for key, entry in list(self._sessions.items()):
                if match.session_id is not None and key[1] != match.session_id:
                    continue
                if not match.any_user and key[0] != match.user_id:
                    continue
                if entry.row.status == "erased":
                    continue  # the tombstone is what refuses the erased session's late events
                if before is None or entry.row.updated_at < before:
                    sessions += 1
                    checkpoints += len(entry.model.checkpoints)
                    steps += len(entry.model.steps)
                    events += len(entry.log)
                    del self._sessions[key]
                    continue
                old_ckpts = [c for c in entry.model.checkpoints if c.created_at < before]
                old_steps = {k for k, s in entry.model.steps.items() if s.at < before}
                checkpoints += len(old_ckpts)
                steps += len(old_steps)
                entry.model.checkpoints = [
                    c for c in entry.model.checkpoints if c.created_at >= before
                ]
                for k in old_steps:
                    del entry.model.steps[k]
                kept = [e for e in entry.log if not (isinstance(e, StepRecorded) and e.at < before)]
                events += len(entry.log) - len(kept)
                entry.log = kept
        return PruneResult(sessions, checkpoints, steps, events)


def _at_seq(log: list[Event], seq: int) -> Event | None:
    for event in reversed(log):
        if event.seq == seq:
            return event
        if event.seq < seq:
            break
    return None


class InProcRuntime(Runtime):
    """The same events and projection as the durable runtimes, kept in memory."""

    def __init__(
        self,
        *,
        max_checkpoints_per_session: int | None = None,
        serializer: Serializer | None = None,
        lease_seconds: float | None = None,
        retry_seconds: float | None = None,
        settings: Settings | None = None,
    ) -> None:
        super().__init__(
            InProcStore(),
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
            settings=settings,
        )
