"""bench/audit.py end to end at a tiny size, on SQLite: a log its writer signed, audited
and verified by `loomflow` commands in every mode, each finding nothing wrong."""

from __future__ import annotations

import pytest

from bench import audit

pytestmark = pytest.mark.slow


def test_every_command_runs_on_a_signed_log(capsys: pytest.CaptureFixture[str]) -> None:
    results = audit.main(["--events", "200", "--kafka-events", "0", "--reps", "1"])
    log, tiny = results["sqlite"], results["sqlite-tiny"]
    # whole sessions of ~96 events until 200: three
    assert log["sessions"] == 3 and log["events"] >= 200
    assert tiny["sessions"] == 1
    for rows in (log["rows"], tiny["rows"]):
        assert set(rows) == set(audit.ROWS)
        for row, (run,) in rows.items():
            assert run["code"] == 0 and "problem" not in run, (row, run)
    table = capsys.readouterr().out
    assert table.count("| True |") == len(audit.ROWS)
