"""A research agent in its own process, for tests that SIGKILL it or run many at once.

``python -m tests.support.crash_worker DB SESSION LOG [--hang-at N] [--lease S]
[--kafka | --postgres] [--latency S]``: runs the research agent on ``SqliteRuntime(DB)``,
or on ``KafkaRuntime()`` / ``PostgresRuntime()`` configured by the LOOMFLOW_* variables
alone, as a user's process would be. Every model and tool call is appended to LOG as a
line (``model <assistant messages in request>`` or ``tool <name>:<arg>``) before it
runs, and every event the runtime acknowledged as ``event <seq> <event_id> <type>``
once it has (``emit`` hears of an event only then). With ``--hang-at N`` the N-th model
call prints ``HANGING`` and never returns.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loomflow import Agent, Message, Role
from loomflow.runtime import KafkaRuntime, PostgresRuntime, Runtime, SqliteRuntime
from loomflow.schemas import EventBase
from tests.support.scenario import Research


def _log(path: Path, line: str) -> None:
    with path.open("a") as fh:
        fh.write(line + "\n")
        fh.flush()


def logged_agent(
    research: Research,
    runtime: Runtime,
    log: Path,
    hang_at: int | None = None,
    *,
    latency: float = 0.0,
) -> Agent:
    """The research agent on ``runtime``, appending each model and tool call to ``log``
    before it runs; the ``hang_at``-th model call prints HANGING and never returns."""
    agent = research.agent(runtime, latency=latency)
    calls = 0
    inner = research.models[-1].inner

    async def on_call(messages: Sequence[Message]) -> None:
        nonlocal calls
        calls += 1
        turn = sum(1 for m in messages if m.role is Role.ASSISTANT)
        _log(log, f"model {turn}")
        if calls == hang_at:
            print("HANGING", flush=True)
            await asyncio.Event().wait()

    inner._on_call = on_call
    for name in ("lookup", "note"):
        tool = agent.tools[name]
        original = tool.fn

        def logged(
            _original: Callable[..., Any] = original, _name: str = name, **kwargs: Any
        ) -> Any:
            _log(log, f"tool {_name}:{next(iter(kwargs.values()))}")
            return _original(**kwargs)

        agent.tools[name] = type(tool)(tool.name, tool.description, logged, tool.arguments)
    return agent


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("session")
    parser.add_argument("log", type=Path)
    parser.add_argument("--hang-at", type=int)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--lease", type=float, default=30.0, help="the runtime's lease_seconds")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per model call")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--kafka", action="store_true", help="KafkaRuntime() from LOOMFLOW_*")
    backend.add_argument("--postgres", action="store_true", help="PostgresRuntime() likewise")
    args = parser.parse_args(argv)

    runtime: Runtime
    if args.kafka:
        runtime = KafkaRuntime(lease_seconds=args.lease)
    elif args.postgres:
        runtime = PostgresRuntime(lease_seconds=args.lease)
    else:
        runtime = SqliteRuntime(args.db, lease_seconds=args.lease)
    agent = logged_agent(
        Research(passes=args.passes), runtime, args.log, args.hang_at, latency=args.latency
    )

    async def acknowledged(item: object) -> None:
        if isinstance(item, EventBase):
            _log(args.log, f"event {item.seq} {item.event_id} {getattr(item, 'type', '?')}")

    result = await agent.run("Research.", session_id=args.session, emit=acknowledged)
    print(result.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
