"""The agents the conformance suite drives: every model and tool call is counted.

A runtime under test never sees a network: the model is a :class:`ScriptedModel`
whose reply depends only on the transcript, so a resumed session gets the same next
reply as the run that died, and a repeated call shows up in the counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from loomflow import Agent, Message, Role, SessionState, Tuning, current_journal
from loomflow.models import CallOptions, ModelResponse, ScriptedModel, ToolSpec
from loomflow.runtime import Runtime

__all__ = [
    "CALLS_PER_PASS",
    "FACTS",
    "CrashingModel",
    "Payment",
    "Research",
    "SimulatedCrash",
    "digging_agent",
    "research_script",
]

FACTS = {"kafka": "a distributed log", "sqlite": "an embedded database", "faust": "streams"}

#: model calls of one research pass: the lookup, the note, the answer
CALLS_PER_PASS = 3


class SimulatedCrash(BaseException):
    """Stands in for the process dying: not an Exception, so nothing handles it."""


class CrashingModel:
    """Delegates to a model and dies at its ``crash_at``-th call (1-based)."""

    def __init__(self, inner: ScriptedModel, crash_at: int | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.crash_at = crash_at
        self.calls = 0

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        options: CallOptions | None = None,
    ) -> ModelResponse:
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            raise SimulatedCrash(f"died at model call {self.calls}")
        return await self.inner.complete(messages, tools, options=options)


def research_script(passes: int = 3) -> list[Message | str]:
    """Each pass: look a topic up, take a note, answer."""
    topics = list(FACTS) * (passes // len(FACTS) + 1)
    script: list[Message | str] = []
    for n in range(passes):
        topic = topics[n]
        script += [
            ScriptedModel.tool_call("lookup", topic=topic),
            ScriptedModel.tool_call("note", text=f"{topic} noted"),
            f"Pass {n + 1}: {topic} is {FACTS[topic]}.",
        ]
    return script


class Research:
    """Builds agents over one runtime and counts what really executed.

    A run makes ``passes`` passes (the first, then one per stop-hook iteration), each
    of :data:`CALLS_PER_PASS` model calls and two tool calls, so with checkpointing on
    pass *n* writes a checkpoint at turn ``3 * n``.
    """

    def __init__(self, passes: int = 3) -> None:
        self.passes = passes
        self.tool_runs: Counter[str] = Counter()
        self.models: list[CrashingModel] = []

    def lookup(self, topic: str) -> str:
        """Look a topic up.

        Args:
            topic: what to look up
        """
        self.tool_runs[f"lookup:{topic}"] += 1
        return FACTS.get(topic, "unknown")

    def note(self, text: str) -> dict[str, Any]:
        """Write a note."""
        self.tool_runs[f"note:{text}"] += 1
        return {"saved": text}

    def more(self, state: SessionState) -> str | None:
        """Ask for another pass until the transcript holds ``passes`` answers."""
        done = sum(
            1 for m in state.messages if m.role is Role.ASSISTANT and m.content.startswith("Pass ")
        )
        return "Go deeper." if done < self.passes else None

    def agent(
        self,
        runtime: Runtime,
        *,
        crash_at: int | None = None,
        checkpoint: bool = True,
        latency: float = 0.0,
        **tuning: Any,
    ) -> Agent:
        """An agent on ``runtime`` that dies at model call ``crash_at`` (1-based), if given."""
        scripted = ScriptedModel(research_script(self.passes), latency=latency)
        model = CrashingModel(scripted, crash_at)
        self.models.append(model)
        tuning.setdefault("max_stop_hook_iterations", max(10, self.passes))
        return Agent(
            "You are a careful researcher.",
            model=model,
            runtime=runtime,
            tuning=Tuning(checkpoint=checkpoint, stop_hooks=[self.more], **tuning),
            tools=[self.lookup, self.note],
        )

    async def ran(
        self,
        runtime: Runtime,
        *,
        session_id: str = "s1",
        user_id: str | None = None,
        **options: Any,
    ) -> Agent:
        """An agent as :meth:`agent` makes it, once it has run the research on a session."""
        agent = self.agent(runtime, **options)
        await agent.run("Research.", session_id=session_id, user_id=user_id)
        return agent

    @property
    def model_calls(self) -> int:
        return sum(m.calls for m in self.models)


class Payment:
    """A tool that charges an order in a journaled step, and whose process dies once,
    after the charge was recorded and before the tool returned."""

    def __init__(self) -> None:
        self.charged: list[str] = []
        self.crashed = False

    def _charge(self, order: str) -> str:
        self.charged.append(order)
        return f"paid {order}"

    async def pay(self, order: str) -> str:
        """Charge an order, then send a receipt."""
        journal = current_journal()
        assert journal is not None, "a tool runs inside a journal"
        receipt = await journal.step("charge", self._charge, order)
        if not self.crashed:
            self.crashed = True
            raise SimulatedCrash("died after charging, before the tool returned")
        return receipt


def _dig(messages: Sequence[Message]) -> Message | str:
    # each pass: one tool call with small arguments, then a ~600-character answer
    if messages[-1].role is Role.TOOL:
        return "The findings so far, restated in full for the reader. " * 11
    return ScriptedModel.tool_call("search", query="event sourcing", page=len(messages))


def search(query: str, page: int) -> str:
    """Search the notes."""
    return f"{query} result page {page}: " + "x" * 370


def digging_agent(runtime: Runtime, passes: int) -> Agent:
    """A checkpointing agent of ``passes`` passes, each a search and a long answer: a
    long session whose transcript is ~2.2 kB a pass, for measuring storage growth."""

    def deeper(state: SessionState) -> str | None:
        return "Please dig one level deeper into the topic. " * 4 if state.passes < passes else None

    return Agent(
        "You are a careful researcher.",
        model=ScriptedModel(_dig),
        runtime=runtime,
        tuning=Tuning(checkpoint=True, stop_hooks=[deeper], max_stop_hook_iterations=passes),
        tools=[search],
    )
