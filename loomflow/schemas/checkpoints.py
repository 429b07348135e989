"""Checkpoints, their listing metadata, and the result of a run."""

# No ``from __future__ import annotations`` here: pydantic would then compile and
# evaluate every field's annotation from its string when the models are made, at import
# (~a quarter of the package's own import time, most of the embedded import's share).

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loomflow.schemas.clock import utcnow
from loomflow.schemas.ids import new_id
from loomflow.schemas.messages import Message, Usage

__all__ = ["Checkpoint", "CheckpointMeta", "RunResult", "StopReason"]

StopReason = Literal["completed", "max_turns", "stop_hook_limit", "waiting"]


class Checkpoint(BaseModel):
    """A transcript snapshot taken after an architecture pass."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    checkpoint_id: str = Field(default_factory=lambda: new_id("ckpt"))
    turn: int
    messages: list[Message]
    cumulative_usage: Usage
    cursor: str | None = None
    created_at: datetime = Field(default_factory=utcnow)


class CheckpointMeta(BaseModel):
    """What listing returns: which checkpoint, at which turn, when; never the messages."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    checkpoint_id: str
    turn: int
    created_at: datetime


class RunResult(BaseModel):
    """The outcome of ``agent.run`` or ``agent.resume``; usage includes restored turns."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    output: str
    turns: int
    tokens_in: int
    cached_tokens_in: int
    tokens_out: int
    cost_usd: float
    usage: Usage
    run_id: str
    # Beyond the spec: how much of this result was restored rather than executed.
    restored_turns: int = 0
    model_calls: int = 0
    stop_reason: StopReason = "completed"
    parent_session_id: str | None = None
    parent_checkpoint_id: str | None = None
    #: the final answer validated by the run's ``output_schema`` (None without one)
    parsed: Any = None
    #: the signal the run stopped to wait for (``stop_reason="waiting"``), else None
    waiting_for: str | None = None
