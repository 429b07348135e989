"""Pydantic models of loomflow's data: transcript, checkpoints, results and events."""

from loomflow.schemas.checkpoints import Checkpoint, CheckpointMeta, RunResult, StopReason
from loomflow.schemas.clock import utcnow
from loomflow.schemas.events import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    EventBase,
    RunFailed,
    RunFinished,
    RunHeartbeat,
    RunStarted,
    RunWaiting,
    SessionErased,
    SessionForked,
    SignalSent,
    StepRecorded,
    TranscriptCompacted,
    TurnAppended,
)
from loomflow.schemas.ids import new_id, validate_id
from loomflow.schemas.messages import (
    Message,
    RedactedThinkingBlock,
    Role,
    Thinking,
    ThinkingBlock,
    ToolCall,
    Usage,
)

__all__ = [
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointWritten",
    "CheckpointsPruned",
    "Event",
    "EventBase",
    "Message",
    "RedactedThinkingBlock",
    "Role",
    "RunFailed",
    "RunFinished",
    "RunHeartbeat",
    "RunResult",
    "RunStarted",
    "RunWaiting",
    "SessionErased",
    "SessionForked",
    "SignalSent",
    "StepRecorded",
    "StopReason",
    "Thinking",
    "ThinkingBlock",
    "ToolCall",
    "TranscriptCompacted",
    "TurnAppended",
    "Usage",
    "new_id",
    "utcnow",
    "validate_id",
]
