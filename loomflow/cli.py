"""The ``loomflow`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from loomflow._demo import WORKER_COMMAND, run_demo, run_worker

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loomflow", description="Durable agent runs: crash, resume, fork."
    )
    # The metavar lists only public commands, so the worker stays out of --help.
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,processor}")
    demo = commands.add_parser(
        "demo",
        help="kill an agent run with SIGKILL, resume it, then fork it",
        description="Run a research agent in a worker process, SIGKILL it mid-run, resume "
        "the session from its SQLite log without repeating model calls, then fork it from an "
        "older checkpoint. Offline unless ANTHROPIC_API_KEY is set.",
    )
    demo.add_argument(
        "--db",
        type=Path,
        default=Path("loomflow-demo.db"),
        metavar="PATH",
        help="SQLite log to use; deleted (with -wal/-shm) at start (default: %(default)s)",
    )
    demo.add_argument(
        "--kill-after-turns",
        type=_positive_int,
        default=3,
        metavar="N",
        help="SIGKILL the worker once N turns are in the log (default: %(default)s)",
    )
    demo.add_argument(
        "--model",
        default="claude-opus-4-7",
        metavar="NAME",
        help="Claude model used when ANTHROPIC_API_KEY is set (default: %(default)s)",
    )
    processor = commands.add_parser(
        "processor",
        help="project the Kafka log into PostgreSQL (a faust-streaming worker)",
        description="Consume loomflow.events, fold it into the PostgreSQL read model, publish "
        "snapshots, dead-letter bad events. Reads LOOMFLOW_KAFKA_BOOTSTRAP, "
        "LOOMFLOW_POSTGRES_DSN, LOOMFLOW_SCHEMA and LOOMFLOW_TOPIC_PREFIX.",
    )
    processor.add_argument("--loglevel", default="info", help="(default: %(default)s)")
    worker = commands.add_parser(WORKER_COMMAND)
    worker.add_argument("--db", type=Path, required=True)
    worker.add_argument("--session-id", required=True)
    worker.add_argument("--backend", choices=("scripted", "anthropic"), required=True)
    worker.add_argument("--model", required=True)
    return parser


def _run_processor(loglevel: str) -> int:
    from loomflow.processors.app import app

    # faust's worker reads its own command line; no web server, whatever faust defaults to
    sys.argv = ["loomflow processor", "worker", "--without-web", "--loglevel", loglevel]
    app.main()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return run_demo(args.db, args.kill_after_turns, args.model)
    if args.command == "processor":
        return _run_processor(args.loglevel)
    return run_worker(args.db, args.session_id, args.backend, args.model)


if __name__ == "__main__":
    sys.exit(main())
