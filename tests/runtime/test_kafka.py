"""What only KafkaRuntime has to prove: appends pay for the log, reads see their writes,
fenced writers learn it, and a missing or far-away projector is named."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loomflow import Agent, Message, Tuning
from loomflow.errors import (
    InvalidEventError,
    ProjectionTimeoutError,
    RunCancelledError,
    SequenceConflictError,
    StaleWriterError,
    StoreError,
)
from loomflow.models import ScriptedModel
from loomflow.processors import Projector
from loomflow.producers import EventProducer, scope_key
from loomflow.runtime import KafkaRuntime, RestoredState, Scope
from loomflow.runtime.kafka import KafkaStore
from loomflow.schemas import CheckpointWritten, RunStarted, TurnAppended, new_id
from loomflow.schemas.events import (
    MAX_EVENT_BYTES,
    CheckpointWrittenPayload,
    RunStartedPayload,
    TurnAppendedPayload,
)
from loomflow.schemas.sessions import SessionRecord
from tests.support.kafka_env import ROOT, KafkaEnv
from tests.support.scenario import Research
from tests.support.services import postgres_dsn
from tests.support.signals import approval_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.kafka


def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=2)
    yield made
    await made.close()


async def test_without_a_running_projector_an_append_fails_clearly(env: KafkaEnv) -> None:
    runtime = env.runtime(projection_timeout=1.5)
    with pytest.raises(StoreError, match="loomflow processor"):
        await runtime.open_session(Scope("s1"), run_id=new_id("run"))
    await runtime.close()
    # once a projector runs, the same log is applied and the session can be claimed
    await env.start_projector()
    runtime = env.runtime()
    writer = await runtime.open_session(Scope("s1"), run_id=new_id("run"))
    # the first claim was projected too, and the run it opened parked, then this claim
    assert writer.next_seq == 4
    await runtime.close()


async def test_a_run_whose_claim_timed_out_is_parked_so_no_worker_runs_it(
    env: KafkaEnv,
) -> None:
    """With no processor, a run's claim is in the log but its verdict never comes: the
    caller gets ProjectionTimeoutError before any model call. That run is parked right
    after its claim (stuck, the error recorded), so once a processor runs, no worker
    takes it over as abandoned and continues a run its caller was told had failed, with
    a prompt the log never got (a new user's trial of the README found one doing so)."""
    runtime = env.runtime(projection_timeout=1.5)
    research = Research(passes=1)
    with pytest.raises(ProjectionTimeoutError, match=r"Run run\w+ of session s1 .* was parked"):
        await research.agent(runtime).run("Research.", session_id="s1")
    assert research.models[0].calls == 0
    await runtime.close()
    await env.start_projector()
    await eventually(env.caught_up, what="the projector to apply the claim")
    reader = env.runtime()
    row = await reader.store.session(Scope("s1"))
    assert row is not None and row.status == "stuck"
    assert row.last_error is not None and row.last_error.startswith("ProjectionTimeoutError")
    in_flight = await reader.store.sessions_in_flight()
    assert "s1" not in [r.session_id for r in in_flight]  # no worker sees a run to take
    result = await Research(passes=1).agent(reader).run("Research.", session_id="s1")
    assert result.turns == 3  # a person runs it again: from where the log left it
    await reader.close()


async def test_an_unreachable_kafka_names_the_script() -> None:
    runtime = KafkaRuntime("127.0.0.1:1", postgres_dsn())
    with pytest.raises(StoreError, match=r"dev/kafka\.sh start"):
        await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    await runtime.close()


async def test_restore_reads_the_log_past_a_lagging_read_model(env: KafkaEnv) -> None:
    projector = await env.start_projector()
    runtime = env.runtime()
    research = Research(passes=2)
    await research.agent(runtime).run("Research.", session_id="s1")
    row = await runtime.store.session(Scope("s1"))
    assert row is not None
    await env.stop_projector(projector)

    # acknowledged by Kafka while no projector runs: the read model does not have it
    late = TurnAppended(
        session_id="s1",
        run_id=new_id("run"),
        seq=row.last_seq + 1,
        epoch=row.epoch,
        payload=TurnAppendedPayload(messages=[Message.user("a late question")]),
    )
    producer = EventProducer(env.bootstrap, env.topics)
    await producer.send([late])
    await producer.stop()

    state = await runtime.restore(Scope("s1"))
    assert state is not None and state.seq == late.seq
    assert state.messages[-1] == Message.user("a late question")
    # the tail's reader leaves no fetch waiting at the partition's end: the next read of a
    # tail would wait it out (fetch_max_wait_ms, 500 ms) once an end_offsets() came between
    reader = runtime.store._consumer
    assert reader is not None and reader.assignment() and reader.assignment() <= reader.paused()
    assert (await runtime.store.session(Scope("s1"))).last_seq == late.seq  # type: ignore[union-attr]

    await env.start_projector()  # the projector catches up; the resumed run goes on
    follow = Research(passes=3)
    result = await follow.agent(runtime).resume(session_id="s1")
    assert result.restored_turns == 6 and result.turns == 9
    first_request = follow.models[-1].inner.calls[0]
    assert first_request.count(Message.user("a late question")) == 1
    await runtime.close()


# --- the writer pays for the log, not for the projection -----------------------------------


async def test_a_zombie_writer_is_fenced_and_never_reaches_the_read_model(env: KafkaEnv) -> None:
    await env.start_projector()
    scope = Scope("s1")
    zombie_rt, fresh_rt, blind_rt = env.runtime(), env.runtime(), env.runtime()
    zombie = await zombie_rt.open_session(scope, run_id=new_id("run"))
    await zombie.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("before")]))
    fresh = await fresh_rt.open_session(scope, run_id=new_id("run"))  # a resume elsewhere
    assert fresh.epoch == zombie.epoch + 1

    # the zombie's runtime hears of the new epoch and refuses before writing to the log
    watch = zombie_rt.store._watches[Scope("s1")]
    await eventually(lambda: watch.epoch == fresh.epoch, what="the new epoch's notification")
    ends = await env.end_offsets()
    with pytest.raises(StaleWriterError):
        await zombie.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
    assert await env.end_offsets() == ends, "a fenced writer still wrote to the log"

    # a zombie that never heard (its process was asleep): the projector refuses its event,
    # and the writer learns it when its run confirms
    blind = await blind_rt.open_session(Scope("other"), run_id=new_id("run"))
    del blind
    stale = zombie.make(TurnAppended, TurnAppendedPayload(messages=[Message.user("stale")]))
    await blind_rt.store.append([stale])
    with pytest.raises(StaleWriterError):
        await blind_rt.store.confirm(scope)

    await fresh.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("mine")]))
    await fresh.confirm()
    state = await fresh_rt.restore(scope)
    assert state is not None
    assert [m.content for m in state.messages] == ["before", "mine"]
    for runtime in (zombie_rt, fresh_rt, blind_rt):
        await runtime.close()


async def _judged_unheard(env: KafkaEnv) -> tuple[KafkaRuntime, Scope, list[KafkaRuntime]]:
    """A blind writer's runtime whose stale append to ``s1`` the projector is yet to
    refuse (it is stopped), with the runtimes to close."""
    projector = await env.start_projector()
    scope = Scope("s1")
    zombie_rt, fresh_rt, blind_rt = env.runtime(), env.runtime(), env.runtime()
    zombie = await zombie_rt.open_session(scope, run_id=new_id("run"))
    await fresh_rt.open_session(scope, run_id=new_id("run"))  # a resume elsewhere
    await env.stop_projector(projector)
    await blind_rt.store.open()  # listening before it appends
    stale = zombie.make(TurnAppended, TurnAppendedPayload(messages=[Message.user("stale")]))
    await blind_rt.store.append([stale])
    return blind_rt, scope, [zombie_rt, fresh_rt, blind_rt]


async def test_a_refusal_sent_while_the_writer_was_reconnecting_is_read_from_the_read_model(
    env: KafkaEnv,
) -> None:
    """A confirm that heard the projector pass its events skips asking the read model for
    refusals only on the LISTEN connection that was up when they were sent: one re-made
    since may have missed the refusal's notification, though it hears later positions."""
    blind_rt, scope, runtimes = await _judged_unheard(env)
    store = blind_rt.store
    await store._listener.close()  # PostgreSQL dropped it, say
    await env.start_projector()
    await eventually(lambda: store._reads.refusal(list(store._watches[scope].unconfirmed)))
    await store._listener.start()  # back, after the refusal's notification went out
    other = env.runtime()  # another event of the session, heard on the new connection
    writer = await other.open_session(scope, run_id=new_id("run"))
    await writer.confirm()
    watch = store._watches[scope]
    await eventually(
        lambda: store._positions.heard_passed(watch.written, store._listener.generation),
        what="a position past the refused event, heard on the new connection",
    )
    with pytest.raises(StaleWriterError):
        await store.confirm(scope)
    for runtime in (*runtimes, other):
        await runtime.close()


async def test_a_refusal_whose_notification_is_late_is_read_when_the_wait_polled_the_position(
    env: KafkaEnv,
) -> None:
    """A position the wait read from the table (its poll) says nothing of notes still in
    flight: the confirm asks the read model for refusals."""
    blind_rt, scope, runtimes = await _judged_unheard(env)
    listener = blind_rt.store._listener
    held: list[tuple[Any, ...]] = []
    listener._on_position = lambda *note: held.append(note)
    listener._on_session = lambda *note: held.append(note)
    await env.start_projector()
    with pytest.raises(StaleWriterError):
        await blind_rt.store.confirm(scope)
    assert held, "the projector's notifications were not held"
    for runtime in runtimes:
        await runtime.close()


async def test_a_cancelled_writer_hears_of_it_and_writes_nothing_more_to_the_log(
    env: KafkaEnv,
) -> None:
    await env.start_projector()
    scope = Scope("s1")
    running_rt, operator_rt = env.runtime(), env.runtime()
    writer = await running_rt.open_session(scope, run_id=new_id("run"))
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("before")]))
    seq = await operator_rt.cancel(scope, "stop")  # `loomflow sessions cancel` elsewhere

    # the projector's notification of the cancel's epoch says it is a cancel: the running
    # runtime refuses the run's next append with the typed error, before the log sees it
    watch = running_rt.store._watches[scope]
    await eventually(lambda: watch.cancelled == writer.epoch + 1, what="the cancel's notification")
    ends = await env.end_offsets()
    with pytest.raises(RunCancelledError, match=f"run {writer.run_id} of session s1"):
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
    assert await env.end_offsets() == ends, "a cancelled writer still wrote to the log"

    # one that never heard (its process was asleep): the projector refuses its event with
    # the same error, which the writer learns when its run confirms
    blind_rt = env.runtime()
    stale = writer.make(TurnAppended, TurnAppendedPayload(messages=[Message.user("stale")]))
    await blind_rt.store.append([stale])
    with pytest.raises(RunCancelledError, match=f"run {writer.run_id} of session s1"):
        await blind_rt.store.confirm(scope)
    row = await operator_rt.store.session(scope)
    assert row is not None and (row.status, row.last_seq) == ("cancelled", seq)
    for runtime in (running_rt, operator_rt, blind_rt):
        await runtime.close()


class _SlowProjector(Projector):
    """A loaded processor: every round of projection takes a while."""

    async def _apply(self, batches: Any) -> None:
        await asyncio.sleep(0.3)  # stands in for a busy database, not for synchronisation
        await super()._apply(batches)


async def test_another_process_reads_a_run_the_moment_it_returns(
    env: KafkaEnv, tmp_path: Path
) -> None:
    slow = _SlowProjector(env.settings, poll_ms=20)
    await slow.start()
    stop = asyncio.Event()
    task = asyncio.create_task(slow.run(stop))
    try:
        log = str(tmp_path / "calls.log")
        writer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.crash_worker",
            "unused.db",
            "s1",
            log,
            "--kafka",
            env=dict(os.environ, **env.variables(), PYTHONPATH=str(ROOT)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
        )
        assert writer.stdout is not None
        line = await asyncio.wait_for(writer.stdout.readline(), 120)
        # the run has returned in the writer; this process reads at once, no waiting
        reader = env.runtime()
        metas = await reader.list_checkpoints(Scope("s1"))
        row, _ = await reader.store.projected_session(Scope("s1"))
        await reader.close()
        await writer.wait()
    finally:
        stop.set()
        await task
        await slow.stop()
    result = json.loads(line)
    assert result["turns"] == 9
    assert len(metas) == 3 and metas[0].turn == 9
    assert row is not None and row.status == "finished"


async def test_concurrent_reads_on_one_runtime_while_the_projector_is_stopped(
    env: KafkaEnv,
) -> None:
    projector = await env.start_projector()
    writer_rt = env.runtime()
    await Research(passes=2).agent(writer_rt).run("Research.", session_id="s1")
    row = await writer_rt.store.session(Scope("s1"))
    await writer_rt.close()
    assert row is not None
    await env.stop_projector(projector)
    late = [
        TurnAppended(
            session_id="s1",
            run_id=new_id("run"),
            seq=row.last_seq + k,
            epoch=row.epoch,
            payload=TurnAppendedPayload(messages=[Message.user(f"late {k}")]),
        )
        for k in (1, 2, 3)
    ]
    producer = EventProducer(env.bootstrap, env.topics)
    await producer.send(late)
    await producer.stop()

    runtime = env.runtime()
    sessions = [runtime.store.session(Scope("s1")) for _ in range(20)]
    restores = [runtime.restore(Scope("s1")) for _ in range(20)]
    results = await asyncio.gather(*sessions, *restores, return_exceptions=True)
    await runtime.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    for found in results[:20]:
        assert isinstance(found, SessionRecord) and found.last_seq == row.last_seq + 3
    for state in results[20:]:
        assert isinstance(state, RestoredState) and state.seq == row.last_seq + 3
        assert [m.content for m in state.messages[-3:]] == ["late 1", "late 2", "late 3"]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("processor_id", "group 'someone-else-projector'"),
        ("db_schema", "schema 'someone_else'"),
        ("topic_prefix", "someone-else.events"),
    ],
)
async def test_a_runtime_configured_unlike_the_processor_says_how(
    env: KafkaEnv, setting: str, expected: str
) -> None:
    await env.start_projector()
    value = "someone_else" if setting == "db_schema" else "someone-else"
    mismatched = env.settings.model_copy(update={setting: value, "projection_timeout": 2.0})
    lost = KafkaRuntime(settings=mismatched)
    try:
        with pytest.raises(ProjectionTimeoutError) as caught:
            await Research(passes=1).agent(lost).run("Research.", session_id="s1")
    finally:
        await lost.close()
        if setting == "db_schema":
            env.extra_schemas.append(value)
        if setting == "topic_prefix":
            env.extra_topics.append(value)
    message = str(caught.value)
    assert expected in message  # what this runtime waited for
    assert f"group {env.group!r} on topic {env.topics.events!r}" in message  # what runs
    assert f"schema {env.schema!r}" in message
    assert "LOOMFLOW_" in message


async def test_a_timeout_with_no_processor_reporting_does_not_say_none_ever_ran(
    env: KafkaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A processor that stops removes its row: with none reporting, the timeout said
    that none had ever reported, minutes after one had (a new-user trial)."""
    runtime = env.runtime()
    store = runtime.store
    assert isinstance(store, KafkaStore)

    async def nobody() -> list[Any]:
        return []

    monkeypatch.setattr(store._reads, "processors", nobody)
    said = await store._diagnose({0: 7})
    assert "No processor reports to this database now" in said
    assert "ever" not in said and "one that stops removes its row" in said
    assert "start `loomflow processor` with the same LOOMFLOW_* settings" in said
    await runtime.close()


async def test_an_unreachable_postgres_names_the_script(env: KafkaEnv) -> None:
    runtime = KafkaRuntime(
        settings=env.settings.model_copy(
            update={"postgres_dsn": "postgresql://loomflow:loomflow@127.0.0.1:1/loomflow"}
        )
    )
    with pytest.raises(StoreError, match=r"dev/postgres\.sh start"):
        await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    await runtime.close()


def _counted(runtime: KafkaRuntime, seen: list[str]) -> None:
    """Note in ``seen`` every query of the read model, every request for the end of a
    partition and every wait for the projector."""
    store = runtime.store
    call, projected = store._reads._call, store._projected

    async def counted_read(read: Any, *args: Any) -> Any:
        seen.append(read.__name__)  # every query of the read model, one round trip each
        return await call(read, *args)

    async def counted_wait(wanted: dict[int, int]) -> None:
        seen.append("projector wait")
        await projected(wanted)

    end_of = store._end_of

    async def counted_end(partition: int) -> int:
        seen.append("log end")  # a request to Kafka for the partition's end
        return await end_of(partition)

    store._reads._call = counted_read  # type: ignore[method-assign,assignment]
    store._projected = counted_wait  # type: ignore[method-assign]
    store._end_of = counted_end  # type: ignore[method-assign]


async def _resumed_once_the_projector_is_back(env: KafkaEnv, runtime: KafkaRuntime) -> list[str]:
    """Resume ``s1`` (its first run made 3 turns) on ``runtime`` while the projector is
    away, start the projector once the claim waits for it, and return what ``_counted``
    noted of the resume."""
    seen: list[str] = []
    _counted(runtime, seen)
    resuming = asyncio.create_task(Research(passes=2).agent(runtime).resume(session_id="s1"))
    await eventually(lambda: "projector wait" in seen, what="the first claim's wait")
    await env.start_projector()
    result = await asyncio.wait_for(resuming, 60)
    assert result.restored_turns == 3 and result.turns == 6
    return seen


def _reads(seen: list[str]) -> list[str]:
    """What ``_counted`` noted before the first model call, the first two sorted: the
    read model and the log's end are asked at once, and answer in either order."""
    before = seen[: seen.index("model call")]
    return sorted(before[:2]) + before[2:]


def _heard(agent: Agent, seen: list[str], calls: list[list[Message]]) -> None:
    """Note each model call in ``seen`` and the messages it was handed in ``calls``."""
    complete = agent.model.complete

    async def noted(messages: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append("model call")
        calls.append(list(messages))
        return await complete(messages, *args, **kwargs)

    agent.model.complete = noted  # type: ignore[method-assign]


async def test_a_resume_where_the_session_was_left_reads_nothing_and_waits_for_nothing(
    env: KafkaEnv,
) -> None:
    """What a Kafka resume pays before its first model call in the process that ran the
    session last: the claim's acknowledgement, nothing else. The session is known there
    (its last run's appends, their verdict known, and the projector applied no record of
    the partition after them), and the claim is confirmed by where Kafka put it: right
    after them, so no other record came between (design: "One synchronous point per
    run"). Returning waits for nothing either: the run's events landed right after its
    claim, so the fold's verdict on them is the projector's, and every process's reads of
    the run's checkpoints wait for them by position.

    That process reads no transcript either: its own appends are served from memory,
    and the model is handed the very message objects the
    last run had, so its work on them (a count, a conversion, the transcript's hash)
    carries on instead of starting over each turn. Another process reads the session
    (the read model's row, the newest checkpoint and the projector's position at once,
    and the log's end) and the transcript once, and its first claim waits for the
    projector; after it ran, the first one reads too: the projector has applied records
    past what it knew."""
    await env.start_projector()
    runtime = env.runtime()
    ran = Research(passes=2).agent(runtime)
    last: list[list[Message]] = []
    _heard(ran, [], last)
    await ran.run("Research.", session_id="s1")
    seen: list[str] = []
    _counted(runtime, seen)
    agent = Research(passes=3).agent(runtime)
    calls: list[list[Message]] = []
    _heard(agent, seen, calls)
    result = await agent.resume(session_id="s1")
    assert result.restored_turns == 6 and result.turns == 9  # it did resume, from turn 6
    assert [s for s in seen if s not in ("model call", "get_step")] == []
    before = last[-1]
    assert all(map(operator.is_, calls[0][: len(before)], before))
    assert len(calls[0]) > len(before)  # and the answer and the new prompt after them

    await eventually(env.caught_up, what="the projector to apply the run")
    other = env.runtime()  # another process: nothing of the session in its memory
    seen.clear()
    _counted(other, seen)
    agent = Research(passes=4).agent(other)
    _heard(agent, seen, [])
    result = await agent.resume(session_id="s1")
    assert result.restored_turns == 9 and result.turns == 12
    # its first claim waits: that projector has applied nothing of this process's yet
    assert _reads(seen) == ["load_head", "log end", "projector wait", "read_transcript"]

    await eventually(env.caught_up, what="the projector to apply the other process's run")
    seen.clear()  # the first process again: the other one's run came after what it knew
    agent = Research(passes=5).agent(runtime)
    _heard(agent, seen, [])
    result = await agent.resume(session_id="s1")
    assert result.restored_turns == 12 and result.turns == 15
    assert _reads(seen) == ["load_head", "log end", "read_transcript"]
    await other.close()
    await runtime.close()


async def test_a_fork_whose_wait_timed_out_says_it_is_in_the_log(env: KafkaEnv) -> None:
    """A fork made while no processor runs is written, but its wait times out: the error
    names the fork, which the log holds and a processor applies later, so that its maker
    does not make it again (a new user's trial found the id nowhere)."""
    projector = await env.start_projector()
    runtime = env.runtime(projection_timeout=1.5)
    await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    (meta,) = await runtime.list_checkpoints(Scope("s1"))
    await env.stop_projector(projector)
    with pytest.raises(ProjectionTimeoutError, match=r"The fork session f1 .* is in the log"):
        await runtime.fork(Scope("s1"), meta.checkpoint_id, session_id="f1")
    await env.start_projector()
    forked = await runtime.store.session(Scope("f1"))
    assert forked is not None and forked.parent_session_id == "s1"
    await runtime.close()


async def test_a_signal_whose_wait_timed_out_says_it_is_in_the_log(env: KafkaEnv) -> None:
    """As a fork: a signal sent while no processor runs is written, and the error says so,
    with its seq, so that its sender does not send it again; once a processor runs, the
    waiting run has it."""
    projector = await env.start_projector()
    runtime = env.runtime(projection_timeout=1.5)
    waiting = await approval_agent(runtime, []).run("Pay.", session_id="s1")
    assert waiting.stop_reason == "waiting"
    await eventually(env.caught_up, what="the projector to apply the wait")
    await env.stop_projector(projector)
    with pytest.raises(ProjectionTimeoutError, match=r"signal.sent event \(seq \d+ of session s1"):
        await runtime.signal(Scope("s1"), "approve", {"ok": True})
    await env.start_projector()
    row = await runtime.store.session(Scope("s1"))
    assert row is not None and row.status == "signalled"
    await runtime.close()


async def test_runs_return_without_the_projector_and_another_process_then_reads_them(
    env: KafkaEnv,
) -> None:
    """A pass waits for the projector nowhere once a process has run the session (issue
    25: each run's end waited for it). With the projector stopped after the first run, the
    same process resumes the session twice: each claim made of what it knew and confirmed
    by where Kafka put it, though the projector has not applied the run before (the
    second); each end confirmed by the fold's verdict. Once the projector is back, another
    process waits for it by position (``synced``, before reading the read model itself, as
    a listing does) and sees both runs."""
    projector = await env.start_projector()
    runtime = env.runtime(projection_timeout=1.5)  # a wait for the projector fails the test
    await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    await eventually(env.caught_up, what="the projector to apply the first run")
    await env.stop_projector(projector)
    for passes in (2, 3):
        result = await Research(passes=passes).agent(runtime).resume(session_id="s1")
        assert result.restored_turns == 3 * (passes - 1) and result.turns == 3 * passes
    slow = _SlowProjector(env.settings, poll_ms=20)  # back, and behind for a while
    await slow.start()
    stop = asyncio.Event()
    task = asyncio.create_task(slow.run(stop))
    other = env.runtime()
    try:
        await other.store.synced()
        row, _ = await other.store.projected_session(Scope("s1"))
        assert row is not None and row.status == "finished" and row.turns == 9
        metas = await other.list_checkpoints(Scope("s1"))
        assert [m.turn for m in metas] == [9, 6, 3]
    finally:
        stop.set()
        await task
        await slow.stop()
        for opened in (runtime, other):
            await opened.close()


def _chatty(runtime: KafkaRuntime, between: Any = None) -> Agent:
    """An agent whose user turn is a call of ``look`` and an answer; ``between`` (a
    coroutine function) runs at each model call, while the run is in flight."""

    def reply(messages: Any) -> Any:
        return ScriptedModel.tool_call("look", q="x") if messages[-1].role == "user" else "ok"

    model = ScriptedModel(reply, on_call=(lambda _: between()) if between else None)
    return Agent("Be brief.", model=model, runtime=runtime, tools=[look])


def _reads_of_the_log(runtime: KafkaRuntime) -> list[tuple[int, int, int]]:
    """Every read of the events topic ``runtime`` makes from here on: (partition, from, to)."""
    seen: list[tuple[int, int, int]] = []
    records = runtime.store._records

    async def counted(partition: int, start: int, stop: int) -> list[Any]:
        seen.append((partition, start, stop))
        return await records(partition, start, stop)

    runtime.store._records = counted  # type: ignore[method-assign]
    return seen


@pytest.fixture
async def env1() -> AsyncIterator[KafkaEnv]:
    """One partition: every session's records interleave with every other's."""
    made = await KafkaEnv.create(partitions=1)
    yield made
    await made.close()


async def _run_once_then_stop_the_projector(env: KafkaEnv, *runtimes: KafkaRuntime) -> None:
    projector = await env.start_projector()
    for n, runtime in enumerate(runtimes):
        await _chatty(runtime).run("Hi.", session_id=f"s{n + 1}")
    await eventually(env.caught_up, what="the projector to apply the first runs")
    for runtime in runtimes:
        await runtime.store.synced()  # each has heard where the projector is
    await env.stop_projector(projector)


async def test_a_run_between_other_sessions_records_waits_for_the_projector_nowhere(
    env1: KafkaEnv,
) -> None:
    """With many sessions, other sessions' records land between a run's own in their
    partition (issue 25: each such run's end waited for the projector, and so did the
    claim after it). Those records are read, once, to see that none is the session's:
    with the projector stopped, the run returns, and its claim and end were confirmed
    by where they landed."""
    runtime = env1.runtime(projection_timeout=1.5)  # a wait for the projector fails it
    await _run_once_then_stop_the_projector(env1, runtime)
    producer = EventProducer(env1.bootstrap, env1.topics)

    async def another_writes() -> None:  # another process's session, in the same partition
        other = new_id("sess")
        await producer.send([RunStarted(session_id=other, run_id=new_id("run"), seq=1, epoch=1)])

    reads = _reads_of_the_log(runtime)
    for _ in range(2):
        result = await _chatty(runtime, another_writes).resume("Again.", session_id="s1")
        assert result.output == "ok"
    assert reads  # the records between the run's were read: not this store's own
    await producer.stop()
    await runtime.close()


async def test_a_record_of_the_session_between_a_run_s_own_leaves_the_verdict_to_the_projector(
    env1: KafkaEnv,
) -> None:
    """A record of the same session that this store did not write (another process's,
    here one that does not even decode) may change what the projector makes of the
    run's records: the run's end waits for its verdict (here: no projector, a timeout)."""
    runtime = env1.runtime(projection_timeout=1.5)
    await _run_once_then_stop_the_projector(env1, runtime)
    producer = EventProducer(env1.bootstrap, env1.topics)
    key = scope_key(None, "s1")

    async def another_writes() -> None:
        await producer.send_raw(env1.topics.events, b"not an event", key=key)

    with pytest.raises(ProjectionTimeoutError):
        await _chatty(runtime, another_writes).resume("Again.", session_id="s1")
    await producer.stop()
    await runtime.close()


async def test_this_store_s_own_records_between_a_run_s_are_known_without_reading_them(
    env1: KafkaEnv,
) -> None:
    """A process that runs many sessions at once (a service) interleaves its own records:
    it knows where each landed, so a run's end reads nothing of the log for them."""
    runtime = env1.runtime(projection_timeout=1.5)
    await _run_once_then_stop_the_projector(env1, runtime, runtime)  # s1 and s2

    async def another_session_runs() -> None:
        await _chatty(runtime).resume("More.", session_id="s2")

    reads = _reads_of_the_log(runtime)
    result = await _chatty(runtime, another_session_runs).resume("Again.", session_id="s1")
    assert result.output == "ok"
    assert reads == []
    await runtime.close()


async def test_a_claim_read_behind_a_lagging_projector_needs_no_verdict_from_it(
    env1: KafkaEnv,
) -> None:
    """A resume reads the session when the projector applied records past what its
    process knew. When the projector lags behind the partition's end with records of
    other sessions alone, the row it has is the session's as the log has it, and the
    claim made of it is confirmed by where it lands, as when the projector is at the
    end (the claim waited for it)."""
    first, second = env1.runtime(projection_timeout=1.5), env1.runtime()
    await _run_once_then_stop_the_projector(env1, first, second)
    await _chatty(second).resume("More.", session_id="s2")  # past what the projector applied
    result = await _chatty(first).resume("Again.", session_id="s1")
    assert result.output == "ok"
    for runtime in (first, second):
        await runtime.close()


async def test_prune_right_after_a_run_counts_the_whole_run(env: KafkaEnv) -> None:
    """A run returns before the projector has applied it; prune reads the read model to
    find what to delete, so it first waits for it by position (``synced``): the erased
    session's checkpoints and events are all of them, not what a loaded projector had
    applied when the run returned."""
    slow = _SlowProjector(env.settings, poll_ms=20)
    await slow.start()
    stop = asyncio.Event()
    task = asyncio.create_task(slow.run(stop))
    runtime = env.runtime()
    try:
        await Research(passes=3).agent(runtime).run("Research.", session_id="s1")
        row = await runtime.store.session(Scope("s1"))  # the log's, tail folded
        assert row is not None
        pruned = await runtime.store.prune(session_id="s1")
    finally:
        stop.set()
        await task
        await slow.stop()
        await runtime.close()
    assert (pruned.sessions, pruned.checkpoints, pruned.events) == (1, 3, row.last_seq)


async def test_an_event_larger_than_the_log_takes_is_refused_before_it_is_sent(
    env: KafkaEnv,
) -> None:
    """Every reader of the log refuses an event past MAX_EVENT_BYTES (the projector
    dead-letters it), and a run's end takes the fold's verdict for the projector's: so the
    writer refuses it first, sending nothing of its batch."""
    runtime = env.runtime()
    scope = Scope("s1")
    claim = RunStarted(session_id="s1", run_id=new_id("run"), seq=1, epoch=1)
    huge = TurnAppended(
        session_id="s1",
        run_id=claim.run_id,
        seq=2,
        epoch=1,
        payload=TurnAppendedPayload(messages=[Message.user("x" * MAX_EVENT_BYTES)]),
    )
    before = await env.end_offsets()
    with pytest.raises(InvalidEventError, match=f"at most {MAX_EVENT_BYTES}"):
        await runtime.store.append([claim, huge])
    assert await env.end_offsets() == before
    assert not runtime.store._watches[scope].unconfirmed  # nothing of it is awaited
    await runtime.close()


async def test_a_claim_made_of_a_known_session_another_process_wrote_to_is_made_again(
    env: KafkaEnv,
) -> None:
    """The race the known session leaves open: another process claims the session (its
    claim confirmed by its position too) while the projector is away, so the first
    process has heard of nothing past what it knew. Its claim lands behind the other's:
    it waits for the projector, which refuses it, then reads the session and claims it
    again, and the resume goes on from where the other run left the session."""
    projector = await env.start_projector()
    first, second = env.runtime(), env.runtime()
    await Research(passes=1).agent(first).run("Research.", session_id="s1")
    await Research(passes=1).agent(second).run("Research.", session_id="s2")  # vouched for
    await env.stop_projector(projector)
    scope = Scope("s1")
    theirs = await second.open_session(scope, run_id=new_id("run"))
    partition = await first.store._partition_of(scope)
    assert first.store._positions.at(partition) == second.store._positions.at(partition)
    seen = await _resumed_once_the_projector_is_back(env, first)
    assert seen[0] == "projector wait"  # refused: then read, and claimed again
    assert sorted(seen[1:3]) == ["load_head", "log end"]
    row = await first.store.session(scope)
    assert row is not None and row.epoch == theirs.epoch + 1
    for runtime in (first, second):
        await runtime.close()


async def test_a_final_answer_goes_out_with_the_run_s_end_in_one_acknowledgement(
    env: KafkaEnv,
) -> None:
    """With nothing to act on a final answer before the run ends (no stop hook, output
    check or compaction), the answer is sent ahead and acknowledged with the end: one
    wait for the broker after the model call, not two. A stop hook keeps it durable
    before the hook sees it."""
    await env.start_projector()
    runtime = env.runtime()
    store = runtime.store
    writes: list[str] = []
    append, send = store.append, store.send

    async def counted_append(events: Any) -> None:
        writes.append("append " + ",".join(e.type for e in events))
        await append(events)

    async def counted_send(events: Any) -> None:
        writes.append("send " + ",".join(e.type for e in events))
        await send(events)

    store.append, store.send = counted_append, counted_send  # type: ignore[method-assign]

    def agent(**tuning: Any) -> Agent:
        model = ScriptedModel([ScriptedModel.tool_call("look", q="x"), "the answer"])
        tuned = Tuning(checkpoint=True, **tuning)
        return Agent("Answer.", model=model, runtime=runtime, tools=[look], tuning=tuned)

    result = await agent().run("Question?", session_id="s1")
    assert result.output == "the answer"
    assert writes == [
        "append run.started",  # the claim
        "send turn.appended",  # the prompt, acknowledged with the model's answer
        "append turn.appended",  # the tool call, durable before the tool runs
        "append turn.appended",  # the tool's result
        "send turn.appended",  # the final answer ...
        "append checkpoint.written,run.finished",  # ... acknowledged with the end
    ]
    transcript = await runtime.restore(Scope("s1"))
    assert transcript is not None and transcript.messages[-1].content == "the answer"

    writes.clear()

    async def hook(state: Any) -> None:
        return None

    await agent(stop_hooks=[hook]).run("Again?", session_id="s2")
    assert writes[-2:] == ["append turn.appended", "append checkpoint.written,run.finished"]
    await runtime.close()


def _claim(row: SessionRecord) -> RunStarted:
    """The claim a run makes of the session ``row``: the next seq, a new epoch."""
    return RunStarted(
        session_id=row.session_id,
        run_id=new_id("run"),
        seq=row.last_seq + 1,
        epoch=row.epoch + 1,
        payload=RunStartedPayload(),
    )


async def _read_by_two(env: KafkaEnv) -> tuple[Scope, SessionRecord, list[KafkaRuntime]]:
    """A finished session, read (``head``) by two runtimes before either claims it."""
    await env.start_projector()
    scope = Scope("s1")
    first = env.runtime()
    await Research(passes=1).agent(first).run("Research.", session_id="s1")
    await eventually(env.caught_up, what="the projector to apply the run")  # reads find it so
    second = env.runtime()
    row, _ = await first.store.head(scope)
    again, _ = await second.store.head(scope)
    assert row is not None and again == row
    return scope, row, [first, second]


async def test_a_claim_kafka_put_behind_another_record_waits_for_the_projector_s_verdict(
    env: KafkaEnv,
) -> None:
    """Two processes read the session and claim it at the same seq. The first claim lands
    right where the read found the partition's end: confirmed without the projector. The
    second lands behind it: it waits for the projector, which refuses it; a run whose
    claim that was reads the session again (``open_session``'s loop)."""
    scope, row, (first, second) = await _read_by_two(env)
    waits: list[str] = []
    _counted(first, waits)
    mine, theirs = _claim(row), _claim(row)
    await first.store.append([mine])
    await first.store.confirm(scope, visible=False)
    assert "projector wait" not in waits
    _counted(second, waits)
    await second.store.append([theirs])
    with pytest.raises(SequenceConflictError):
        await second.store.confirm(scope, visible=False)
    assert waits.count("projector wait") == 1
    found = await second.store.session(scope)
    assert found is not None and found.last_run_id == mine.run_id
    assert found.epoch == mine.epoch and found.last_seq == mine.seq
    for runtime in (first, second):
        await runtime.close()


async def test_an_event_the_fold_refuses_is_not_confirmed_by_where_it_landed(
    env: KafkaEnv,
) -> None:
    """Right at the end of the partition as the read found it, but a checkpoint that
    claims messages the session does not hold: the projector refuses it, and the writer
    hears that refusal instead of taking the event for applied."""
    scope, row, (first, second) = await _read_by_two(env)
    wrong = CheckpointWritten(
        session_id="s1",
        run_id=row.last_run_id or new_id("run"),
        seq=row.last_seq + 1,
        epoch=row.epoch,
        payload=CheckpointWrittenPayload(
            checkpoint_id=new_id("ckpt"),
            turn=row.turns,
            cumulative_usage=row.usage,
            message_count=row.message_count + 5,
            retain=0,
        ),
    )
    await first.store.append([wrong])  # the store that ran the session: vouched for
    with pytest.raises(InvalidEventError, match="message"):
        await first.store.confirm(scope, visible=False)
    for runtime in (first, second):
        await runtime.close()


async def test_a_claim_with_no_projector_running_waits_for_it_even_at_the_partition_s_end(
    env: KafkaEnv,
) -> None:
    """The read found the partition applied to its end, but no projector runs: a claim
    is confirmed by its position only once the projector applied an event of this
    store's, so the first claim of a store waits, and times out naming the processor."""
    runtime = env.runtime(projection_timeout=1.5)
    scope = Scope("s1")
    row, _ = await runtime.store.head(scope)
    known = runtime.store._watches[scope].known
    assert row is None and known is not None and known.end == 0  # only the projector is missing
    claim = RunStarted(session_id="s1", run_id=new_id("run"), seq=1, epoch=1)
    await runtime.store.append([claim])
    with pytest.raises(ProjectionTimeoutError, match="loomflow processor"):
        await runtime.store.confirm(scope, visible=False)
    await runtime.close()


async def test_a_claim_made_of_a_read_of_the_unprojected_tail_waits_for_the_projector(
    env: KafkaEnv,
) -> None:
    """The read folds the log's unprojected tail and keeps the first event at each seq;
    the projector keeps the first it accepts. A stale writer's turn at seq N+1 before a
    genuine one makes them differ: the read stops at the stale turn and finds seq N, the
    projector applies the genuine turn at N+1. So a claim made of a read of an
    unprojected tail is never confirmed by its position, however it landed: it waits for
    the projector, which refuses it."""
    projector = await env.start_projector()
    runtime = env.runtime()
    await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    row = await runtime.store.session(Scope("s1"))
    assert row is not None
    await env.stop_projector(projector)

    def turn(epoch: int) -> TurnAppended:
        return TurnAppended(
            session_id="s1",
            run_id=row.last_run_id or new_id("run"),
            seq=row.last_seq + 1,
            epoch=epoch,
            payload=TurnAppendedPayload(messages=[Message.user(f"epoch {epoch}")]),
        )

    producer = EventProducer(env.bootstrap, env.topics)
    await producer.send([turn(row.epoch - 1), turn(row.epoch)])
    await producer.stop()
    read, _ = await runtime.store.head(Scope("s1"))
    assert read == row  # the read stopped at the stale turn

    await env.start_projector()
    await eventually(env.caught_up, what="the projector to apply the tail")
    claim = _claim(read)  # at seq N+1, right where the log ends
    await runtime.store.append([claim])
    with pytest.raises(SequenceConflictError):
        await runtime.store.confirm(Scope("s1"), visible=False)
    other = env.runtime()
    found = await other.store.session(Scope("s1"))
    assert found is not None and found.last_seq == row.last_seq + 1
    for opened in (runtime, other):
        await opened.close()


async def test_a_claim_of_a_known_session_two_epochs_behind_is_made_again(
    env: KafkaEnv,
) -> None:
    """Before the first process hears of anything past what it knew (the projector is
    away), another one claims the session twice (a signal, then a worker's take-over,
    say). The claim made of what the first one knew is refused as a stale writer's (the
    epoch is judged before the seq): it reads the session and claims it again, as after
    a sequence conflict, instead of failing the resume. (Found by review.)"""
    projector = await env.start_projector()
    first, second = env.runtime(), env.runtime()
    await Research(passes=1).agent(first).run("Research.", session_id="s1")
    scope = Scope("s1")
    row = await second.store.session(scope)
    assert row is not None
    await env.stop_projector(projector)
    for k in (1, 2):
        claim = RunStarted(
            session_id="s1",
            run_id=new_id("run"),
            seq=row.last_seq + k,
            epoch=row.epoch + k,
            payload=RunStartedPayload(),
        )
        await second.store.append([claim])
    await _resumed_once_the_projector_is_back(env, first)
    found = await first.store.session(scope)
    assert found is not None and found.epoch == row.epoch + 3
    for runtime in (first, second):
        await runtime.close()
