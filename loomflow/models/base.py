"""What the agent loop needs from a model: one async call per turn."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from loomflow.schemas import Message, Usage

__all__ = [
    "COMPACTION_INSTRUCTIONS",
    "CallOptions",
    "Effort",
    "Model",
    "ModelResponse",
    "ToolSpec",
    "accepts_options",
    "continues",
]


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


class Effort(StrEnum):
    """How hard the model should think: an adapter maps it to its model's parameters
    (Claude: effort and extended thinking), or to the nearest level the model supports."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    MAX = "max"


@dataclass(frozen=True)
class CallOptions:
    """What a run asks of one model call beyond the transcript and the tools.

    ``output_schema`` is the JSON Schema the final answer must satisfy (named
    ``output_name``): an adapter uses its provider's structured-output support where there
    is one; the loop validates the answer either way. ``on_delta`` receives text as the
    model streams it; the returned message is the same as without it.
    """

    effort: Effort | None = None
    output_schema: dict[str, Any] | None = None
    output_name: str = "output"
    on_delta: Callable[[str], Awaitable[None]] | None = None

    def __bool__(self) -> bool:
        return not (self.effort is None and self.output_schema is None and self.on_delta is None)


@runtime_checkable
class Model(Protocol):
    """A chat model. ``messages`` may start with system messages; the adapter maps them.

    An adapter whose ``complete`` also takes a keyword ``options`` (a :class:`CallOptions`)
    receives a run's effort, output schema and delta callback; one that does not is called
    without them (see :func:`accepts_options`).
    """

    name: str

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse: ...


def accepts_options(model: Model) -> bool:
    """Whether ``model.complete`` takes the ``options`` keyword."""
    try:
        parameters = inspect.signature(model.complete).parameters
    except (TypeError, ValueError):
        return False
    return "options" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def continues(messages: Sequence[Message], seen: Sequence[Message]) -> bool:
    """Whether ``messages`` begins with the very objects of ``seen``, in order.

    A transcript only grows between calls, and the runtimes hand back the message objects
    they were given or last read, so what was worked out for ``seen`` (a conversion, a
    count, a hash) holds for that prefix of ``messages``: messages are frozen. A pointer
    comparison per message, where comparing contents would cost about what is saved.
    """
    return len(messages) >= len(seen) and all(map(operator.is_, messages, seen))


COMPACTION_INSTRUCTIONS = (
    "You compact agent transcripts. Summarise the conversation you are given so the agent can "
    "continue the task from the summary alone: the goal, what was done, results and open items."
)
