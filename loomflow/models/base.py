"""What the agent loop needs from a model: one async call per turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from loomflow.schemas import Message, Usage

__all__ = ["COMPACTION_INSTRUCTIONS", "Model", "ModelResponse", "ToolSpec"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description and a JSON Schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})


@dataclass(frozen=True)
class ModelResponse:
    """One model turn: the assistant message and what it cost."""

    message: Message
    usage: Usage
    stop_reason: str | None = None


@runtime_checkable
class Model(Protocol):
    """A chat model. ``messages`` may start with system messages; the adapter maps them."""

    name: str

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse: ...


COMPACTION_INSTRUCTIONS = (
    "You compact agent transcripts. Summarise the conversation you are given so the agent can "
    "continue the task from the summary alone: the goal, what was done, results and open items."
)
