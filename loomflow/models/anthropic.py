"""Claude as a loomflow model, through the official ``anthropic`` SDK's Messages API.

The SDK takes about two seconds to import, so it is imported when a Claude model first
builds its client (or handles the SDK's errors), not with ``loomflow``.

What one call sends, beyond the transcript and the tools:

- **Prompt caching** (on by default): breakpoints on the last tool definition, on the
  system prompt and on the newest message's last block (three of the four the API
  allows). The transcript only grows between calls and is converted the same way every
  time, so each call's prefix is the previous call's and reads what it wrote, in this
  process or in the one that resumes it after a crash.
- **Effort** (``CallOptions.effort``): adaptive thinking plus ``output_config.effort``
  on the models that have them, a thinking budget on the older ones; see
  :meth:`AnthropicModel.complete`.
- **Structured output** (``CallOptions.output_schema``): ``output_config.format`` where
  the model supports it, a forced answer tool otherwise.

What each model accepts, and its list price, come from the tables of
:mod:`loomflow.models.catalog`; ``Price`` and ``price_for`` are importable from here too.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import orjson

if TYPE_CHECKING:
    import ssl

    import anthropic
    from anthropic.types import (
        CacheControlEphemeralParam,
        MessageParam,
        OutputConfigParam,
        ThinkingConfigParam,
        ToolChoiceParam,
        ToolParam,
        ToolResultBlockParam,
    )
    from anthropic.types import Message as ApiMessage

from loomflow.errors import ModelError
from loomflow.models.base import CallOptions, Effort, ModelResponse, ToolSpec, continues
from loomflow.models.catalog import Price, capabilities_for, price_for
from loomflow.schemas import (
    Message,
    RedactedThinkingBlock,
    Role,
    ThinkingBlock,
    ToolCall,
    Usage,
)

__all__ = ["AnthropicModel", "CacheLifetime", "Price", "price_for"]

logger = logging.getLogger("loomflow.models.anthropic")

_ApiRole = Literal["user", "assistant"]
# Loose block dicts: the SDK's content union is too wide to build field by field.
_Block = dict[str, Any]

CacheLifetime = Literal["5m", "1h"]
"""How long a prompt-cache entry lives: 5 minutes (writes cost 1.25x input) or 1 hour (2x)."""


_warned_unpriced: set[str] = set()


def _tls() -> ssl.SSLContext:
    """The TLS context of the SDK's HTTP client, made once per process for the
    certificates it trusts.

    The SDK's client makes its own when it is built: 15-20 ms of loading the CA bundle,
    paid by the first call of every model (every ``Agent`` made with a model's name),
    three quarters of that call's own cost against a local server (2026-12-06). The
    context is made as the client makes it (``httpx2.create_ssl_context``, which reads
    ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``), and made again when either changes.
    """
    return _tls_for(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_for(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """``httpx2.create_ssl_context()`` while ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``
    are ``cert_file`` and ``cert_dir`` (the arguments only key the cache)."""
    import httpx2

    return httpx2.create_ssl_context()


def _cost(model: str, usage: Usage, long_writes: int) -> float:
    price = price_for(model)
    if price is None:
        if model not in _warned_unpriced:
            _warned_unpriced.add(model)
            logger.warning("no price known for model %r; its cost is reported as 0.0", model)
        return 0.0
    return price.cost(usage, long_writes=long_writes)


# Thinking tokens per level: the budget of a budget model, and the room added to
# max_tokens on an adaptive one. MAX is the largest the model allows.
_THINKING_TOKENS = {Effort.LOW: 2_048, Effort.MEDIUM: 8_192, Effort.HIGH: 16_384}
_MIN_BUDGET = 1_024  # the API's smallest budget_tokens
# The SDK refuses a non-streaming request it expects to outlast ten minutes (above
# ~21k max_tokens, 8k on Opus 4.0/4.1); larger requests are streamed.
_STREAM_ABOVE_MAX_TOKENS = 8_192

_noted: set[tuple[str, str]] = set()


def _note_once(model: str, what: str, message: str, *args: object) -> None:
    """Log ``message`` the first time ``what`` happens for ``model`` in this process."""
    if (model, what) not in _noted:
        _noted.add((model, what))
        logger.warning(message, *args)


def _nearest(level: Effort, supported: Sequence[Effort]) -> Effort:
    """The supported level closest to ``level``; a tie goes to the lower one."""
    order = list(Effort)
    return min(supported, key=lambda s: (abs(order.index(s) - order.index(level)), order.index(s)))


# --- the transcript as API messages ------------------------------------------------------


def _thinking_param(block: ThinkingBlock | RedactedThinkingBlock) -> _Block:
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    return {"type": "redacted_thinking", "data": block.data}


def _blocks_for(message: Message) -> tuple[_ApiRole, list[_Block]]:
    """The API role and content blocks one loomflow message turns into."""
    if message.role is Role.USER:
        # The API rejects empty text blocks, so an empty message contributes nothing.
        return "user", ([{"type": "text", "text": message.content}] if message.content else [])
    if message.role is Role.ASSISTANT:
        # Thinking goes back first, unmodified and in its order, as the API requires.
        blocks = [_thinking_param(block) for block in message.thinking]
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


def _turn(role: _ApiRole, blocks: list[_Block]) -> MessageParam:
    if role == "user":
        # Tool results must open the turn that follows the tool_use turn.
        blocks = sorted(blocks, key=lambda block: block["type"] != "tool_result")
    else:
        blocks = list(blocks)
    return cast("MessageParam", {"role": role, "content": blocks})


class _Converter:
    """One transcript in the Messages API's form, extended as the transcript grows.

    The loop only ever appends to a transcript, so the messages converted by earlier
    calls are recognised by identity and only the new ones are converted: a call costs
    a pointer comparison per old message plus the work of the new ones. Any other
    change (a compacted or restored transcript) converts it again from the start.
    Every turn but the last is final; the last may still take same-role messages.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._seen: list[Message] = []
        self._system: list[str] = []
        self._roles: list[_ApiRole] = []
        self._blocks: list[list[_Block]] = []
        self._closed: list[MessageParam] = []  # every turn but the last, as sent

    def convert(self, messages: Sequence[Message]) -> tuple[str | None, list[MessageParam]]:
        """The ``system`` parameter and the alternating ``messages`` list for a transcript."""
        known = len(self._seen)
        if not continues(messages, self._seen):
            self._reset()
            known = 0
        try:
            for message in messages[known:]:
                self._add(message)
        except BaseException:
            self._reset()  # half a conversion is no base for the next call
            raise
        self._seen.extend(messages[known:])
        api_messages = list(self._closed)
        if self._blocks:
            api_messages.append(_turn(self._roles[-1], self._blocks[-1]))
        return ("\n\n".join(self._system) or None), api_messages

    def _add(self, message: Message) -> None:
        if message.role is Role.SYSTEM:
            if message.content:
                self._system.append(message.content)
            return
        role, blocks = _blocks_for(message)
        if not blocks:
            return
        # The API wants strictly alternating roles, so same-role neighbours become one turn.
        if self._roles and self._roles[-1] == role:
            self._blocks[-1].extend(blocks)
            return
        if self._roles:
            self._closed.append(_turn(self._roles[-1], self._blocks[-1]))
        self._roles.append(role)
        self._blocks.append(blocks)


def _to_api_tool(tool: ToolSpec) -> ToolParam:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}


def _with_breakpoint(content: list[_Block], cache: CacheControlEphemeralParam) -> list[_Block]:
    """``content`` with a cache breakpoint on its last block that may carry one."""
    for index in range(len(content) - 1, -1, -1):
        # Thinking blocks cannot be marked; they are never last in a turn anyway.
        if content[index]["type"] not in ("thinking", "redacted_thinking"):
            return [
                *content[:index],
                {**content[index], "cache_control": cache},
                *content[index + 1 :],
            ]
    return content


def _describe(model: str, exc: anthropic.APIError) -> str:
    import anthropic

    status: int | None = getattr(exc, "status_code", None)
    detail = exc.message
    if isinstance(exc, anthropic.APIStatusError) and exc.api_message:
        detail = exc.api_message
    where = f"HTTP {status}" if status is not None else type(exc).__name__
    return f"Anthropic model {model!r} failed ({where}): {detail}"


_ANSWER_TOOL_DESCRIPTION = (
    "Give your final answer through this tool, as its input, once you have it. "
    "Its input schema is the format the answer must have."
)
_MAX_TRANSCRIPTS = 16


class AnthropicModel:
    """A Claude model behind the Messages API, satisfying loomflow's ``Model`` protocol.

    The SDK client is built on the first call, so ``ANTHROPIC_API_KEY`` and
    ``ANTHROPIC_BASE_URL`` are read exactly as the SDK reads them and a missing key only
    fails when a request is made. Pass ``client`` to control retries, timeouts or headers.

    ``cache`` is the prompt cache's lifetime: ``"5m"`` (the default), ``"1h"`` for
    sessions that pause for longer (writes cost 2x input instead of 1.25x; reads 0.1x
    either way), or ``None`` to send no cache breakpoints.

    ``max_tokens`` is the room for the visible answer; an ``effort`` adds room for
    thinking on top of it (see :meth:`complete`).

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
        cache: CacheLifetime | None = "5m",
    ) -> None:
        if cache not in ("5m", "1h", None):
            raise ValueError(f"cache must be '5m', '1h' or None, not {cache!r}")
        self.name = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.cache: CacheLifetime | None = cache
        self._client = client
        self._owns_client = client is None
        self._api_key = api_key
        self._base_url = base_url
        self._capabilities = capabilities_for(model)
        # The converted form of the transcripts of recent calls, by their first message:
        # one model may serve several sessions at once.
        self._transcripts: OrderedDict[int, _Converter] = OrderedDict()

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
            # the SDK's own HTTP client, but for its TLS context: the process's (see _tls)
            kwargs["http_client"] = anthropic.DefaultAsyncHttpxClient(verify=_tls())
            self._client = anthropic.AsyncAnthropic(**kwargs)
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connections of a client this model created; a passed one is left open."""
        if self._owns_client and self._client is not None:
            await self._client.close()
            self._client = None

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        options: CallOptions | None = None,
    ) -> ModelResponse:
        """Send the transcript and tools to Claude and return its turn with usage and cost.

        ``options.on_delta`` makes the call stream (``messages.stream``) and receive each
        text delta as it arrives; the response is the one the same reply gives without
        streaming. The callback is awaited in line, so a slow one slows the reading of
        the stream (nothing is dropped); one that raises is logged (its first failure
        in a call, with the traceback) and the call carries on to the same response.
        Requests above 8,192 ``max_tokens`` stream too, as the SDK requires.

        ``options.effort`` maps to the model's parameters: on adaptive-thinking models
        (Opus 4.6+, Sonnet 4.6+) ``thinking: adaptive`` and ``output_config.effort``,
        with ``max_tokens`` raised by 2k/8k/16k tokens for low/medium/high and to the
        model's limit for max; on budget models (Opus 4.5 and older Claude 4, Haiku 4.5,
        Sonnet 3.7) ``thinking.budget_tokens`` of 2k/8k/16k or, for max, all the model's
        output limit leaves beside ``max_tokens`` (Opus 4.5 also gets
        ``output_config.effort``, at most high). A level the model lacks becomes the
        nearest one it has, and a model that cannot think ignores effort; either is
        logged once per model and level. The thinking blocks of the reply are kept on
        the message and sent back with it.

        ``options.output_schema`` uses ``output_config.format`` on models with
        structured outputs; on others the reply is forced through a tool named
        ``options.output_name`` (``tool_choice`` any, or that tool when it is the only
        one; auto while thinking, which forcing would refuse) and its input becomes the
        message text, as JSON. Either way the text is the JSON answer for the loop to
        validate.
        """
        import anthropic
        import httpx2

        options = options or CallOptions()
        request, answer_tool = self._request(messages, tools, options)
        unresolved = _unresolved()
        try:
            if options.on_delta is not None or request["max_tokens"] > _STREAM_ABOVE_MAX_TOKENS:
                reply = await self._stream(request, options.on_delta)
            else:
                reply = await self._create(request)
        except anthropic.APIError as exc:
            raise ModelError(_describe(self.name, exc)) from exc
        except httpx2.TransportError as exc:
            # A failed connection; the SDK of other versions lets one lost mid-stream out too.
            raise ModelError(_lost_while_streaming(self.name, exc)) from exc
        except unresolved as exc:
            # no credentials anywhere: the SDK says so with a TypeError from deep in its
            # request (or, with a profile named but not there, its CredentialsError)
            if isinstance(exc, TypeError) and "authentication method" not in str(exc):
                raise
            raise ModelError(
                f"Anthropic model {self.name!r} has no credentials: set ANTHROPIC_API_KEY "
                f"(or pass api_key= or client=). The SDK says: {exc}"
            ) from exc
        return self._response(reply, answer_tool)

    # -- the request ------------------------------------------------------------------------

    def _request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], options: CallOptions
    ) -> tuple[dict[str, Any], str | None]:
        """The keyword arguments of ``messages.create``/``stream``, and the name of the
        answer tool when structured output is forced through one."""
        system, api_messages = self._converter(messages).convert(messages)
        api_tools: list[ToolParam] = [_to_api_tool(tool) for tool in tools]
        request: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens}
        output_config: OutputConfigParam = {}
        thinking: ThinkingConfigParam | None = None
        if options.effort is not None:
            thinking, effort, request["max_tokens"] = self._effort(Effort(options.effort))
            if effort is not None:
                output_config["effort"] = effort.value
        answer_tool: str | None = None
        tool_choice: ToolChoiceParam | None = None
        if options.output_schema is not None:
            if self._capabilities.structured_outputs:
                output_config["format"] = {
                    "type": "json_schema",
                    "schema": _strict_schema(options.output_schema),
                }
            else:
                answer_tool = options.output_name
                tool_choice = self._answer_tool_choice(answer_tool, tools, thinking is not None)
                api_tools.append(
                    {
                        "name": answer_tool,
                        "description": _ANSWER_TOOL_DESCRIPTION,
                        "input_schema": options.output_schema,
                    }
                )

        cache = self._cache_control()
        if cache is not None:
            if api_tools:
                api_tools[-1] = {**api_tools[-1], "cache_control": cache}
            if api_messages:
                last = api_messages[-1]
                content = _with_breakpoint(cast(list[_Block], last["content"]), cache)
                api_messages[-1] = cast("MessageParam", {**last, "content": content})
        request["messages"] = api_messages
        if system is not None:
            request["system"] = (
                system
                if cache is None
                else [{"type": "text", "text": system, "cache_control": cache}]
            )
        if api_tools:
            request["tools"] = api_tools
        if tool_choice is not None:
            request["tool_choice"] = tool_choice
        if thinking is not None:
            request["thinking"] = thinking
        if output_config:
            request["output_config"] = output_config
        if self.temperature is not None:
            request["extra_body"] = {"temperature": self.temperature}
        return request, answer_tool

    def _converter(self, messages: Sequence[Message]) -> _Converter:
        key = id(messages[0]) if messages else 0
        converter = self._transcripts.pop(key, None) or _Converter()
        self._transcripts[key] = converter  # most recently used last
        if len(self._transcripts) > _MAX_TRANSCRIPTS:
            self._transcripts.popitem(last=False)
        return converter

    def _cache_control(self) -> CacheControlEphemeralParam | None:
        if self.cache is None:
            return None
        if self.cache == "1h":
            return {"type": "ephemeral", "ttl": "1h"}
        return {"type": "ephemeral"}

    def _effort(self, level: Effort) -> tuple[ThinkingConfigParam | None, Effort | None, int]:
        """The thinking parameter, the ``output_config.effort`` and the ``max_tokens`` of
        a call at ``level`` on this model."""
        capabilities = self._capabilities
        answer = self.max_tokens
        limit = capabilities.max_output
        if capabilities.thinking is None:
            _note_once(
                self.name,
                f"effort:{level.value}",
                "model %r has neither effort nor thinking parameters; effort %r is ignored",
                self.name,
                level.value,
            )
            return None, None, answer
        if capabilities.thinking == "adaptive":
            served = _nearest(level, capabilities.efforts)
            if served is not level:
                _note_once(
                    self.name,
                    f"effort:{level.value}",
                    "model %r has no effort %r; using %r, the nearest it has",
                    self.name,
                    level.value,
                    served.value,
                )
            room = limit if served is Effort.MAX else min(answer + _THINKING_TOKENS[served], limit)
            return {"type": "adaptive"}, served, max(answer, room)
        # A budget must be at least 1,024 and below max_tokens, which the model caps.
        wanted = limit - answer if level is Effort.MAX else _THINKING_TOKENS[level]
        budget = max(_MIN_BUDGET, min(wanted, limit - answer))
        max_tokens = min(budget + answer, limit)
        effort = _nearest(level, capabilities.efforts) if capabilities.efforts else None
        return {"type": "enabled", "budget_tokens": budget}, effort, max_tokens

    def _answer_tool_choice(
        self, name: str, tools: Sequence[ToolSpec], thinking: bool
    ) -> ToolChoiceParam:
        if any(tool.name == name for tool in tools):
            raise ModelError(
                f"the structured output's answer tool {name!r} clashes with a tool of that "
                "name; choose another output name"
            )
        if thinking:
            # The API refuses a forced tool while thinking: let the model choose.
            _note_once(
                self.name,
                "answer-tool-auto",
                "model %r has no structured outputs and cannot be forced to use the answer "
                "tool while thinking; the tool is offered, not forced",
                self.name,
            )
            return {"type": "auto"}
        if tools:
            return {"type": "any"}
        return {"type": "tool", "name": name}

    async def _create(self, request: dict[str, Any]) -> ApiMessage:
        """``messages.create(**request)``, with the body encoded here (see ``_post``)."""
        # below _STREAM_ABOVE_MAX_TOKENS the timeout ``create`` picks is the client's own
        body = await self.client.post(
            "/v1/messages", cast_to=bytes, content=_encoded(request, stream=False)
        )
        return _reply(self.name, body)

    async def _stream(
        self, request: dict[str, Any], on_delta: Callable[[str], Awaitable[None]] | None
    ) -> ApiMessage:
        failures = 0
        finished = False
        import anthropic
        from anthropic import AsyncStream
        from anthropic.lib.streaming import AsyncMessageStreamManager
        from anthropic.types import Message as ApiMessage
        from anthropic.types import RawMessageStreamEvent

        # ``messages.stream(**request)``, with the body encoded here (see ``_encoded``)
        events = self.client.post(
            "/v1/messages",
            cast_to=ApiMessage,
            content=_encoded(request, stream=True),
            stream=True,
            stream_cls=AsyncStream[RawMessageStreamEvent],
        )
        started = False
        try:
            async with AsyncMessageStreamManager(events) as stream:
                async for event in stream:
                    started = True
                    finished = event.type == "message_stop"
                    if on_delta is None or event.type != "content_block_delta":
                        continue
                    if event.delta.type != "text_delta":
                        continue
                    try:
                        await on_delta(event.delta.text)
                    except Exception:
                        failures += 1
                        if failures == 1:
                            logger.warning(
                                "on_delta raised while streaming %s; the call carries on",
                                self.name,
                                exc_info=True,
                            )
                reply = await stream.get_final_message()
        except anthropic.APIConnectionError as exc:
            if not started:
                raise  # no stream yet: a connection that failed, as for any call
            # the SDK (2.17.0 here) wraps a connection lost in the middle of a stream
            raise ModelError(_lost_while_streaming(self.name, exc.__cause__ or exc)) from exc
        if not finished:
            raise ModelError(
                f"Anthropic model {self.name!r} failed: its stream ended before message_stop"
            )
        if failures > 1:
            logger.warning("on_delta raised %d times in one call to %s", failures, self.name)
        return reply

    # -- the response ----------------------------------------------------------------------

    def _response(self, reply: ApiMessage, answer_tool: str | None) -> ModelResponse:
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[ThinkingBlock | RedactedThinkingBlock] = []
        answer: str | None = None
        for block in reply.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                if block.name == answer_tool and answer is None:
                    answer = json.dumps(block.input, ensure_ascii=False)
                else:
                    calls.append(
                        ToolCall(id=block.id, name=block.name, arguments=dict(block.input))
                    )
            elif block.type == "thinking":
                thinking.append(
                    ThinkingBlock(
                        type="thinking", thinking=block.thinking, signature=block.signature
                    )
                )
            elif block.type == "redacted_thinking":
                thinking.append(RedactedThinkingBlock(type="redacted_thinking", data=block.data))
            else:
                logger.debug("ignoring a %s block in %s's reply", block.type, self.name)
        stop_reason = reply.stop_reason
        if answer is not None and not calls and stop_reason == "tool_use":
            stop_reason = "end_turn"  # the answer tool is ours, not a call to run

        api_usage = reply.usage
        usage = Usage(
            input_tokens=api_usage.input_tokens,
            cached_input_tokens=api_usage.cache_read_input_tokens or 0,
            cache_write_tokens=api_usage.cache_creation_input_tokens or 0,
            output_tokens=api_usage.output_tokens,
        )
        if api_usage.cache_creation is not None:
            long_writes = api_usage.cache_creation.ephemeral_1h_input_tokens
        else:
            long_writes = usage.cache_write_tokens if self.cache == "1h" else 0
        usage = usage.model_copy(update={"cost_usd": _cost(self.name, usage, long_writes)})
        return ModelResponse(
            message=Message.assistant(
                "".join(texts) if answer is None else answer, tool_calls=calls, thinking=thinking
            ),
            usage=usage,
            stop_reason=stop_reason,
        )


@functools.cache
def _unresolved() -> tuple[type[Exception], ...]:
    """What the SDK raises when it finds no credentials: a TypeError from deep in its
    request, or, for a profile named but not there, CredentialsError (newer SDKs)."""
    import anthropic

    error = getattr(anthropic, "CredentialsError", None)
    if isinstance(error, type) and issubclass(error, Exception):
        return (TypeError, error)
    return (TypeError,)


def _reply(model: str, body: bytes) -> ApiMessage:
    """The SDK's ``Message`` of a reply's JSON body, as ``create`` returns it.

    ``create`` builds it with the SDK's lenient construction, which walks every field in
    Python: ~190 µs a reply, two replies a user turn. pydantic validates the same body
    into the same model in ~30 µs. A reply it refuses (a content block newer than this
    SDK, say) is built the SDK's way, so nothing the SDK takes is refused here; a body
    that is no JSON object is a ModelError (the SDK would hand back its text).
    """
    from anthropic.types import Message as ApiMessage
    from pydantic import ValidationError

    try:
        return ApiMessage.model_validate_json(body)
    except ValidationError:
        pass
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ModelError(
            f"Anthropic model {model!r} failed: its reply is not a JSON object: {body[:200]!r}"
        )
    return ApiMessage.construct(**data)


def _encoded(request: dict[str, Any], *, stream: bool) -> bytes:
    """The JSON body of ``messages.create``/``stream(**request)``.

    Encoded here because the SDK prepares a body by copying every container in it, in
    Python, and then encodes it with the ``json`` module. The Messages API takes the whole
    transcript on every call, so that grows with the session: ~30 ms a call for a
    transcript of 200 user turns (~320 KB), where orjson encodes the same bytes in 0.5 ms.
    The SDK's documented ``post`` with ``content`` sends them as they are, with the
    client's headers, retries, timeout and errors, and parses the reply as ``create`` and
    ``stream`` do.
    """
    body = dict(request)
    body.update(body.pop("extra_body", None) or {})
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def _strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` in the form ``output_config.format`` takes (the SDK's transform: closed
    objects, unsupported keywords moved into descriptions)."""
    import anthropic

    try:
        return anthropic.transform_schema(schema)
    except (ValueError, TypeError) as exc:
        raise ModelError(f"the output schema cannot be sent as a structured output: {exc}") from exc


def _lost_while_streaming(name: str, exc: BaseException) -> str:
    """A call's error when its connection was lost in the middle of the reply's stream."""
    return (
        f"Anthropic model {name!r} failed (connection lost while streaming, "
        f"{type(exc).__name__}): {exc}"
    )
