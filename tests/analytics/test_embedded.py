"""The stats database's tables hold what analytics counts: its migrations are fixed text
(projections/sqlite/stats.py), so a counter added to the tally needs a step of its own."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from loomflow.analytics.tally import COUNTS, SUMS
from loomflow.projections.sqlite.stats import connect_stats


def test_the_hourly_tables_columns_are_the_tallys_counters(tmp_path: Path) -> None:
    with closing(connect_stats(tmp_path / "journal.stats.db")) as conn:
        columns = [
            (name, kind) for _, name, kind, *_ in conn.execute("PRAGMA table_info(stats_hourly)")
        ]
    assert columns == [
        ("hour", "TEXT"),
        ("model", "TEXT"),
        ("user_id", "TEXT"),
        *((name, "INTEGER") for name in COUNTS),
        *((name, "REAL") for name in SUMS),
        ("latency", "TEXT"),
        ("tools", "TEXT"),
    ]
