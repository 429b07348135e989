"""An agent on Claude, through the Anthropic adapter, in its own process, for tests that
SIGKILL it.

``python -m tests.support.anthropic_worker DB SESSION BASE_URL``: runs :func:`claude_agent`
on ``SqliteRuntime(DB)`` against the Messages API at BASE_URL (the local fake server) and
prints the run's result as JSON.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from loomflow import Agent, Tuning
from loomflow.models.anthropic import AnthropicModel
from loomflow.runtime import SqliteRuntime

FACTS = {"kafka": "a replicated log", "faust": "stream processing in Python"}
PROMPT = "Research Kafka and faust."


def lookup(topic: str) -> str:
    """Look a topic up.

    Args:
        topic: what to look up
    """
    return FACTS.get(topic, "unknown")


def claude_agent(db: Path | str, base_url: str) -> tuple[Agent, AnthropicModel]:
    """The research agent on Claude over ``SqliteRuntime(db)``, and its model (to close)."""
    model = AnthropicModel("claude-opus-4-7", api_key="test-key", base_url=base_url)
    agent = Agent(
        "You are a careful researcher.",
        model=model,
        runtime=SqliteRuntime(db),
        tuning=Tuning(checkpoint=True),
        tools=[lookup],
    )
    return agent, model


async def main(argv: Sequence[str]) -> int:
    db, session, base_url = argv
    agent, model = claude_agent(db, base_url)
    try:
        result = await agent.run(PROMPT, session_id=session)
    finally:
        await model.aclose()
        await agent.runtime.close()
    print(result.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
