"""The fault-injection suite: each scenario runs a bounded number of trials in CI and the
counts RELIABILITY.md reports with ``pytest tests/faults --soak``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

#: how many trials a scenario runs: ``trials(ci=5, soak=50)``
Trials = Callable[..., int]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    """Whether the suite runs with ``--soak``."""
    return bool(request.config.getoption("--soak"))


@pytest.fixture
def trials(request: pytest.FixtureRequest) -> Trials:
    """The number of trials for a scenario: ``ci`` normally, ``soak`` with ``--soak``."""
    soaking = bool(request.config.getoption("--soak"))

    def count(*, ci: int, soak: int) -> int:
        return soak if soaking else ci

    return count
