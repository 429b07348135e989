"""The transcript: messages, tool calls and token usage."""

# No ``from __future__ import annotations`` here: pydantic would then compile and
# evaluate every field's annotation from its string when the models are made, at import
# (~a quarter of the package's own import time, most of the embedded import's share).

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Message",
    "RedactedThinkingBlock",
    "Role",
    "Thinking",
    "ThinkingBlock",
    "ToolCall",
    "Usage",
]


class Role(StrEnum):
    """Who wrote a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ToolCall(BaseModel):
    """A tool invocation requested by the model."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(BaseModel):
    """A block of the model's reasoning, kept so it can be sent back as the provider
    requires: unmodified, signature included (Claude refuses a history whose thinking
    does not verify)."""

    # ``type`` has no default: a payload stored with ``exclude_defaults`` keeps it, and
    # it is what tells the two kinds of block apart when they are read back.
    model_config = ConfigDict(frozen=True, defer_build=True)

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(BaseModel):
    """Reasoning the provider returned encrypted (``data`` is opaque); sent back unchanged."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    type: Literal["redacted_thinking"]
    data: str


Thinking = Annotated[ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")]
"""One block of an assistant message's reasoning, in either form."""


class Message(BaseModel):
    """One message of a transcript.

    Tool results are ``role="tool"`` messages carrying the ``tool_call_id`` they answer.
    ``thinking`` holds an assistant message's reasoning blocks in the order the model
    produced them; it is left out of the JSON when empty, so a message without it
    serialises (and hashes) as it did before the field existed.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    is_error: bool = False
    thinking: list[Thinking] = Field(default_factory=list, exclude_if=lambda blocks: not blocks)

    @classmethod
    def system(cls, content: str) -> "Message":
        return cls(role=Role.SYSTEM, content=_text(content))

    @classmethod
    def user(cls, content: str) -> "Message":
        return cls(role=Role.USER, content=_text(content))

    @classmethod
    def assistant(
        cls,
        content: str = "",
        tool_calls: list[ToolCall] | None = None,
        *,
        thinking: list[ThinkingBlock | RedactedThinkingBlock] | None = None,
    ) -> "Message":
        return cls(
            role=Role.ASSISTANT,
            content=_text(content),
            tool_calls=tool_calls or [],
            thinking=thinking or [],
        )

    @classmethod
    def tool(cls, tool_call_id: str, content: str, *, is_error: bool = False) -> "Message":
        return cls(
            role=Role.TOOL, content=_text(content), tool_call_id=tool_call_id, is_error=is_error
        )


def _text(content: str) -> str:
    """``content`` as JSON can carry it: a lone surrogate becomes U+FFFD (a pair, the
    character it stands for).

    Python strings may hold lone surrogates (``os.fsdecode`` makes them of file names that
    are not UTF-8), and no JSON writer takes one: a tool's result or a model's answer
    holding one would fail every write of its turn, so a resume would run the tool again
    and fail again. The loop builds its messages with these constructors.
    """
    if not isinstance(content, str) or content.isascii():
        return content  # pydantic says what is wrong with a non-str
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        return content.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return content


class Usage(BaseModel):
    """Tokens and cost of one or more model calls; ``+`` adds them up."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        # Both sides are validated already; summing needs no second validation. This is
        # what model_construct does, without its generic walk over the fields: the fold
        # adds usage for every turn a projector consumes.
        if not (
            other.input_tokens
            or other.cached_input_tokens
            or other.cache_write_tokens
            or other.output_tokens
            or other.cost_usd
        ):
            return self  # a turn without a model call: the same object, nothing to store
        total = object.__new__(Usage)
        object.__setattr__(
            total,
            "__dict__",
            {
                "input_tokens": self.input_tokens + other.input_tokens,
                "cached_input_tokens": self.cached_input_tokens + other.cached_input_tokens,
                "cache_write_tokens": self.cache_write_tokens + other.cache_write_tokens,
                "output_tokens": self.output_tokens + other.output_tokens,
                "cost_usd": round(self.cost_usd + other.cost_usd, 10),
            },
        )
        object.__setattr__(total, "__pydantic_fields_set__", set(_USAGE_FIELDS))
        object.__setattr__(total, "__pydantic_extra__", None)
        object.__setattr__(total, "__pydantic_private__", None)
        return total

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.cached_input_tokens
            + self.cache_write_tokens
            + self.output_tokens
        )


_USAGE_FIELDS = frozenset(Usage.model_fields)
