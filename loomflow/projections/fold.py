"""The fold: how each event changes the read model. Plain Python, no I/O.

Every store (in-process, SQLite, PostgreSQL) calls :func:`fold` for each event it
appends or consumes and applies the returned mutations in the same transaction, so
all of them hold the same read model for the same log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from loomflow.errors import (
    InvalidEventError,
    SequenceConflictError,
    SessionErasedError,
    StaleWriterError,
)
from loomflow.schemas import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    Message,
    RunFailed,
    RunFinished,
    RunStarted,
    SessionErased,
    SessionForked,
    StepRecorded,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)

__all__ = [
    "BASE_TYPES",
    "TRANSCRIPT_TYPES",
    "AddTranscript",
    "CheckpointRow",
    "DeleteCheckpoints",
    "EraseSession",
    "Mutation",
    "PutCheckpoint",
    "PutStep",
    "RetainCheckpoints",
    "SessionRow",
    "SessionStatus",
    "StepRow",
    "fold",
    "materialise",
]

SessionStatus = Literal["running", "finished", "failed", "erased"]

#: Events whose messages replace the transcript (a fork's origin, a compaction).
BASE_TYPES = ("session.forked", "transcript.compacted")
#: Events that carry transcript messages.
TRANSCRIPT_TYPES = ("turn.appended", *BASE_TYPES)


@dataclass(frozen=True)
class SessionRow:
    """A session's state after the events folded so far."""

    user_id: str | None
    session_id: str
    created_at: datetime
    updated_at: datetime
    last_seq: int = 0
    epoch: int = 0
    status: SessionStatus = "running"
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    message_count: int = 0
    base_seq: int = 0
    parent_session_id: str | None = None
    parent_checkpoint_id: str | None = None
    last_run_id: str | None = None


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


def fold(session: SessionRow | None, event: Event) -> tuple[SessionRow, list[Mutation]]:
    """Apply one event to a session; return its new row and the read-model mutations.

    Raises InvalidEventError (or a subclass) when the event cannot be applied: the
    session was erased, the writer's epoch is stale, or its seq is not the next one.
    """
    if session is None:
        session = SessionRow(
            user_id=event.user_id,
            session_id=event.session_id,
            created_at=event.at,
            updated_at=event.at,
        )
    elif (session.user_id, session.session_id) != (event.user_id, event.session_id):
        raise InvalidEventError(
            f"event for session {event.session_id!r} (user {event.user_id!r}) folded into "
            f"session {session.session_id!r} (user {session.user_id!r})"
        )
    if session.status == "erased":
        raise SessionErasedError(
            f"session {session.session_id!r} (user {session.user_id!r}) was erased; "
            "start a new session id"
        )
    if event.epoch < session.epoch:
        raise StaleWriterError(
            f"writer epoch {event.epoch} is older than epoch {session.epoch} of session "
            f"{session.session_id!r}: another run took the session over"
        )
    claims = isinstance(event, RunStarted | SessionForked | SessionErased)
    if event.epoch > session.epoch and not claims:
        raise InvalidEventError(
            f"{event.type} at epoch {event.epoch} but session {session.session_id!r} is at "
            f"epoch {session.epoch}; only run.started or session.forked claims a new epoch"
        )
    if event.seq != session.last_seq + 1:
        raise SequenceConflictError(
            f"session {session.session_id!r} expects seq {session.last_seq + 1}, "
            f"got {event.seq}: another writer appended first"
        )
    if isinstance(event, SessionForked) and event.seq != 1:
        raise InvalidEventError("session.forked must be the first event of its session")

    # one replace per event: the fold runs for every event a projector consumes
    changes: dict[str, Any] = {"last_seq": event.seq, "epoch": event.epoch, "updated_at": event.at}
    mutations: list[Mutation] = []
    match event:
        case RunStarted():
            changes.update(status="running", last_run_id=event.run_id)
        case RunFinished():
            changes["status"] = "finished"
        case RunFailed():
            changes["status"] = "failed"
        case TurnAppended(payload=p):
            changes.update(
                turns=session.turns + int(p.model_call),
                usage=session.usage + p.usage,
                message_count=session.message_count + len(p.messages),
            )
            mutations.append(AddTranscript(event.seq, False, p.messages))
        case TranscriptCompacted(payload=p):
            changes.update(
                usage=session.usage + p.usage,
                message_count=len(p.messages),
                base_seq=event.seq,
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
            )
            mutations.append(AddTranscript(event.seq, True, p.messages))
        case StepRecorded(payload=p):
            mutations.append(
                PutStep(
                    StepRow(p.step_key, p.input_hash, event.seq, p.value, p.serializer, event.at)
                )
            )
        case CheckpointWritten(payload=p):
            if p.message_count != session.message_count:
                raise InvalidEventError(
                    f"checkpoint {p.checkpoint_id} claims {p.message_count} messages but the "
                    f"session holds {session.message_count} at seq {event.seq}"
                )
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
        case CheckpointsPruned(payload=p):
            mutations.append(DeleteCheckpoints(p.checkpoint_ids))
        case SessionErased():
            changes.update(status="erased", turns=0, usage=Usage(), message_count=0, base_seq=0)
            mutations.append(EraseSession())
        case _:
            pass  # signals and future informational events change no projection
    return _evolve(session, changes), mutations


def _evolve(row: SessionRow, changes: dict[str, Any]) -> SessionRow:
    """``dataclasses.replace`` for the fold's hot path: a projector folds every event it
    consumes, and ``replace`` re-runs ``__init__`` field by field (~5 µs a call here).
    The row is frozen; its copy is filled in before anyone can see it."""
    new = object.__new__(SessionRow)
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
