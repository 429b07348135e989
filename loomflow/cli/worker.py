"""``loomflow worker``: host agents and finish their runs that nobody else will."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from loomflow.agent.worker import Budget, Worker
from loomflow.control.agents import load_agents
from loomflow.control.source import quiet_kafka

if TYPE_CHECKING:
    from loomflow.agent import Agent

NAMES = ("worker",)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = commands.add_parser(
        "worker",
        help="host agents and resume their crashed or signalled runs",
        description="Import module:factory (as uvicorn does; the current directory is on "
        "the path), call it for the Agents to host, and resume each of their runs whose "
        "process went silent past its lease or that waits for a signal that has come. "
        "Several workers share the runs: each is resumed by one of them. A resumed run is "
        "given the options its run recorded (metadata, extra tools, output schema, effort); "
        "one that needs a tool or schema the agents do not host is parked as stuck. Ctrl-C "
        "(SIGTERM) stops the runs in progress at their next step, for the next worker.",
    )
    worker.add_argument("factory", metavar="module:factory", help="e.g. myapp.agents:build")
    worker.add_argument(
        "--poll", type=float, default=1.0, metavar="S", help="seconds between looks (default 1)"
    )
    worker.add_argument(
        "--attempts",
        type=int,
        default=3,
        metavar="N",
        help="takes of a run in a row before it is parked as stuck (default 3)",
    )
    worker.add_argument(
        "--backoff",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds before retrying a failed run, doubling each time (default 1)",
    )
    budget = Budget()
    worker.add_argument(
        "--max-takes",
        type=int,
        default=budget.takes,
        metavar="N",
        help="take-overs of one run by workers (since it started or last waited) before it "
        f"is parked as stuck, however it progresses (default {budget.takes})",
    )
    worker.add_argument(
        "--max-model-calls",
        type=int,
        metavar="N",
        help="model calls of one run, since its caller started it, past which workers park "
        "it (default: no limit)",
    )
    worker.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="tokens of one run, since its caller started it, past which workers park it "
        "(default: no limit)",
    )
    worker.add_argument(
        "--max-cost",
        type=float,
        metavar="USD",
        help="cost of one run in dollars, since its caller started it, past which workers "
        "park it (default: no limit)",
    )
    worker.add_argument(
        "--stop-grace",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds a run in progress is given to reach its next step once the worker "
        "stops, before it is cut off there (default 5)",
    )
    worker.add_argument("--name", help="this worker's name in the log (default host:pid)")
    worker.set_defaults(handler=_worker)


def _worker(args: argparse.Namespace) -> int:

    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    logging.getLogger("loomflow.worker").setLevel(logging.INFO)
    quiet_kafka()
    try:
        agents = load_agents(args.factory)
        worker = Worker(
            agents,
            name=args.name,
            poll_seconds=args.poll,
            max_attempts=args.attempts,
            backoff_seconds=args.backoff,
            budget=Budget(
                takes=args.max_takes,
                model_calls=args.max_model_calls,
                tokens=args.max_tokens,
                cost_usd=args.max_cost,
            ),
            stop_grace_seconds=args.stop_grace,
        )
    except (ValueError, TypeError) as exc:
        print(f"loomflow worker: {exc}", file=sys.stderr)
        return 2
    hosted = ", ".join(f"{a.name} ({type(a.runtime).__name__})" for a in agents)
    print(f"worker {worker.name} hosts {hosted}; Ctrl-C stops", file=sys.stderr, flush=True)
    asyncio.run(_serve(worker, agents))
    return 0


async def _serve(worker: Any, agents: list[Agent]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stopping() -> None:
        if stop.is_set():  # asked twice: stop now, as a crash would
            print(
                "stopping now; the runs in progress are left for another worker",
                file=sys.stderr,
                flush=True,
            )
            os._exit(130)
        stop.set()
        print(
            f"stopping: {worker.in_progress} run(s) in progress stop at their next step "
            f"(within {worker.stop_grace_seconds:g} s) and are left for another worker, "
            "after their lease; Ctrl-C again to stop now",
            file=sys.stderr,
            flush=True,
        )

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping)
    try:
        await worker.run(stop)
    finally:
        # the factory made them for this process: its models and runtimes end with it
        runtimes = {id(a.runtime): a.runtime for a in agents}
        for agent in agents:
            await agent.aclose()
            closing = getattr(agent.model, "aclose", None)
            if closing is not None:
                await closing()
        for runtime in runtimes.values():
            await runtime.close()
        await _without_stuck_threads(1.0)


async def _without_stuck_threads(grace: float) -> None:
    """Let the threads of plain ``def`` tools end, for ``grace`` seconds more at most: a
    tool the worker cut off (its run had the worker's grace already) may still be running
    in one, since a thread cannot be cancelled, and the interpreter would wait for it at
    exit. Past it the process ends at once; the run it served was left for the next
    worker, like the run of a crashed one."""
    shutdown = asyncio.ensure_future(asyncio.get_running_loop().shutdown_default_executor())
    try:
        await asyncio.wait_for(asyncio.shield(shutdown), grace)
    except TimeoutError:
        print(
            "stopped; a tool call still running in a thread is cut off (its run is left for "
            "another worker)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(0)
