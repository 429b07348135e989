"""The Anthropic adapter against a local fake of the Messages API (no SDK mocking)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pydantic import BaseModel, Field

from loomflow.errors import ModelError
from loomflow.models import anthropic as claude
from loomflow.models.anthropic import AnthropicModel, CacheLifetime, Price, price_for
from loomflow.models.base import CallOptions, Effort, ToolSpec
from loomflow.schemas import Message, RedactedThinkingBlock, Role, ThinkingBlock, ToolCall, Usage
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    Responder,
    error_response,
    redacted_thinking_block,
    scripted_responder,
    text_response,
    thinking_block,
    tool_use_response,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

EPH = {"type": "ephemeral"}  # a 5-minute cache breakpoint

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


@pytest.fixture(autouse=True)
def hermetic_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep the developer's Anthropic credentials, profiles and base URL out of the tests."""
    for key in list(os.environ):
        if key.startswith("ANTHROPIC_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "anthropic-config"))


@pytest.fixture
def server() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(lambda body: text_response("hello")) as fake:
        yield fake


@pytest.fixture
async def clients() -> AsyncIterator[list[AnthropicModel]]:
    """Models registered here get their HTTP connections closed after the test."""
    made: list[AnthropicModel] = []
    yield made
    for model in made:
        await model.aclose()


def model_for(
    server: FakeAnthropicServer,
    clients: list[AnthropicModel],
    name: str = "claude-opus-4-7",
    **kwargs: Any,
) -> AnthropicModel:
    model = AnthropicModel(name, api_key="test-key", base_url=server.url, **kwargs)
    clients.append(model)
    return model


def respond_with(server: FakeAnthropicServer, responder: Responder) -> None:
    server.responder = responder


async def test_text_reply(server: FakeAnthropicServer, clients: list[AnthropicModel]) -> None:
    model = model_for(server, clients)

    response = await model.complete([Message.user("hi")], [])

    assert model.name == "claude-opus-4-7"
    assert response.message == Message.assistant("hello")
    assert response.stop_reason == "end_turn"
    assert server.requests == [
        {
            "model": "claude-opus-4-7",
            "max_tokens": 4096,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPH}]}
            ],
        }
    ]


async def test_a_reply_holding_a_block_newer_than_the_sdk_is_read_as_the_sdk_reads_it(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    # the reply is validated by pydantic, which refuses a block type the SDK does not know;
    # the SDK's lenient construction takes it, so the call must too
    reply = tool_use_response("get_weather", {"city": "Oslo"}, id="toolu_1", text="Checking.")
    reply["content"].insert(1, {"type": "block_of_2027", "payload": {"n": 1}})
    respond_with(server, lambda body: reply)
    model = model_for(server, clients)

    response = await model.complete([Message.user("Weather in Oslo?")], [WEATHER])

    call = ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Oslo"})
    assert response.message == Message.assistant("Checking.", tool_calls=[call])
    assert response.usage.input_tokens == 10


def test_a_reply_that_is_no_json_object_is_a_model_error() -> None:
    from loomflow.models.anthropic import _reply

    for body in (b"<html>502 Bad Gateway</html>", b"[1, 2]"):
        with pytest.raises(ModelError, match="not a JSON object"):
            _reply("claude-opus-4-7", body)


async def test_tool_use_round_trip(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    respond_with(
        server,
        scripted_responder(
            [
                tool_use_response("get_weather", {"city": "Oslo"}, id="toolu_1", text="Checking."),
                text_response("Cold in Oslo, and Bergen is unknown."),
            ]
        ),
    )
    model = AnthropicModel("claude-sonnet-4-6", api_key="k", base_url=server.url, max_tokens=512)
    clients.append(model)
    transcript = [
        Message.system("You are terse."),
        Message.system("Use tools for facts."),
        Message.user("Weather in Oslo and Bergen?"),
    ]

    first = await model.complete(transcript, [WEATHER])

    call = ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Oslo"})
    assert first.message == Message.assistant("Checking.", tool_calls=[call])
    assert first.stop_reason == "tool_use"

    transcript += [
        Message.assistant(
            "Checking.",
            tool_calls=[call, ToolCall(id="toolu_2", name="get_weather", arguments={})],
        ),
        Message.tool("toolu_1", "-3C"),
        Message.tool("toolu_2", "missing city", is_error=True),
        Message.user("Be brief."),
    ]
    second = await model.complete(transcript, [WEATHER])

    assert second.message == Message.assistant("Cold in Oslo, and Bergen is unknown.")
    assert server.requests[1] == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 512,
        "system": [
            {"type": "text", "text": "You are terse.\n\nUse tools for facts.", "cache_control": EPH}
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "input_schema": WEATHER.input_schema,
                "cache_control": EPH,
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Weather in Oslo and Bergen?"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "missing city",
                        "is_error": True,
                    },
                    {"type": "text", "text": "Be brief.", "cache_control": EPH},
                ],
            },
        ],
    }


async def test_same_role_messages_merge_with_tool_results_first(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    call = ToolCall(id="toolu_9", name="get_weather", arguments={"city": "Rome"})
    transcript = [
        Message.user("one"),
        Message.user("two"),
        Message.assistant(tool_calls=[call]),
        Message.user("interjection"),
        Message.tool("toolu_9", "20C"),
    ]

    await model_for(server, clients, cache=None).complete(transcript, [])

    assert server.requests[0]["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_9",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_9", "content": "20C"},
                {"type": "text", "text": "interjection"},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("name", "expected_cost"),
    [
        # (1000*5 + 2000*0.5 + 400*6.25 + 500*25) / 1e6
        ("claude-opus-4-7", 0.021),
        # (1000*3 + 2000*0.3 + 400*3.75 + 500*15) / 1e6
        pytest.param(
            "claude-sonnet-4-5-20250929",
            0.0126,
            # The SDK warns that Sonnet 4.5 is deprecated; the price still applies.
            marks=pytest.mark.filterwarnings("ignore:The model:DeprecationWarning"),
        ),
    ],
)
async def test_usage_and_cost_with_cache_tokens(
    server: FakeAnthropicServer, clients: list[AnthropicModel], name: str, expected_cost: float
) -> None:
    respond_with(
        server,
        lambda body: text_response(
            "ok", input_tokens=1000, output_tokens=500, cache_read=2000, cache_write=400
        ),
    )

    response = await model_for(server, clients, name).complete([Message.user("hi")], [])

    usage = response.usage
    assert (usage.input_tokens, usage.cached_input_tokens) == (1000, 2000)
    assert (usage.cache_write_tokens, usage.output_tokens) == (400, 500)
    assert usage.cost_usd == pytest.approx(expected_cost)


async def test_unknown_model_costs_nothing_and_warns_once(
    server: FakeAnthropicServer, clients: list[AnthropicModel], caplog: pytest.LogCaptureFixture
) -> None:
    model = model_for(server, clients, "my-finetune-unpriced")

    with caplog.at_level(logging.WARNING, logger="loomflow.models.anthropic"):
        first = await model.complete([Message.user("hi")], [])
        second = await model.complete([Message.user("hi again")], [])

    assert first.usage.cost_usd == second.usage.cost_usd == 0.0
    assert first.usage.input_tokens == 10
    warnings = [r for r in caplog.records if "my-finetune-unpriced" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize(
    ("name", "per_million"),
    [
        ("claude-opus-4-7", (5.0, 25.0)),
        ("claude-opus-4-6", (5.0, 25.0)),
        ("claude-opus-4-5-20251101", (5.0, 25.0)),
        ("claude-opus-4-8", (5.0, 25.0)),
        ("claude-opus-4-10", (5.0, 25.0)),  # newer than 4.1, not 4.1 with a suffix
        ("claude-opus-4-1", (15.0, 75.0)),
        ("claude-opus-4-1-20250805", (15.0, 75.0)),
        ("claude-opus-4-0", (15.0, 75.0)),
        ("claude-opus-4-20250514", (15.0, 75.0)),
        ("claude-opus-4@20250514", (15.0, 75.0)),
        ("claude-sonnet-4-5-20250929", (3.0, 15.0)),
        ("claude-sonnet-4-20250514", (3.0, 15.0)),
        ("claude-3-7-sonnet-latest", (3.0, 15.0)),
        ("claude-haiku-4-5", (1.0, 5.0)),
        ("claude-3-5-haiku-20241022", (0.8, 4.0)),
    ],
)
def test_price_table(name: str, per_million: tuple[float, float]) -> None:
    price = price_for(name)

    assert price is not None
    assert (price.input, price.output) == per_million
    assert price.cache_read == pytest.approx(per_million[0] * 0.1)
    assert price.cache_write == pytest.approx(per_million[0] * 1.25)


@pytest.mark.parametrize("name", ["gpt-4o", "claude-2.1", "claude-opus-5", "opus-4-7"])
def test_price_unknown(name: str) -> None:
    assert price_for(name) is None


def test_price_cost_of_usage() -> None:
    usage = Usage(input_tokens=10, cached_input_tokens=20, cache_write_tokens=4, output_tokens=3)

    assert Price.of(5.0, 25.0).cost(usage) == pytest.approx((50 + 10 + 25 + 75) / 1e6)


async def test_env_vars_are_honoured_when_no_args_given(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = AnthropicModel()  # no key anywhere yet: constructing must not fail
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")

    try:
        response = await model.complete([Message.user("hi")], [])
    finally:
        await model.aclose()

    assert response.message.content == "hello"
    # SDK 2.x sends the API key as a bearer token, not as ``x-api-key``.
    assert server.headers[0]["authorization"] == "Bearer env-key"
    assert "anthropic-version" in server.headers[0]


async def test_no_api_key_anywhere_is_a_model_error_that_says_which_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = AnthropicModel()  # no key, and a profile directory with no profile in it
    with pytest.raises(ModelError, match="has no credentials: set ANTHROPIC_API_KEY"):
        await model.complete([Message.user("hi")], [])
    await model.aclose()
    monkeypatch.delenv("ANTHROPIC_CONFIG_DIR")  # and none at all, as on a new machine
    monkeypatch.setenv("HOME", "/nonexistent")
    model = AnthropicModel()
    with pytest.raises(ModelError, match="has no credentials: set ANTHROPIC_API_KEY") as no:
        await model.complete([Message.user("hi")], [])
    assert "authentication method" in str(no.value)  # the SDK's own words, after ours
    await model.aclose()


def _system_bundle_copied_to(path: Path) -> Path:
    import certifi  # httpx's, a dependency of the tests

    path.write_bytes(Path(certifi.where()).read_bytes())
    return path


async def test_the_models_of_a_process_load_the_trusted_certificates_once(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Building the SDK's client loaded the CA bundle (15-20 ms) for every model, so
    the first call of every Agent made with a model's name paid it; the models of a
    process now share one TLS context, made again when SSL_CERT_FILE or SSL_CERT_DIR
    changes, and the client is otherwise the SDK's own."""
    loads: list[tuple[Any, ...]] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or tuple(kwargs.values()))
        load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    claude._tls_for.cache_clear()
    models = [AnthropicModel(api_key="test-key", base_url=server.url) for _ in range(3)]
    bundle = _system_bundle_copied_to(tmp_path / "ca.pem")
    try:
        clients = [model.client for model in models]
        assert len(loads) == 1
        replies = [await model.complete([Message.user("hi")], []) for model in models]
        assert [r.message.content for r in replies] == ["hello"] * 3
        # another CA bundle: a context of its own, trusting that one
        monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
        models.append(AnthropicModel(api_key="test-key", base_url=server.url))
        assert models[-1].client is not None
        assert len(loads) == 2 and str(bundle) in map(str, loads[-1])
        plain = anthropic.AsyncAnthropic(api_key="test-key")
        assert clients[0].timeout == plain.timeout
        assert clients[0].max_retries == plain.max_retries
        await plain.close()
    finally:
        for model in models:
            await model.aclose()


async def test_bad_request_becomes_model_error(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    respond_with(
        server,
        lambda body: error_response(400, "invalid_request_error", "messages: roles must alternate"),
    )

    with pytest.raises(ModelError) as caught:
        await model_for(server, clients).complete([Message.user("hi")], [])

    message = str(caught.value)
    assert "claude-opus-4-7" in message
    assert "400" in message
    assert "messages: roles must alternate" in message
    assert isinstance(caught.value.__cause__, anthropic.BadRequestError)
    assert len(server.requests) == 1  # 400 is not retried


async def test_overloaded_after_sdk_retries_becomes_model_error(
    server: FakeAnthropicServer,
) -> None:
    respond_with(
        server,
        # retry-after-ms keeps the SDK's backoff to a millisecond.
        lambda body: error_response(
            529, "overloaded_error", "Overloaded", headers={"retry-after-ms": "1"}
        ),
    )
    client = anthropic.AsyncAnthropic(api_key="k", base_url=server.url, max_retries=1)
    model = AnthropicModel("claude-haiku-4-5", client=client)

    try:
        with pytest.raises(ModelError, match=r"claude-haiku-4-5.*529.*Overloaded") as caught:
            await model.complete([Message.user("hi")], [])
    finally:
        await client.close()

    assert isinstance(caught.value.__cause__, anthropic.APIStatusError)
    assert len(server.requests) == 2


async def test_connection_error_becomes_model_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    client = anthropic.AsyncAnthropic(
        api_key="k", base_url=f"http://127.0.0.1:{closed_port}", max_retries=0
    )

    try:
        with pytest.raises(ModelError, match="claude-opus-4-7") as caught:
            await AnthropicModel(client=client).complete([Message.user("hi")], [])
    finally:
        await client.close()

    assert isinstance(caught.value.__cause__, anthropic.APIConnectionError)


async def test_held_request_completes_after_release(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    server.hold(lambda body: body["messages"][-1]["content"][0]["text"] == "wait")
    model = model_for(server, clients)

    pending = asyncio.create_task(model.complete([Message.user("wait")], []))
    await asyncio.to_thread(server.wait_for_requests, 1, 5.0)
    assert not pending.done()
    quick = await model.complete([Message.user("go")], [])
    server.release()

    assert quick.message.content == "hello"
    assert (await asyncio.wait_for(pending, 5.0)).message.content == "hello"


async def test_standalone_fake_server_process(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                tool_use_response("get_weather", {"city": "Oslo"}, id="toolu_1"),
                text_response("done"),
            ]
        )
    )
    port_file, log = tmp_path / "port", tmp_path / "requests.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "tests.support.fake_anthropic", "--script", str(script)],
        *["--port-file", str(port_file), "--log", str(log)],
        cwd=REPO_ROOT,
    )
    try:
        deadline = time.monotonic() + 5.0
        # The port file appears only once the server listens (it is written atomically).
        while not port_file.exists():
            assert proc.returncode is None, "fake server exited early"
            assert time.monotonic() < deadline, "fake server did not report its port"
            await asyncio.sleep(0.02)
        model = AnthropicModel(
            api_key="k", base_url=f"http://127.0.0.1:{port_file.read_text().strip()}"
        )
        try:
            first = await model.complete([Message.user("hi")], [WEATHER])
            call = first.message.tool_calls[0]
            second = await model.complete(
                [Message.user("hi"), first.message, Message.tool(call.id, "-3C")], [WEATHER]
            )
        finally:
            await model.aclose()
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 5.0) == 0

    assert call == ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Oslo"})
    assert second.message.content == "done"
    logged: list[dict[str, Any]] = [json.loads(line) for line in log.read_text().splitlines()]
    assert [len(body["messages"]) for body in logged] == [1, 3]


async def test_temperature_is_sent_only_when_set(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    warm = AnthropicModel(api_key="k", base_url=server.url, temperature=0.2)
    clients.append(warm)

    await warm.complete([Message.user("hi")], [])
    await model_for(server, clients).complete([Message.user("hi")], [])

    assert server.requests[0]["temperature"] == 0.2
    assert "temperature" not in server.requests[1]


# --- streaming ------------------------------------------------------------------------


THOUGHT = thinking_block("The user wants the weather; I should call the tool.", "c2lnbmF0dXJl")
REDACTED = redacted_thinking_block("RW5jcnlwdGVkIHRob3VnaHQ=")

REPLIES = {
    "text": text_response("It is cold in Oslo, about minus three.", output_tokens=12),
    "tool use": tool_use_response(
        "get_weather",
        {"city": "Oslo", "units": ["C", "F"], "detail": {"hourly": True}},
        id="toolu_1",
        text="Checking the weather.",
        thinking=[THOUGHT, REDACTED],
    ),
    "tool use without input": tool_use_response("get_weather", {}, id="toolu_2"),
    "cached": text_response(
        "From the cache.", input_tokens=3, cache_read=2000, cache_write=500, cache_write_1h=200
    ),
}


@pytest.mark.parametrize("reply", REPLIES.values(), ids=list(REPLIES))
async def test_streaming_returns_what_the_plain_call_returns(
    server: FakeAnthropicServer, clients: list[AnthropicModel], reply: dict[str, Any]
) -> None:
    respond_with(server, lambda body: reply)
    model = model_for(server, clients)
    transcript = [Message.system("Be brief."), Message.user("Weather in Oslo?")]
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    plain = await model.complete(transcript, [WEATHER])
    streamed = await model.complete(transcript, [WEATHER], options=CallOptions(on_delta=on_delta))

    assert streamed == plain
    text = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
    assert "".join(deltas) == text
    assert len(deltas) == len(text.split())  # one delta per word the server sent
    first, second = server.requests
    assert second == {**first, "stream": True}


async def test_deltas_reach_the_callback_while_the_reply_streams(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    respond_with(server, lambda body: text_response("one two three"))
    gate = threading.Event()
    server.gate_stream(gate)
    seen: list[str] = []

    async def on_delta(text: str) -> None:
        seen.append(text)
        gate.set()  # the server holds the rest of the stream until the first delta is here

    response = await model_for(server, clients).complete(
        [Message.user("count")], [], options=CallOptions(on_delta=on_delta)
    )

    assert server.gate_results == [True]
    assert seen == ["one ", "two ", "three"]
    assert response.message.content == "one two three"


async def test_a_failing_on_delta_is_logged_and_the_call_completes(
    server: FakeAnthropicServer, clients: list[AnthropicModel], caplog: pytest.LogCaptureFixture
) -> None:
    respond_with(server, lambda body: text_response("one two three"))
    model = model_for(server, clients)
    calls = 0

    async def broken(text: str) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("the UI went away")

    with caplog.at_level(logging.WARNING, logger="loomflow.models.anthropic"):
        streamed = await model.complete(
            [Message.user("count")], [], options=CallOptions(on_delta=broken)
        )
    plain = await model.complete([Message.user("count")], [])

    assert streamed == plain
    assert calls == 3  # it was called for every delta all the same
    records = [r for r in caplog.records if "on_delta" in r.getMessage()]
    assert records[0].exc_info is not None and "the UI went away" in str(records[0].exc_info[1])
    assert "3 times" in records[-1].getMessage()
    assert len(records) == 2


async def test_requests_too_long_for_a_plain_call_stream(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    model = model_for(server, clients, max_tokens=32_000)

    response = await model.complete([Message.user("write a book")], [])

    assert response.message.content == "hello"
    assert server.requests[0]["stream"] is True


async def test_an_error_status_on_a_stream_is_a_model_error(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    respond_with(server, lambda body: error_response(400, "invalid_request_error", "bad thing"))

    with pytest.raises(ModelError, match=r"400.*bad thing"):
        await model_for(server, clients).complete(
            [Message.user("hi")], [], options=CallOptions(on_delta=_ignore)
        )


async def _ignore(text: str) -> None:
    return None


# --- thinking and effort -----------------------------------------------------------------


async def test_thinking_blocks_are_kept_and_sent_back_first_and_unmodified(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    respond_with(server, lambda body: REPLIES["tool use"])
    model = model_for(server, clients, cache=None)
    transcript = [Message.user("Weather in Oslo?")]

    first = await model.complete(transcript, [WEATHER], options=CallOptions(effort=Effort.HIGH))

    assert first.message.thinking == [
        ThinkingBlock(type="thinking", thinking=THOUGHT["thinking"], signature="c2lnbmF0dXJl"),
        RedactedThinkingBlock(type="redacted_thinking", data=REDACTED["data"]),
    ]
    # through the log and back, as a resumed run reads it
    stored = Message.model_validate_json(first.message.model_dump_json(exclude_defaults=True))
    transcript += [stored, Message.tool("toolu_1", "-3C")]
    await model.complete(transcript, [WEATHER], options=CallOptions(effort=Effort.HIGH))

    sent_back = server.requests[1]["messages"][1]
    assert sent_back == {"role": "assistant", "content": REPLIES["tool use"]["content"]}


@pytest.mark.parametrize(
    ("name", "effort", "max_tokens", "thinking", "level", "sent_max_tokens"),
    [
        # adaptive thinking, depth by output_config.effort, room for thinking added
        ("claude-opus-4-7", Effort.LOW, 4096, {"type": "adaptive"}, "low", 4096 + 2048),
        ("claude-opus-4-7", Effort.MEDIUM, 4096, {"type": "adaptive"}, "medium", 4096 + 8192),
        ("claude-opus-4-6", Effort.HIGH, 4096, {"type": "adaptive"}, "high", 4096 + 16384),
        ("claude-opus-4-7", Effort.MAX, 4096, {"type": "adaptive"}, "max", 128_000),
        ("claude-sonnet-4-6", Effort.MAX, 4096, {"type": "adaptive"}, "max", 64_000),
        ("claude-haiku-5-5", Effort.MAX, 4096, {"type": "adaptive"}, "high", 4096 + 16384),
        # a thinking budget, below max_tokens, which the model's output limit caps
        (
            "claude-sonnet-4-5",
            Effort.MEDIUM,
            4096,
            {"type": "enabled", "budget_tokens": 8192},
            None,
            4096 + 8192,
        ),
        (
            "claude-haiku-4-5",
            Effort.LOW,
            4096,
            {"type": "enabled", "budget_tokens": 2048},
            None,
            6144,
        ),
        pytest.param(
            "claude-opus-4-5",
            Effort.MAX,
            4096,
            {"type": "enabled", "budget_tokens": 64_000 - 4096},
            "high",
            64_000,
            # the SDK warns that Opus 4.5 is deprecated; it still takes requests
            marks=pytest.mark.filterwarnings("ignore:The model:DeprecationWarning"),
        ),
        (
            "claude-opus-4-1-20250805",
            Effort.MAX,
            4096,
            {"type": "enabled", "budget_tokens": 32_000 - 4096},
            None,
            32_000,
        ),
        (
            "claude-sonnet-4-5",
            Effort.HIGH,
            63_000,
            {"type": "enabled", "budget_tokens": 1024},
            None,
            64_000,
        ),
        # no thinking at all
        ("claude-3-5-haiku-20241022", Effort.HIGH, 4096, None, None, 4096),
    ],
)
async def test_effort_becomes_the_models_thinking_parameters(
    server: FakeAnthropicServer,
    clients: list[AnthropicModel],
    name: str,
    effort: Effort,
    max_tokens: int,
    thinking: dict[str, Any] | None,
    level: str | None,
    sent_max_tokens: int,
) -> None:
    model = model_for(server, clients, name, max_tokens=max_tokens)

    await model.complete([Message.user("think")], [], options=CallOptions(effort=effort))

    body = server.requests[0]
    assert body.get("thinking") == thinking
    assert body.get("output_config", {}).get("effort") == level
    assert body["max_tokens"] == sent_max_tokens
    if thinking is not None and thinking["type"] == "enabled":
        assert 1024 <= thinking["budget_tokens"] < body["max_tokens"]


async def test_a_level_a_model_lacks_is_noted_once_per_model_and_level(
    server: FakeAnthropicServer, clients: list[AnthropicModel], caplog: pytest.LogCaptureFixture
) -> None:
    haiku = model_for(server, clients, "claude-haiku-5-5-test-notes")
    old = model_for(server, clients, "claude-3-5-haiku-test-notes")

    with caplog.at_level(logging.WARNING, logger="loomflow.models.anthropic"):
        for _ in range(2):
            await haiku.complete([Message.user("x")], [], options=CallOptions(effort=Effort.MAX))
            await old.complete([Message.user("x")], [], options=CallOptions(effort=Effort.LOW))
            await old.complete([Message.user("x")], [], options=CallOptions(effort=Effort.HIGH))

    notes = [r.getMessage() for r in caplog.records if "effort" in r.getMessage()]
    assert notes == [
        "model 'claude-haiku-5-5-test-notes' has no effort 'max'; using 'high', the nearest it has",
        "model 'claude-3-5-haiku-test-notes' has neither effort nor thinking parameters; "
        "effort 'low' is ignored",
        "model 'claude-3-5-haiku-test-notes' has neither effort nor thinking parameters; "
        "effort 'high' is ignored",
    ]


async def test_no_effort_sends_no_thinking(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    await model_for(server, clients).complete([Message.user("x")], [], options=CallOptions())

    assert not {"thinking", "output_config", "tool_choice"} & set(server.requests[0])


# --- structured output -------------------------------------------------------------------


class Forecast(BaseModel):
    city: str
    celsius: float = Field(description="temperature", ge=-90)
    tags: list[str] = []


ANSWER = {"city": "Oslo", "celsius": -3.0, "tags": ["cold"]}


async def test_structured_output_uses_output_config_format(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    respond_with(server, lambda body: text_response(json.dumps(ANSWER)))
    schema = Forecast.model_json_schema()

    response = await model_for(server, clients).complete(
        [Message.user("Weather in Oslo?")],
        [WEATHER],
        options=CallOptions(output_schema=schema, effort=Effort.LOW),
    )

    assert Forecast.model_validate_json(response.message.content) == Forecast(**ANSWER)
    body = server.requests[0]
    assert body["output_config"] == {
        "effort": "low",
        "format": {"type": "json_schema", "schema": anthropic.transform_schema(schema)},
    }
    assert body["output_config"]["format"]["schema"]["additionalProperties"] is False
    assert "tool_choice" not in body
    assert [tool["name"] for tool in body["tools"]] == ["get_weather"]


@pytest.mark.parametrize(
    ("tools", "effort", "choice"),
    [
        ([WEATHER], None, {"type": "any"}),  # a real tool or the answer, nothing else
        ([], None, {"type": "tool", "name": "forecast"}),
        ([WEATHER], Effort.HIGH, {"type": "auto"}),  # thinking refuses a forced tool
    ],
)
async def test_structured_output_without_native_support_forces_an_answer_tool(
    server: FakeAnthropicServer,
    clients: list[AnthropicModel],
    tools: list[ToolSpec],
    effort: Effort | None,
    choice: dict[str, Any],
) -> None:
    respond_with(
        server,
        lambda body: tool_use_response("forecast", ANSWER, text="Here it is:", thinking=[THOUGHT]),
    )
    schema = Forecast.model_json_schema()
    model = model_for(server, clients, "claude-opus-4-1-20250805")

    response = await model.complete(
        [Message.user("Weather in Oslo?")],
        tools,
        options=CallOptions(output_schema=schema, output_name="forecast", effort=effort),
    )

    assert json.loads(response.message.content) == ANSWER
    assert response.message.tool_calls == []
    assert response.stop_reason == "end_turn"
    body = server.requests[0]
    assert body["tool_choice"] == choice
    assert body["tools"][-1] == {
        "name": "forecast",
        "description": body["tools"][-1]["description"],
        "input_schema": schema,
        "cache_control": EPH,
    }
    assert "output_config" not in body


async def test_answer_tool_may_not_shadow_a_tool(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    model = model_for(server, clients, "claude-3-7-sonnet-latest")

    with pytest.raises(ModelError, match="get_weather"):
        await model.complete(
            [Message.user("x")],
            [WEATHER],
            options=CallOptions(output_schema={"type": "object"}, output_name="get_weather"),
        )
    assert server.requests == []


# --- prompt caching ----------------------------------------------------------------------


def breakpoints(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Where a request body carries cache_control, in prefix order."""
    found = [("tools", t["cache_control"]) for t in body.get("tools", []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += [("system", b["cache_control"]) for b in system if "cache_control" in b]
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(message["content"]):
            if "cache_control" in block:
                found.append((f"messages[{i}][{j}]", block["cache_control"]))
    return found


LONG_TRANSCRIPT = [
    Message.system("You are terse."),
    Message.user("Weather in Oslo?"),
    Message.assistant(
        tool_calls=[ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Oslo"})],
        thinking=[ThinkingBlock(type="thinking", thinking="t", signature="s")],
    ),
    Message.tool("toolu_1", "-3C"),
]


@pytest.mark.parametrize(
    ("cache", "control"),
    [("5m", {"type": "ephemeral"}), ("1h", {"type": "ephemeral", "ttl": "1h"})],
)
async def test_breakpoints_on_tools_system_and_the_newest_message(
    server: FakeAnthropicServer,
    clients: list[AnthropicModel],
    cache: CacheLifetime,
    control: dict[str, Any],
) -> None:
    model = model_for(server, clients, cache=cache)

    await model.complete(LONG_TRANSCRIPT, [WEATHER, WEATHER_ALERTS])

    assert breakpoints(server.requests[0]) == [
        ("tools", control),  # on the last tool only
        ("system", control),
        ("messages[2][0]", control),  # the tool result, the newest message's last block
    ]


WEATHER_ALERTS = ToolSpec(name="get_alerts", description="Weather alerts for a city.")


async def test_cache_none_sends_no_breakpoints(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    await model_for(server, clients, cache=None).complete(LONG_TRANSCRIPT, [WEATHER])

    body = server.requests[0]
    assert breakpoints(body) == []
    assert body["system"] == "You are terse."


def test_cache_lifetime_is_checked() -> None:
    with pytest.raises(ValueError, match="'5m', '1h' or None"):
        AnthropicModel(cache="10m")  # type: ignore[arg-type]


async def test_the_breakpoint_skips_thinking(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    # A transcript ending on the model's own turn (a prefill) whose text is empty
    only_thinking = Message.assistant(
        thinking=[ThinkingBlock(type="thinking", thinking="t", signature="s")],
        tool_calls=[ToolCall(id="toolu_1", name="get_weather", arguments={})],
    )

    await model_for(server, clients).complete([Message.user("x"), only_thinking], [])

    assert breakpoints(server.requests[0]) == [("messages[1][1]", EPH)]


@pytest.mark.parametrize(
    ("cache", "breakdown", "expected"),
    [
        # (1000*5 + 2000*0.5 + 400*6.25 + 600*10 + 500*25) / 1e6: the API's breakdown
        ("5m", 600, 0.027),
        # no breakdown: every write at the lifetime this model asks for
        ("1h", None, (1000 * 5 + 2000 * 0.5 + 1000 * 10 + 500 * 25) / 1e6),
        ("5m", None, (1000 * 5 + 2000 * 0.5 + 1000 * 6.25 + 500 * 25) / 1e6),
    ],
)
async def test_cache_writes_are_priced_by_lifetime(
    server: FakeAnthropicServer,
    clients: list[AnthropicModel],
    cache: CacheLifetime,
    breakdown: int | None,
    expected: float,
) -> None:
    respond_with(
        server,
        lambda body: text_response(
            "ok",
            input_tokens=1000,
            output_tokens=500,
            cache_read=2000,
            cache_write=1000,
            cache_write_1h=breakdown,
        ),
    )

    response = await model_for(server, clients, cache=cache).complete([Message.user("hi")], [])

    assert response.usage.cached_input_tokens == 2000
    assert response.usage.cache_write_tokens == 1000
    assert response.usage.cost_usd == pytest.approx(expected)


def test_price_of_one_hour_writes() -> None:
    price = price_for("claude-sonnet-4-6")

    assert price is not None and price.cache_write_1h == pytest.approx(6.0)


# --- incremental conversion --------------------------------------------------------------


def grow(transcript: list[Message], turn: int) -> list[Message]:
    call = ToolCall(id=f"toolu_{turn}", name="get_weather", arguments={"city": f"c{turn}"})
    return [*transcript, Message.assistant(f"step {turn}", [call]), Message.tool(call.id, "ok")]


async def test_incremental_conversion_sends_what_a_fresh_conversion_sends(
    server: FakeAnthropicServer, clients: list[AnthropicModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    import loomflow.models.anthropic as adapter

    converted: list[Message] = []
    original = adapter._blocks_for

    def counting(message: Message) -> Any:
        converted.append(message)
        return original(message)

    monkeypatch.setattr(adapter, "_blocks_for", counting)
    model = model_for(server, clients)
    other = [Message.system("Another session."), Message.user("Hello?")]
    transcript = [Message.system("You are terse."), Message.user("Plan a trip.")]
    for turn in range(40):
        transcript = grow(transcript, turn)
    await model.complete(transcript, [WEATHER])
    assert len(converted) == 81  # once each, the system message aside

    def edited(messages: list[Message]) -> list[Message]:
        changed = list(messages)
        changed[5] = Message.tool("toolu_1", "changed")
        return changed

    steps: list[tuple[str, Callable[[list[Message]], list[Message]], int | None]] = [
        ("a turn", lambda m: grow(m, 40), 2),
        ("a user message joining the last turn", lambda m: [*m, Message.user("Any rain?")], 1),
        ("a system message", lambda m: [*m, Message.system("Be kind.")], 0),
        ("two turns", lambda m: grow(grow(m, 41), 42), 4),
        ("nothing new", lambda m: list(m), 0),
        ("an edit of an old message", edited, None),
        ("a compaction", lambda m: [m[0], Message.user("Summary: a trip."), *m[-4:]], None),
        ("a turn after it", lambda m: grow(m, 43), 2),
    ]
    for what, step, new in steps:
        converted.clear()
        transcript = step(transcript)
        await model.complete(transcript, [WEATHER])
        ours = server.requests[-1]
        everything = sum(1 for m in transcript if m.role.value != "system")
        assert len(converted) == (everything if new is None else new), what
        await model.complete(other, [])  # a second session through the same model
        await model_for(server, clients).complete(transcript, [WEATHER])  # from scratch
        assert server.requests[-1] == ours, what


# --- a resumed session reads the cache its crashed run wrote -----------------------------


def _encoded(value: Any) -> bytes:
    # The SDK's encoding: compact, UTF-8, keys in the order they were built.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in block.items() if key != "cache_control"}


def cache_prefix(raw: bytes) -> tuple[dict[str, bytes], list[tuple[str, list[bytes]]]]:
    """What a request's prompt cache is keyed on, as the bytes that were sent.

    The cache keys an entry on the prompt up to a breakpoint, in the order tools, system,
    messages, under the same model and settings that shape the prompt (thinking,
    tool_choice, output_config). A cache_control marker is not part of the prompt: the
    newest-message breakpoint moves to the new last block on every call, so message
    blocks are compared without it; those of tools and system stay where they are and
    are compared with it.
    """
    body = json.loads(raw)
    assert _encoded(body) == raw  # so re-encoding a part gives the bytes sent for it
    fixed = {key: _encoded(body.get(key)) for key in ("model", "tools", "system", "thinking")}
    fixed |= {key: _encoded(body.get(key)) for key in ("tool_choice", "output_config")}
    turns = [
        (turn["role"], [_encoded(_unmarked(block)) for block in turn["content"]])
        for turn in body["messages"]
    ]
    return fixed, turns


def assert_extends(earlier: bytes, later: bytes) -> None:
    """``later``'s prompt begins with all of ``earlier``'s, byte for byte: its turns before
    ``earlier``'s last are the same, and that last turn's blocks begin its own (a turn may
    grow: a prompt after tool results joins their user turn)."""
    (fixed, turns), (later_fixed, later_turns) = cache_prefix(earlier), cache_prefix(later)
    assert later_fixed == fixed
    *closed, (role, blocks) = turns
    assert later_turns[: len(closed)] == closed
    later_role, later_blocks = later_turns[len(closed)]
    assert later_role == role
    assert later_blocks[: len(blocks)] == blocks


async def test_a_resumed_session_sends_the_prefix_its_killed_run_sent(tmp_path: Path) -> None:
    """A run killed by SIGKILL mid-request and resumed by a new process (new agent, model
    and runtime over the same SQLite file) sends a request whose prefix is, byte for
    byte, what every request of the killed run sent, so it reads the cache they wrote."""
    from tests.support.anthropic_worker import PROMPT, claude_agent

    script = [
        tool_use_response("lookup", {"topic": "kafka"}, id="toolu_1", thinking=[THOUGHT]),
        tool_use_response(
            "lookup", {"topic": "faust"}, id="toolu_2", text="Now faust.", thinking=[REDACTED]
        ),
        text_response("Kafka is a replicated log; faust processes streams in Python."),
    ]
    db = tmp_path / "journal.db"
    with FakeAnthropicServer(scripted_responder(script)) as server:
        # the third call (two assistant turns in the transcript) hangs until released
        server.hold(lambda body: sum(m["role"] == "assistant" for m in body["messages"]) == 2)
        env = dict(
            os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
        )
        victim = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "tests.support.anthropic_worker", str(db), "s1", server.url],
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await asyncio.to_thread(server.wait_for_requests, 3, 60.0)
        finally:
            victim.send_signal(signal.SIGKILL)
            _, err = await asyncio.wait_for(victim.communicate(), 30)
        assert victim.returncode == -signal.SIGKILL, err.decode()
        server.release()

        agent, model = claude_agent(db, server.url)
        try:
            result = await agent.resume(session_id="s1")
        finally:
            await model.aclose()
            await agent.runtime.close()
        raw = server.raw_requests

    assert result.output == "Kafka is a replicated log; faust processes streams in Python."
    assert len(raw) == 4  # three by the killed run, one by the resumed one
    killed, resumed = raw[:3], raw[3]
    for earlier in killed:
        assert_extends(earlier, resumed)
    # what the resumed call adds is the nudge to continue, after the last tool result
    *_, (role, blocks) = cache_prefix(resumed)[1]
    assert role == "user" and len(blocks) == len(cache_prefix(killed[-1])[1][-1][1]) + 1
    assert json.loads(blocks[-1])["text"] == agent.tuning.continuation_prompt
    # and its own newest-message breakpoint is on that block
    assert breakpoints(json.loads(resumed))[-1] == ("messages[4][1]", EPH)
    # the thinking the killed run received went back unmodified in both processes
    turns = json.loads(resumed)["messages"]
    assert turns[1]["content"][0] == THOUGHT
    assert turns[3]["content"][0] == REDACTED
    assert turns[0]["content"][0]["text"] == PROMPT


@pytest.mark.parametrize(
    ("error", "cut", "match"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, False, "Overloaded"),
        (None, True, "connection lost while streaming"),
        (None, False, "ended before message_stop"),
    ],
    ids=["error event", "cut", "no message_stop"],
)
async def test_a_stream_that_breaks_off_is_a_model_error(
    server: FakeAnthropicServer,
    clients: list[AnthropicModel],
    error: dict[str, Any] | None,
    cut: bool,
    match: str,
) -> None:
    respond_with(server, lambda body: text_response("one two three four"))
    server.break_streams(5, error=error, cut=cut)  # after two of the four deltas
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    with pytest.raises(ModelError, match=match):
        await model_for(server, clients).complete(
            [Message.user("count")], [], options=CallOptions(on_delta=on_delta)
        )
    assert deltas == ["one ", "two "]


async def test_a_message_the_api_cannot_take_fails_the_call_and_nothing_else(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    model = model_for(server, clients, cache=None)
    first = [Message.user("one")]
    await model.complete(first, [])

    with pytest.raises(ModelError, match="tool_call_id"):
        await model.complete([*first, Message.user("two"), Message(role=Role.TOOL)], [])
    await model.complete([*first, Message.user("two")], [])

    assert len(server.requests) == 2
    assert server.requests[-1]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": t} for t in ("one", "two")]}
    ]


async def test_requests_carry_the_bytes_the_sdk_would_send(
    server: FakeAnthropicServer, clients: list[AnthropicModel]
) -> None:
    """The adapter encodes the body itself (the SDK's preparation of a long transcript
    costs tens of milliseconds a call): the API must not see a difference."""
    respond_with(server, lambda body: text_response("ok"))
    model = model_for(server, clients, temperature=0.5)
    call = ToolCall(
        id="toolu_1", name="get_weather", arguments={"city": "Zürich", "n": [1.5, None]}
    )
    transcript = [
        Message.system("Be brief. ✓"),
        Message.user("Weather in Zürich?"),
        Message.assistant("Let me look — 🌦", tool_calls=[call]),
        Message.tool("toolu_1", 'sunny, "12 °C"'),
        Message.user("And tomorrow?"),
    ]
    options = CallOptions(effort=Effort.LOW)

    async def on_delta(text: str) -> None:
        pass

    await model.complete(transcript, [WEATHER], options=options)
    await model.complete(transcript, [WEATHER], options=CallOptions(on_delta=on_delta))
    request, _ = model._request(transcript, [WEATHER], options)
    await model.client.messages.create(**request)
    request, _ = model._request(transcript, [WEATHER], CallOptions())
    async with model.client.messages.stream(**request) as stream:
        await stream.get_final_message()

    ours_plain, ours_streamed, sdk_plain, sdk_streamed = server.raw_requests
    # the same JSON (the SDK orders the top-level keys by its signature), and the text as
    # UTF-8 as the SDK sends it, not as escapes
    assert json.loads(ours_plain) == json.loads(sdk_plain)
    assert json.loads(ours_streamed) == json.loads(sdk_streamed)
    for raw in (ours_plain, ours_streamed):
        assert "Zürich".encode() in raw and "🌦".encode() in raw
