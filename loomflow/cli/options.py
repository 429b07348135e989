"""What several commands take alike: argument types and options.

Only the standard library loads here: ``loomflow --help`` builds every parser with it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "add_db_option",
    "add_loglevel",
    "id_of",
    "parse_when",
    "positive_int",
    "user_filter",
    "user_of",
]


def positive_int(text: str) -> int:
    """An argument type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_when(text: str) -> datetime:
    """An argument type: a moment as ``--before`` and ``--since`` take it
    (:func:`loomflow.control.when.parse_when`)."""
    from loomflow.control.when import parse_when as moment

    try:
        return moment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def id_of(what: str) -> Callable[[str], str]:
    """An argument type: a valid id (``what``: ``session id``, ``user id``, ...)."""

    def check(text: str) -> str:
        from loomflow.errors import InvalidIdError
        from loomflow.schemas import validate_id

        try:
            return validate_id(text, what)
        except InvalidIdError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def user_filter(text: str) -> str:
    """An argument type: a user id, or '' for the sessions run without a user."""
    return text and id_of("user id")(text)


def user_of(text: str | None) -> str | None:
    """A --user value: an id, or None (the sessions of no user) for ''."""
    return text or None


def add_loglevel(parser: argparse.ArgumentParser) -> None:
    """The ``--loglevel`` of a command that runs a faust worker."""
    parser.add_argument(
        "--loglevel",
        default="info",
        choices=("crit", "error", "warn", "info", "debug"),
        help="(default: %(default)s)",
    )


def run_faust_worker(command: str, app: Any, loglevel: str) -> int:
    """Run ``app`` (a faust app) as ``loomflow COMMAND`` runs its worker: faust reads its
    own command line, and the web server stays off whatever faust defaults to."""
    sys.argv = [f"loomflow {command}", "worker", "--without-web", "--loglevel", loglevel]
    app.main()
    return 0


def add_db_option(parser: argparse.ArgumentParser) -> None:
    """The ``--db`` of a command that reads the log (audit, tail)."""
    parser.add_argument(
        "--db",
        type=Path,
        metavar="PATH",
        help="an embedded log (the SQLite file of a SqliteRuntime); without it, the Kafka "
        "topic and PostgreSQL schema of the LOOMFLOW_* settings",
    )
