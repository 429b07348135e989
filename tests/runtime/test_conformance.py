"""The runtime conformance suite: every rule of checkpoints, resume, fork and the journal.

Parametrised over every backend in tests/support/backends.py; a new runtime proves
itself by passing this module unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loomflow import Agent, CheckpointNotFoundError, InvalidIdError, Message, Role, Tuning
from loomflow.errors import (
    SequenceConflictError,
    SerializationError,
    SessionErasedError,
    StaleWriterError,
    UnsafeDeserializationError,
)
from loomflow.models import ScriptedModel
from loomflow.runtime import EventStore, Journal, Scope
from loomflow.schemas import CheckpointWritten, Event, TurnAppended, Usage, new_id
from loomflow.schemas.events import TurnAppendedPayload
from tests.support.backends import Backend
from tests.support.scenario import Research, SimulatedCrash

CALLS_PER_PASS = 3  # lookup, note, answer


# --- checkpoints per pass, listing, scoping ----------------------------------------------


async def test_one_checkpoint_per_pass(backend: Backend) -> None:
    research = Research(passes=3)
    result = await research.agent(backend.runtime()).run("Research.", session_id="s1")
    metas = await research.agent(backend.runtime()).list_checkpoints("s1")
    assert len(metas) == 3  # the first pass and two stop-hook iterations
    assert [m.turn for m in metas] == [9, 6, 3]  # newest first
    assert result.turns == 9 and result.model_calls == 9 and result.restored_turns == 0
    assert all(m.session_id == "s1" for m in metas)


async def test_no_checkpoints_when_checkpointing_is_off(backend: Backend) -> None:
    research = Research(passes=2)
    agent = research.agent(backend.runtime(), checkpoint=False)
    await agent.run("Research.", session_id="s1")
    assert await agent.list_checkpoints("s1") == []


async def test_list_limit_and_metadata_only(backend: Backend) -> None:
    research = Research(passes=3)
    agent = research.agent(backend.runtime())
    await agent.run("Research.", session_id="s1")
    metas = await agent.list_checkpoints("s1", limit=2)
    assert [m.turn for m in metas] == [9, 6]
    assert set(type(metas[0]).model_fields) == {"session_id", "checkpoint_id", "turn", "created_at"}
    with pytest.raises(ValueError):
        await agent.list_checkpoints("s1", limit=0)


async def test_checkpoints_are_scoped_by_user(backend: Backend) -> None:
    research = Research(passes=1)
    agent = research.agent(backend.runtime())
    await agent.run("Research.", session_id="shared", user_id="alice")
    assert len(await agent.list_checkpoints("shared", user_id="alice")) == 1
    assert await agent.list_checkpoints("shared", user_id="bob") == []
    assert await agent.list_checkpoints("shared") == []
    # bob resuming "shared" finds nothing of alice's: he starts his own session
    bob = (
        await Research(passes=1)
        .agent(backend.runtime())
        .resume("hi", session_id="shared", user_id="bob")
    )
    assert bob.restored_turns == 0
    runtime = backend.runtime()
    bob_state = await runtime.restore(Scope("shared", "bob"))
    assert bob_state is not None
    assert not any("alice" in m.content for m in bob_state.messages)
    assert len(await agent.list_checkpoints("shared", user_id="alice")) == 1


async def test_checkpoint_holds_full_transcript_turn_and_usage(backend: Backend) -> None:
    research = Research(passes=2)
    result = await research.agent(backend.runtime()).run("Research.", session_id="s1")
    runtime = backend.runtime()
    ckpt = await runtime.get_checkpoint(Scope("s1"))
    assert ckpt is not None
    assert ckpt.turn == 6
    assert ckpt.cumulative_usage == result.usage
    roles = [m.role for m in ckpt.messages]
    assert roles[:2] == [Role.SYSTEM, Role.USER]
    assert roles.count(Role.ASSISTANT) == 6 and roles.count(Role.TOOL) == 4
    assert ckpt.messages[-1].content.startswith("Pass 2:")


# --- resume ------------------------------------------------------------------------------


async def test_resume_restores_verbatim_and_never_repeats_a_model_call(backend: Backend) -> None:
    research = Research(passes=3)
    # dies at the model call that would start the third pass
    with pytest.raises(SimulatedCrash):
        await research.agent(backend.runtime(), crash_at=2 * CALLS_PER_PASS + 1).run(
            "Research.", session_id="s1"
        )
    runtime = backend.runtime()
    before = await runtime.get_checkpoint(Scope("s1"))
    assert before is not None and before.turn == 6
    calls_before = research.model_calls

    resumed_agent = research.agent(runtime)
    result = await resumed_agent.resume("Pick it up where you left off.", session_id="s1")

    new_calls = research.model_calls - calls_before
    assert new_calls == CALLS_PER_PASS  # only the third pass ran
    assert result.session_id == "s1"
    assert result.restored_turns == 6 and result.model_calls == 3 and result.turns == 9
    first_request = research.models[-1].inner.calls[0]
    assert first_request[: len(before.messages)] == before.messages  # restored verbatim
    # the stop hook's message was recorded after the checkpoint: replayed, then the prompt
    assert first_request[len(before.messages) :] == [
        Message.user("Go deeper."),
        Message.user("Pick it up where you left off."),
    ]
    assert [m.role for m in first_request].count(Role.SYSTEM) == 1  # no re-seeding
    assert result.usage.input_tokens > before.cumulative_usage.input_tokens
    assert result.tokens_in == result.usage.input_tokens
    assert result.cost_usd == pytest.approx(result.usage.cost_usd)


async def test_resume_rolls_up_restored_and_new_usage(backend: Backend) -> None:
    research = Research(passes=2)
    with pytest.raises(SimulatedCrash):
        await research.agent(backend.runtime(), crash_at=CALLS_PER_PASS + 1).run(
            "Research.", session_id="s1"
        )
    runtime = backend.runtime()
    ckpt = await runtime.get_checkpoint(Scope("s1"))
    assert ckpt is not None
    result = await research.agent(runtime).resume(session_id="s1")
    events = await runtime.store.read_events(Scope("s1"), ckpt_seq := 0)
    assert ckpt_seq == 0
    billed_after = Usage()
    seen_ckpt = False
    for event in events:
        if (
            isinstance(event, CheckpointWritten)
            and event.payload.checkpoint_id == ckpt.checkpoint_id
        ):
            seen_ckpt = True
        elif seen_ckpt and isinstance(event, TurnAppended):
            billed_after = billed_after + event.payload.usage
    assert result.usage == ckpt.cumulative_usage + billed_after
    assert result.usage.cost_usd > ckpt.cumulative_usage.cost_usd


async def test_resume_without_prompt_injects_the_continuation_nudge(backend: Backend) -> None:
    research = Research(passes=2)
    with pytest.raises(SimulatedCrash):
        await research.agent(backend.runtime(), crash_at=CALLS_PER_PASS + 1).run(
            "Research.", session_id="s1"
        )
    agent = research.agent(backend.runtime())
    await agent.resume(session_id="s1")
    first_request = research.models[-1].inner.calls[0]
    assert first_request[-1] == Message.user(agent.tuning.continuation_prompt)


async def test_crash_mid_pass_loses_no_recorded_turn_or_tool_call(backend: Backend) -> None:
    research = Research(passes=2)
    # dies at the model call after the second pass's lookup: the lookup result is recorded
    with pytest.raises(SimulatedCrash):
        await research.agent(backend.runtime(), crash_at=CALLS_PER_PASS + 2).run(
            "Research.", session_id="s1"
        )
    assert research.tool_runs["lookup:sqlite"] == 1
    calls_before = research.model_calls
    result = await research.agent(backend.runtime()).resume(session_id="s1")
    # replayed past the checkpoint: the lookup and its model call are restored
    assert research.tool_runs["lookup:sqlite"] == 1
    assert all(count == 1 for count in research.tool_runs.values())
    assert research.model_calls - calls_before == 2  # the note call and the answer
    assert result.restored_turns == 4
    assert result.turns == 6
    assert result.output.startswith("Pass 2:")


async def test_crash_between_tool_calls_runs_only_the_missing_tool(backend: Backend) -> None:
    research = Research(passes=1)

    class Boom(BaseException):
        pass

    def note(text: str) -> str:
        """Write a note."""
        raise Boom  # the process dies inside the tool: nothing about it was recorded

    agent = research.agent(backend.runtime())
    agent.tools["note"] = type(agent.tools["note"])(
        "note", "Write a note.", note, agent.tools["note"].arguments
    )
    with pytest.raises(Boom):
        await agent.run("Research.", session_id="s1")
    result = await research.agent(backend.runtime()).resume(session_id="s1")
    assert research.tool_runs == {"lookup:kafka": 1, "note:kafka noted": 1}
    assert result.output.startswith("Pass 1:")


async def test_fallback_without_checkpoints_replays_the_log(backend: Backend) -> None:
    research = Research(passes=2)
    with pytest.raises(SimulatedCrash):
        await research.agent(backend.runtime(), checkpoint=False, crash_at=CALLS_PER_PASS + 2).run(
            "Research.", session_id="s1"
        )
    calls_before = research.model_calls
    result = await research.agent(backend.runtime(), checkpoint=False).resume(session_id="s1")
    assert research.model_calls - calls_before == 2
    assert all(count == 1 for count in research.tool_runs.values())
    assert result.restored_turns == 4 and result.turns == 6


async def test_resume_of_a_finished_session_continues_it(backend: Backend) -> None:
    research = Research(passes=1)
    first = await research.agent(backend.runtime()).run("Research.", session_id="s1")
    agent = Agent(
        "You are a careful researcher.",
        model=ScriptedModel(lambda messages: "Anything else?"),
        runtime=backend.runtime(),
        tuning=Tuning(checkpoint=True),
    )
    result = await agent.resume("One more thing.", session_id="s1")
    assert result.restored_turns == first.turns
    assert result.model_calls == 1 and result.output == "Anything else?"
    assert len(await agent.list_checkpoints("s1")) == 2


# --- fork --------------------------------------------------------------------------------


async def test_older_checkpoint_forks_and_leaves_the_original_untouched(backend: Backend) -> None:
    research = Research(passes=3)
    agent = research.agent(backend.runtime())
    await agent.run("Research.", session_id="s1")
    runtime = backend.runtime()
    metas = await agent.list_checkpoints("s1")
    original_events = await runtime.store.read_events(Scope("s1"))
    older = metas[-1]  # the first pass

    calls_before = research.model_calls
    fork = await research.agent(runtime).resume(
        "Try another angle.", session_id="s1", from_checkpoint=older.checkpoint_id
    )
    assert fork.session_id != "s1" and fork.session_id.startswith("sess")
    assert fork.parent_session_id == "s1" and fork.parent_checkpoint_id == older.checkpoint_id
    assert fork.restored_turns == older.turn == 3
    assert research.model_calls - calls_before == 6  # passes two and three, in the fork
    assert await agent.list_checkpoints("s1") == metas
    assert await runtime.store.read_events(Scope("s1")) == original_events
    fork_row = await runtime.store.session(Scope(fork.session_id))
    assert fork_row is not None
    assert (fork_row.parent_session_id, fork_row.parent_checkpoint_id) == (
        "s1",
        older.checkpoint_id,
    )
    fork_first = await runtime.get_checkpoint(
        Scope(fork.session_id), (await agent.list_checkpoints(fork.session_id))[-1].checkpoint_id
    )
    older_full = await runtime.get_checkpoint(Scope("s1"), older.checkpoint_id)
    assert fork_first is not None and older_full is not None
    assert fork_first.messages[: len(older_full.messages)] == older_full.messages


async def test_latest_checkpoint_id_continues_in_place(backend: Backend) -> None:
    research = Research(passes=1)
    agent = research.agent(backend.runtime())
    await agent.run("Research.", session_id="s1")
    latest = (await agent.list_checkpoints("s1"))[0]
    follow = Agent(
        "x",
        model=ScriptedModel(lambda m: "ok"),
        runtime=backend.runtime(),
        tuning=Tuning(checkpoint=True),
    )
    result = await follow.resume("more", session_id="s1", from_checkpoint=latest.checkpoint_id)
    assert result.session_id == "s1" and result.parent_session_id is None


async def test_unknown_checkpoint_is_a_clear_error(backend: Backend) -> None:
    research = Research(passes=1)
    agent = research.agent(backend.runtime())
    await agent.run("Research.", session_id="s1")
    missing = new_id("ckpt")
    with pytest.raises(CheckpointNotFoundError, match=missing):
        await agent.resume(session_id="s1", from_checkpoint=missing)
    # another user's id is just as unknown
    other = (await agent.list_checkpoints("s1"))[0].checkpoint_id
    with pytest.raises(CheckpointNotFoundError):
        await agent.resume(session_id="s1", from_checkpoint=other, user_id="mallory")
    with pytest.raises(InvalidIdError):
        await agent.resume(session_id="s1", from_checkpoint="../../etc/passwd")


# --- failures -------------------------------------------------------------------------


Write = Callable[[Sequence[Event]], Awaitable[None]]


@contextlib.contextmanager
def faulty(store: EventStore, fault: Callable[[Write, Sequence[Event]], Awaitable[None]]) -> Any:
    """Every write of ``store`` goes through ``fault(real_write, events)`` meanwhile: its
    ``append``, and its ``send`` where the store has one of its own (Kafka's)."""
    names = ["append"] + (["send"] if type(store).send is not EventStore.send else [])
    for name in names:
        real = getattr(store, name)

        async def write(events: Sequence[Event], _real: Write = real) -> None:
            await fault(_real, events)

        setattr(store, name, write)
    try:
        yield
    finally:
        for name in names:
            delattr(store, name)


def _checkpoint_in(events: Sequence[Event]) -> str | None:
    return next((e.event_id for e in events if isinstance(e, CheckpointWritten)), None)


async def test_failed_checkpoint_write_warns_and_the_run_goes_on(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = backend.runtime()

    async def disk_full(write: Write, events: Sequence[Event]) -> None:
        if _checkpoint_in(events):
            raise OSError("disk full")
        await write(events)

    with faulty(runtime.store, disk_full):
        research = Research(passes=2)
        with caplog.at_level(logging.WARNING, logger="loomflow.runtime"):
            result = await research.agent(runtime).run("Research.", session_id="s1")
    assert result.output.startswith("Pass 2:") and result.turns == 6
    assert (
        sum(
            "checkpoint" in r.getMessage() and "disk full" in r.getMessage() for r in caplog.records
        )
        == 2
    )
    assert await research.agent(runtime).list_checkpoints("s1") == []


async def test_a_write_that_lands_and_then_raises_never_ends_the_run(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = backend.runtime()
    in_doubt: list[str] = []

    async def lands_then_raises(write: Write, events: Sequence[Event]) -> None:
        await write(events)
        checkpoint = _checkpoint_in(events)
        if not in_doubt and checkpoint:
            in_doubt.append(checkpoint)
            raise TimeoutError("the write landed but its reply was lost")

    with faulty(runtime.store, lands_then_raises):
        research = Research(passes=3)
        with caplog.at_level(logging.WARNING, logger="loomflow.runtime"):
            result = await research.agent(runtime).run("Research.", session_id="s1")
    assert in_doubt, "the fault was never injected"
    assert result.output.startswith("Pass 3:") and result.turns == 9
    assert any("reply was lost" in r.getMessage() for r in caplog.records)
    # the checkpoint whose write raised is there once, and no seq was taken twice or skipped
    assert len(await research.agent(runtime).list_checkpoints("s1")) == 3
    events = await runtime.store.read_events(Scope("s1"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.event_id for e in events].count(in_doubt[0]) == 1


async def test_a_write_that_never_lands_gives_its_seq_back(backend: Backend) -> None:
    runtime = backend.runtime()
    failures: list[str] = []

    async def fails_once(write: Write, events: Sequence[Event]) -> None:
        checkpoint = _checkpoint_in(events)
        if not failures and checkpoint:
            failures.append(checkpoint)
            raise ConnectionResetError("connection lost before the write")
        await write(events)

    with faulty(runtime.store, fails_once):
        research = Research(passes=2)
        result = await research.agent(runtime).run("Research.", session_id="s1")
    assert failures and result.turns == 6
    assert len(await research.agent(runtime).list_checkpoints("s1")) == 1
    events = await runtime.store.read_events(Scope("s1"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert failures[0] not in {e.event_id for e in events}


async def test_non_json_tool_result_is_a_typed_error_and_loses_nothing(backend: Backend) -> None:
    def fetch() -> object:
        """Return something JSON cannot hold."""
        return object()

    model = ScriptedModel([ScriptedModel.tool_call("fetch"), "done"])
    agent = Agent("x", model=model, runtime=backend.runtime(), tools=[fetch])
    with pytest.raises(SerializationError, match="fetch"):
        await agent.run("go", session_id="s1")
    state = await backend.runtime().restore(Scope("s1"))
    assert state is not None and state.turns == 1  # the model turn before it is kept


@pytest.mark.parametrize("bad", ["", "a b", "x" * 300, "../x", "é"])
async def test_invalid_ids_are_rejected(backend: Backend, bad: str) -> None:
    agent = Research().agent(backend.runtime())
    with pytest.raises(InvalidIdError):
        await agent.run("hi", session_id=bad)
    with pytest.raises(InvalidIdError):
        await agent.run("hi", session_id="ok", user_id=bad)
    with pytest.raises(InvalidIdError):
        await agent.list_checkpoints(bad)


# --- compaction --------------------------------------------------------------------------


async def test_auto_compaction_runs_before_the_checkpoint(backend: Backend) -> None:
    research = Research(passes=2)
    agent = research.agent(backend.runtime(), auto_compact_at_tokens=1, compact_keep_messages=2)
    result = await agent.run("Research.", session_id="s1")
    ckpt = await backend.runtime().get_checkpoint(Scope("s1"))
    assert ckpt is not None
    assert ckpt.messages[0].role is Role.SYSTEM
    assert ckpt.messages[1].content.startswith("Summary of the earlier conversation")
    assert len(ckpt.messages) < 12
    assert ckpt.cumulative_usage == result.usage  # the summarising calls are accounted
    # resuming from the compacted checkpoint restores the compacted transcript
    follow = Agent(
        "x",
        model=ScriptedModel(lambda m: "ok"),
        runtime=backend.runtime(),
        tuning=Tuning(checkpoint=True),
    )
    resumed = await follow.resume("and?", session_id="s1")
    assert resumed.output == "ok"
    assert follow.model.calls[0][: len(ckpt.messages)] == ckpt.messages  # type: ignore[attr-defined]


# --- journal -------------------------------------------------------------------------------


async def test_journal_step_replays_same_inputs_and_reruns_changed_ones(backend: Backend) -> None:
    runtime = backend.runtime()
    scope = Scope("s1", "alice")
    runs: list[int] = []

    async def work(n: int) -> dict[str, object]:
        runs.append(n)
        return {"n": n, "at": datetime(2026, 1, 1, tzinfo=UTC), "pair": (n, n)}

    writer = await runtime.open_session(scope, run_id=new_id("run"))
    journal = Journal(writer)
    first = await journal.step("fetch", work, 1)
    again = await Journal(await backend.runtime().open_session(scope, run_id=new_id("run"))).step(
        "fetch", work, 1
    )
    assert runs == [1] and again == first  # same key, same inputs: recorded value, typed
    assert again["pair"] == (1, 1) and again["at"] == datetime(2026, 1, 1, tzinfo=UTC)
    changed = await Journal(await runtime.open_session(scope, run_id=new_id("run"))).step(
        "fetch", work, 2
    )
    assert runs == [1, 2] and changed["n"] == 2
    # a journal is per (session, user)
    other = await Journal(await runtime.open_session(Scope("s1"), run_id=new_id("run"))).step(
        "fetch", work, 1
    )
    assert runs == [1, 2, 1] and other["n"] == 1


async def test_tools_can_journal_steps_that_replay_after_a_crash(backend: Backend) -> None:
    from loomflow import current_journal

    charged: list[str] = []

    async def pay(order: str) -> str:
        """Charge an order, then send a receipt."""
        journal = current_journal()
        assert journal is not None
        receipt = await journal.step("charge", lambda o: charged.append(o) or f"paid {o}", order)
        if len(charged) == 1 and not getattr(pay, "crashed", False):
            pay.crashed = True  # type: ignore[attr-defined]
            raise SimulatedCrash("died after charging, before the tool returned")
        return receipt

    model = ScriptedModel([ScriptedModel.tool_call("pay", order="o-1"), "paid"])
    with pytest.raises(SimulatedCrash):
        await Agent("x", model=model, runtime=backend.runtime(), tools=[pay]).run(
            "pay", session_id="s1"
        )
    result = await Agent("x", model=model, runtime=backend.runtime(), tools=[pay]).resume(
        session_id="s1"
    )
    assert charged == ["o-1"]  # the tool ran again (at least once) but the charge did not
    assert result.output == "paid"


async def test_json_store_never_unpickles(backend: Backend) -> None:
    scope = Scope("s1")
    pickling = backend.runtime(serializer="pickle")
    value = await Journal(await pickling.open_session(scope, run_id=new_id("run"))).step(
        "blob", lambda: {1, 2, 3}.__class__([1, 2])
    )
    assert value == {1, 2}
    again = await Journal(await pickling.open_session(scope, run_id=new_id("run"))).step(
        "blob", lambda: pytest.fail("replayed step ran again")
    )
    assert again == {1, 2}
    json_runtime = backend.runtime(serializer="json")
    with pytest.raises(UnsafeDeserializationError):
        await Journal(await json_runtime.open_session(scope, run_id=new_id("run"))).step(
            "blob", lambda: None
        )


async def test_non_json_step_values_are_refused_under_json(backend: Backend) -> None:
    runtime = backend.runtime()
    journal = Journal(await runtime.open_session(Scope("s1"), run_id=new_id("run")))
    with pytest.raises(SerializationError):
        await journal.step("bad", lambda: object())
    assert await runtime.store.step(Scope("s1"), "bad") is None


async def test_reappending_an_event_is_idempotent(backend: Backend) -> None:
    runtime = backend.runtime()
    scope = Scope("s1")
    writer = await runtime.open_session(scope, run_id=new_id("run"))
    event = writer.make(TurnAppended, TurnAppendedPayload(messages=[Message.user("hi")]))
    await runtime.store.append([event])
    await runtime.store.append([event])  # delivered twice: stored once
    events = await runtime.store.read_events(scope)
    assert [e.seq for e in events] == [1, 2]
    clash = writer.make(TurnAppended, TurnAppendedPayload(messages=[Message.user("other")]))
    with pytest.raises(SequenceConflictError):  # refused at once, or when the run confirms
        await runtime.store.append([clash])  # same seq, different event
        await runtime.store.confirm(scope)
    assert [e.event_id for e in await runtime.store.read_events(scope)][-1] == event.event_id


# --- single writer -------------------------------------------------------------------------


async def test_a_stale_writer_cannot_write_into_a_resumed_session(backend: Backend) -> None:
    scope = Scope("s1")
    stale = await backend.runtime().open_session(scope, run_id=new_id("run"))
    fresh = await backend.runtime().open_session(scope, run_id=new_id("run"))
    assert fresh.epoch > stale.epoch
    stale.next_seq = fresh.next_seq  # even with the right seq, its epoch is refused
    with pytest.raises(StaleWriterError):  # at its next append, or when its run confirms
        await stale.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
        await stale.confirm()
    await fresh.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("mine")]))
    state = await backend.runtime().restore(scope)
    assert state is not None and [m.content for m in state.messages] == ["mine"]


# --- retention, prune, erase ---------------------------------------------------------------


async def test_retention_keeps_the_newest_n_per_session_and_user(backend: Backend) -> None:
    research = Research(passes=5)
    agent = research.agent(backend.runtime(max_checkpoints_per_session=2))
    await agent.run("Research.", session_id="s1", user_id="alice")
    await (
        Research(passes=3)
        .agent(backend.runtime(max_checkpoints_per_session=2))
        .run("Research.", session_id="s1", user_id="bob")
    )
    alice = await agent.list_checkpoints("s1", user_id="alice")
    assert [m.turn for m in alice] == [15, 12]
    assert [m.turn for m in await agent.list_checkpoints("s1", user_id="bob")] == [9, 6]
    # the session itself is intact: resuming still restores everything
    state = await backend.runtime().restore(Scope("s1", "alice"))
    assert state is not None and state.turns == 15


@pytest.mark.parametrize("keep", [0, -1])
async def test_retention_below_one_is_unbounded(backend: Backend, keep: int) -> None:
    research = Research(passes=4)
    agent = research.agent(backend.runtime(max_checkpoints_per_session=keep))
    await agent.run("Research.", session_id="s1")
    assert len(await agent.list_checkpoints("s1")) == 4


async def test_prune_by_session_deletes_its_journal_and_checkpoints(backend: Backend) -> None:
    runtime = backend.runtime()
    await Research(passes=2).agent(runtime).run("Research.", session_id="done")
    await Research(passes=2).agent(runtime).run("Research.", session_id="live")
    with pytest.raises(ValueError):
        await runtime.store.prune()
    result = await runtime.store.prune(session_id="done")
    assert result.sessions == 1 and result.checkpoints == 2 and result.events > 0
    assert await runtime.list_checkpoints(Scope("done")) == []
    assert await runtime.restore(Scope("done")) is None
    assert len(await runtime.list_checkpoints(Scope("live"))) == 2


async def test_prune_before_a_time(backend: Backend) -> None:
    runtime = backend.runtime()
    await Research(passes=2).agent(runtime).run("Research.", session_id="old")
    cutoff = datetime.now(UTC) + timedelta(microseconds=1)
    assert (await runtime.store.prune(before=cutoff - timedelta(days=1))).sessions == 0
    assert len(await runtime.list_checkpoints(Scope("old"))) == 2
    result = await runtime.store.prune(before=cutoff)
    assert result.sessions == 1
    assert await runtime.list_checkpoints(Scope("old")) == []
    with pytest.raises(ValueError):
        await runtime.store.prune(before=datetime(2026, 1, 1))  # naive: ambiguous


async def test_erase_leaves_a_tombstone_that_late_writes_cannot_undo(backend: Backend) -> None:
    runtime = backend.runtime()
    scope = Scope("s1", "alice")
    writer = await runtime.open_session(scope, run_id=new_id("run"))
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("secret")]))
    assert await runtime.store.erase("s1", user_id="alice") is True
    assert await runtime.restore(scope) is None
    assert await runtime.store.read_events(scope) != []  # only the tombstone remains
    assert all(e.type == "session.erased" for e in await runtime.store.read_events(scope))
    with pytest.raises(SessionErasedError):
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
    assert await runtime.store.erase("s1", user_id="alice") is False


# --- storage -------------------------------------------------------------------------------


async def test_checkpoint_events_carry_no_messages(backend: Backend) -> None:
    research = Research(passes=3)
    await research.agent(backend.runtime()).run("Research.", session_id="s1")
    events = await backend.runtime().store.read_events(Scope("s1"))
    checkpoints = [e for e in events if isinstance(e, CheckpointWritten)]
    assert len(checkpoints) == 3
    assert all("messages" not in e.payload.model_dump() for e in checkpoints)
    assert all(len(e.payload.model_dump_json()) < 400 for e in checkpoints)
