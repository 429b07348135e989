"""The event envelope and every event type: a discriminated union on ``type``.

Events are the source of truth. They are JSON only (``model_dump_json``), never pickle.
A checkpoint event carries no messages: the transcript is the concatenation of the
``turn.appended`` messages since the session's last *base* (its fork origin or its
latest compaction), which is what keeps storage linear in a session's length.
"""

# No ``from __future__ import annotations`` here: pydantic would then compile and
# evaluate every field's annotation from its string when the models are made, at import
# (~a quarter of the package's own import time, most of the embedded import's share).

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from loomflow.schemas.clock import utcnow
from loomflow.schemas.ids import Id, new_id
from loomflow.schemas.messages import Message, Role, Usage
from loomflow.schemas.options import DEFAULT_LEASE_SECONDS

__all__ = [
    "CLAIM_TYPES",
    "DEFAULT_LEASE_SECONDS",
    "EVENT_SCHEMA_VERSION",
    "MAX_EVENT_BYTES",
    "MAX_SIGNAL_BYTES",
    "CheckpointWritten",
    "CheckpointsPruned",
    "Event",
    "EventBase",
    "RunCancelled",
    "RunFailed",
    "RunFinished",
    "RunHeartbeat",
    "RunOptions",
    "RunStarted",
    "RunWaiting",
    "SchemaRef",
    "SessionErased",
    "SessionForked",
    "SignalSent",
    "Signature",
    "StepRecorded",
    "ToolRef",
    "TranscriptCompacted",
    "TurnAppended",
    "event_adapter",
]

EVENT_SCHEMA_VERSION = 1
MAX_EVENT_BYTES = 8 * 1024 * 1024
#: the largest signal payload, as JSON
MAX_SIGNAL_BYTES = 64 * 1024

_FROZEN = ConfigDict(frozen=True, extra="forbid", defer_build=True)


def _unset(value: object) -> bool:
    return value is None


def _optional(**constraints: Any) -> Any:
    """An optional field left out of the JSON while unset: events written before it
    existed decode as they did, and events that do not set it do not grow."""
    return Field(default=None, exclude_if=_unset, **constraints)


class Signature(BaseModel):
    """A writer's signature of an event (:mod:`loomflow.schemas.signing`): the id of the
    key that made it and the Ed25519 signature, base64url without padding."""

    model_config = _FROZEN
    key: str = Field(min_length=1, max_length=80)
    value: str = Field(min_length=1, max_length=200)


class EventBase(BaseModel):
    """The envelope every event shares."""

    model_config = _FROZEN

    event_id: Id = Field(default_factory=lambda: new_id("evt"))
    v: int = EVENT_SCHEMA_VERSION
    user_id: Id | None = None
    session_id: Id
    run_id: Id
    seq: int = Field(ge=1)
    epoch: int = Field(ge=0)
    at: datetime = Field(default_factory=utcnow)
    #: the writer's signature when it has a signing key (None, and absent from the JSON,
    #: otherwise): it covers every other field, scope and seq included
    sig: Signature | None = _optional()


# --- payloads -------------------------------------------------------------------------


class ToolRef(BaseModel):
    """An extra tool a run was given: its name and the hash of its input schema (what the
    model is told it takes), which a process continuing the run must host unchanged."""

    model_config = _FROZEN
    name: str = Field(min_length=1, max_length=64)
    schema_hash: str = Field(min_length=1, max_length=64)


class SchemaRef(BaseModel):
    """A run's output schema: the model class's name, the hash of its JSON Schema, and
    the JSON Schema itself (so a reader of the log sees what the answer had to be)."""

    model_config = _FROZEN
    name: str = Field(min_length=1, max_length=200)
    schema_hash: str = Field(min_length=1, max_length=64)
    json_schema: dict[str, Any]


class RunOptions(BaseModel):
    """What a run was asked beyond its prompt and metadata: every option of ``run()``
    that changes what the run does. Every way the run continues (a resume, a worker's
    take-over, a signal, a fork) restores them from here; the options that are code
    (tools, the schema class) are resolved by name and hash from what the continuing
    process hosts."""

    model_config = _FROZEN
    extra_tools: tuple[ToolRef, ...] = ()
    output_schema: SchemaRef | None = None
    output_validation_retries: int = Field(default=1, ge=0)
    effort: str | None = None
    #: the keywords given explicitly to the ``resume()`` that started this run, which
    #: replaced the ones its predecessor recorded
    replaced: tuple[str, ...] = ()


class RunStartedPayload(BaseModel):
    model_config = _FROZEN
    mode: Literal["run", "resume", "fork"] = "run"
    from_checkpoint: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: the run's options (None in events from before they were kept: the defaults)
    options: RunOptions | None = _optional()
    #: the name of the model the run's agent calls (None in events from before it was kept)
    model: str | None = _optional()
    #: the name of the agent whose run it is, so that a process hosting that agent can
    #: resume the run (None in events from before it was kept)
    agent: str | None = _optional()
    #: seconds the run's writer may stay silent before the run counts as abandoned
    lease_seconds: float | None = _optional(gt=0, allow_inf_nan=False)
    #: the worker that took the run over (``loomflow worker``), None for a caller's run
    worker: str | None = _optional()
    #: the process that claimed the session for the run, ``host:pid`` (None in events
    #: from before it was kept): who ran it, read by the console and the audit
    process: str | None = _optional(max_length=300)
    #: the run that was still running when this one claimed the session (a crashed or
    #: abandoned run, or a live one another resume took the session from): it ends here,
    #: fenced, and this event is the record of its end
    interrupted: Id | None = _optional()


class RunFinishedPayload(BaseModel):
    """How a run ended. ``output`` is its answer only where the transcript does not hold
    it: None (absent from the JSON) says the answer is the content of the session's last
    assistant message before this event, which a reader of the transcript has already
    (``answer``). Events written before that carry it always, and read the same."""

    model_config = _FROZEN
    output: str | None = _optional()
    turns: int
    usage: Usage
    stop_reason: str = "completed"
    model: str | None = _optional()

    def answer(self, transcript: Sequence[Message]) -> str:
        """The run's answer: ``output`` when the event carries it, otherwise the content
        of the last assistant message of ``transcript`` (the session's messages up to
        this event), "" when it has none."""
        if self.output is not None:
            return self.output
        for message in reversed(transcript):
            if message.role is Role.ASSISTANT:
                return message.content
        return ""


class RunFailedPayload(BaseModel):
    model_config = _FROZEN
    error_type: str
    error: str
    model: str | None = _optional()
    #: a worker gave up on the run after its bounded retries: it waits for a person
    #: (``loomflow sessions ls --stuck``)
    parked: bool | None = _optional()


class TurnAppendedPayload(BaseModel):
    """Messages a turn added to the transcript and what producing them cost.

    ``step_key``/``input_hash`` identify the model or tool call that produced them,
    so auditors can see which call each message came from. A model call's turn also
    names the ``model`` and its wall time, ``latency_ms`` (request to complete answer);
    both are None, and absent from the JSON, on other turns and in older events.
    """

    model_config = _FROZEN
    messages: list[Message]
    usage: Usage = Field(default_factory=Usage)
    model_call: bool = False
    step_key: str | None = None
    input_hash: str | None = None
    model: str | None = _optional()
    latency_ms: float | None = _optional(ge=0, allow_inf_nan=False)


class TranscriptCompactedPayload(BaseModel):
    """The whole transcript after auto-compaction: a new base for later turns.

    ``usage``, ``model`` and ``latency_ms`` are those of the model call that summarised.
    """

    model_config = _FROZEN
    messages: list[Message]
    usage: Usage = Field(default_factory=Usage)
    replaced_messages: int
    model: str | None = _optional()
    latency_ms: float | None = _optional(ge=0, allow_inf_nan=False)


class StepRecordedPayload(BaseModel):
    """A journal entry: the result of a step, keyed for replay."""

    model_config = _FROZEN
    step_key: str
    input_hash: str
    value: Any = None
    serializer: Literal["json", "pickle"] = "json"
    #: the seq of the ``signal.sent`` this step received (``wait_for_signal``): the
    #: signal leaves the session's inbox with it
    signal_seq: int | None = _optional(ge=1)


class CheckpointWrittenPayload(BaseModel):
    """A snapshot marker: the transcript is every message up to this event's seq."""

    model_config = _FROZEN
    checkpoint_id: Id
    turn: int
    cumulative_usage: Usage
    cursor: str | None = None
    message_count: int
    retain: int = Field(description="newest checkpoints kept per session; < 1 keeps all")


class SessionForkedPayload(BaseModel):
    """First event of a fork: where it came from and the transcript it starts with."""

    model_config = _FROZEN
    parent_session_id: Id
    parent_checkpoint_id: Id
    messages: list[Message]
    turn: int
    cumulative_usage: Usage
    #: the metadata and options of the parent's run the fork continues (None in events
    #: from before they were kept): the fork's first run is given them, as a resume is
    metadata: dict[str, Any] | None = _optional()
    options: RunOptions | None = _optional()


class CheckpointsPrunedPayload(BaseModel):
    model_config = _FROZEN
    checkpoint_ids: list[Id]


class SessionErasedPayload(BaseModel):
    model_config = _FROZEN
    reason: str = ""


class SignalSentPayload(BaseModel):
    """A named message for the session's run: kept in the session's inbox until a
    ``wait_for_signal`` of that name receives it."""

    model_config = _FROZEN
    name: str = Field(min_length=1, max_length=200)
    data: Any = None


class RunHeartbeatPayload(BaseModel):
    """Nothing: the event itself says that the run's writer is alive."""

    model_config = _FROZEN


class RunCancelledPayload(BaseModel):
    """A person (``loomflow sessions cancel``, ``runtime.cancel``) stopped the session's
    run: its writer is fenced (the event claims a new epoch), and no worker resumes it."""

    model_config = _FROZEN
    reason: str = Field(default="", max_length=2000)


class RunWaitingPayload(BaseModel):
    """The run stopped to wait for a signal; a worker resumes it once the signal is in
    the session's inbox, or once ``until`` has passed."""

    model_config = _FROZEN
    signal: str = Field(min_length=1, max_length=200)
    #: the journal key under which the waiting step records what it receives
    step_key: str
    until: datetime | None = None
    #: where the run waits: in a tool call, or in a stop hook after a pass
    where: Literal["tool", "stop_hook"] = "tool"


# --- events ---------------------------------------------------------------------------


class RunStarted(EventBase):
    type: Literal["run.started"] = "run.started"
    payload: RunStartedPayload = Field(default_factory=RunStartedPayload)


class RunFinished(EventBase):
    type: Literal["run.finished"] = "run.finished"
    payload: RunFinishedPayload


class RunFailed(EventBase):
    type: Literal["run.failed"] = "run.failed"
    payload: RunFailedPayload


class TurnAppended(EventBase):
    type: Literal["turn.appended"] = "turn.appended"
    payload: TurnAppendedPayload


class TranscriptCompacted(EventBase):
    type: Literal["transcript.compacted"] = "transcript.compacted"
    payload: TranscriptCompactedPayload


class StepRecorded(EventBase):
    type: Literal["step.recorded"] = "step.recorded"
    payload: StepRecordedPayload


class CheckpointWritten(EventBase):
    type: Literal["checkpoint.written"] = "checkpoint.written"
    payload: CheckpointWrittenPayload


class SessionForked(EventBase):
    type: Literal["session.forked"] = "session.forked"
    payload: SessionForkedPayload


class CheckpointsPruned(EventBase):
    type: Literal["checkpoints.pruned"] = "checkpoints.pruned"
    payload: CheckpointsPrunedPayload


class SessionErased(EventBase):
    type: Literal["session.erased"] = "session.erased"
    payload: SessionErasedPayload = Field(default_factory=SessionErasedPayload)


class SignalSent(EventBase):
    type: Literal["signal.sent"] = "signal.sent"
    payload: SignalSentPayload


class RunHeartbeat(EventBase):
    type: Literal["run.heartbeat"] = "run.heartbeat"
    payload: RunHeartbeatPayload = Field(default_factory=RunHeartbeatPayload)


class RunWaiting(EventBase):
    type: Literal["run.waiting"] = "run.waiting"
    payload: RunWaitingPayload


class RunCancelled(EventBase):
    """Written under the run_id of the run it stops (the session's latest)."""

    type: Literal["run.cancelled"] = "run.cancelled"
    payload: RunCancelledPayload = Field(default_factory=RunCancelledPayload)


Event = Annotated[
    RunStarted
    | RunFinished
    | RunFailed
    | TurnAppended
    | TranscriptCompacted
    | StepRecorded
    | CheckpointWritten
    | SessionForked
    | CheckpointsPruned
    | SessionErased
    | SignalSent
    | RunHeartbeat
    | RunWaiting
    | RunCancelled,
    Field(discriminator="type"),
]


#: events that claim the session for a new writer (a new epoch): a run's start, a fork's
#: origin, an erasure, a signal (which takes the session from a run that waits or whose
#: writer went silent), and a cancel (which fences the run it stops)
CLAIM_TYPES = (RunStarted, SessionForked, SessionErased, SignalSent, RunCancelled)


@functools.cache
def event_adapter() -> TypeAdapter[Event]:
    """The validator of the union, built on first use: building it (and every event
    model's schema) at import would cost a tenth of ``import loomflow``."""
    return TypeAdapter(Event)
