"""An agent whose tool waits for a person's approval: the signal tests' agent."""

from __future__ import annotations

from typing import Any

from loomflow import Agent, Tuning, wait_for_signal
from loomflow.models.scripted import ScriptedModel
from loomflow.runtime import Runtime
from loomflow.schemas import Message, ToolCall


def approval_agent(runtime: Runtime, seen: list[Any], *, greet: bool = False) -> Agent:
    async def ask_approval(amount: int) -> str:
        """Ask a person to approve a payment."""
        answer = await wait_for_signal("approve", timeout=3600)
        seen.append(answer)
        return f"approved={answer['ok']} for {amount}"

    model = ScriptedModel(
        [
            *(["Hello."] if greet else []),
            Message.assistant(
                "", tool_calls=[ToolCall(id="c1", name="ask_approval", arguments={"amount": 5})]
            ),
            Message.assistant("Paid."),
        ]
    )
    return Agent(
        "You pay invoices.",
        model=model,
        runtime=runtime,
        tools=[ask_approval],
        tuning=Tuning(checkpoint=True),
    )
