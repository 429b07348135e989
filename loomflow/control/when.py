"""A moment as an operator writes it: an ISO date or datetime, or an age (``30d``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["parse_when"]

_AGE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """An aware UTC moment (``--before``, ``--since``, the console's filter): an ISO date
    or datetime (UTC when it names no zone) or an age before ``now``: a whole number and
    s, m, h, d or w (``30d``). ValueError saying which forms it takes."""
    # A regex and timedelta, not a date-parsing dependency: these two forms are all
    # --before takes, and datetime.fromisoformat reads every ISO form since 3.11.
    age = _AGE.fullmatch(text.strip())
    if age is not None:
        try:
            delta = timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
            return (now or datetime.now(UTC)) - delta
        except OverflowError:
            raise ValueError(f"{text!r} is further back than any date") from None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO date or datetime (2026-11-01, 2026-11-01T12:00:00Z) "
            "nor an age (30d, 12h, 45m, 2w)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
