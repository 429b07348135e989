from __future__ import annotations

from loomflow.processors.analytics import RunTransition, run_transition, usage_delta
from loomflow.schemas import Message, RunFinished, RunStarted, TurnAppended, Usage


def _turn(model_call: bool) -> bytes:
    event = TurnAppended(
        user_id="alice",
        session_id="s",
        run_id="r",
        seq=2,
        epoch=1,
        payload={
            "messages": [Message.assistant("hi")],
            "usage": Usage(input_tokens=10, output_tokens=5, cost_usd=0.25),
            "model_call": model_call,
        },
    )
    return event.model_dump_json().encode()


def test_usage_comes_from_model_turns_only() -> None:
    delta = usage_delta(_turn(True))
    assert delta is not None and (delta.scope, delta.tokens, delta.cost_usd) == (
        "alice/s",
        15,
        0.25,
    )
    assert usage_delta(_turn(False)) is None
    assert usage_delta(b"{broken") is None
    assert usage_delta(None) is None


def test_runs_start_and_end() -> None:
    started = RunStarted(session_id="s", run_id="r", seq=1, epoch=1)
    finished = RunFinished(
        session_id="s",
        run_id="r",
        seq=2,
        epoch=1,
        payload={"output": "", "turns": 0, "usage": Usage()},
    )
    assert run_transition(started.model_dump_json().encode()) == RunTransition("/s", True)
    assert run_transition(finished.model_dump_json().encode()) == RunTransition("/s", False)
    assert run_transition(_turn(True)) is None
