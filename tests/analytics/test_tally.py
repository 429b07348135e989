from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loomflow.analytics.tally import (
    NO_MODEL,
    NO_USER,
    Counters,
    Histogram,
    Mark,
    Stats,
    Tally,
    admit,
    contribution,
)
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    Message,
    RunFailed,
    RunFinished,
    RunStarted,
    SessionErased,
    SignalSent,
    ToolCall,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)

T0 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def _envelope(seq: int, **overrides: Any) -> dict[str, Any]:
    base = {"user_id": "ada", "session_id": "s1", "run_id": "r1", "seq": seq, "epoch": 1}
    return {**base, "at": T0, **overrides}


def _turn(seq: int, *, model_call: bool = True, **payload: Any) -> TurnAppended:
    defaults: dict[str, Any] = {
        "messages": [Message.assistant("hi")],
        "usage": Usage(
            input_tokens=10,
            cached_input_tokens=3,
            cache_write_tokens=2,
            output_tokens=5,
            cost_usd=0.25,
        ),
        "model_call": model_call,
        "model": "m1" if model_call else None,
        "latency_ms": 120.0 if model_call else None,
    }
    return TurnAppended(**_envelope(seq), payload={**defaults, **payload})


def _run(seq: int, kind: type[RunStarted | RunFinished | RunFailed], **env: Any) -> Event:
    payloads: dict[type[Any], dict[str, Any]] = {
        RunStarted: {"model": "m1"},
        RunFinished: {"output": "", "turns": 1, "usage": Usage(), "model": "m1"},
        RunFailed: {"error_type": "ModelError", "error": "down", "model": "m1"},
    }
    event: Event = kind(**_envelope(seq, **env), payload=payloads[kind])
    return event


# --- latency histogram ----------------------------------------------------------------


def test_quantiles_from_the_histogram_are_within_its_bucket_width_of_the_samples() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(6, 1) for _ in range(5000)]  # ~400 ms, long tail
    histogram = Histogram.of(*samples)
    ordered = sorted(samples)
    for q in (0.5, 0.95):
        exact = ordered[int(q * len(ordered)) - 1]
        estimate = histogram.quantile(q)
        assert estimate is not None and abs(estimate - exact) / exact < 0.06
    assert Histogram().quantile(0.5) is None


def test_histograms_merge_by_adding_counts_so_quantiles_come_from_the_tables() -> None:
    a, b = [5.0, 80.0, 81.0, 2000.0], [0.2, 90.0, 30_000.0, 10**9]
    merged = Histogram.of(*a) + Histogram.of(*b)
    assert merged == Histogram.of(*a, *b) and merged.count == 8
    assert Histogram.from_json(merged.to_json()) == merged
    top = merged.quantile(1.0)
    assert top is not None and top > 30_000  # a billion ms is clamped into the last bucket


# --- what an event adds ---------------------------------------------------------------


def test_a_model_turn_adds_its_tokens_cost_latency_and_each_tool_it_calls() -> None:
    calls = [ToolCall(id="c1", name="lookup"), ToolCall(id="c2", name="lookup"),
             ToolCall(id="c3", name="note")]  # fmt: skip
    added = contribution(_turn(2, messages=[Message.assistant("", calls)]))
    assert added is not None
    assert (added.hour, added.model, added.user) == ("2026-12-01T09:00Z", "m1", "ada")
    c = added.counters
    assert (c.turns, c.model_calls, c.input_tokens, c.cached_input_tokens) == (1, 1, 10, 3)
    assert (c.cache_write_tokens, c.output_tokens, c.cost_usd) == (2, 5, 0.25)
    assert dict(c.tools) == {"lookup": 2, "note": 1} and c.tool_calls == 3
    assert c.latency.count == 1 and c.latency_ms_total == 120.0


def test_prompts_and_tool_results_add_nothing_and_compactions_are_model_calls() -> None:
    assert contribution(_turn(2, model_call=False, usage=Usage())) is None
    compacted = TranscriptCompacted(
        **_envelope(3),
        payload={
            "messages": [Message.user("summary")],
            "usage": Usage(input_tokens=100, output_tokens=20, cost_usd=0.5),
            "replaced_messages": 4,
            "model": "m1",
            "latency_ms": 900.0,
        },
    )
    added = contribution(compacted)
    assert added is not None
    assert (added.counters.turns, added.counters.model_calls, added.counters.cost_usd) == (
        0,
        1,
        0.5,
    )
    checkpoint = CheckpointWritten(
        **_envelope(4),
        payload={"checkpoint_id": "c", "turn": 1, "cumulative_usage": Usage(cost_usd=9.0),
                 "message_count": 2, "retain": 3},
    )  # fmt: skip
    assert contribution(checkpoint) is None  # cumulative usage: already counted per turn


def test_runs_count_per_model_and_events_without_model_or_user_get_a_label() -> None:
    added = [contribution(_run(1, k)) for k in (RunStarted, RunFinished, RunFailed)]
    totals = sum((a.counters for a in added if a), Counters())
    assert (totals.runs_started, totals.runs_finished, totals.runs_failed) == (1, 1, 1)
    old = TurnAppended(
        **_envelope(2, user_id=None),
        payload={"messages": [], "usage": Usage(input_tokens=1), "model_call": True},
    )
    got = contribution(old)
    assert got is not None and (got.model, got.user) == (NO_MODEL, NO_USER)


# --- which events count ---------------------------------------------------------------


def test_admit_refuses_what_the_projector_refuses_and_skips_redeliveries() -> None:
    mark = Mark(last_seq=3, epoch=2)
    stale = admit(mark, _turn(4))  # epoch 1, the session is at 2
    assert stale.refused and "writer epoch 1 is older than 2" in stale.refused
    redelivered = admit(mark, _run(3, RunStarted, epoch=2))
    assert redelivered.duplicate and redelivered.mark == mark
    unclaimed = admit(mark, _turn(4).model_copy(update={"epoch": 3}))
    assert unclaimed.refused and "only a run start" in unclaimed.refused
    claim = admit(mark, _run(4, RunStarted, epoch=3))
    assert claim.refused is None and claim.mark == Mark(4, 3)
    ahead = _run(9, RunFinished, epoch=2)
    assert admit(mark, ahead).refused == "session 's1' (user 'ada') seq 9 skips ahead of seq 4"
    assert admit(mark, ahead, contiguous=False).mark == Mark(9, 2)  # the embedded log's gaps
    erased = admit(mark, SessionErased(**_envelope(4, epoch=3))).mark
    assert erased.erased and admit(erased, _run(5, RunStarted, epoch=4)).refused


def test_a_signal_claims_a_new_epoch_as_the_projector_lets_it() -> None:
    # a signal takes the session from a waiting run (the fold's CLAIM_TYPES); refused,
    # it left the mark behind, and on Kafka the worker's resumed run skipped ahead of it
    mark = Mark(last_seq=5, epoch=1)
    signal = SignalSent(**_envelope(6, epoch=2), payload={"name": "approve", "data": {"ok": 1}})
    sent = admit(mark, signal)
    assert sent.refused is None and sent.mark == Mark(6, 2)
    resumed = admit(sent.mark, _run(7, RunStarted, epoch=3))
    assert resumed.refused is None and resumed.mark == Mark(7, 3)


@pytest.mark.parametrize(
    "usage",
    [Usage(input_tokens=-5), Usage(cost_usd=-1.0), Usage(cost_usd=float("inf"))],
)
def test_a_forged_usage_that_no_model_call_has_is_refused(usage: Usage) -> None:
    verdict = admit(None, _turn(1, usage=usage))
    assert verdict.refused is not None and "negative or not finite" in verdict.refused


# --- tallies, ledgers and the read side -----------------------------------------------


def _session(tally: Tally, user: str, session: str, at: datetime, model: str) -> None:
    env = {"user_id": user, "session_id": session, "at": at}
    tally.add(RunStarted(**_envelope(1, **env), payload={"model": model}))
    tally.add(
        _turn(2, model=model, latency_ms=100.0 if model == "m1" else 1000.0).model_copy(update=env)
    )
    tally.add(
        RunFinished(
            **_envelope(3, **env),
            payload={"output": "", "turns": 1, "usage": Usage(), "model": model},
        )
    )


def test_a_tally_sums_sessions_and_the_read_side_groups_cuts_and_ranks_them() -> None:
    tally = Tally()
    _session(tally, "ada", "s1", T0, "m1")
    _session(tally, "bob", "s2", T0 + timedelta(hours=2), "m2")
    _session(tally, "ada", "s3", T0 + timedelta(hours=2), "m1")
    tally.add(_turn(2))  # s1's seq 2 again: a redelivery
    assert tally.skipped == {"duplicate": 1}

    ledger = Tally.from_ledger(Tally(marks={("ada", "s1"): tally.marks[("ada", "s1")]}).to_ledger())
    assert ledger.marks == {("ada", "s1"): Mark(3, 1)}

    stats = Stats.of_tallies([tally], "test")
    total = stats.totals()
    assert (total.runs_started, total.runs_finished, total.turns) == (3, 3, 3)
    assert total.cost_usd == 0.75 and total.input_tokens == 30
    assert [label for label, _ in stats.by("user")] == ["ada", "bob"]  # by cost
    assert [(h, c.turns) for h, c in stats.by("hour")] == [
        ("2026-12-01T09:00Z", 1),
        ("2026-12-01T11:00Z", 2),
    ]
    by_model = dict(stats.by("model"))
    p95 = by_model["m2"].latency.quantile(0.95)
    assert p95 is not None and 950 < p95 < 1050
    later = stats.since(T0 + timedelta(hours=1))
    assert later.totals().turns == 2 and {s.session_id for s in later.sessions} == {"s2", "s3"}
    assert stats.since(T0 + timedelta(days=1)).empty
    assert stats.slowest(1)[0].session_id == "s2"  # 1000 ms of model time


def test_an_erased_session_stops_being_named_and_late_events_do_not_count() -> None:
    tally = Tally()
    _session(tally, "ada", "s1", T0, "m1")
    tally.add(SessionErased(**_envelope(4, epoch=2)))
    assert tally.sessions[("ada", "s1")] is None
    tally.add(_run(5, RunStarted, epoch=3))
    assert tally.skipped == {"refused": 1}
    assert Stats.of_tallies([tally], "t").totals().runs_started == 1
