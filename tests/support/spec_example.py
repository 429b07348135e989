"""The code of the checkpoints spec page, unchanged, split into its two phases.

Run as ``python -m tests.support.spec_example {run|resume} {sqlite|inproc}`` from a
directory where ``./journal.db`` may live; the model is reached through
ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY. Prints the RunResult of each phase as JSON.
"""

from __future__ import annotations

import asyncio
import sys


async def main(phase: str, backend: str) -> None:
    from loomflow import Agent, Tuning
    from loomflow.runtime import InProcRuntime, SqliteRuntime

    runtime = SqliteRuntime("./journal.db") if backend == "sqlite" else InProcRuntime()

    # --- from the spec page ---------------------------------------------------------
    agent = Agent(
        "...",
        model="claude-opus-4-7",
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
    )

    if phase in ("run", "both"):
        # First run, killed by OOM / deploy / Ctrl-C partway through:
        first = await agent.run("long research task", session_id="research-2026-07-04")
        print(first.model_dump_json(), flush=True)

    if phase in ("resume", "both", "run"):
        # After restart: restore the latest checkpoint and keep going.
        result = await agent.resume(
            "pick it up where you left off",
            session_id="research-2026-07-04",
        )
        print(result.model_dump_json(), flush=True)

    if phase == "both":
        metas = await agent.list_checkpoints("research-2026-07-04")
        older = metas[-1]  # newest-first => last = earliest
        fork = await agent.resume(
            "try a different approach from here",
            session_id="research-2026-07-04",
            from_checkpoint=older.checkpoint_id,
        )
        print(fork.model_dump_json(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
