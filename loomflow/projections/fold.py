"""The fold: how each event changes the read model. Plain Python, no I/O.

Every store (in-process, SQLite, PostgreSQL) folds each event it appends or consumes,
through :func:`project` in the apply step (projections/apply.py), and applies the
returned mutations in the same transaction, so all of them hold the same read model for
the same log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from loomflow.errors import InvalidEventError
from loomflow.projections.admission import refuse
from loomflow.schemas import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    Message,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunStarted,
    RunWaiting,
    SessionErased,
    SessionForked,
    SignalSent,
    StepRecorded,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)
from loomflow.schemas.scope import Scope, scope_of
from loomflow.schemas.sessions import PendingSignal, SessionRecord, Waiting

__all__ = [
    "BASE_TYPES",
    "TRANSCRIPT_TYPES",
    "AddTranscript",
    "Change",
    "CheckpointRow",
    "DeleteCheckpoints",
    "EraseSession",
    "Mutation",
    "PruneFilter",
    "PutCheckpoint",
    "PutStep",
    "RetainCheckpoints",
    "StepRow",
    "fold",
    "materialise",
    "maybe_redelivered",
    "project",
]

#: Events whose messages replace the transcript (a fork's origin, a compaction).
BASE_TYPES = ("session.forked", "transcript.compacted")
#: Events that carry transcript messages.
TRANSCRIPT_TYPES = ("turn.appended", *BASE_TYPES)


@dataclass(frozen=True)
class CheckpointRow:
    """Checkpoint metadata plus what is needed to materialise its transcript."""

    checkpoint_id: str
    seq: int
    base_seq: int
    turn: int
    message_count: int
    cumulative_usage: Usage
    cursor: str | None
    created_at: datetime


@dataclass(frozen=True)
class StepRow:
    """A journal entry: the recorded value of a step for its key and inputs."""

    step_key: str
    input_hash: str
    seq: int
    value: Any
    serializer: Literal["json", "pickle"]
    at: datetime


@dataclass(frozen=True)
class AddTranscript:
    """Messages at ``seq``; ``base`` means they replace everything before them."""

    seq: int
    base: bool
    messages: Sequence[Message]


@dataclass(frozen=True)
class PutCheckpoint:
    row: CheckpointRow


@dataclass(frozen=True)
class RetainCheckpoints:
    """Keep only the ``keep`` newest checkpoints of the session."""

    keep: int


@dataclass(frozen=True)
class DeleteCheckpoints:
    checkpoint_ids: Sequence[str]


@dataclass(frozen=True)
class PutStep:
    row: StepRow


@dataclass(frozen=True)
class EraseSession:
    """Remove everything of the session; its row stays as a tombstone."""


Mutation = (
    AddTranscript | PutCheckpoint | RetainCheckpoints | DeleteCheckpoints | PutStep | EraseSession
)


def fold(session: SessionRecord | None, event: Event) -> tuple[SessionRecord, list[Mutation]]:
    """Apply one event to a session; return its new row and the read-model mutations.

    Raises InvalidEventError (or a subclass) when the event cannot be applied: the rule
    of validity (:func:`loomflow.projections.admission.refuse`) refuses it.
    """
    if session is None:
        session = SessionRecord(
            user_id=event.user_id,
            session_id=event.session_id,
            created_at=event.at,
            updated_at=event.at,
        )
    elif session.session_id != event.session_id or session.user_id != event.user_id:
        raise InvalidEventError(
            f"event for session {event.session_id!r} (user {event.user_id!r}) folded into "
            f"session {session.session_id!r} (user {session.user_id!r})"
        )
    refuse(
        event,
        epoch=session.epoch,
        last_seq=session.last_seq,
        message_count=session.message_count,
        cancelled=session.status == "cancelled",
        erased=session.status == "erased",
    )

    # one replace per event: the fold runs for every event a projector consumes
    changes: dict[str, Any] = {"last_seq": event.seq, "epoch": event.epoch, "updated_at": event.at}
    mutations: list[Mutation] = []
    match event:
        # most of a log is turns and checkpoints: their cases first, each case tried
        # costs an isinstance
        case TurnAppended(payload=p):
            changes.update(
                turns=session.turns + int(p.model_call),
                usage=session.usage + p.usage,
                message_count=session.message_count + len(p.messages),
            )
            if p.model_call:
                changes.update(spent_calls=session.spent_calls + 1, spent=session.spent + p.usage)
                if session.waiting is not None:
                    changes["waiting"] = None  # the resumed run went on past where it waited
                if session.attempts:
                    changes["attempts"] = 0  # a take-over that makes progress is no failure
            mutations.append(AddTranscript(event.seq, False, p.messages))
        case CheckpointWritten(payload=p):
            mutations.append(
                PutCheckpoint(
                    CheckpointRow(
                        checkpoint_id=p.checkpoint_id,
                        seq=event.seq,
                        base_seq=session.base_seq,
                        turn=p.turn,
                        message_count=p.message_count,
                        cumulative_usage=p.cumulative_usage,
                        cursor=p.cursor,
                        created_at=event.at,
                    )
                )
            )
            if p.retain >= 1:
                mutations.append(RetainCheckpoints(p.retain))
        case RunStarted(payload=p):
            # ``waiting`` stays: the resumed run reads where its predecessor waited
            taken = p.worker is not None
            changes.update(
                status="running",
                last_run_id=event.run_id,
                agent=p.agent,
                lease_seconds=p.lease_seconds,
                attempts=session.attempts + 1 if taken else session.attempts,
                run_metadata=p.metadata,
                run_options=p.options,
                takes=session.takes + 1 if taken else 0,
            )
            if not taken:  # a caller's run starts a budget of its own
                changes.update(spent_calls=0, spent=Usage())
        case RunFinished():
            # signals not received by the run are dropped with it: a stale "approve"
            # must never approve the next run's wait
            changes.update(status="finished", waiting=None, inbox=(), attempts=0, last_error=None)
        case RunFailed(payload=p):
            changes.update(
                status="stuck" if p.parked else "failed",
                last_error=f"{p.error_type}: {p.error}"[:500],
            )
            if not p.parked:
                # a parked run is not over: the person who resumes it goes on where it
                # waited, with the signals it was sent
                changes.update(waiting=None, inbox=())
        case RunCancelled(payload=p):
            # as when a worker parks a run, its wait and inbox stay: the person who
            # resumes it goes on where it stopped
            changes.update(
                status="cancelled",
                last_error=("cancelled: " + (p.reason or "no reason given"))[:500],
            )
        case RunWaiting(payload=p):
            here = any(s.name == p.signal for s in session.inbox)
            changes.update(
                status="signalled" if here else "waiting",
                waiting=Waiting(p.signal, p.step_key, p.until, p.where),
                attempts=0,
                takes=0,
            )
        case SignalSent(payload=p):
            changes["inbox"] = (*session.inbox, PendingSignal(event.seq, p.name, p.data, event.at))
            waiting = session.waiting
            if (
                session.status == "waiting"
                and waiting is not None
                and waiting.signal == p.name
                # one recorded past the deadline does not answer the wait, which times out
                and (waiting.until is None or event.at < waiting.until)
            ):
                changes["status"] = "signalled"
        case TranscriptCompacted(payload=p):
            changes.update(
                usage=session.usage + p.usage,
                message_count=len(p.messages),
                base_seq=event.seq,
                spent_calls=session.spent_calls + 1,  # the summary is a model call too
                spent=session.spent + p.usage,
            )
            mutations.append(AddTranscript(event.seq, True, p.messages))
        case SessionForked(payload=p):
            changes.update(
                turns=p.turn,
                usage=p.cumulative_usage,
                message_count=len(p.messages),
                base_seq=event.seq,
                parent_session_id=p.parent_session_id,
                parent_checkpoint_id=p.parent_checkpoint_id,
                run_metadata=p.metadata,
                run_options=p.options,
            )
            mutations.append(AddTranscript(event.seq, True, p.messages))
        case StepRecorded(payload=p):
            if p.signal_seq is not None:
                changes["inbox"] = tuple(s for s in session.inbox if s.seq != p.signal_seq)
            mutations.append(
                PutStep(
                    StepRow(p.step_key, p.input_hash, event.seq, p.value, p.serializer, event.at)
                )
            )
        case CheckpointsPruned(payload=p):
            mutations.append(DeleteCheckpoints(p.checkpoint_ids))
        case SessionErased():
            changes.update(
                status="erased",
                turns=0,
                usage=Usage(),
                message_count=0,
                base_seq=0,
                waiting=None,
                inbox=(),
            )
            mutations.append(EraseSession())
        case _:
            pass  # heartbeats and future informational events change no projection
    return _evolve(session, changes), mutations


@dataclass(frozen=True)
class PruneFilter:
    """What ``store.prune`` deletes, checked: sessions matching ``session_id`` (any when
    None) of ``user_id`` (any user when ``any_user``); of those, the ones last changed
    before ``before`` (all when None) go whole, the others lose their checkpoints and
    journal steps recorded before it."""

    before: datetime | None
    session_id: str | None
    user_id: str | None
    any_user: bool


@dataclass(frozen=True)
class Change:
    """An event of a batch that the fold accepted, with the read-model changes it makes."""

    event: Event
    mutations: list[Mutation]


def maybe_redelivered(
    rows: Mapping[Scope, SessionRecord | None], events: Iterable[Event]
) -> list[tuple[Scope, int]]:
    """(scope, seq) of the events at or below their session's last seq.

    Only these can be a redelivery of an event already stored: a store looks up which
    event ids it holds at these seqs and hands them to :func:`project`.
    """
    return [
        (scope, e.seq)
        for e in events
        if (row := rows.get(scope := scope_of(e))) is not None and e.seq <= row.last_seq
    ]


def project(
    rows: Mapping[Scope, SessionRecord | None],
    events: Iterable[Event],
    stored: Mapping[tuple[Scope, int], str],
) -> tuple[dict[Scope, SessionRecord], list[Change]]:
    """The step every store applies to a batch of events: skip what it already holds,
    fold the rest.

    ``rows`` are the stored rows of the batch's sessions (None or missing: no row yet);
    ``stored`` maps (scope, seq) to the event id the log holds there, for the
    seqs :func:`maybe_redelivered` named. An event whose id is already stored at its seq
    is a retried or redelivered write and is skipped, so appends and consumers are
    idempotent; any other event is folded, and refused with an InvalidEventError when the
    fold refuses it. Returns the changed rows and the accepted events with their
    mutations, in order. Nothing is changed in place: a store applies the result (in one
    transaction) only when the whole batch was accepted.
    """
    current = dict(rows)
    held = dict(stored)
    changed: dict[Scope, SessionRecord] = {}
    changes: list[Change] = []
    for event in events:
        key = scope_of(event)
        row = current.get(key)
        if (
            row is not None
            and event.seq <= row.last_seq
            and held.get((key, event.seq)) == event.event_id
        ):
            continue
        folded, mutations = fold(row, event)
        if EraseSession in map(type, mutations):
            held = {k: v for k, v in held.items() if k[0] != key}
        held[(key, event.seq)] = event.event_id
        current[key] = changed[key] = folded
        changes.append(Change(event, mutations))
    return changed, changes


def _evolve(row: SessionRecord, changes: dict[str, Any]) -> SessionRecord:
    """``dataclasses.replace`` for the fold's hot path: a projector folds every event it
    consumes, and ``replace`` re-runs ``__init__`` field by field (~5 µs a call here).
    The row is frozen; its copy is filled in before anyone can see it."""
    new = object.__new__(SessionRecord)
    state = new.__dict__
    state.update(row.__dict__)
    state.update(changes)
    return new


def materialise(parts: Iterable[Event], start: Sequence[Message] = ()) -> list[Message]:
    """Rebuild a transcript from a session's events in seq order (others are skipped),
    continuing ``start`` when given."""
    messages: list[Message] = list(start)
    for event in parts:
        if isinstance(event, TurnAppended):
            messages.extend(event.payload.messages)
        elif isinstance(event, SessionForked | TranscriptCompacted):
            messages = list(event.payload.messages)
    return messages
