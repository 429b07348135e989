from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from loomflow import Agent, Message, SessionState, Tuning
from loomflow.errors import InvalidIdError, StoreError
from loomflow.models import AnthropicModel, ScriptedModel
from loomflow.runtime import InProcRuntime, Runtime, Scope, SqliteRuntime
from loomflow.schemas import RunFinished, RunStarted, TurnAppended


def boom(x: int) -> int:
    """Always fails."""
    raise RuntimeError(f"no {x}")


async def test_tool_errors_and_unknown_tools_go_back_to_the_model() -> None:
    model = ScriptedModel(
        [
            ScriptedModel.tool_call("boom", x=1),
            ScriptedModel.tool_call("missing"),
            ScriptedModel.tool_call("boom", x="not a number"),
            "gave up",
        ]
    )
    result = await Agent("x", model=model, tools=[boom]).run("go")
    tool_messages = [m for request in model.calls for m in request[-1:] if m.role.value == "tool"]
    assert [m.is_error for m in tool_messages] == [True, True, True]
    assert "RuntimeError: no 1" in tool_messages[0].content
    assert "tool 'missing' is not offered in this run" in tool_messages[1].content
    assert "invalid arguments" in tool_messages[2].content
    assert result.output == "gave up"


async def test_max_turns_ends_a_pass_that_keeps_calling_tools() -> None:
    model = ScriptedModel(lambda messages: ScriptedModel.tool_call("boom", x=1))
    result = await Agent("x", model=model, tools=[boom], tuning=Tuning(max_turns=3)).run("go")
    assert result.stop_reason == "max_turns" and result.model_calls == 3


async def test_stop_hooks_run_until_none_or_the_limit() -> None:
    seen: list[int] = []

    async def forever(state: SessionState) -> Message:
        seen.append(state.passes)
        return Message.user("again")

    model = ScriptedModel(lambda messages: "ok")
    runtime = InProcRuntime()
    tuning = Tuning(
        checkpoint=True, stop_hooks=[lambda s: None, forever], max_stop_hook_iterations=2
    )
    result = await Agent("x", model=model, runtime=runtime, tuning=tuning).run("go", session_id="s")
    assert result.stop_reason == "stop_hook_limit"
    assert seen == [1, 2, 3] and result.model_calls == 3
    assert len(await runtime.list_checkpoints(Scope("s"))) == 3  # one per pass


async def test_a_stop_hook_returning_junk_is_a_type_error_and_the_log_records_it() -> None:
    runtime = InProcRuntime()
    agent = Agent(
        "x",
        model=ScriptedModel(lambda m: "ok"),
        runtime=runtime,
        tuning=Tuning(stop_hooks=[lambda s: 42]),  # type: ignore[list-item, return-value]
    )
    with pytest.raises(TypeError, match="stop hook"):
        await agent.run("go", session_id="s")
    events = await runtime.store.read_events(Scope("s"))
    assert events[-1].type == "run.failed"


def test_a_model_name_means_claude_through_the_anthropic_sdk() -> None:
    agent = Agent("x", model="claude-opus-4-7")
    assert isinstance(agent.model, AnthropicModel) and agent.model.name == "claude-opus-4-7"


def test_bad_configuration_is_refused_early() -> None:
    with pytest.raises(ValueError):
        Tuning(max_turns=0)
    with pytest.raises(ValueError, match="two tools"):
        Agent("x", model=ScriptedModel([]), tools=[boom, boom])
    with pytest.raises(TypeError):
        Agent("x", model=42)  # type: ignore[arg-type]


async def test_resume_refuses_unknown_keywords() -> None:
    agent = Agent("x", model=ScriptedModel(lambda m: "ok"))
    with pytest.raises(TypeError, match="unexpected"):
        await agent.resume(session_id="s", colour="blue")


async def test_empty_prompts_are_refused_before_anything_is_written() -> None:
    runtime = InProcRuntime()
    agent = Agent("x", model=ScriptedModel(lambda m: "ok"), runtime=runtime)
    with pytest.raises(ValueError, match="empty"):
        await agent.run("  ", session_id="s")
    with pytest.raises(ValueError, match="empty"):
        await agent.resume("", session_id="s")
    with pytest.raises(TypeError):
        await agent.run(None, session_id="s")  # type: ignore[arg-type]
    assert await runtime.store.session(Scope("s")) is None


async def test_a_store_away_for_longer_than_the_retry_window_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loomflow.errors import StoreUnavailableError

    for bad in (-1, True, "5", 90_000):
        with pytest.raises(ValueError, match="retry_seconds must be a number from 0 to 86400"):
            InProcRuntime(retry_seconds=bad)  # type: ignore[arg-type]
    runtime = InProcRuntime(retry_seconds=0.5)
    agent = Agent("x", model=ScriptedModel(["a"]), runtime=runtime)
    attempts = 0
    real_append = runtime.store.append

    async def away(events: Any) -> None:
        nonlocal attempts
        if any(getattr(e.payload, "model_call", False) for e in events):
            attempts += 1
            raise StoreUnavailableError("down for good")
        await real_append(events)

    monkeypatch.setattr(runtime.store, "append", away)
    with pytest.raises(StoreUnavailableError, match="down for good"):
        await agent.run("go", session_id="s1")
    assert attempts >= 2  # tried again within the window, then gave up


async def test_model_turns_record_their_model_and_wall_time_and_tool_turns_stay_small(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [ScriptedModel.tool_call("boom", x=1), "done"], name="scripted-slow", latency=0.05
    )
    runtime = SqliteRuntime(tmp_path / "journal.db")
    try:
        await Agent("x", model=model, runtime=runtime, tools=[boom]).run("go", session_id="s")
        events = await runtime.store.read_events(Scope("s"))
    finally:
        await runtime.close()
    turns = [e for e in events if isinstance(e, TurnAppended)]
    calls = [t.payload for t in turns if t.payload.model_call]
    assert [c.model for c in calls] == ["scripted-slow", "scripted-slow"]
    assert all(c.latency_ms is not None and 50 <= c.latency_ms < 5_000 for c in calls)
    others = [t.payload for t in turns if not t.payload.model_call]
    assert others and all(p.model is None and p.latency_ms is None for p in others)
    runs = [e.payload for e in events if isinstance(e, RunStarted | RunFinished)]
    assert [r.model for r in runs] == ["scripted-slow", "scripted-slow"]
    # unset, the fields stay out of the stored JSON: a tool turn is no bigger than before
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        stored = [p for (p,) in conn.execute("SELECT payload FROM loomflow_events")]
    assert sum("latency_ms" in p for p in stored) == 2
    assert not any('"model":null' in p or '"latency_ms":null' in p for p in stored)


async def test_each_run_records_the_name_of_its_agent(tmp_path: Path) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db")
    named = Agent(
        "Be brief.",
        model=ScriptedModel(lambda messages: "ok"),
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
        name="researcher",
    )
    first = await named.run("one")
    await named.resume("two", session_id=first.session_id)
    older = (await named.list_checkpoints(first.session_id))[-1].checkpoint_id
    fork = await named.resume("three", session_id=first.session_id, from_checkpoint=older)
    unnamed = Agent("Be brief.", model=ScriptedModel(lambda messages: "ok"), runtime=runtime)
    other = await unnamed.run("four")

    def agents(session_id: str) -> list[tuple[str, str | None]]:
        return [
            (e.payload.mode, e.payload.agent)
            for e in events
            if isinstance(e, RunStarted) and e.session_id == session_id
        ]

    events = await runtime.store.read_events(Scope(first.session_id))
    assert agents(first.session_id) == [("run", "researcher"), ("resume", "researcher")]
    events = await runtime.store.read_events(Scope(fork.session_id))
    assert agents(fork.session_id) == [("fork", "researcher")]
    events = await runtime.store.read_events(Scope(other.session_id))
    assert agents(other.session_id) == [("run", "agent")]
    await runtime.close()
    with pytest.raises(InvalidIdError, match="agent name"):
        Agent("x", model=ScriptedModel(["a"]), name="has space")


async def test_run_finished_leaves_the_answer_to_the_transcript_that_holds_it(
    tmp_path: Path,
) -> None:
    from loomflow.log.describe import describe

    answer = "Oslo it is. " * 200  # ~2 KB, which the log held twice
    runtime = SqliteRuntime(tmp_path / "journal.db")
    try:
        agent = Agent("x", model=ScriptedModel([answer]), runtime=runtime)
        result = await agent.run("Where?", session_id="s")
        events = await runtime.store.read_events(Scope("s"))
        state = await runtime.restore(Scope("s"))
    finally:
        await runtime.close()
    assert result.output == answer
    finish = events[-1]
    assert isinstance(finish, RunFinished) and finish.payload.output is None
    assert "output" not in orjson.loads(finish.payload.model_dump_json(exclude_defaults=True))
    assert state is not None and finish.payload.answer(state.messages) == answer
    assert describe(finish).endswith(": its answer is the last above")
    # a run.finished written before keeps its answer, and tail shows it
    old = finish.model_copy(update={"payload": finish.payload.model_copy(update={"output": "a"})})
    assert describe(old).endswith(": a")


def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def _writes(runtime: Runtime) -> list[list[str]]:
    """The types of the events of each append to ``runtime``'s store from now on."""
    writes: list[list[str]] = []
    append = runtime.store.append

    async def counted(events: Any) -> None:
        writes.append([e.type for e in events])
        await append(events)

    runtime.store.append = counted  # type: ignore[method-assign]
    return writes


@pytest.mark.parametrize("embedded", ["sqlite", "inproc"])
async def test_a_final_answer_is_written_with_the_run_s_end_in_one_transaction(
    tmp_path: Path, embedded: str
) -> None:
    """On the stores that commit each append (no sending ahead), the prompt goes in the
    claim's transaction, and a final answer nothing acts on in the transaction of the
    checkpoint and the run's end: four writes a pass, not six, for a run of a new
    session and for a resume. With a stop hook the answer is written before the hook
    sees it."""
    runtime = SqliteRuntime(tmp_path / "j.db") if embedded == "sqlite" else InProcRuntime()
    writes = _writes(runtime)

    def agent(**tuning: Any) -> Agent:
        model = ScriptedModel(  # a prompt gets the tool call, the tool's result the answer
            lambda m: (
                ScriptedModel.tool_call("look", q="x")
                if m[-1].role.value == "user"
                else "the answer"
            )
        )
        tuned = Tuning(checkpoint=True, **tuning)
        return Agent("Answer.", model=model, runtime=runtime, tools=[look], tuning=tuned)

    turn = ["turn.appended"]
    one_pass = [
        ["run.started", *turn],  # the claim with the prompt, durable before the model call
        turn,  # the tool call, durable before the tool runs
        turn,  # the tool's result, durable before the model sees it
        [*turn, "checkpoint.written", "run.finished"],  # the answer with the end
    ]
    assert (await agent().run("Question?", session_id="s1")).output == "the answer"
    assert writes == one_pass
    state = await runtime.restore(Scope("s1"))
    assert state is not None and state.messages[-1].content == "the answer"
    assert [m.content for m in state.messages[:2]] == ["Answer.", "Question?"]
    writes.clear()
    assert (await agent().resume("Again?", session_id="s1")).output == "the answer"
    assert writes == one_pass
    state = await runtime.restore(Scope("s1"))
    assert state is not None and [m.content for m in state.messages[-4:]] == [
        "Again?",
        "",
        "found x",
        "the answer",
    ]

    writes.clear()
    result = await agent(stop_hooks=[lambda s: None]).run("Again?", session_id="s2")
    assert result.output == "the answer"
    assert writes[-2:] == [turn, ["checkpoint.written", "run.finished"]]
    await runtime.close()


@pytest.mark.parametrize("embedded", ["sqlite", "inproc"])
async def test_a_heartbeat_failed_during_the_final_model_call_leaves_the_answer_in_order(
    tmp_path: Path, embedded: str
) -> None:
    """A heartbeat written during a long final model call fails (a store blip): the
    answer held and the checkpoint staged after it are written with the run's end at the
    seqs the log has free, the answer kept (they were numbered past the heartbeat, and
    the end was refused as another writer's)."""
    options: dict[str, Any] = {"lease_seconds": 0.6, "retry_seconds": 0}  # a beat in 0.2 s
    runtime = (
        SqliteRuntime(tmp_path / "j.db", **options)
        if embedded == "sqlite"
        else InProcRuntime(**options)
    )
    append = runtime.store.append
    failed: list[str] = []

    async def blip(events: Any) -> None:
        if not failed and [e.type for e in events] == ["run.heartbeat"]:
            failed.append("heartbeat")
            raise StoreError("disk I/O error")  # not retriable; it did not land
        await append(events)

    runtime.store.append = blip  # type: ignore[method-assign]
    model = ScriptedModel(["the answer"], latency=0.3)  # the heartbeat falls inside it
    agent = Agent("Answer.", model=model, runtime=runtime, tuning=Tuning(checkpoint=True))
    result = await agent.run("Question?", session_id="s1")
    assert failed == ["heartbeat"] and result.output == "the answer"
    events = await runtime.store.read_events(Scope("s1"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events[-3:]] == ["turn.appended", "checkpoint.written", "run.finished"]
    await runtime.close()


# --- an interrupted run (Ctrl-C, a cancelled task) is left as a crash leaves it ------------


def _interruptible(db: Path, replies: list[Any], entered: asyncio.Event | None = None) -> Agent:
    async def wait_here() -> str:
        """Waits for a thing that never comes."""
        if entered is not None:
            entered.set()
        await asyncio.Event().wait()  # set by nothing
        return "never"

    def done_waiting() -> str:
        """Returns at once."""
        return "back"

    tool = wait_here if entered is not None else done_waiting
    tool.__name__ = "wait_here"
    return Agent(
        "x",
        model=ScriptedModel(replies),
        runtime=SqliteRuntime(db),
        tools=[tool],
        tuning=Tuning(checkpoint=True),
    )


async def _left_in_flight(db: Path, session_id: str) -> None:
    """The session as a crash leaves it: still running (a worker takes it over once its
    lease lapses), no run.failed; then a resume runs only what was not recorded."""
    runtime = SqliteRuntime(db)
    try:
        events = await runtime.store.read_events(Scope(session_id))
        assert [e.type for e in events][-1] == "turn.appended"
        assert "run.failed" not in {e.type for e in events}
        row = await runtime.store.session(Scope(session_id))
        assert row is not None and row.status == "running"
    finally:
        await runtime.close()
    agent = _interruptible(db, [ScriptedModel.tool_call("wait_here"), "done"])
    try:
        result = await agent.resume(None, session_id=session_id)
    finally:
        await agent.aclose()
    assert result.output == "done"
    model = agent.model
    assert isinstance(model, ScriptedModel) and len(model.calls) == 1  # the answer only
    tools = [m.content for m in model.calls[0] if m.role.value == "tool"]
    assert tools == ["back"]  # the call the run recorded, made again: it has no result


async def _cancelled_in_its_tool(db: Path, prompt: str) -> None:
    """Run ``prompt`` in session s1 until its tool waits, then cancel its task (Ctrl-C)."""
    entered = asyncio.Event()
    agent = _interruptible(db, [ScriptedModel.tool_call("wait_here"), "done"], entered)
    run = asyncio.create_task(agent.run(prompt, session_id="s1"))
    await asyncio.wait_for(entered.wait(), 60)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await agent.aclose()


async def test_a_cancelled_run_is_left_for_a_resume_not_failed(tmp_path: Path) -> None:
    await _cancelled_in_its_tool(tmp_path / "journal.db", "go")
    await _left_in_flight(tmp_path / "journal.db", "s1")


_CTRL_C = """
import asyncio, sys
from tests.agent.test_loop import _interruptible
from loomflow.models import ScriptedModel

async def main() -> None:
    entered = asyncio.Event()
    agent = _interruptible(sys.argv[1], [ScriptedModel.tool_call("wait_here"), "done"], entered)
    run = asyncio.create_task(agent.run("go", session_id="s1"))
    await entered.wait()
    print("IN TOOL", flush=True)
    await run

asyncio.run(main())
"""


def _run_to_interrupt(db: Path) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, "-c", _CTRL_C, str(db)],
        env=dict(os.environ, PYTHONPATH=str(root)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_ctrl_c_leaves_the_run_for_a_resume_not_failed(tmp_path: Path) -> None:
    """The README's Ctrl-C: ``asyncio.run`` cancels the run's task on SIGINT."""
    victim = _run_to_interrupt(tmp_path / "journal.db")
    try:
        assert victim.stdout is not None and victim.stderr is not None
        line = await asyncio.wait_for(asyncio.to_thread(victim.stdout.readline), 60)
        assert line.strip() == "IN TOOL", victim.stderr.read()
        victim.send_signal(signal.SIGINT)
        await asyncio.to_thread(victim.wait, 60)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(timeout=30)
    assert victim.stderr is not None and "KeyboardInterrupt" in victim.stderr.read()
    await _left_in_flight(tmp_path / "journal.db", "s1")


# --- a prompt a run left unanswered is not sent twice --------------------------------------


class _FirstCall(ScriptedModel):
    """A model whose first call fails (an API key missing, an outage), or, given
    ``entered``, hangs until its task is cancelled (Ctrl-C); "done" after that."""

    def __init__(self, entered: asyncio.Event | None = None) -> None:
        super().__init__(lambda messages: "done")
        self.entered = entered

    async def complete(self, messages: Any, tools: Any, **kwargs: Any) -> Any:
        if not self.calls:
            self.calls.append(list(messages))
            if self.entered is None:
                raise RuntimeError("no API key")
            self.entered.set()
            await asyncio.Event().wait()  # set by nothing: cancelled
        return await super().complete(messages, tools, **kwargs)


async def _left_unanswered(agent: Agent, model: _FirstCall) -> str:
    """Run "the task" in session s1 until its first model call fails or is cancelled
    (the run's process interrupted); the id of that run."""
    if model.entered is None:
        with pytest.raises(RuntimeError, match="no API key"):
            await agent.run("the task", session_id="s1")
    else:
        run = asyncio.create_task(agent.run("the task", session_id="s1"))
        await asyncio.wait_for(model.entered.wait(), 60)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    row = await agent.runtime.store.session(Scope("s1"))
    assert row is not None and row.last_run_id is not None
    return row.last_run_id


@pytest.mark.parametrize("again", ["the task", "another task"])
@pytest.mark.parametrize("ended", ["failed", "was interrupted"])
async def test_a_run_again_after_one_that_left_its_prompt_unanswered_sends_it_once(
    tmp_path: Path, again: str, ended: str
) -> None:
    model = _FirstCall(asyncio.Event() if ended == "was interrupted" else None)
    agent = Agent("x", model=model, runtime=SqliteRuntime(tmp_path / "journal.db"))
    try:
        first = await _left_unanswered(agent, model)
        result = await agent.run(again, session_id="s1")
    finally:
        await agent.aclose()
    assert result.output == "done"
    sent = [m.content for m in model.calls[-1] if m.role.value in ("user", "assistant")]
    if again == "the task":  # the same prompt: the one left unanswered, now answered
        assert sent == ["the task"]
    elif ended == "was interrupted":  # another: after a note that the first got no answer
        assert sent[0::2] == ["the task", "another task"] and len(sent) == 3
        assert sent[1].startswith(f"[no answer: run {first} {ended} before it answered this")
    else:  # another after a failure, whose error the log holds: it follows the first
        assert sent == ["the task", "another task"]


async def test_a_prompt_comes_after_the_tool_calls_a_run_left_unanswered(tmp_path: Path) -> None:
    """A run interrupted in a tool call left it without a result: the next run with a
    prompt runs it first, so that prompt does not go with the claim but after it."""
    await _cancelled_in_its_tool(tmp_path / "journal.db", "First?")
    again = _interruptible(tmp_path / "journal.db", [ScriptedModel.tool_call("wait_here"), "done"])
    writes = _writes(again.runtime)
    try:
        assert (await again.run("Next?", session_id="s1")).output == "done"
        state = await again.runtime.restore(Scope("s1"))
    finally:
        await again.aclose()
    assert writes[:3] == [["run.started"], ["turn.appended"], ["turn.appended"]]
    assert state is not None
    tail = [(m.role.value, m.content) for m in state.messages[-3:]]
    assert tail == [("tool", "back"), ("user", "Next?"), ("assistant", "done")]
