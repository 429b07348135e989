"""Tuning: the knobs of the agent loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from loomflow.schemas import Message, Usage

__all__ = ["CONTINUATION_PROMPT", "SessionState", "StopHook", "Tuning"]

CONTINUATION_PROMPT = "Continue the interrupted task."


@dataclass(frozen=True)
class SessionState:
    """What a stop hook sees after a pass: the session as it stands."""

    session_id: str
    user_id: str | None
    run_id: str
    messages: tuple[Message, ...]
    turns: int
    usage: Usage
    passes: int
    output: str


StopHook = Callable[[SessionState], "str | Message | Awaitable[str | Message | None] | None"]


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """How the loop runs.

    ``checkpoint``: write a checkpoint after every pass (off by default).
    ``stop_hooks``: called after each pass; the first that returns a message starts
    another pass with it as a user turn, at most ``max_stop_hook_iterations`` times.
    ``auto_compact_at_tokens``: when the transcript passes this size, older turns are
    summarised by the model (keeping ``compact_keep_messages`` recent ones) before the
    pass's checkpoint. ``max_turns``: model calls allowed in one pass; reaching it
    ends the run with ``stop_reason="max_turns"``.
    """

    checkpoint: bool = False
    stop_hooks: Sequence[StopHook] = field(default_factory=tuple)
    max_stop_hook_iterations: int = 10
    auto_compact_at_tokens: int | None = None
    compact_keep_messages: int = 6
    max_turns: int = 50
    continuation_prompt: str = CONTINUATION_PROMPT

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("Tuning.max_turns must be at least 1")
        if self.max_stop_hook_iterations < 0:
            raise ValueError("Tuning.max_stop_hook_iterations cannot be negative")
        if self.auto_compact_at_tokens is not None and self.auto_compact_at_tokens < 1:
            raise ValueError("Tuning.auto_compact_at_tokens must be positive or None")
        if self.compact_keep_messages < 1:
            raise ValueError("Tuning.compact_keep_messages must be at least 1")
        object.__setattr__(self, "stop_hooks", tuple(self.stop_hooks))
