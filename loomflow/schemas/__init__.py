"""Pydantic models of loomflow's data: transcript, checkpoints, results and events.

Each name loads with its module when first asked for: a runtime that is made but has
run nothing yet has built none of the event models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomflow.schemas.checkpoints import Checkpoint, CheckpointMeta, RunResult, StopReason
    from loomflow.schemas.clock import utcnow
    from loomflow.schemas.events import (
        CheckpointsPruned,
        CheckpointWritten,
        Event,
        EventBase,
        RunCancelled,
        RunFailed,
        RunFinished,
        RunHeartbeat,
        RunOptions,
        RunStarted,
        RunWaiting,
        SchemaRef,
        SessionErased,
        SessionForked,
        SignalSent,
        StepRecorded,
        ToolRef,
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
    from loomflow.schemas.scope import ANY_USER, Scope
    from loomflow.schemas.sessions import (
        PendingSignal,
        SessionCursor,
        SessionRecord,
        SessionStatus,
        SessionTotals,
        Waiting,
    )

__all__ = [
    "ANY_USER",
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointWritten",
    "CheckpointsPruned",
    "Event",
    "EventBase",
    "Message",
    "PendingSignal",
    "RedactedThinkingBlock",
    "Role",
    "RunCancelled",
    "RunFailed",
    "RunFinished",
    "RunHeartbeat",
    "RunOptions",
    "RunResult",
    "RunStarted",
    "RunWaiting",
    "SchemaRef",
    "Scope",
    "SessionCursor",
    "SessionErased",
    "SessionForked",
    "SessionRecord",
    "SessionStatus",
    "SessionTotals",
    "SignalSent",
    "StepRecorded",
    "StopReason",
    "Thinking",
    "ThinkingBlock",
    "ToolCall",
    "ToolRef",
    "TranscriptCompacted",
    "TurnAppended",
    "Usage",
    "Waiting",
    "new_id",
    "utcnow",
    "validate_id",
]

#: the module of each name
_MODULES = {
    "Checkpoint": "checkpoints",
    "CheckpointMeta": "checkpoints",
    "RunResult": "checkpoints",
    "StopReason": "checkpoints",
    "utcnow": "clock",
    "CheckpointWritten": "events",
    "CheckpointsPruned": "events",
    "Event": "events",
    "EventBase": "events",
    "RunCancelled": "events",
    "RunFailed": "events",
    "RunFinished": "events",
    "RunHeartbeat": "events",
    "RunOptions": "events",
    "RunStarted": "events",
    "RunWaiting": "events",
    "SchemaRef": "events",
    "SessionErased": "events",
    "SessionForked": "events",
    "SignalSent": "events",
    "StepRecorded": "events",
    "ToolRef": "events",
    "TranscriptCompacted": "events",
    "TurnAppended": "events",
    "new_id": "ids",
    "validate_id": "ids",
    "Message": "messages",
    "RedactedThinkingBlock": "messages",
    "Role": "messages",
    "Thinking": "messages",
    "ThinkingBlock": "messages",
    "ToolCall": "messages",
    "Usage": "messages",
    "ANY_USER": "scope",
    "Scope": "scope",
    "PendingSignal": "sessions",
    "SessionCursor": "sessions",
    "SessionRecord": "sessions",
    "SessionStatus": "sessions",
    "SessionTotals": "sessions",
    "Waiting": "sessions",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # found directly from now on
    return value
