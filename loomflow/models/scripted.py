"""A deterministic model for tests and the offline demo."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomflow.errors import ModelError
from loomflow.models.base import (
    COMPACTION_INSTRUCTIONS,
    CallOptions,
    ModelResponse,
    ToolSpec,
    continues,
)
from loomflow.schemas import Message, Role, ToolCall, Usage

__all__ = ["Reply", "ScriptedModel"]

Reply = str | Message
Script = Sequence[Reply] | Callable[[Sequence[Message]], Reply]
_MAX_TRANSCRIPTS = 16


@dataclass
class _Tally:
    """What the script and the usage need of a transcript: its size and its answers."""

    seen: list[Message] = field(default_factory=list)
    chars: int = 0
    assistants: int = 0

    def add(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self.chars += _chars(message)
            self.assistants += message.role is Role.ASSISTANT
        self.seen.extend(messages)


class ScriptedModel:
    """Answers from a script instead of a network call.

    With a list, the reply to a request is ``script[i]`` where ``i`` is the number of
    assistant messages already in the request: a process that resumes a session gets the
    same next reply as the one that was killed. A callable gets the messages and picks.
    Usage is derived from text length (about four characters a token) and priced at
    ``price_in``/``price_out`` USD per million tokens, so costs add up like a real model's.
    """

    def __init__(
        self,
        script: Script,
        *,
        name: str = "scripted",
        price_in: float = 3.0,
        price_out: float = 15.0,
        latency: float = 0.0,
        on_call: Callable[[Sequence[Message]], Any] | None = None,
    ) -> None:
        self.name = name
        self._script = script
        self._price_in = price_in
        self._price_out = price_out
        self._latency = latency
        self._on_call = on_call
        self.calls: list[list[Message]] = []
        # the tallies of recent transcripts by their first message, extended as each grows,
        # so that a call costs what its new messages cost (one model may serve several
        # sessions at once)
        self._tallies: OrderedDict[int, _Tally] = OrderedDict()
        #: the options each call got (None: called without)
        self.options: list[CallOptions | None] = []

    @staticmethod
    def tool_call(name: str, /, **arguments: Any) -> Message:
        """An assistant message calling one tool (its id is assigned per turn)."""
        return Message.assistant(tool_calls=[ToolCall(id="", name=name, arguments=arguments)])

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        options: CallOptions | None = None,
    ) -> ModelResponse:
        """The scripted reply. With ``options.on_delta`` its text is also streamed, a word
        at a time; the reply is the same either way."""
        self.calls.append(list(messages))
        self.options.append(options)
        if self._on_call is not None:
            outcome = self._on_call(messages)
            if asyncio.iscoroutine(outcome):
                await outcome
        if self._latency:
            await asyncio.sleep(self._latency)  # stands in for network time, not for sync
        tally = self._tally(messages)
        index = tally.assistants
        if messages and messages[0].content == COMPACTION_INSTRUCTIONS:
            reply: Reply = f"Summary of {len(messages[1].content)} characters of work so far."
        elif callable(self._script):
            reply = self._script(messages)
        elif index < len(self._script):
            reply = self._script[index]
        else:
            replies = len(self._script)
            raise ModelError(
                f"scripted model {self.name!r} has {replies} repl{'y' if replies == 1 else 'ies'}"
                f" and was asked for reply {index + 1}: the conversation holds every reply of "
                "its script already (a session given another prompt once its script was done, "
                "or a run longer than its script); give it more replies, or a function of the "
                "messages"
            )
        message = Message.assistant(reply) if isinstance(reply, str) else reply
        if any(not call.id for call in message.tool_calls):
            message = message.model_copy(
                update={
                    "tool_calls": [
                        call if call.id else call.model_copy(update={"id": f"call_{index}_{k}"})
                        for k, call in enumerate(message.tool_calls)
                    ]
                }
            )
        if options is not None and options.on_delta is not None:
            for piece in re.findall(r"\S+\s*|\s+", message.content):
                await options.on_delta(piece)
        return ModelResponse(message=message, usage=self._usage(tally, message))

    def _tally(self, messages: Sequence[Message]) -> _Tally:
        key = id(messages[0]) if messages else 0
        tally = self._tallies.pop(key, None)
        if tally is None or not continues(messages, tally.seen):
            tally = _Tally()
        tally.add(messages[len(tally.seen) :])
        self._tallies[key] = tally  # most recently used last
        if len(self._tallies) > _MAX_TRANSCRIPTS:
            self._tallies.popitem(last=False)
        return tally

    def _usage(self, tally: _Tally, reply: Message) -> Usage:
        tokens_in = tally.chars // 4 + 1
        tokens_out = _chars(reply) // 4 + 1
        cost = (tokens_in * self._price_in + tokens_out * self._price_out) / 1_000_000
        return Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=round(cost, 10))


def _chars(message: Message) -> int:
    return len(message.content) + sum(
        len(c.name) + len(str(c.arguments)) for c in message.tool_calls
    )
