"""What several commands take alike: argument types, options, and the refusal of a request.

Only the standard library loads here: ``loomflow --help`` builds every parser with it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "Refused",
    "add_db_option",
    "add_loglevel",
    "id_of",
    "parse_when",
    "positive_int",
    "user_filter",
    "user_of",
]

_AGE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class Refused(Exception):
    """A request the command turns down, with its exit code (2: usage, 1: not found)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def positive_int(text: str) -> int:
    """An argument type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """An aware UTC moment from ``--before``: an ISO date or datetime (UTC when it names
    no zone) or an age before ``now``: a whole number and s, m, h, d or w (``30d``)."""
    # A regex and timedelta, not a date-parsing dependency: these two forms are all
    # --before takes, and datetime.fromisoformat reads every ISO form since 3.11.
    age = _AGE.fullmatch(text.strip())
    if age is not None:
        delta = timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
        return (now or datetime.now(UTC)) - delta
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO date or datetime (2026-11-01, 2026-11-01T12:00:00Z) "
            "nor an age (30d, 12h, 45m, 2w)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


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
