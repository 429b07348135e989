"""The resume worker and durable signals on the embedded default (SqliteRuntime).

The Kafka counterparts are in tests/runtime/test_kafka_worker.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loomflow import (
    Agent,
    RunTakenError,
    SerializationError,
    SessionBusyError,
    SessionNotFoundError,
    SessionState,
    SignalRefusedError,
    Tuning,
    wait_for_signal,
)
from loomflow.agent.worker import Budget, Worker, due
from loomflow.models.scripted import ScriptedModel
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.runtime.base import abandoned
from loomflow.schemas.clock import utcnow
from loomflow.schemas.sessions import SessionRecord
from tests.support.scenario import Research
from tests.support.signals import approval_agent
from tests.support.waiting import eventually, kill_once_hanging

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        **extra,
    )


def _crash_worker(db: Path, session: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.crash_worker", str(db), session, str(log), *extra],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _loomflow(*args: str, **env: str) -> subprocess.Popen[str]:
    """The ``loomflow`` command in its own process, from the repository's directory."""
    return subprocess.Popen(
        [sys.executable, "-m", "loomflow.cli", *args],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


async def _status(db: Path, session: str) -> str | None:
    runtime = SqliteRuntime(db)
    try:
        row = await runtime.store.session(Scope(session))
    finally:
        await runtime.close()
    return None if row is None else row.status


async def test_a_worker_finishes_a_sigkilled_run_without_repeating_recorded_calls(
    tmp_path: Path,
) -> None:
    db, log = tmp_path / "journal.db", tmp_path / "calls.log"
    # the 8th model call is pass 3's note call: it hangs, and the process is SIGKILLed
    await kill_once_hanging(_crash_worker(db, "s1", log, "--hang-at", "8", "--lease", "1"))
    assert await _status(db, "s1") == "running"  # its owner is dead, nobody knows yet

    # `loomflow worker` as a user starts it: the factory names the agents it hosts
    worker = _loomflow(
        "worker", "tests.support.resume_worker:research", RESEARCH_DB=str(db), RESEARCH_LOG=str(log)
    )
    try:
        await eventually(
            lambda: _finished(db, "s1"), within=60, what="the worker to finish the run"
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, err
    assert "claims session s1" in err and "abandoned" in err

    calls = Counter(log.read_text().splitlines())
    # model calls 0-6 were recorded before the kill: each ran once; call 7 was in flight
    # (never recorded), so the worker made it again, then the final answer (8)
    assert [calls[f"model {turn}"] for turn in range(9)] == [1] * 7 + [2, 1]
    tools = [line for line in calls if line.startswith("tool ")]
    assert tools and all(calls[line] == 1 for line in tools)
    runtime = SqliteRuntime(db)
    state = await runtime.restore(Scope("s1"))
    row = await runtime.store.session(Scope("s1"))
    await runtime.close()
    assert state is not None and state.turns == 9
    assert row is not None and row.status == "finished" and row.attempts == 0


async def _finished(db: Path, session: str) -> bool:
    return await _status(db, session) == "finished"


async def _abandoned_run(db: Path, session: str) -> int:
    """A session whose process was SIGKILLed mid-run (lease 0.5 s), once the lease has
    passed; returns its last seq."""
    log = db.with_suffix(".calls")
    victim = _crash_worker(db, session, log, "--passes", "2", "--hang-at", "3", "--lease", "0.5")
    await kill_once_hanging(victim)
    reader = SqliteRuntime(db)
    row = await eventually(
        lambda: _abandoned_row(reader, session), within=10, what="the lease to pass"
    )
    await reader.close()
    return int(row.last_seq)


async def _abandoned_row(runtime: SqliteRuntime, session: str) -> Any:
    row = await runtime.store.session(Scope(session))
    return row if row is not None and abandoned(row) else None


async def test_two_workers_racing_for_one_abandoned_run_resume_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "journal.db"
    await _abandoned_run(db, "s1")
    seen = await _row(db, "s1")
    researches = [Research(passes=2) for _ in range(2)]
    runtimes = [SqliteRuntime(db) for _ in range(2)]
    agents = [r.agent(rt) for r, rt in zip(researches, runtimes, strict=True)]
    workers = [Worker([agent]) for agent in agents]
    # Both see the same abandoned run and both claim it; the second claims once the
    # first's claim is in the log, while the first waits for its model, so the seq the
    # second saw the session end at is behind and nothing else is being written. A claim
    # made then would collide with no seq of the winner's: only the claim's own check
    # (the session moved on) keeps the second worker from taking the run over again.
    take_over = [agent.take_over for agent in agents]
    saw = [asyncio.Event(), asyncio.Event()]
    decided = asyncio.Event()  # the second worker's claim won or lost

    async def first_claim(*args: Any, **kwargs: Any) -> Any:
        saw[0].set()  # this worker read the session as abandoned
        await asyncio.wait_for(saw[1].wait(), 30)
        return await take_over[0](*args, **kwargs)

    async def second_claim(*args: Any, **kwargs: Any) -> Any:
        saw[1].set()
        await asyncio.wait_for(saw[0].wait(), 30)
        await eventually(
            lambda: _claimed_after(runtimes[1], seen.epoch), what="the first worker's claim"
        )
        try:
            return await take_over[1](*args, **kwargs)
        finally:
            decided.set()

    first_model = researches[0].models[-1]
    complete = first_model.complete

    async def waits_for_the_second_claim(*args: Any, **kwargs: Any) -> Any:
        await asyncio.wait_for(decided.wait(), 60)
        return await complete(*args, **kwargs)

    monkeypatch.setattr(agents[0], "take_over", first_claim)
    monkeypatch.setattr(agents[1], "take_over", second_claim)
    monkeypatch.setattr(first_model, "complete", waits_for_the_second_claim)
    tasks = [t for found in await asyncio.gather(*(w.scan() for w in workers)) for t in found]
    assert len(tasks) == 2, "each worker should have seen the abandoned run"
    await asyncio.gather(*tasks)
    outcomes = [[o.outcome for o in w.done] for w in workers]
    for runtime in runtimes:
        await runtime.close()
    assert outcomes == [["finished"], ["taken"]], outcomes
    assert len(researches[1].models[-1].inner.calls) == 0  # the loser called no model at all
    row = await _row(db, "s1")
    assert row.status == "finished" and row.epoch == seen.epoch + 1  # claimed once


async def _row(db: Path, session: str) -> SessionRecord:
    runtime = SqliteRuntime(db)
    try:
        row = await runtime.store.session(Scope(session))
    finally:
        await runtime.close()
    assert row is not None, f"no session {session}"
    return row


async def _claimed_after(runtime: SqliteRuntime, epoch: int) -> bool:
    row = await runtime.store.session(Scope("s1"))
    return row is not None and row.epoch > epoch


async def test_a_claim_after_a_seq_that_moved_on_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    last = await _abandoned_run(db, "s1")
    researches = [Research(passes=2) for _ in range(3)]
    agents = [r.agent(SqliteRuntime(db)) for r in researches]
    try:
        # two claims after the seq the session ends at, at once: one of them wins
        results = await asyncio.gather(
            *(
                a.take_over("s1", user_id=None, after_seq=last, worker=f"w{n}")
                for n, a in enumerate(agents[:2])
            ),
            return_exceptions=True,
        )
        finished = await agents[2].runtime.store.session(Scope("s1"))
        # a third after the same seq, now that the session has moved on past it: refused,
        # though the seq after the session's end is free for it to write at
        with pytest.raises(RunTakenError):
            await agents[2].take_over("s1", user_id=None, after_seq=last, worker="w2")
        after = await agents[2].runtime.store.session(Scope("s1"))
    finally:
        for agent in agents:
            await agent.runtime.close()
    taken = [r for r in results if isinstance(r, RunTakenError)]
    done = [r for r in results if not isinstance(r, BaseException)]
    assert len(taken) == 1 and len(done) == 1, results
    assert finished is not None and finished.status == "finished" and finished.last_seq > last
    assert after == finished  # the refused claim wrote nothing
    assert len(researches[2].models[-1].inner.calls) == 0  # nor called the model


async def test_a_worker_leaves_runs_of_agents_it_does_not_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "journal.db"
    await _abandoned_run(db, "s1")
    runtime = SqliteRuntime(db)
    other = Research(passes=2).agent(runtime)
    other.name = "someone-else"
    worker = Worker([other])
    with caplog.at_level("WARNING", logger="loomflow.worker"):
        assert await worker.scan() == []
    await runtime.close()
    assert "does not host" in caplog.text and "'agent'" in caplog.text
    assert await _status(db, "s1") == "running"


async def test_a_worker_leaves_a_fork_no_run_has_continued_alone_and_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db")
    agent = Agent(
        "x", model=ScriptedModel(["Oslo: 709000."]), runtime=runtime, tuning=Tuning(checkpoint=True)
    )
    await agent.run("Oslo?", session_id="s1")
    (checkpoint,) = await runtime.store.list_checkpoints(Scope("s1"), 10)
    await runtime.fork(Scope("s1"), checkpoint.checkpoint_id, session_id="s1-fork")
    # an hour on, as `loomflow sessions fork` leaves it: past any lease, still no run
    later = utcnow() + timedelta(hours=1)
    monkeypatch.setattr("loomflow.runtime.base.utcnow", lambda: later)
    with caplog.at_level(logging.DEBUG, logger="loomflow.worker"):
        assert await Worker([agent]).scan() == []
    fork = await runtime.store.session(Scope("s1-fork"))
    assert [r.getMessage() for r in caplog.records] == []
    assert fork is not None and (fork.status, fork.last_run_id) == ("running", None)
    assert due(fork) is None  # not abandoned: it has no run (whoever read it)
    # nor is it a run to signal: it said "run None … is running" (retriable) within the
    # lease, and took the signal past it, which no run then received
    for when in (utcnow, lambda: later):
        monkeypatch.setattr("loomflow.runtime.base.utcnow", when)
        with pytest.raises(SignalRefusedError, match="a fork that no run has continued"):
            await agent.signal("s1-fork", "approve", {"ok": True})
    await runtime.close()


# -- signals ----------------------------------------------------------------------------


async def test_a_waiting_run_exits_and_continues_with_the_signal_on_a_worker(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    seen: list[Any] = []
    first = SqliteRuntime(db)
    waiting = await approval_agent(first, seen).run("Pay invoice 7.", session_id="pay")
    await first.close()  # the process that ran it is gone
    assert waiting.stop_reason == "waiting" and waiting.waiting_for == "approve"
    assert await _status(db, "pay") == "waiting"

    # the signal comes from another process: the CLI, as the README sends it
    sender = _loomflow("signal", "pay", "approve", "--json", '{"ok": true}', "--db", str(db))
    out, err = await asyncio.to_thread(sender.communicate, timeout=60)
    assert sender.returncode == 0, err
    assert out.startswith("sent approve to pay")

    runtime = SqliteRuntime(db)
    agent = approval_agent(runtime, seen)
    worker = Worker([agent])
    tasks = await worker.scan()
    await asyncio.gather(*tasks)
    await runtime.close()
    assert [o.reason for o in worker.done] == ["signalled"]
    assert seen == [{"ok": True}]  # the tool got the payload where it waited
    assert await _status(db, "pay") == "finished"
    model = agent.model
    assert isinstance(model, ScriptedModel)
    # the resumed run made only the call after the tool's result: no nudge, no repeat
    (request,) = model.calls
    assert request[-1].role.value == "tool" and "approved=True for 5" in request[-1].content


async def test_a_signal_sent_while_no_process_runs_the_session_is_kept_and_delivered(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    dead = SqliteRuntime(db, lease_seconds=0.5)
    # a run that claimed the session, and whose process then died before its first turn
    await dead.open_session(Scope("pay"), run_id="run_dead", agent="agent")
    await dead.close()
    runtime = SqliteRuntime(db)
    seen: list[Any] = []
    agent = approval_agent(runtime, seen)
    await eventually(
        lambda: _abandoned_row(runtime, "pay"), within=10, what="the dead run's lease to pass"
    )
    await agent.signal("pay", "approve", {"ok": False})  # before the run ever waited
    worker = Worker([agent])
    # the signal's event is the session's newest: the run is abandoned again a lease later
    tasks = await eventually(worker.scan, within=10, what="the worker to find the run")
    await asyncio.gather(*tasks)
    row = await runtime.store.session(Scope("pay"))
    await runtime.close()
    # the resumed run got to its wait and found the signal there: it never waited
    assert [(o.reason, o.outcome) for o in worker.done] == [("abandoned", "finished")]
    assert seen == [{"ok": False}]
    assert row is not None and row.status == "finished" and row.inbox == ()


async def test_signals_go_only_to_runs_in_flight_and_end_with_them(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)
    seen: list[Any] = []
    agent = approval_agent(runtime, seen, greet=True)
    await agent.run("Hi.", session_id="pay")  # finished: no run to receive a signal
    with pytest.raises(SignalRefusedError, match="no run in flight"):
        await agent.signal("pay", "approve", {"ok": True})
    waiting = await agent.run("Pay invoice 8.", session_id="pay")
    assert waiting.stop_reason == "waiting"
    # a double click: two approvals for one wait
    await agent.signal("pay", "approve", {"ok": True})
    await agent.signal("pay", "approve", {"ok": True})
    result = await agent.resume(session_id="pay")
    row = await runtime.store.session(Scope("pay"))
    await runtime.close()
    assert result.stop_reason == "completed" and seen == [{"ok": True}]
    # the second approval ended with the run: it cannot approve a later run's wait
    assert row is not None and row.inbox == ()


async def _waiting_for_approval(tmp_path: Path) -> tuple[SqliteRuntime, Agent, list[Any]]:
    """A run of session "pay" that waits for "approve"; the signals its tool got."""
    runtime = SqliteRuntime(tmp_path / "journal.db")
    seen: list[Any] = []
    agent = approval_agent(runtime, seen)
    assert (await agent.run("Pay invoice 7.", session_id="pay")).stop_reason == "waiting"
    return runtime, agent, seen


async def test_a_new_prompt_ends_a_wait_in_a_tool(tmp_path: Path) -> None:
    runtime, agent, seen = await _waiting_for_approval(tmp_path)
    result = await agent.resume("Actually, cancel invoice 7.", session_id="pay")
    state = await runtime.restore(Scope("pay"))
    await runtime.close()
    assert result.stop_reason == "completed" and seen == []
    assert state is not None
    tool, prompt = state.messages[-3], state.messages[-2]
    assert tool.role.value == "tool" and tool.is_error and "ended without it" in tool.content
    assert prompt.content == "Actually, cancel invoice 7."


async def test_the_waiting_run_s_own_prompt_again_does_not_end_its_wait(tmp_path: Path) -> None:
    """The README's approval.py run a second time while its run waits sends the same
    prompt: that is the prompt the run is answering, not a new message. The run goes on
    waiting (a new user's trial saw the wait ended, the prompt twice in the transcript
    and the invoice "settled" with no approval); the signal then approves it."""
    runtime, agent, seen = await _waiting_for_approval(tmp_path)
    again = await agent.run("Pay invoice 7.", session_id="pay")
    assert again.stop_reason == "waiting" and again.waiting_for == "approve"
    state = await runtime.restore(Scope("pay"))
    assert state is not None and state.session is not None
    assert [m.content for m in state.messages].count("Pay invoice 7.") == 1
    assert not any(m.is_error for m in state.messages)
    assert state.session.waiting is not None
    await agent.signal("pay", "approve", {"ok": True})
    result = await agent.resume(session_id="pay")
    await runtime.close()
    assert result.stop_reason == "completed" and seen == [{"ok": True}]


def test_a_take_over_that_makes_progress_is_not_counted_as_a_failed_attempt() -> None:
    from loomflow.projections.fold import fold
    from loomflow.schemas import RunStarted, TurnAppended
    from loomflow.schemas.events import RunStartedPayload, TurnAppendedPayload

    row = None
    seq = 0

    def apply(event_type: Any, payload: Any, epoch: int) -> None:
        nonlocal row, seq
        seq += 1
        row, _ = fold(
            row, event_type(session_id="s", run_id="r", seq=seq, epoch=epoch, payload=payload)
        )

    apply(RunStarted, RunStartedPayload(worker="w1"), 1)
    apply(RunStarted, RunStartedPayload(worker="w2"), 2)
    assert row is not None and row.attempts == 2
    apply(TurnAppended, TurnAppendedPayload(messages=[], model_call=True), 2)
    apply(RunStarted, RunStartedPayload(worker="w3"), 3)
    assert row is not None and row.attempts == 1


async def test_bad_signals_are_typed_errors_and_change_nothing(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)
    agent = approval_agent(runtime, [])
    waiting = await agent.run("Pay.", session_id="pay", user_id="alice")
    assert waiting.stop_reason == "waiting"
    before = await runtime.store.session(Scope("pay", "alice"))
    with pytest.raises(SessionNotFoundError):
        await agent.signal("pay", "approve", {"ok": True}, user_id="mallory")
    with pytest.raises(SessionNotFoundError):
        await agent.signal("nope", "approve", user_id="alice")
    with pytest.raises(SerializationError, match="limit"):
        await agent.signal("pay", "approve", "x" * 70_000, user_id="alice")
    with pytest.raises(SerializationError):
        await agent.signal("pay", "approve", {1, 2}, user_id="alice")
    for not_json in (float("nan"), {"k": float("inf")}, {1: "int key"}):
        with pytest.raises(SerializationError):
            await agent.signal("pay", "approve", not_json, user_id="alice")
    assert await runtime.store.session(Scope("pay", "alice")) == before
    await runtime.close()


async def test_a_signalled_run_a_worker_cannot_continue_is_parked_with_its_signal(
    tmp_path: Path,
) -> None:
    # the run's tool is not hosted by the worker: the worker parks the signalled run;
    # the person who then resumes it where the tool is hosted goes on with the signal
    db = tmp_path / "journal.db"
    answers: list[Any] = []

    async def ask(question: str) -> str:
        """Ask a person."""
        answers.append(await wait_for_signal("answer"))
        return f"the answer: {answers[-1]}"

    def agent_on(runtime: SqliteRuntime, **hosted: Any) -> Agent:
        model = ScriptedModel([ScriptedModel.tool_call("ask", question="Ship it?"), "Shipped."])
        return Agent("x", model=model, runtime=runtime, tuning=Tuning(checkpoint=True), **hosted)

    runtime = SqliteRuntime(db)
    waiting = await agent_on(runtime).run("Ask first.", session_id="ship", extra_tools=[ask])
    assert waiting.stop_reason == "waiting"
    bare = agent_on(runtime)
    await bare.signal("ship", "answer", "yes")
    worker = Worker([bare])
    await asyncio.gather(*await worker.scan())
    assert [(o.reason, o.outcome) for o in worker.done] == [("signalled", "parked")]
    row = await runtime.store.session(Scope("ship"))
    assert row is not None and row.status == "stuck" and "'ask'" in (row.last_error or "")
    result = await agent_on(runtime, extra_tools=[ask]).resume(session_id="ship")
    await runtime.close()
    assert (result.stop_reason, result.output) == ("completed", "Shipped.")
    assert answers == ["yes"]


async def test_a_live_run_is_not_signalled_and_a_timed_out_wait_raises_in_the_tool(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)
    holder = await runtime.open_session(Scope("busy"), run_id="run_live", agent="agent")
    with pytest.raises(SessionBusyError):
        await runtime.signal(Scope("busy"), "approve", None)
    assert holder.next_seq == 2
    await runtime.close()


async def test_a_wait_in_a_stop_hook_goes_on_in_the_hook_without_a_model_call(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    reviews: list[Any] = []

    async def review(state: SessionState) -> str | None:
        answer = await wait_for_signal("review")
        reviews.append(answer)
        return None if answer["ok"] else "Shorter, please."

    def agent_on(runtime: SqliteRuntime) -> Agent:
        return Agent(
            "You draft notes.",
            model=ScriptedModel(["A long draft.", "Short draft."]),
            runtime=runtime,
            tuning=Tuning(checkpoint=True, stop_hooks=[review]),
        )

    first = SqliteRuntime(db)
    waiting = await agent_on(first).run("Draft a note.", session_id="note")
    await first.close()
    assert (waiting.stop_reason, waiting.waiting_for) == ("waiting", "review")
    assert waiting.output == "A long draft."

    runtime = SqliteRuntime(db)
    agent = agent_on(runtime)
    await agent.signal("note", "review", {"ok": False})
    worker = Worker([agent])
    await asyncio.gather(*await worker.scan())
    # the hook got the answer where it waited, asked for a revision, and waits again
    assert reviews == [{"ok": False}]
    assert [o.outcome for o in worker.done] == ["waiting"]
    await agent.signal("note", "review", {"ok": True})
    await asyncio.gather(*await worker.scan())
    row = await runtime.store.session(Scope("note"))
    state = await runtime.restore(Scope("note"))
    await runtime.close()
    assert reviews == [{"ok": False}, {"ok": True}]
    assert row is not None and row.status == "finished" and not row.inbox
    assert state is not None and [m.content for m in state.messages][-2:] == [
        "Shorter, please.",
        "Short draft.",
    ]
    model = agent.model
    assert isinstance(model, ScriptedModel) and len(model.calls) == 1  # only the revision


async def test_a_wait_past_its_timeout_is_a_tool_error_the_model_sees(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)

    async def ask(question: str) -> str:
        """Ask a person."""
        return str(await wait_for_signal("answer", timeout=0.3))

    model = ScriptedModel([ScriptedModel.tool_call("ask", question="Go?"), "Nobody answered."])
    agent = Agent(
        "You ask.", model=model, runtime=runtime, tools=[ask], tuning=Tuning(checkpoint=True)
    )
    waiting = await agent.run("Ask.", session_id="q")
    assert waiting.stop_reason == "waiting"
    worker = Worker([agent])
    tasks = await eventually(worker.scan, within=10, what="the wait's timeout to pass")
    await asyncio.gather(*tasks)
    state = await runtime.restore(Scope("q"))
    await runtime.close()
    assert [o.reason for o in worker.done] == ["timed out"]
    assert state is not None
    tool = next(m for m in state.messages if m.role.value == "tool")
    assert tool.is_error and "SignalTimeoutError" in tool.content
    assert state.messages[-1].content == "Nobody answered."


async def test_heartbeats_keep_a_long_model_call_from_being_taken_over(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db, lease_seconds=0.6)
    slow = ScriptedModel(["Done, slowly."], latency=2.0)  # over three leases in one call
    agent = Agent("You are slow.", model=slow, runtime=runtime)
    run = asyncio.create_task(agent.run("Take your time.", session_id="slow"))
    watcher_runtime = SqliteRuntime(db)
    watcher = Worker([Agent("You are slow.", model=ScriptedModel(["x"]), runtime=watcher_runtime)])
    looks = 0
    while not run.done():
        assert await watcher.scan() == []  # never due: its writer says it is alive
        looks += 1
        await asyncio.sleep(0.05)  # the watcher's poll interval
    result = await run
    events = await runtime.store.read_events(Scope("slow"))
    await runtime.close()
    await watcher_runtime.close()
    assert result.output == "Done, slowly." and looks > 10
    assert sum(e.type == "run.heartbeat" for e in events) >= 2
    assert watcher.done == []


async def test_a_run_that_keeps_failing_is_parked_and_listed_as_stuck(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "journal.db"
    await _abandoned_run(db, "s1")
    runtime = SqliteRuntime(db)
    broken = Research(passes=2).agent(runtime)
    broken.model = ScriptedModel([])  # every call fails: no replies
    worker = Worker([broken], name="w1", max_attempts=2, backoff_seconds=0.01)
    with caplog.at_level(logging.INFO, logger="loomflow.worker"):
        await asyncio.gather(*await worker.scan())
    row = await runtime.store.session(Scope("s1"))
    await runtime.close()
    # what an operator reads of a run that keeps failing: each claim, each failure, the
    # park and where to look; the TakeOver says the same to code
    s1 = Scope("s1").describe()
    said = [r.getMessage() for r in caplog.records if r.name == "loomflow.worker"]
    assert said[0] == f"worker w1 claims {s1} (abandoned, attempt 1 of 2, take 1 of 10)"
    assert said[1].startswith(f"worker w1: resuming {s1} failed: ModelError: ")
    assert said[2] == f"worker w1 claims {s1} (abandoned, attempt 2 of 2, take 2 of 10)"
    assert said[3].startswith(f"worker w1: resuming {s1} failed: ModelError: ")
    assert said[4] == (
        f"worker w1 parked {s1} (after 2 attempts): it waits for a person "
        "(loomflow sessions ls --stuck)"
    )
    assert said[5:] == [f"worker w1: {s1} is parked"]
    [done] = worker.done
    assert (done.session_id, done.user_id, done.reason, done.outcome) == (
        "s1",
        None,
        "abandoned",
        "parked",
    )
    assert done.detail.startswith("scripted model 'scripted' has 0 replies")
    assert [o.outcome for o in worker.done] == ["parked"]
    assert row is not None and row.status == "stuck" and row.attempts == 2
    assert row.last_error is not None and "ModelError" in row.last_error
    listing = _loomflow("sessions", "ls", "--stuck", "--db", str(db))
    out, err = await asyncio.to_thread(listing.communicate, timeout=60)
    assert listing.returncode == 0, err
    assert "stuck" in out and "s1: ModelError" in out


async def test_a_factory_that_does_not_import_is_a_clear_error() -> None:
    worker = _loomflow("worker", "no_such_module_here:agents")
    _, err = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 2
    assert err.strip().startswith("loomflow worker: cannot import 'no_such_module_here'")


def test_a_factory_that_gives_no_agents_is_a_clear_error() -> None:
    from loomflow.control.agents import load_agents

    for target in ("os:sep", "os:getpid", "tests.support.resume_worker"):
        with pytest.raises(ValueError, match=r"Agent|module:factory"):
            load_agents(target)
    # a factory that fails is named with its error (exit 2 from the command)
    with pytest.raises(ValueError, match=r"calling json:loads raised TypeError: .*argument"):
        load_agents("json:loads")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("max_attempts", 0, "max_attempts must be an int >= 1"),
        ("max_attempts", True, "max_attempts must be an int >= 1"),
        ("poll_seconds", 0, "poll_seconds must be a number from 0.01 to 3600"),
        ("poll_seconds", "1", "poll_seconds must be a number"),
        ("backoff_seconds", -1, "backoff_seconds must be a number from 0 to 3600"),
        ("backoff_seconds", 3601, "backoff_seconds must be a number"),
        ("stop_grace_seconds", -0.5, "stop_grace_seconds must be a number from 0 to 3600"),
    ],
)
async def test_a_worker_refuses_bad_options_and_is_named_by_its_host_and_pid(
    tmp_path: Path, option: str, value: object, says: str
) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db")
    agent = Agent("x", model=ScriptedModel(["hi"]), runtime=runtime)
    with pytest.raises(ValueError, match=says):
        Worker([agent], **{option: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one Agent"):
        Worker([])
    with pytest.raises(TypeError, match="a worker hosts Agents, not str"):
        Worker(["agent"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="budget must be a Budget, not dict"):
        Worker([agent], budget={"takes": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two agents are named 'agent': give each"):
        Worker([agent, Agent("y", model=ScriptedModel([]), runtime=runtime)])
    # the bounds are inclusive, and the defaults are what the README gives
    Worker([agent], max_attempts=1, poll_seconds=3600, backoff_seconds=3600)
    Worker([agent], stop_grace_seconds=0)
    Worker([agent], stop_grace_seconds=3600)
    defaults = Worker([agent])
    assert (defaults.poll_seconds, defaults.max_attempts, defaults.backoff_seconds) == (1, 3, 1)
    assert defaults.stop_grace_seconds == 5 and defaults.budget == Budget(takes=10)
    # the options checked, the worker keeps its own name (what run.started records)
    worker = Worker([agent], poll_seconds=0.5, backoff_seconds=0)
    assert worker.name == f"{socket.gethostname()}:{os.getpid()}"
    assert (worker.poll_seconds, worker.backoff_seconds) == (0.5, 0)
    assert Worker([agent], name="w1").name == "w1"
    await runtime.close()
