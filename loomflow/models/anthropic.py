"""Claude as a loomflow model, through the official ``anthropic`` SDK's Messages API.

The SDK takes about two seconds to import, so it is imported when a Claude model first
builds its client (or handles the SDK's errors), not with ``loomflow``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam

from loomflow.errors import ModelError
from loomflow.models.base import ModelResponse, ToolSpec
from loomflow.schemas import Message, Role, ToolCall, Usage

__all__ = ["AnthropicModel", "Price", "price_for"]

logger = logging.getLogger("loomflow.models.anthropic")

_ApiRole = Literal["user", "assistant"]
# Loose block dicts: the SDK's content union is too wide to build field by field.
_Block = dict[str, Any]


@dataclass(frozen=True)
class Price:
    """List price of a model in USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    @classmethod
    def of(cls, input: float, output: float) -> Price:
        """The price of a model whose cache reads cost 0.1x and 5-minute writes 1.25x input."""
        return cls(input=input, output=output, cache_read=input * 0.1, cache_write=input * 1.25)

    def cost(self, usage: Usage) -> float:
        """The cost in USD of ``usage``; its own ``cost_usd`` is ignored."""
        total = (
            usage.input_tokens * self.input
            + usage.cached_input_tokens * self.cache_read
            + usage.cache_write_tokens * self.cache_write
            + usage.output_tokens * self.output
        )
        # Rounded so sums of many turns compare equal however they were added up.
        return round(total / 1_000_000, 10)


_OPUS_LEGACY = Price.of(15.0, 75.0)
_OPUS = Price.of(5.0, 25.0)
_SONNET = Price.of(3.0, 15.0)

# Keys are matched as prefixes of the normalised name (see _normalise); longest wins.
_PRICES: dict[str, Price] = {
    # Any Opus 4.x newer than 4.1 is priced like 4.5; 4.0 and 4.1 override it below.
    "claude-opus-4": _OPUS,
    "claude-opus-4-0": _OPUS_LEGACY,
    "claude-opus-4-1": _OPUS_LEGACY,
    "claude-opus-4-5": _OPUS,
    "claude-opus-4-6": _OPUS,
    "claude-opus-4-7": _OPUS,
    "claude-sonnet-4": _SONNET,
    "claude-3-7-sonnet": _SONNET,
    "claude-haiku-4-5": Price.of(1.0, 5.0),
    "claude-3-5-haiku": Price.of(0.8, 4.0),
}

# The first Claude 4 releases had no minor version: "claude-opus-4-20250514" (or
# "claude-opus-4@20250514" on Vertex) is Opus 4.0, priced unlike the generic "claude-opus-4".
_UNVERSIONED = re.compile(r"^(claude-[a-z]+-\d+)(?=$|[-@]\d{8})")

_warned_unpriced: set[str] = set()


def _normalise(model: str) -> str:
    return _UNVERSIONED.sub(r"\1-0", model.strip().lower())


def price_for(model: str) -> Price | None:
    """The list price of ``model`` (dated and Vertex ``@`` names included), or None if unknown."""
    name = _normalise(model)
    best: str | None = None
    for prefix in _PRICES:
        if not name.startswith(prefix):
            continue
        # "claude-opus-4-1" must not claim a hypothetical "claude-opus-4-10".
        rest = name[len(prefix) :]
        if rest[:1].isdigit():
            continue
        if best is None or len(prefix) > len(best):
            best = prefix
    return None if best is None else _PRICES[best]


def _cost(model: str, usage: Usage) -> float:
    price = price_for(model)
    if price is None:
        if model not in _warned_unpriced:
            _warned_unpriced.add(model)
            logger.warning("no price known for model %r; its cost is reported as 0.0", model)
        return 0.0
    return price.cost(usage)


def _blocks_for(message: Message) -> tuple[_ApiRole, list[_Block]]:
    """The API role and content blocks one loomflow message turns into."""
    if message.role is Role.USER:
        # The API rejects empty text blocks, so an empty message contributes nothing.
        return "user", ([{"type": "text", "text": message.content}] if message.content else [])
    if message.role is Role.ASSISTANT:
        blocks: list[_Block] = []
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
            for call in message.tool_calls
        )
        return "assistant", blocks
    if message.role is Role.TOOL:
        if message.tool_call_id is None:
            raise ModelError("a tool message has no tool_call_id; the API cannot pair it")
        result: ToolResultBlockParam = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id,
            "content": message.content,
        }
        if message.is_error:
            result["is_error"] = True
        return "user", [cast(_Block, result)]
    raise ModelError(f"cannot send a {message.role.value!r} message in the conversation")


def _to_api_messages(messages: Sequence[Message]) -> tuple[str | None, list[MessageParam]]:
    """The ``system`` parameter and the alternating ``messages`` list for a transcript."""
    system = [m.content for m in messages if m.role is Role.SYSTEM and m.content]
    turns: list[tuple[_ApiRole, list[_Block]]] = []
    for message in messages:
        if message.role is Role.SYSTEM:
            continue
        role, blocks = _blocks_for(message)
        if not blocks:
            continue
        # The API wants strictly alternating roles, so same-role neighbours become one turn.
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    api_messages: list[MessageParam] = []
    for role, blocks in turns:
        if role == "user":
            # Tool results must open the turn that follows the tool_use turn.
            blocks = sorted(blocks, key=lambda block: block["type"] != "tool_result")
        api_messages.append(cast("MessageParam", {"role": role, "content": blocks}))
    return ("\n\n".join(system) or None), api_messages


def _to_api_tool(tool: ToolSpec) -> ToolParam:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}


def _describe(model: str, exc: anthropic.APIError) -> str:
    import anthropic

    status: int | None = getattr(exc, "status_code", None)
    detail = exc.message
    if isinstance(exc, anthropic.APIStatusError) and exc.api_message:
        detail = exc.api_message
    where = f"HTTP {status}" if status is not None else type(exc).__name__
    return f"Anthropic model {model!r} failed ({where}): {detail}"


class AnthropicModel:
    """A Claude model behind the Messages API, satisfying loomflow's ``Model`` protocol.

    The SDK client is built on the first call, so ``ANTHROPIC_API_KEY`` and
    ``ANTHROPIC_BASE_URL`` are read exactly as the SDK reads them and a missing key only
    fails when a request is made. Pass ``client`` to control retries, timeouts or headers.

    ``temperature`` is sent as an extra body field because SDK 2.x dropped the argument;
    API version 2026-10-21 (the SDK's default) rejects it with HTTP 400, which surfaces as
    a ``ModelError``, so leave it unset unless the client pins an older ``anthropic-version``.
    """

    def __init__(
        self,
        model: str = "claude-opus-4-7",
        *,
        client: anthropic.AsyncAnthropic | None = None,
        max_tokens: int = 4096,
        api_key: str | None = None,
        base_url: str | None = None,
        temperature: float | None = None,
    ) -> None:
        self.name = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._client = client
        self._owns_client = client is None
        self._api_key = api_key
        self._base_url = base_url

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        """The SDK client, created on first use from the constructor arguments and env."""
        if self._client is None:
            import anthropic

            kwargs: dict[str, Any] = {}
            if self._api_key is not None:
                kwargs["api_key"] = self._api_key
            if self._base_url is not None:
                kwargs["base_url"] = self._base_url
            self._client = anthropic.AsyncAnthropic(**kwargs)
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connections of a client this model created; a passed one is left open."""
        if self._owns_client and self._client is not None:
            await self._client.close()
            self._client = None

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        """Send the transcript and tools to Claude and return its turn with usage and cost."""
        import anthropic

        system, api_messages = _to_api_messages(messages)
        api_tools = [_to_api_tool(tool) for tool in tools]
        extra_body = {"temperature": self.temperature} if self.temperature is not None else None
        try:
            response = await self.client.messages.create(
                model=self.name,
                max_tokens=self.max_tokens,
                messages=api_messages,
                system=system if system is not None else anthropic.omit,
                tools=api_tools if api_tools else anthropic.omit,
                extra_body=extra_body,
            )
        except anthropic.APIError as exc:
            raise ModelError(_describe(self.name, exc)) from exc

        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in response.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, arguments=dict(block.input)))
            else:
                logger.debug("ignoring a %s block in %s's reply", block.type, self.name)

        api_usage = response.usage
        usage = Usage(
            input_tokens=api_usage.input_tokens,
            cached_input_tokens=api_usage.cache_read_input_tokens or 0,
            cache_write_tokens=api_usage.cache_creation_input_tokens or 0,
            output_tokens=api_usage.output_tokens,
        )
        usage = usage.model_copy(update={"cost_usd": _cost(self.name, usage)})
        return ModelResponse(
            message=Message.assistant("".join(texts), tool_calls=calls),
            usage=usage,
            stop_reason=response.stop_reason,
        )
