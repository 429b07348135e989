"""The demo's worker process, ``python -m loomflow_demo.worker``: it runs the research task
on one session until it finishes or, in the demo, is SIGKILLed.

The demo starts it (the first part's worker, the unattended scene's run process) as this
module of its own package, never through the ``loomflow`` command; it loads the scenario
and no rich.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from loomflow.runtime import SqliteRuntime
from loomflow_demo.assistant import TASK, build_agent
from loomflow_demo.scenario import Backend, CallLog, CallStep, call_log_path, make_model

__all__ = ["main", "run_worker"]


def run_worker(
    db: Path,
    session_id: str,
    backend: Backend,
    model_name: str,
    lease_seconds: float | None = None,
    step: CallStep = "worker",
) -> int:
    """Run the task on ``session_id`` until it finishes (or, in the demo, is killed)."""
    asyncio.run(_work(db, session_id, backend, model_name, lease_seconds, step))
    return 0


async def _work(
    db: Path,
    session_id: str,
    backend: Backend,
    model_name: str,
    lease_seconds: float | None,
    step: CallStep,
) -> None:
    model = make_model(backend, model_name, CallLog(call_log_path(db)), step)
    runtime = (
        SqliteRuntime(db)
        if lease_seconds is None
        else SqliteRuntime(db, lease_seconds=lease_seconds)
    )
    try:
        await build_agent(runtime, model).run(TASK, session_id=session_id)
    finally:
        await model.aclose()
        await runtime.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options the scenario starts this process with, then run the task."""
    parser = argparse.ArgumentParser(prog="python -m loomflow_demo.worker")
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--session-id", required=True)
    parser.add_argument("--backend", choices=("scripted", "anthropic"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--step", choices=("worker", "unattended"), default="worker")
    args = parser.parse_args(argv)
    return run_worker(args.db, args.session_id, args.backend, args.model, args.lease, args.step)


if __name__ == "__main__":
    sys.exit(main())
