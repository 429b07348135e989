"""A pytest plugin dev/mutants.py loads into mutmut's test runs.

mutmut 3.7 maps each test to the functions it calls by ``item._nodeid``, an attribute
pytest 9 no longer has (every test then errors in mutmut's stats run). mutmut 3.8 reads
``item.nodeid`` instead, but needs click>=8.4.2, which faust-streaming's pin (click<8.4)
refuses in the same environment. Drop this once a mutmut that installs here reads
``nodeid``.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not hasattr(item, "_nodeid"):
            item._nodeid = item.nodeid  # type: ignore[attr-defined]
