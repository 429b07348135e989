"""bench/pg_peers.py: the transcript check, the verdict against the best peer, and our stack
end to end at a tiny size (the peers need their venv and are not run here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import checkpoints, pg_peers
from tests.support.services import postgres_dsn


def test_the_check_names_a_missing_a_changed_and_an_extra_message() -> None:
    expected = pg_peers.turn_transcript(0, 3)
    assert len(expected) == 1 + 4 * 3
    assert pg_peers.transcript_problems(list(expected), expected) == []

    dropped = expected[:5] + expected[6:]  # turn 2's user message
    (problem,) = pg_peers.transcript_problems(dropped, expected)
    assert problem.startswith("message 5 is assistant")

    role, text, _ = expected[7]  # turn 2's tool result, answering another call
    wrong_call = [*expected[:7], (role, text, "toolu_other"), *expected[8:]]
    assert pg_peers.transcript_problems(wrong_call, expected) != []

    assert pg_peers.transcript_problems(expected[:-1], expected) == [
        "the stored transcript holds 12 messages, expected 13"
    ]
    assert pg_peers.transcript_problems([*expected, expected[-1]], expected) != []


def test_the_put_transcript_is_the_checkpoint_workloads() -> None:
    put = pg_peers.put_transcript(2, 4)
    assert len(put) == 1 + 3 * 4
    # the assistant message carries the pass's text and its tool call
    assert put[2][0] == "assistant" and put[2][1] and put[2][2] == put[3][2]


def _runs(**medians: float | None) -> dict[str, list[dict[str, Any]]]:
    return {
        stack: [{"turn_p50": value, "ok": True}] if value is not None else [{"error": "boom"}]
        for stack, value in medians.items()
    }


def test_the_target_is_ours_over_the_faster_peer() -> None:
    target = pg_peers.turn_target({"turn": _runs(ours=10.0, langgraph=30.0, dbos=50.0)})
    assert target["peer"] == "langgraph" and target["ratio"] == pytest.approx(1 / 3)
    assert target["met"] is True

    target = pg_peers.turn_target({"turn": _runs(ours=20.0, langgraph=60.0, dbos=30.0)})
    assert target["peer"] == "dbos" and target["met"] is False

    # a peer whose runs all failed is no peer; none left: not measured
    target = pg_peers.turn_target({"turn": _runs(ours=10.0, langgraph=None, dbos=40.0)})
    assert target["peer"] == "dbos" and target["ratio"] == pytest.approx(0.25)
    assert pg_peers.turn_target({"turn": _runs(ours=10.0)})["met"] is None


def test_the_report_shows_each_stack_and_the_verdict() -> None:
    results = {"turn": _runs(ours=16.0, langgraph=31.0, dbos=None)}
    for runs in results["turn"].values():
        for r in runs:
            r.setdefault("first_p50", 12.0)
    table = pg_peers.report(results, pg_peers.STACKS, 30, 100)
    d = checkpoints.DASH
    assert f"| ours | 1 | 12.00 (12.00{d}12.00) | 16.00 (16.00{d}16.00) | 0.52x | True |" in table
    assert "| dbos | 0 | could not run: boom |" in table
    assert "0.52x (16.00 ms / langgraph's 31.00 ms): MISSED" in table


pg = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _dsn(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The benches find PostgreSQL by LOOMFLOW_POSTGRES_DSN, as the tests' services do."""
    if request.node.get_closest_marker("postgres"):
        monkeypatch.setenv("LOOMFLOW_POSTGRES_DSN", postgres_dsn())


@pg
@pytest.mark.slow
async def test_ours_keeps_every_message_of_its_turns() -> None:
    result = await pg_peers.ours_turn(12)
    assert result["problems"] == [] and result["turns"] == 12
    assert result["first_p50"] > 0 and result["turn_p50"] > 0


@pg
@pytest.mark.slow
async def test_a_stored_transcript_unlike_the_expected_one_is_a_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wanted = pg_peers.turn_transcript

    def one_too_many(index: int, turns: int) -> list[pg_peers.Norm]:
        return wanted(index, turns + 1)

    monkeypatch.setattr(pg_peers, "turn_transcript", one_too_many)
    result = await pg_peers.ours_turn(2)
    assert any("holds 9 messages, expected 13" in p for p in result["problems"])


@pg
@pytest.mark.slow
def test_a_put_child_prints_one_ok_line(capsys: pytest.CaptureFixture[str]) -> None:
    pg_peers.child(["--stack", "ours", "--case", "put", "--count", "4"])
    (line,) = capsys.readouterr().out.splitlines()
    result = json.loads(line)
    assert result["ok"] is True, result
    assert result["passes"] == 4 and result["put_p50"] > 0
