"""The ``loomflow-demo`` command, which ``make demo`` runs: parse its options, then play the
demo in this terminal."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from loomflow_demo.view import run_demo

__all__ = ["main"]


def _at_least_one(text: str) -> int:
    """A whole number of turns, 1 or more, for ``--kill-after-turns``."""
    if not text.strip().isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if int(text) < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loomflow-demo",
        description="Run a research agent in a worker process, SIGKILL it mid-run, resume "
        "the session from its SQLite log without repeating model calls, then fork it from an "
        "older checkpoint. Then two `loomflow worker` processes finish a run whose process, "
        "and then whose worker, is SIGKILLed, and a run that waits for `loomflow signal`. "
        "Offline unless ANTHROPIC_API_KEY is set.",
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=Path("loomflow-demo.db"),
        metavar="PATH",
        help="SQLite log to use; deleted at start with its -wal/-shm files and its "
        "-calls.jsonl record of model calls (default: %(default)s)",
    )
    parser.add_argument(
        "--kill-after-turns",
        type=_at_least_one,
        default=3,
        metavar="N",
        help="SIGKILL the worker once N turns are in the log (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        default="claude-opus-4-7",
        metavar="NAME",
        help="Claude model used when ANTHROPIC_API_KEY is set (default: %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return the exit code (1 when a step did not do what it shows)."""
    args = _parser().parse_args(argv)
    return run_demo(args.db, args.kill_after_turns, args.model)
