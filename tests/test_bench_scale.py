"""bench/scale.py end to end at a tiny size: our SQLite store only (the peers need their
venv), loaded by one process and measured by another, then found in its cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import scale

pytestmark = pytest.mark.slow

TINY = ["--sessions", "4", "--per-session", "3", "--copies", "1", "--samples", "2"]


def _run(cache: Path, *extra: str) -> dict[str, Any]:
    argv = [*TINY, "--long-passes", "20", "--stores", "lf-sqlite", "--cache", str(cache)]
    (run,) = scale.main([*argv, *extra])
    return run


def test_a_tiny_load_is_measured_then_reused_from_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path)
    assert "error" not in run, run
    assert run["ok"], run["problems"]
    # the load: 4 sessions of 3 passes; then resume sessions of 10, 20 and 20 passes
    # (the last with 10 checkpoints)
    assert run["checkpoints"] == 4 * 3
    assert run["resume_checkpoints"] == 10 + 20 + 10
    assert run["list_rows"] == [3]
    assert run["bytes"] > 0 and not run["cached"]
    for kind in scale.RESUME_KINDS:
        assert run[f"{kind}_resume"] > 0 and run[f"{kind}_restore"] > 0
    table = capsys.readouterr().out
    assert "| lf-sqlite | 12 | 4 |" in table

    again = _run(tmp_path)
    assert again["cached"] and again["load_s"] == run["load_s"]
    # the first run wrote and resumed its resume sessions in a copy: the cached file is
    # as loaded
    assert again["ok"], again["problems"]
    assert "reused from" in capsys.readouterr().out
    fresh = _run(tmp_path, "--fresh")
    assert not fresh["cached"] and fresh["ok"], fresh.get("problems")


def test_the_plan_writes_the_long_sessions_first_and_names_each_session_once() -> None:
    plan = scale.Plan(sessions=3, per_session=5, copies=2, long=30)
    resumes = plan.resumes()
    assert [passes for _, passes, _ in resumes[:4]] == [30, 30, 30, 30]
    indexes = [index for index, _, _ in (*plan.bulk(), *resumes)]
    assert len(set(indexes)) == 3 + 3 * 2
    assert plan.kinds()["r1000c10"] == (30, 3)
    assert scale.checkpoints(plan.bulk()) == 3 * 5
    assert scale.checkpoints(resumes) == 2 * (10 + 30 + 10)
