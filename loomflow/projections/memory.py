"""The in-memory dialect of the log and read model: a dict of sessions, each holding its
row, its events and its read-model rows; what the in-process store keeps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from loomflow.projections.apply import NewRows, Seq, StoredRows
from loomflow.projections.fold import (
    AddTranscript,
    Change,
    CheckpointRow,
    DeleteCheckpoints,
    EraseSession,
    Mutation,
    PruneFilter,
    PutCheckpoint,
    PutStep,
    RetainCheckpoints,
    StepRow,
    materialise,
)
from loomflow.schemas import Event, Message, StepRecorded
from loomflow.schemas.scope import Scope, scope_of
from loomflow.schemas.sessions import SessionRecord

__all__ = ["MemoryLog", "MemorySession", "apply"]


@dataclass
class MemorySession:
    """One session: its row, its log, its read-model rows; the transcript stays in the log.

    ``messages`` is the transcript from its latest base (``base_seq``) through the last
    event, kept as events are appended: a resume reads a prefix of it instead of folding
    the log.
    """

    row: SessionRecord
    log: list[Event] = field(default_factory=list)
    checkpoints: list[CheckpointRow] = field(default_factory=list)  # ascending seq
    steps: dict[str, StepRow] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    base_seq: int = 0


def apply(target: MemorySession, mutation: Mutation) -> None:
    """Apply one mutation to the session's read-model rows."""
    match mutation:
        case AddTranscript(seq=seq, base=base, messages=messages):
            if base:
                target.messages, target.base_seq = list(messages), seq
            else:
                target.messages.extend(messages)
        case PutCheckpoint(row=row):
            target.checkpoints.append(row)
        case RetainCheckpoints(keep=keep):
            if len(target.checkpoints) > keep:
                del target.checkpoints[:-keep]
        case DeleteCheckpoints(checkpoint_ids=ids):
            drop = set(ids)
            target.checkpoints = [c for c in target.checkpoints if c.checkpoint_id not in drop]
        case PutStep(row=row):
            target.steps[row.step_key] = row
        case EraseSession():
            target.log.clear()
            target.checkpoints.clear()
            target.steps.clear()
            target.messages, target.base_seq = [], 0


class MemoryLog:
    """Sessions by scope, gone when the process ends; the apply step's dialect for them
    (see projections/apply.py), their reads and prune. Callers serialise its writes."""

    def __init__(self) -> None:
        self.sessions: dict[Scope, MemorySession] = {}

    # -- the apply step ----------------------------------------------------------------

    def rows(self, scopes: Sequence[Scope]) -> dict[Scope, SessionRecord | None]:
        """The rows of these sessions; a session with none is missing."""
        return {scope: held.row for scope in scopes if (held := self.sessions.get(scope))}

    def event_ids(self, wanted: Sequence[Seq]) -> dict[Seq, str]:
        """The id of the event at each of these seqs; missing where none is."""
        return {
            (scope, seq): found.event_id
            for scope, seq in wanted
            if (held := self.sessions.get(scope)) and (found := _at_seq(held.log, seq)) is not None
        }

    def write(self, changes: Sequence[Change], rows: NewRows, before: StoredRows) -> None:
        """Append each change's event and apply its mutations, then keep the new rows."""
        for scope, row in rows.items():
            session = self.sessions.get(scope)
            if session is None:
                self.sessions[scope] = MemorySession(row)
            else:
                session.row = row
        for change in changes:
            event = change.event
            session = self.sessions[scope_of(event)]
            for mutation in change.mutations:
                apply(session, mutation)  # an erasure empties the log before its own event
            session.log.append(event)

    # -- reads -------------------------------------------------------------------------

    def in_flight(self, now: datetime, limit: int) -> list[SessionRecord]:
        """The running and signalled sessions, the longest silent first, then the waiting
        ones whose wait timed out by ``now``: up to ``limit`` of each. Forks no run has
        continued are left out (no run to take over)."""
        rows = sorted((s.row for s in self.sessions.values()), key=lambda r: r.updated_at)
        live = [
            r for r in rows if r.status in ("running", "signalled") and r.last_run_id is not None
        ][:limit]
        timed_out = [
            r
            for r in rows
            if r.status == "waiting" and r.waiting and r.waiting.until and r.waiting.until <= now
        ]
        return live + timed_out[:limit]

    def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        """The named checkpoint, the newest when ``checkpoint_id`` is None; None if absent."""
        held = self.sessions.get(scope)
        if held is None or not held.checkpoints:
            return None
        if checkpoint_id is None:
            return held.checkpoints[-1]
        return next((c for c in held.checkpoints if c.checkpoint_id == checkpoint_id), None)

    def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        """Up to ``limit`` checkpoints, newest first."""
        held = self.sessions.get(scope)
        return list(reversed(held.checkpoints))[:limit] if held else []

    def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        """The transcript as of ``upto_seq`` (``message_count`` messages), folded from
        its base at ``base_seq``: a prefix of the kept one when it has the same base."""
        held = self.sessions.get(scope)
        if held is None:
            return []
        if base_seq == held.base_seq and message_count <= len(held.messages):
            return held.messages[:message_count]  # a checkpoint since the latest base
        return materialise(e for e in held.log if base_seq <= e.seq <= upto_seq)

    def step(self, scope: Scope, step_key: str) -> StepRow | None:
        """The journal entry recorded under ``step_key``, or None."""
        held = self.sessions.get(scope)
        return held.steps.get(step_key) if held else None

    def read_events(self, scope: Scope, after_seq: int) -> list[Event]:
        """The session's events after ``after_seq``, in order."""
        held = self.sessions.get(scope)
        return [e for e in held.log if e.seq > after_seq] if held else []

    # -- prune -------------------------------------------------------------------------

    def prune(self, match: PruneFilter) -> tuple[int, int, int, int]:
        """Delete what ``match`` selects; return the counts of (sessions, checkpoints,
        steps, events) deleted."""
        before = match.before
        sessions = checkpoints = steps = events = 0
        for scope, held in list(self.sessions.items()):
            if match.session_id is not None and scope.session_id != match.session_id:
                continue
            if not match.any_user and scope.user_id != match.user_id:
                continue
            if held.row.status == "erased":
                continue  # the tombstone is what refuses the erased session's late events
            if before is None or held.row.updated_at < before:
                sessions += 1
                checkpoints += len(held.checkpoints)
                steps += len(held.steps)
                events += len(held.log)
                del self.sessions[scope]
                continue
            kept = [c for c in held.checkpoints if c.created_at >= before]
            checkpoints += len(held.checkpoints) - len(kept)
            held.checkpoints = kept
            old_steps = [k for k, s in held.steps.items() if s.at < before]
            steps += len(old_steps)
            for key in old_steps:
                del held.steps[key]
            log = [e for e in held.log if not (isinstance(e, StepRecorded) and e.at < before)]
            events += len(held.log) - len(log)
            held.log = log
        return sessions, checkpoints, steps, events


def _at_seq(log: list[Event], seq: int) -> Event | None:
    for event in reversed(log):
        if event.seq == seq:
            return event
        if event.seq < seq:
            break
    return None
