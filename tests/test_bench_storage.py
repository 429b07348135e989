"""bench/storage.py: the issue's workloads on disk, through the store and the Agent."""

from __future__ import annotations

import pytest

from bench import storage


@pytest.mark.parametrize("workload", ["big", "agent-big"])
def test_a_session_of_2_kb_turns_takes_at_most_1_5x_its_transcript_on_disk(
    workload: str,
) -> None:
    # every checkpoint kept; the file and its WAL after the runtime closed
    measured = storage._measure(workload, 4096)
    assert measured["disk"] <= 1.5 * measured["transcript"], measured


def test_an_unknown_workload_is_refused_with_the_known_ones(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["storage", "--workloads", "big,huge"])
    with pytest.raises(SystemExit):
        storage.main()
    assert "unknown workloads huge: choose from single, big, agent-single" in (
        capsys.readouterr().err
    )
