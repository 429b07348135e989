"""An agent run with context, extra_tools and output_schema in its own process, for tests
that SIGKILL it and resume with the same keywords.

``python -m tests.support.keywords_worker sqlite|postgres|kafka DB SESSION LOG --hang-at N``:
on ``SqliteRuntime(DB)``, or ``PostgresRuntime()`` / ``KafkaRuntime()`` configured by the
LOOMFLOW_* variables alone, as a user's process would be.
Every model and tool call is appended to LOG before it runs; the N-th model call prints
``HANGING`` and never returns.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from loomflow import Agent, Message, RunContext, Tuning, get_run_context
from loomflow.models import ScriptedModel
from loomflow.runtime import KafkaRuntime, PostgresRuntime, Runtime, SqliteRuntime

CONTEXT = RunContext(user_id="u1", metadata={"tenant": "acme"})
OSLO = '{"name": "Oslo", "population": 709000}'
#: a tool call, an answer the schema refuses, then the valid answer
REPLIES: list[str | Message] = [
    ScriptedModel.tool_call("population", city="Oslo"),
    "Oslo, roughly 709k",
    OSLO,
]


class City(BaseModel):
    name: str
    population: int


def _log(path: Path, line: str) -> None:
    with path.open("a") as fh:
        fh.write(line + "\n")


def population_tool(log: Path) -> Any:
    def population(city: str) -> str:
        """Look up a city's population."""
        context = get_run_context()
        _log(log, f"tool {city} for {context.user_id}/{context.metadata['tenant']}")
        return f"{city}: 709000"

    return population


def runtime_of(kind: str, db: str) -> Runtime:
    if kind == "kafka":
        return KafkaRuntime()
    return SqliteRuntime(db) if kind == "sqlite" else PostgresRuntime()


def agent_on(runtime: Runtime, log: Path, hang_at: int | None = None) -> Agent:
    calls = 0

    async def on_call(messages: Sequence[Message]) -> None:
        nonlocal calls
        calls += 1
        _log(log, f"model {sum(1 for m in messages if m.role.value == 'assistant')}")
        if calls == hang_at:
            print("HANGING", flush=True)
            await asyncio.Event().wait()

    return Agent(
        "Answer with data.",
        model=ScriptedModel(REPLIES, on_call=on_call),
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
    )


def keywords(log: Path) -> dict[str, Any]:
    return {"context": CONTEXT, "extra_tools": [population_tool(log)], "output_schema": City}


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("sqlite", "postgres", "kafka"))
    parser.add_argument("db")
    parser.add_argument("session")
    parser.add_argument("log", type=Path)
    parser.add_argument("--hang-at", type=int, required=True)
    args = parser.parse_args(argv)
    runtime = runtime_of(args.kind, args.db)
    agent = agent_on(runtime, args.log, args.hang_at)
    await agent.run("How many people live in Oslo?", session_id=args.session, **keywords(args.log))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
