"""Options of the whole suite: ``--soak`` runs tests/faults with its long trial counts."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="run the fault-injection suite (tests/faults) with the trial counts of "
        "RELIABILITY.md instead of CI's bounded ones (tens of minutes)",
    )
