"""What ``loomflow sessions resume|retry --agent tests.support.lifecycle:...`` loads in
tests: a researcher whose tool is counted, a payer whose tool waits for an approval, one
whose model is down, and one of another name.

Each factory gives its agents a runtime of their own, as a program's factory for
``loomflow worker`` does; the command runs them on the store it names, with that
runtime's run options: here one checkpoint kept per session, which the tests can see.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from loomflow import Agent, Message, Tuning, wait_for_signal
from loomflow.models import ScriptedModel
from loomflow.runtime import InProcRuntime, Runtime, Scope, SqliteRuntime

#: the researcher's tool calls that ran in this process, by city
TOOL_RUNS: Counter[str] = Counter()
#: what the payer's waits received, in this process
APPROVALS: list[Any] = []

RESEARCH: list[Message | str] = [
    ScriptedModel.tool_call("population", city="Oslo"),
    "Oslo has 709000 people.",
    "Bergen is smaller.",
]


def population(city: str) -> str:
    """Look up a city's population."""
    TOOL_RUNS[city] += 1
    return f"{city}: 709000"


def _own_runtime() -> Runtime:
    return InProcRuntime(max_checkpoints_per_session=1)


def researcher(*, replies: int | None = None, runtime: Runtime | None = None) -> Agent:
    """The researcher; with ``replies``, a model that has only the first ones (the next
    call raises ModelError)."""
    return Agent(
        "Answer with data.",
        model=ScriptedModel(RESEARCH[:replies]),
        runtime=runtime or _own_runtime(),
        tuning=Tuning(checkpoint=True),
        tools=[population],
    )


async def ask_approval(amount: int) -> str:
    """Ask a person to approve a payment."""
    answer = await wait_for_signal("approve", timeout=3600)
    APPROVALS.append(answer)
    return f"approved={answer['ok']} for {amount}"


def payer(runtime: Runtime | None = None) -> Agent:
    """An agent whose tool waits for the signal "approve"."""
    model = ScriptedModel([ScriptedModel.tool_call("ask_approval", amount=5), "Paid."])
    return Agent(
        "You pay invoices.",
        model=model,
        runtime=runtime or _own_runtime(),
        tools=[ask_approval],
        tuning=Tuning(checkpoint=True),
    )


def broken() -> Agent:
    """The researcher with a model that has no reply left for anything."""
    return researcher(replies=0)


def others() -> list[Agent]:
    """Agents of other names than the default one the sessions' runs recorded."""
    return [
        Agent("x", model=ScriptedModel(["?"]), runtime=_own_runtime(), name=name)
        for name in ("billing", "support")
    ]


async def park(db: Path, session_id: str = "oslo") -> None:
    """A researcher's run on ``db`` whose first attempt and a worker's last one fail on a
    script too short: the run is parked (stuck), its tool already run once."""
    import pytest

    from loomflow.errors import ModelError

    async with SqliteRuntime(db) as runtime:
        agent = researcher(replies=1, runtime=runtime)
        with pytest.raises(ModelError):
            await agent.run("How many people live in Oslo?", session_id=session_id)
        row = await runtime.session(Scope(session_id))
        assert row is not None
        with pytest.raises(ModelError):
            await agent.take_over(
                session_id, user_id=None, after_seq=row.last_seq, worker="w1", last_attempt=True
            )


async def hang(topic: str) -> str:
    """Look a topic up, for ever: the file LOOMFLOW_TEST_STARTED names says it started."""
    import asyncio
    import os

    await asyncio.to_thread(Path(os.environ["LOOMFLOW_TEST_STARTED"]).write_text, topic)
    await asyncio.Event().wait()
    return topic


def hanging(runtime: Runtime | None = None) -> Agent:
    """An agent whose one tool call never returns (until Ctrl-C)."""

    def reply(messages: Any) -> Message | str:
        return ScriptedModel.tool_call("hang", topic="x") if messages[-1].role == "user" else "?"

    model = ScriptedModel(reply)
    return Agent(
        "You look things up.", model=model, runtime=runtime or _own_runtime(), tools=[hang]
    )
