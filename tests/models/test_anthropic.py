"""The Anthropic adapter against a local fake of the Messages API (no SDK mocking)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from loomflow.errors import ModelError
from loomflow.models.anthropic import AnthropicModel, Price, price_for
from loomflow.models.base import ToolSpec
from loomflow.schemas import Message, ToolCall, Usage
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    Responder,
    error_response,
    scripted_responder,
    text_response,
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
