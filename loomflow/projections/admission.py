"""The rule of validity: whether a session accepts an event, written once.

The fold (:func:`loomflow.projections.fold.fold`, which every store and the Kafka
projector run) and the audit (``audit/auditor.py``) both ask :func:`admit`, so the audit
chains exactly what the read model accepts and records the rest as refused: an event of
an erased session, of a stale or unclaimed epoch, at a seq that is not the session's
next, a fork that is not its session's first event, a checkpoint that claims another
message count than the session holds. (Signatures are the other half of the rule, checked
where a record is decoded: :class:`loomflow.schemas.signing.Signatures`.)

:class:`Standing` is what the rule needs to know of a session; a store reads it off the
session's row (:meth:`Standing.of`), the audit keeps it in its trail.
"""

from __future__ import annotations

from dataclasses import dataclass

from loomflow.errors import (
    InvalidEventError,
    RunCancelledError,
    SequenceConflictError,
    SessionErasedError,
    StaleWriterError,
)
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunStarted,
    RunWaiting,
    SessionErased,
    SessionForked,
    TranscriptCompacted,
    TurnAppended,
)
from loomflow.schemas.events import CLAIM_TYPES
from loomflow.schemas.scope import scope_of
from loomflow.schemas.sessions import SessionRecord

__all__ = ["Standing", "admit", "refuse"]

#: the events after which a session is no longer cancelled (each sets another status)
_UNCANCELS = (RunStarted, RunFinished, RunFailed, RunWaiting, SessionErased)


@dataclass(frozen=True, slots=True)
class Standing:
    """What the rule of validity knows of a session: its writer's epoch, its last seq,
    the messages its transcript holds, whether it is cancelled or erased. ``gapped``:
    the log removed some of its records before they were read (an embedded log's prune
    or erasure, met by an audit that started after it), so seqs may skip and the message
    count is not known."""

    epoch: int = 0
    last_seq: int = 0
    message_count: int = 0
    cancelled: bool = False
    erased: bool = False
    gapped: bool = False

    @classmethod
    def of(cls, row: SessionRecord) -> Standing:
        return cls(
            row.epoch,
            row.last_seq,
            row.message_count,
            row.status == "cancelled",
            row.status == "erased",
        )


def refuse(
    event: Event,
    *,
    epoch: int,
    last_seq: int,
    message_count: int | None,
    cancelled: bool,
    erased: bool,
    gaps: bool = False,
) -> None:
    """Raise the :class:`~loomflow.errors.InvalidEventError` (or subclass) that refuses
    ``event`` for a session standing so; return when the session accepts it. ``gaps``: a
    seq past the next one is accepted (the log removed the records between);
    ``message_count`` None: not checked."""
    where = f"session {event.session_id!r}"
    if erased:
        raise SessionErasedError(
            f"{where} (user {event.user_id!r}) was erased; start a new session id"
        )
    if event.epoch < epoch:
        if cancelled and event.epoch == epoch - 1:
            # the run the cancel fenced (it claimed the epoch after the run's)
            raise RunCancelledError.of(event.run_id, scope_of(event).describe())
        raise StaleWriterError(
            f"writer epoch {event.epoch} is older than epoch {epoch} of {where}: another "
            "run took the session over"
        )
    if event.epoch > epoch and not isinstance(event, CLAIM_TYPES):
        raise InvalidEventError(
            f"{event.type} at epoch {event.epoch} but {where} is at epoch {epoch}; only "
            "run.started or session.forked claims a new epoch"
        )
    if event.seq != last_seq + 1 and not (gaps and event.seq > last_seq):
        raise SequenceConflictError(
            f"{where} expects seq {last_seq + 1}, got {event.seq}: another writer appended first"
        )
    if isinstance(event, SessionForked) and event.seq != 1:
        raise InvalidEventError("session.forked must be the first event of its session")
    if (
        isinstance(event, CheckpointWritten)
        and message_count is not None
        and event.payload.message_count != message_count
    ):
        raise InvalidEventError(
            f"checkpoint {event.payload.checkpoint_id} claims {event.payload.message_count} "
            f"messages but the session holds {message_count} at seq {event.seq}"
        )


def admit(standing: Standing | None, event: Event, *, gaps: bool = False) -> Standing:
    """The session's standing after ``event``; raises what :func:`refuse` raises when
    the session refuses it. ``gaps``: the log may have removed records (see
    :attr:`Standing.gapped`)."""
    now = standing or Standing()
    skipped = event.seq > now.last_seq + 1
    refuse(
        event,
        epoch=now.epoch,
        last_seq=now.last_seq,
        message_count=None if now.gapped or skipped else now.message_count,
        cancelled=now.cancelled,
        erased=now.erased,
        gaps=gaps,
    )
    count = now.message_count
    match event:
        case TurnAppended(payload=p):
            count += len(p.messages)
        case TranscriptCompacted(payload=p) | SessionForked(payload=p):
            count = len(p.messages)
        case SessionErased():
            count = 0
    if isinstance(event, RunCancelled):
        cancelled = True
    elif isinstance(event, _UNCANCELS):
        cancelled = False
    else:
        cancelled = now.cancelled
    return Standing(
        event.epoch,
        event.seq,
        count,
        cancelled,
        isinstance(event, SessionErased),
        # a new base (a compaction, a fork) holds the whole transcript: its count is known
        (now.gapped or skipped) and not isinstance(event, TranscriptCompacted | SessionForked),
    )
