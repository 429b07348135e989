"""bench/console.py at a tiny size: the console started as a user starts it, every page
it times answered and checked (a fork's page, a page deep in after the next-page links),
warm and cold-process, and the table printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bigjournal, console

pytestmark = pytest.mark.slow

SESSIONS = 120  # three pages of the list; sessions 39, 79 and 119 are forks


def test_every_page_is_timed_warm_and_cold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--sessions", str(SESSIONS), "--checkpoints", str(2 * SESSIONS)]
    argv += ["--requests", "2", "--warmup", "1", "--deep", "3", "--cache", str(tmp_path)]
    results = console.main(argv)
    names = [t.request.name for t in results.timings]
    assert names == [
        "list, first page",
        "list, status=failed",
        f"list, user={console.USER}",
        "list, page 3 (cursor)",
        "session page, typical",
        "session page, a fork",
        "API list, first page",
        "API session, typical",
    ]
    assert results.deep_page == 3
    deep = results.timings[3].request.url
    assert "cursor=" in deep
    typical, fork = console._picked(SESSIONS)
    assert fork is not None and bigjournal.is_fork(fork) and not bigjournal.is_fork(typical)
    for timing in results.timings:
        assert len(timing.warm_ms) == 2 and timing.cold_ms > 0 and timing.size > 0
    out = capsys.readouterr().out
    assert f"console: {SESSIONS} sessions, {2 * SESSIONS} checkpoints" in out
    assert "| list, page 3 (cursor) |" in out and "target (warm p50 < 100 ms" in out
