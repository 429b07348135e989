"""The runtime conformance suite: every rule of checkpoints, resume, fork and the journal,
as an :class:`loomflow.Agent` on the runtime under test lives them.

The agents are scripted (:mod:`loomflow.testing.scenario`), so a repeated model or tool
call shows in the counts, and a crash is a ``BaseException`` raised mid-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import TypeAdapter

from loomflow import (
    Agent,
    CheckpointNotFoundError,
    InvalidIdError,
    Message,
    Role,
    RunResult,
    SessionState,
    Tuning,
    Usage,
    new_id,
    wait_for_signal,
)
from loomflow.errors import (
    RunTakenError,
    SequenceConflictError,
    SerializationError,
    SessionErasedError,
    SessionNotFoundError,
    SignalRefusedError,
    SignalTimeoutError,
    StaleWriterError,
    StoreUnavailableError,
    UnsafeDeserializationError,
)
from loomflow.models import ScriptedModel
from loomflow.runtime import EventStore, Journal, Runtime, Scope
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    EventBase,
    SignalSent,
    StepRecorded,
    ToolCall,
    TurnAppended,
    utcnow,
)
from loomflow.schemas.events import SignalSentPayload, TurnAppendedPayload
from loomflow.testing._support import Opened, Suite, opened_fixture, required_fixture
from loomflow.testing.keywords import RunKeywords
from loomflow.testing.scenario import (
    CALLS_PER_PASS,
    Payment,
    Research,
    SimulatedCrash,
    digging_agent,
)

__all__ = ["RuntimeConformance"]

Write = Callable[[Sequence[Event]], Awaitable[None]]


@contextlib.contextmanager
def faulty(
    store: EventStore, fault: Callable[[Write, Sequence[Event]], Awaitable[None]]
) -> Iterator[None]:
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


async def _research_under(
    runtime: Runtime,
    fault: Callable[[Write, Sequence[Event]], Awaitable[None]],
    caplog: pytest.LogCaptureFixture,
    passes: int,
) -> tuple[Research, RunResult]:
    """Run the research on session s1 with every write of the store going through
    ``fault``, capturing the runtime's warnings."""
    research = Research(passes=passes)
    with (
        faulty(runtime.store, fault),
        caplog.at_level(logging.WARNING, logger="loomflow.runtime"),
    ):
        result = await research.agent(runtime).run("Research.", session_id="s1")
    return research, result


async def _dies(research: Research, runtime: Runtime, at: int, *, checkpoint: bool = True) -> None:
    """Run ``research`` on session s1 until its process dies at model call ``at``."""
    with pytest.raises(SimulatedCrash):
        await research.ran(runtime, crash_at=at, checkpoint=checkpoint)


def _follower(runtime: Runtime, reply: str = "ok") -> Agent:
    """A checkpointing agent that answers everything with ``reply``."""
    return Agent(
        "x", model=ScriptedModel(lambda m: reply), runtime=runtime, tuning=Tuning(checkpoint=True)
    )


class RuntimeConformance(RunKeywords, Suite):
    """Subclass in a test module and define the fixture ``open_runtime``: a callable that
    takes :class:`loomflow.runtime.Runtime`'s options and returns a new runtime on the
    test's storage, each seeing what the earlier ones wrote.
    """

    factory = "open_runtime"
    open_runtime = required_fixture("open_runtime", "Runtime")
    new_runtime = opened_fixture("new_runtime")
    runtime = opened_fixture("runtime", one=True)

    # --- checkpoints per pass, listing, scoping -------------------------------------------

    async def test_one_checkpoint_per_pass(self, new_runtime: Opened[Runtime]) -> None:
        research = Research(passes=3)
        result = await research.agent(new_runtime()).run("Research.", session_id="s1")
        metas = await research.agent(new_runtime()).list_checkpoints("s1")
        assert len(metas) == 3  # the first pass and two stop-hook iterations
        assert [m.turn for m in metas] == [9, 6, 3]  # newest first
        assert result.turns == 9 and result.model_calls == 9 and result.restored_turns == 0
        assert all(m.session_id == "s1" for m in metas)

    async def test_no_checkpoints_when_checkpointing_is_off(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        agent = await research.ran(new_runtime(), checkpoint=False)
        assert await agent.list_checkpoints("s1") == []

    async def test_checkpointing_is_off_by_default(self, runtime: Runtime) -> None:
        research = Research(passes=2)
        for tuning in (None, Tuning(stop_hooks=[research.more])):
            agent = Agent(
                "You are a careful researcher.",
                model=ScriptedModel(["Pass 1: done.", "Pass 2: done."]),
                runtime=runtime,
                tuning=tuning,
            )
            session = "plain" if tuning is None else "hooked"
            result = await agent.run("Research.", session_id=session)
            assert result.turns == (1 if tuning is None else 2)
            assert await agent.list_checkpoints(session) == []
            events = await runtime.store.read_events(Scope(session))
            assert events and not any(isinstance(e, CheckpointWritten) for e in events)
            assert await runtime.get_checkpoint(Scope(session)) is None

    async def test_list_limit_and_metadata_only(self, runtime: Runtime) -> None:
        research = Research(passes=3)
        agent = await research.ran(runtime)
        metas = await agent.list_checkpoints("s1", limit=2)
        assert [m.turn for m in metas] == [9, 6]
        fields = set(type(metas[0]).model_fields)
        assert fields == {"session_id", "checkpoint_id", "turn", "created_at"}
        with pytest.raises(ValueError):
            await agent.list_checkpoints("s1", limit=0)

    async def test_checkpoints_are_scoped_by_user(self, new_runtime: Opened[Runtime]) -> None:
        research = Research(passes=1)
        agent = research.agent(new_runtime())
        await agent.run("Research.", session_id="shared", user_id="alice")
        assert len(await agent.list_checkpoints("shared", user_id="alice")) == 1
        assert await agent.list_checkpoints("shared", user_id="bob") == []
        assert await agent.list_checkpoints("shared") == []
        # bob resuming "shared" finds nothing of alice's: he starts his own session
        bob_agent = Research(passes=1).agent(new_runtime())
        bob = await bob_agent.resume("hi", session_id="shared", user_id="bob")
        assert bob.restored_turns == 0
        bob_state = await new_runtime().restore(Scope("shared", "bob"))
        assert bob_state is not None
        assert not any("alice" in m.content for m in bob_state.messages)
        assert len(await agent.list_checkpoints("shared", user_id="alice")) == 1

    async def test_checkpoint_holds_full_transcript_turn_and_usage(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        result = await research.agent(new_runtime()).run("Research.", session_id="s1")
        ckpt = await new_runtime().get_checkpoint(Scope("s1"))
        assert ckpt is not None
        assert ckpt.turn == 6
        assert ckpt.cumulative_usage == result.usage
        roles = [m.role for m in ckpt.messages]
        assert roles[:2] == [Role.SYSTEM, Role.USER]
        assert roles.count(Role.ASSISTANT) == 6 and roles.count(Role.TOOL) == 4
        assert ckpt.messages[-1].content.startswith("Pass 2:")

    # --- resume ------------------------------------------------------------------------

    async def test_resume_restores_verbatim_and_never_repeats_a_model_call(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=3)
        # dies at the model call that would start the third pass
        await _dies(research, new_runtime(), 2 * CALLS_PER_PASS + 1)
        runtime = new_runtime()
        before = await runtime.get_checkpoint(Scope("s1"))
        assert before is not None and before.turn == 6
        calls_before = research.model_calls

        result = await research.agent(runtime).resume(
            "Pick it up where you left off.", session_id="s1"
        )

        assert research.model_calls - calls_before == CALLS_PER_PASS  # only the third pass ran
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

    async def test_resume_rolls_up_restored_and_new_usage(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        await _dies(research, new_runtime(), CALLS_PER_PASS + 1)
        runtime = new_runtime()
        ckpt = await runtime.get_checkpoint(Scope("s1"))
        assert ckpt is not None
        result = await research.agent(runtime).resume(session_id="s1")
        row = await runtime.store.checkpoint(Scope("s1"), ckpt.checkpoint_id)
        assert row is not None
        after = await runtime.store.read_events(Scope("s1"), row.seq)
        assert after and after[0].seq == row.seq + 1
        billed_after = sum((e.payload.usage for e in after if isinstance(e, TurnAppended)), Usage())
        assert billed_after.input_tokens > 0  # the resumed pass's model calls
        assert result.usage == ckpt.cumulative_usage + billed_after
        assert result.usage.cost_usd > ckpt.cumulative_usage.cost_usd

    async def test_resume_without_prompt_injects_the_continuation_nudge(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        await _dies(research, new_runtime(), CALLS_PER_PASS + 1)
        agent = research.agent(new_runtime())
        await agent.resume(session_id="s1")
        first_request = research.models[-1].inner.calls[0]
        assert first_request[-1] == Message.user(agent.tuning.continuation_prompt)
        assert first_request[-1] == Message.user("Continue the interrupted task.")

    async def test_crash_mid_pass_loses_no_recorded_turn_or_tool_call(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        # dies at the model call after the second pass's lookup: the lookup result is recorded
        await _dies(research, new_runtime(), CALLS_PER_PASS + 2)
        assert research.tool_runs["lookup:sqlite"] == 1
        calls_before = research.model_calls
        result = await research.agent(new_runtime()).resume(session_id="s1")
        # replayed past the checkpoint: the lookup and its model call are restored
        assert research.tool_runs["lookup:sqlite"] == 1
        assert all(count == 1 for count in research.tool_runs.values())
        assert research.model_calls - calls_before == 2  # the note call and the answer
        assert result.restored_turns == 4
        assert result.turns == 6
        assert result.output.startswith("Pass 2:")

    async def test_crash_between_tool_calls_runs_only_the_missing_tool(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=1)

        class Boom(BaseException):
            pass

        def note(text: str) -> str:
            """Write a note."""
            raise Boom  # the process dies inside the tool: nothing about it was recorded

        agent = research.agent(new_runtime())
        recorded = agent.tools["note"]
        agent.tools["note"] = type(recorded)("note", "Write a note.", note, recorded.arguments)
        with pytest.raises(Boom):
            await agent.run("Research.", session_id="s1")
        result = await research.agent(new_runtime()).resume(session_id="s1")
        assert research.tool_runs == {"lookup:kafka": 1, "note:kafka noted": 1}
        assert result.output.startswith("Pass 1:")

    async def test_fallback_without_checkpoints_replays_the_log(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        await _dies(research, new_runtime(), CALLS_PER_PASS + 2, checkpoint=False)
        calls_before = research.model_calls
        result = await research.agent(new_runtime(), checkpoint=False).resume(session_id="s1")
        assert research.model_calls - calls_before == 2
        assert all(count == 1 for count in research.tool_runs.values())
        assert result.restored_turns == 4 and result.turns == 6

    async def test_resume_of_a_finished_session_continues_it(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=1)
        first = await research.agent(new_runtime()).run("Research.", session_id="s1")
        agent = _follower(new_runtime(), "Anything else?")
        result = await agent.resume("One more thing.", session_id="s1")
        assert result.restored_turns == first.turns
        assert result.model_calls == 1 and result.output == "Anything else?"
        assert len(await agent.list_checkpoints("s1")) == 2

    async def test_a_reader_sees_what_another_writer_added_after_it_read(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        reader, writer = new_runtime(), new_runtime()
        await Research(passes=1).agent(writer).run("Research.", session_id="s1")
        first = await reader.get_checkpoint(Scope("s1"))  # the reader now holds the transcript
        assert first is not None and first.turn == 3
        await Research(passes=2).agent(writer).resume(session_id="s1")
        latest = await reader.get_checkpoint(Scope("s1"))
        assert latest is not None and latest.turn == 6
        from_storage = await new_runtime().restore(Scope("s1"))
        assert from_storage is not None and latest.messages == from_storage.messages
        assert await reader.get_checkpoint(Scope("s1"), first.checkpoint_id) == first

        # another writer compacts: the transcript gets a new base, and the reader follows it
        compacting = Research(passes=3).agent(
            writer, auto_compact_at_tokens=1, compact_keep_messages=2
        )
        await compacting.resume(session_id="s1")
        compacted = await reader.get_checkpoint(Scope("s1"))
        assert compacted is not None
        assert compacted.messages[1].content.startswith("Summary of the earlier conversation")

    async def test_a_fresh_runtime_restores_messages_byte_for_byte(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        writer = await new_runtime().open_session(Scope("s1"), run_id=new_id("run"))
        call = ToolCall(id="c1", name="search", arguments={"zeta": 1, "alpha": {"y": 2, "b": 3}})
        sent = [Message.assistant("", [call]), Message.tool("c1", "NUL \x00 inside")]
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=sent))
        state = await new_runtime().restore(Scope("s1"))
        assert state is not None
        # key order kept, so a resumed transcript is the same prompt prefix byte for byte
        assert [m.model_dump_json() for m in state.messages] == [m.model_dump_json() for m in sent]

    # --- fork --------------------------------------------------------------------------

    async def test_older_checkpoint_forks_and_leaves_the_original_untouched(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=3)
        agent = await research.ran(new_runtime())
        runtime = new_runtime()
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
        fork_metas = await agent.list_checkpoints(fork.session_id)
        fork_first = await runtime.get_checkpoint(
            Scope(fork.session_id), fork_metas[-1].checkpoint_id
        )
        older_full = await runtime.get_checkpoint(Scope("s1"), older.checkpoint_id)
        assert fork_first is not None and older_full is not None
        assert fork_first.messages[: len(older_full.messages)] == older_full.messages

    async def test_a_fork_stays_with_its_user(self, new_runtime: Opened[Runtime]) -> None:
        research = Research(passes=3)
        agent = await research.ran(new_runtime(), user_id="alice")
        metas = await agent.list_checkpoints("s1", user_id="alice")
        older = metas[-1]
        with pytest.raises(CheckpointNotFoundError):  # not without alice's user id
            await agent.resume(session_id="s1", from_checkpoint=older.checkpoint_id)
        fork = await research.agent(new_runtime()).resume(
            "Try another angle.",
            session_id="s1",
            user_id="alice",
            from_checkpoint=older.checkpoint_id,
        )
        assert fork.session_id != "s1" and fork.parent_checkpoint_id == older.checkpoint_id
        assert fork.restored_turns == 3 and fork.turns == 9
        runtime = new_runtime()
        row = await runtime.store.session(Scope(fork.session_id, "alice"))
        assert row is not None and row.user_id == "alice"
        assert (row.parent_session_id, row.parent_checkpoint_id) == ("s1", older.checkpoint_id)
        forked = await agent.list_checkpoints(fork.session_id, user_id="alice")
        assert [m.turn for m in forked] == [9, 6]  # the fork's own passes two and three
        for stranger in (None, "bob"):
            assert await agent.list_checkpoints(fork.session_id, user_id=stranger) == []
            assert await runtime.restore(Scope(fork.session_id, stranger)) is None
        assert await agent.list_checkpoints("s1", user_id="alice") == metas
        # the fork continues in place for alice, from its own latest checkpoint
        follow = await _follower(new_runtime()).resume(
            "And?", session_id=fork.session_id, user_id="alice"
        )
        assert follow.session_id == fork.session_id and follow.restored_turns == 9

    async def test_a_fork_made_without_a_run_resumes_from_its_checkpoint(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=3)
        agent = await research.ran(new_runtime(), user_id="alice")
        metas = await agent.list_checkpoints("s1", user_id="alice")
        older = metas[-1]  # the first pass
        runtime = new_runtime()
        calls = research.model_calls
        child = await runtime.fork(Scope("s1", "alice"), older.checkpoint_id, session_id="alt")
        assert child == Scope("alt", "alice") and research.model_calls == calls
        assert [e.type for e in await runtime.store.read_events(child)] == ["session.forked"]
        row = await runtime.store.session(child)
        assert row is not None and row.last_run_id is None and row.turns == older.turn
        assert (row.parent_session_id, row.parent_checkpoint_id) == ("s1", older.checkpoint_id)
        assert (await runtime.fork(Scope("s1", "alice"), older.checkpoint_id)).session_id != "alt"
        with pytest.raises(InvalidIdError, match="already exists"):
            await runtime.fork(Scope("s1", "alice"), metas[0].checkpoint_id, session_id="alt")
        with pytest.raises(CheckpointNotFoundError):  # alice's checkpoint, not bob's
            await runtime.fork(Scope("s1", "bob"), older.checkpoint_id)

        # resumed like any session: no checkpoint of its own yet, so its log is replayed
        fork = await research.agent(new_runtime()).resume(
            "Try another angle.", session_id="alt", user_id="alice"
        )
        assert fork.session_id == "alt" and fork.parent_session_id == "s1"
        assert fork.restored_turns == older.turn == 3 and fork.turns == 9
        assert research.model_calls - calls == 6  # passes two and three, in the fork
        first = await runtime.get_checkpoint(
            child, (await agent.list_checkpoints("alt", user_id="alice"))[-1].checkpoint_id
        )
        older_full = await runtime.get_checkpoint(Scope("s1", "alice"), older.checkpoint_id)
        assert first is not None and older_full is not None
        assert first.messages[: len(older_full.messages)] == older_full.messages
        assert await agent.list_checkpoints("s1", user_id="alice") == metas

    async def test_latest_checkpoint_id_continues_in_place(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=1)
        agent = await research.ran(new_runtime())
        latest = (await agent.list_checkpoints("s1"))[0]
        follow = _follower(new_runtime())
        result = await follow.resume("more", session_id="s1", from_checkpoint=latest.checkpoint_id)
        assert result.session_id == "s1" and result.parent_session_id is None

    async def test_unknown_checkpoint_is_a_clear_error(self, runtime: Runtime) -> None:
        research = Research(passes=1)
        agent = await research.ran(runtime)
        missing = new_id("ckpt")
        with pytest.raises(CheckpointNotFoundError, match=missing):
            await agent.resume(session_id="s1", from_checkpoint=missing)
        # another user's id is just as unknown
        other = (await agent.list_checkpoints("s1"))[0].checkpoint_id
        with pytest.raises(CheckpointNotFoundError):
            await agent.resume(session_id="s1", from_checkpoint=other, user_id="mallory")
        with pytest.raises(InvalidIdError):
            await agent.resume(session_id="s1", from_checkpoint="../../etc/passwd")

    # --- failures ------------------------------------------------------------------------

    async def test_failed_checkpoint_write_warns_and_the_run_goes_on(
        self, runtime: Runtime, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def disk_full(write: Write, events: Sequence[Event]) -> None:
            if _checkpoint_in(events):
                raise OSError("disk full")
            await write(events)

        research, result = await _research_under(runtime, disk_full, caplog, passes=2)
        assert result.output.startswith("Pass 2:") and result.turns == 6
        warnings = [r.getMessage() for r in caplog.records]
        assert sum("checkpoint" in w and "disk full" in w for w in warnings) == 2
        assert await research.agent(runtime).list_checkpoints("s1") == []

    async def test_a_write_that_lands_and_then_raises_never_ends_the_run(
        self, runtime: Runtime, caplog: pytest.LogCaptureFixture
    ) -> None:
        in_doubt: list[str] = []

        async def lands_then_raises(write: Write, events: Sequence[Event]) -> None:
            await write(events)
            checkpoint = _checkpoint_in(events)
            if not in_doubt and checkpoint:
                in_doubt.append(checkpoint)
                raise TimeoutError("the write landed but its reply was lost")

        research, result = await _research_under(runtime, lands_then_raises, caplog, passes=3)
        assert in_doubt, "the fault was never injected"
        assert result.output.startswith("Pass 3:") and result.turns == 9
        assert any("reply was lost" in r.getMessage() for r in caplog.records)
        # the checkpoint whose write raised is there once, and no seq was taken twice or skipped
        assert len(await research.agent(runtime).list_checkpoints("s1")) == 3
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.event_id for e in events].count(in_doubt[0]) == 1

    async def test_a_write_that_never_lands_gives_its_seq_back(self, runtime: Runtime) -> None:
        failures: list[str] = []

        async def fails_once(write: Write, events: Sequence[Event]) -> None:
            checkpoint = _checkpoint_in(events)
            if not failures and checkpoint:
                failures.append(checkpoint)
                raise ConnectionResetError("connection lost before the write")
            await write(events)

        research = Research(passes=2)
        with faulty(runtime.store, fails_once):
            result = await research.agent(runtime).run("Research.", session_id="s1")
        assert failures and result.turns == 6
        assert len(await research.agent(runtime).list_checkpoints("s1")) == 1
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert failures[0] not in {e.event_id for e in events}

    @pytest.mark.parametrize("lands", [False, True], ids=["lost", "landed"])
    @pytest.mark.parametrize("outage", [1, 4], ids=["one-failure", "four-failures"])
    async def test_a_write_to_a_store_briefly_away_is_tried_again(
        self, runtime: Runtime, lands: bool, outage: int, caplog: pytest.LogCaptureFixture
    ) -> None:
        failed: list[str] = []
        landed = False

        async def away_for_a_while(write: Write, events: Sequence[Event]) -> None:
            nonlocal landed
            answer = any(isinstance(e, TurnAppended) and e.payload.model_call for e in events)
            if answer and len(failed) < outage:
                failed.append(events[-1].event_id)
                if lands and not landed:
                    landed = True
                    await write(events)  # the first attempt lands; its reply is lost
                raise StoreUnavailableError("the server went away for a moment")
            await write(events)

        research, result = await _research_under(runtime, away_for_a_while, caplog, passes=2)
        assert len(failed) == outage, "the fault was not injected as planned"
        assert result.turns == 6 and result.output.startswith("Pass 2:")
        assert research.model_calls == 6  # the answer was recorded, not asked for again
        assert any("trying again for up to" in r.getMessage() for r in caplog.records)
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        answers = [e for e in events if isinstance(e, TurnAppended) and e.payload.model_call]
        assert len(answers) == 6  # the answer in doubt is in the log once
        assert (failed[0] in {e.event_id for e in events}) is lands

    async def test_emit_hears_once_of_a_write_that_landed_in_doubt(self, runtime: Runtime) -> None:
        heard: list[str] = []
        doubted: list[str] = []

        async def emit(item: object) -> None:
            if isinstance(item, EventBase):
                heard.append(item.event_id)

        async def lands_then_raises(write: Write, events: Sequence[Event]) -> None:
            await write(events)
            answer = any(isinstance(e, TurnAppended) and e.payload.model_call for e in events)
            if answer and not doubted:
                doubted.append(events[-1].event_id)
                raise StoreUnavailableError("the reply was lost")

        research = Research(passes=1)
        with faulty(runtime.store, lands_then_raises):
            result = await research.agent(runtime).run("Research.", session_id="s1", emit=emit)
        assert doubted, "the fault was never injected"
        logged = [e.event_id for e in await runtime.store.read_events(Scope("s1"))]
        assert heard == logged and heard.count(doubted[0]) == 1
        assert result.turns == 3

    @pytest.mark.parametrize(
        "value", [object(), {1, 2}, b"bytes", {1: "int key"}, float("nan"), [float("inf")]]
    )
    async def test_a_tool_value_json_cannot_hold_is_a_recorded_tool_error(
        self, new_runtime: Opened[Runtime], value: object
    ) -> None:
        runs: list[int] = []

        def fetch() -> object:
            """Return something JSON cannot hold (after a side effect)."""
            runs.append(1)
            return value

        model = ScriptedModel([ScriptedModel.tool_call("fetch"), "done"])
        agent = Agent("x", model=model, runtime=new_runtime(), tools=[fetch])
        result = await agent.run("go", session_id="s1")
        assert result.output == "done"
        state = await new_runtime().restore(Scope("s1"))
        assert state is not None
        tool = next(m for m in state.messages if m.role is Role.TOOL)
        assert tool.is_error and "SerializationError" in tool.content and "fetch" in tool.content
        # recorded: a resume replays it instead of running the side effect again
        again = Agent("x", model=ScriptedModel(["ok"] * 4), runtime=new_runtime(), tools=[fetch])
        await again.resume(session_id="s1")
        assert runs == [1]

    @pytest.mark.parametrize("bad", ["", "a b", "x" * 300, "../x", "é"])
    async def test_invalid_ids_are_rejected(self, runtime: Runtime, bad: str) -> None:
        agent = Research().agent(runtime)
        with pytest.raises(InvalidIdError):
            await agent.run("hi", session_id=bad)
        with pytest.raises(InvalidIdError):
            await agent.run("hi", session_id="ok", user_id=bad)
        with pytest.raises(InvalidIdError):
            await agent.list_checkpoints(bad)

    # --- compaction ----------------------------------------------------------------------

    async def test_auto_compaction_runs_before_the_checkpoint(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=2)
        agent = research.agent(new_runtime(), auto_compact_at_tokens=1, compact_keep_messages=2)
        result = await agent.run("Research.", session_id="s1")
        ckpt = await new_runtime().get_checkpoint(Scope("s1"))
        assert ckpt is not None
        assert ckpt.messages[0].role is Role.SYSTEM
        assert ckpt.messages[1].content.startswith("Summary of the earlier conversation")
        assert len(ckpt.messages) < 12
        assert ckpt.cumulative_usage == result.usage  # the summarising calls are accounted
        # resuming from the compacted checkpoint restores the compacted transcript
        model = ScriptedModel(lambda m: "ok")
        follow = Agent("x", model=model, runtime=new_runtime(), tuning=Tuning(checkpoint=True))
        resumed = await follow.resume("and?", session_id="s1")
        assert resumed.output == "ok"
        assert model.calls[0][: len(ckpt.messages)] == ckpt.messages

    # --- journal ---------------------------------------------------------------------------

    async def test_journal_step_replays_same_inputs_and_reruns_changed_ones(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        runtime = new_runtime()
        scope = Scope("s1", "alice")
        runs: list[int] = []

        async def work(n: int) -> dict[str, object]:
            runs.append(n)
            return {"n": n, "at": datetime(2026, 1, 1, tzinfo=UTC), "pair": (n, n)}

        async def journal(on: Runtime, where: Scope) -> Journal:
            return Journal(await on.open_session(where, run_id=new_id("run")))

        first: dict[str, object] = await (await journal(runtime, scope)).step("fetch", work, 1)
        again: dict[str, object] = await (await journal(new_runtime(), scope)).step(
            "fetch", work, 1
        )
        assert runs == [1] and again == first  # same key, same inputs: recorded value, typed
        assert again["pair"] == (1, 1) and again["at"] == datetime(2026, 1, 1, tzinfo=UTC)
        changed: dict[str, object] = await (await journal(runtime, scope)).step("fetch", work, 2)
        assert runs == [1, 2] and changed["n"] == 2
        # a journal is per (session, user)
        other: dict[str, object] = await (await journal(runtime, Scope("s1"))).step(
            "fetch", work, 1
        )
        assert runs == [1, 2, 1] and other["n"] == 1

    async def test_tools_can_journal_steps_that_replay_after_a_crash(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        payment = Payment()
        model = ScriptedModel([ScriptedModel.tool_call("pay", order="o-1"), "paid"])
        with pytest.raises(SimulatedCrash):
            await Agent("x", model=model, runtime=new_runtime(), tools=[payment.pay]).run(
                "pay", session_id="s1"
            )
        again = Agent("x", model=model, runtime=new_runtime(), tools=[payment.pay])
        result = await again.resume(session_id="s1")
        assert payment.charged == ["o-1"]  # the tool ran again (at least once), the charge not
        assert result.output == "paid"

    async def test_journal_steps_and_checkpoints_compose(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        payment = Payment()

        def more(state: SessionState) -> str | None:
            answers = [m for m in state.messages if m.content.startswith("Pass ")]
            return "Now pay." if len(answers) < 2 else None

        script: list[Message | str] = [
            "Pass 1: nothing to pay yet.",
            ScriptedModel.tool_call("pay", order="o-1"),
            "Pass 2: paid.",
        ]

        def agent(model: ScriptedModel) -> Agent:
            tuning = Tuning(checkpoint=True, stop_hooks=[more])
            runtime = new_runtime()
            return Agent("x", model=model, runtime=runtime, tuning=tuning, tools=[payment.pay])

        with pytest.raises(SimulatedCrash):  # in pass two, after the step was recorded
            await agent(ScriptedModel(script)).run("Pay when asked.", session_id="s1")
        runtime = new_runtime()
        assert [m.turn for m in await runtime.list_checkpoints(Scope("s1"))] == [1]

        model = ScriptedModel(script)
        result = await agent(model).resume(session_id="s1")
        assert payment.charged == ["o-1"]  # replayed from the journal, not charged again
        assert result.restored_turns == 2 and result.model_calls == 1
        assert result.output == "Pass 2: paid."
        assert [m.content for m in model.calls[0] if m.role is Role.TOOL] == ["paid o-1"]
        events = await runtime.store.read_events(Scope("s1"))
        steps = [e for e in events if isinstance(e, StepRecorded)]
        checkpoints = [e for e in events if isinstance(e, CheckpointWritten)]
        assert len(steps) == 1 and len(checkpoints) == 2
        assert checkpoints[0].seq < steps[0].seq < checkpoints[1].seq  # one log holds both
        step = await runtime.store.step(Scope("s1"), steps[0].payload.step_key)
        assert step is not None and step.value == "paid o-1"

    async def test_json_store_never_unpickles(self, new_runtime: Opened[Runtime]) -> None:
        scope = Scope("s1")
        pickling = new_runtime(serializer="pickle")

        def make_set() -> set[int]:
            return {1, 2}

        def must_not_run() -> set[int]:
            pytest.fail("replayed step ran again")

        async def journal(on: Runtime) -> Journal:
            return Journal(await on.open_session(scope, run_id=new_id("run")))

        assert await (await journal(pickling)).step("blob", make_set) == {1, 2}
        assert await (await journal(pickling)).step("blob", must_not_run) == {1, 2}
        json_runtime = new_runtime(serializer="json")
        with pytest.raises(UnsafeDeserializationError):
            await (await journal(json_runtime)).step("blob", must_not_run)

    async def test_non_json_step_values_are_refused_under_json(self, runtime: Runtime) -> None:
        journal = Journal(await runtime.open_session(Scope("s1"), run_id=new_id("run")))
        with pytest.raises(SerializationError):
            await journal.step("bad", object)
        assert await runtime.store.step(Scope("s1"), "bad") is None

    async def test_reappending_an_event_is_idempotent(self, runtime: Runtime) -> None:
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

    # --- single writer -------------------------------------------------------------------

    async def test_a_stale_writer_cannot_write_into_a_resumed_session(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        scope = Scope("s1")
        stale = await new_runtime().open_session(scope, run_id=new_id("run"))
        fresh = await new_runtime().open_session(scope, run_id=new_id("run"))
        assert fresh.epoch > stale.epoch
        stale.next_seq = fresh.next_seq  # even with the right seq, its epoch is refused
        with pytest.raises(StaleWriterError):  # at its next append, or when its run confirms
            await stale.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
            await stale.confirm()
        await fresh.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("mine")]))
        state = await new_runtime().restore(scope)
        assert state is not None and [m.content for m in state.messages] == ["mine"]

    async def test_a_run_that_loses_the_session_mid_pass_is_named_and_its_prompt_marked(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        """Two resumes of one session at once: the one that claims last wins, the other's
        next write raises StaleWriterError. The winner's run.started names the run it
        interrupted, and the loser's prompt, already in the log, is marked as never
        answered instead of standing as a second user turn in a row."""

        def agent(model: ScriptedModel) -> Agent:
            return Agent("You help.", model=model, runtime=new_runtime())

        await agent(ScriptedModel(["one"])).run("hello", session_id="s1")
        entered, release = asyncio.Event(), asyncio.Event()

        async def held(messages: Sequence[Message]) -> None:
            entered.set()
            await release.wait()

        loser = agent(ScriptedModel(["one", "lost"], on_call=held))
        losing = asyncio.create_task(loser.resume("first question", session_id="s1"))
        await entered.wait()  # its prompt is in the log, its model call in flight
        winner = agent(ScriptedModel(lambda messages: "kept"))
        result = await winner.resume("second question", session_id="s1")
        release.set()
        with pytest.raises(StaleWriterError):
            await losing
        assert result.output == "kept"

        events = await new_runtime().store.read_events(Scope("s1"))
        runs = [e for e in events if e.type == "run.started"]
        assert [r.payload.interrupted for r in runs] == [None, None, runs[1].run_id]
        state = await new_runtime().restore(Scope("s1"))
        assert state is not None
        roles = [m.role for m in state.messages]
        assert all(not (a is b is Role.USER) for a, b in itertools.pairwise(roles))
        marker = state.messages[-3]
        assert marker.role is Role.ASSISTANT and runs[1].run_id in marker.content
        assert [m.content for m in state.messages[-4::2]] == ["first question", "second question"]
        assert "lost" not in [m.content for m in state.messages]

    async def test_a_run_taken_over_after_its_final_answer_ends_with_no_model_call(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        """A run whose final answer is recorded but whose end is not (its process died
        between the two) is continued from its stop hooks by ``resume()``: no nudge, no
        new model call, and the checkpoint of its last pass is written."""
        entered = asyncio.Event()

        async def hang(state: SessionState) -> None:
            entered.set()  # the answer is in the log; the run's end never will be
            await asyncio.Event().wait()

        first = Agent(
            "You help.",
            model=ScriptedModel(["done"]),
            runtime=new_runtime(),
            tuning=Tuning(checkpoint=True, stop_hooks=[hang]),
        )
        hung = asyncio.create_task(first.run("go", session_id="s1"))
        await entered.wait()
        model = ScriptedModel(["again"])
        second = Agent(
            "You help.", model=model, runtime=new_runtime(), tuning=Tuning(checkpoint=True)
        )
        result = await second.resume(session_id="s1")
        hung.cancel()
        with contextlib.suppress(asyncio.CancelledError, StaleWriterError):
            await hung
        assert model.calls == []
        assert (result.output, result.turns, result.model_calls) == ("done", 1, 0)
        assert [m.turn for m in await second.list_checkpoints("s1")] == [1]
        state = await new_runtime().restore(Scope("s1"))
        assert state is not None and [m.content for m in state.messages[1:]] == ["go", "done"]

    # --- retention, prune, erase -----------------------------------------------------------

    async def test_default_retention_keeps_the_newest_20(self, runtime: Runtime) -> None:
        assert runtime.max_checkpoints_per_session == 20
        research = Research(passes=22)
        agent = research.agent(runtime)
        result = await agent.run("Research.", session_id="s1")
        assert result.turns == 66
        metas = await agent.list_checkpoints("s1", limit=50)
        assert [m.turn for m in metas] == list(range(66, 6, -3))  # passes 3 to 22
        events = await runtime.store.read_events(Scope("s1"))
        assert sum(isinstance(e, CheckpointWritten) for e in events) == 22  # the log keeps all

    async def test_retention_keeps_the_newest_n_per_session_and_user(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=5)
        agent = await research.ran(new_runtime(max_checkpoints_per_session=2), user_id="alice")
        bob = Research(passes=3).agent(new_runtime(max_checkpoints_per_session=2))
        await bob.run("Research.", session_id="s1", user_id="bob")
        alice = await agent.list_checkpoints("s1", user_id="alice")
        assert [m.turn for m in alice] == [15, 12]
        assert [m.turn for m in await agent.list_checkpoints("s1", user_id="bob")] == [9, 6]
        # the session itself is intact: resuming still restores everything
        state = await new_runtime().restore(Scope("s1", "alice"))
        assert state is not None and state.turns == 15

    @pytest.mark.parametrize("keep", [0, -1])
    async def test_retention_below_one_is_unbounded(
        self, new_runtime: Opened[Runtime], keep: int
    ) -> None:
        research = Research(passes=4)
        agent = await research.ran(new_runtime(max_checkpoints_per_session=keep))
        assert len(await agent.list_checkpoints("s1")) == 4

    async def test_prune_by_session_deletes_its_journal_and_checkpoints(
        self, runtime: Runtime
    ) -> None:
        await Research(passes=2).agent(runtime).run("Research.", session_id="done")
        await Research(passes=2).agent(runtime).run("Research.", session_id="live")
        with pytest.raises(ValueError):
            await runtime.store.prune()
        result = await runtime.store.prune(session_id="done")
        assert result.sessions == 1 and result.checkpoints == 2 and result.events > 0
        assert await runtime.list_checkpoints(Scope("done")) == []
        assert await runtime.restore(Scope("done")) is None
        assert len(await runtime.list_checkpoints(Scope("live"))) == 2

    async def test_prune_before_a_time(self, runtime: Runtime) -> None:
        await Research(passes=2).agent(runtime).run("Research.", session_id="old")
        cutoff = datetime.now(UTC) + timedelta(microseconds=1)
        assert (await runtime.store.prune(before=cutoff - timedelta(days=1))).sessions == 0
        assert len(await runtime.list_checkpoints(Scope("old"))) == 2
        result = await runtime.store.prune(before=cutoff)
        assert result.sessions == 1
        assert await runtime.list_checkpoints(Scope("old")) == []
        with pytest.raises(ValueError):
            await runtime.store.prune(before=datetime(2026, 1, 1))  # naive: ambiguous

    async def test_erase_leaves_a_tombstone_that_late_writes_cannot_undo(
        self, runtime: Runtime
    ) -> None:
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

    # --- storage ---------------------------------------------------------------------------

    async def test_checkpoint_events_carry_no_messages(self, new_runtime: Opened[Runtime]) -> None:
        research = Research(passes=3)
        await research.agent(new_runtime()).run("Research.", session_id="s1")
        events = await new_runtime().store.read_events(Scope("s1"))
        checkpoints = [e for e in events if isinstance(e, CheckpointWritten)]
        assert len(checkpoints) == 3
        assert all("messages" not in e.payload.model_dump() for e in checkpoints)
        assert all(len(e.payload.model_dump_json()) < 400 for e in checkpoints)

    async def test_the_log_of_a_long_session_grows_linearly(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        passes = 100
        runtime = new_runtime(max_checkpoints_per_session=0)  # keep every checkpoint
        agent = digging_agent(runtime, passes)
        await agent.run("Research event sourcing.", session_id="long")
        assert len(await agent.list_checkpoints("long", limit=1000)) == passes
        final = await runtime.get_checkpoint(Scope("long"))
        assert final is not None
        assert len(final.messages) == 2 + passes * 4 - 1
        transcript = len(TypeAdapter(list[Message]).dump_json(final.messages))
        logged = sum(
            len(e.model_dump_json()) for e in await runtime.store.read_events(Scope("long"))
        )
        assert logged < 3 * transcript, f"a {logged}-byte log for a {transcript}-byte transcript"

    # -- waiting runs, signals and workers ---------------------------------------------

    async def test_a_waiting_run_goes_on_with_a_signal_sent_from_another_runtime(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        from loomflow.agent.worker import Worker

        seen: list[object] = []
        waiting = await _approval(new_runtime(), seen).run("Pay.", session_id="pay", user_id="ada")
        assert (waiting.stop_reason, waiting.waiting_for) == ("waiting", "approve")
        await _approval(new_runtime(), []).signal("pay", "approve", {"ok": True}, user_id="ada")
        worker = Worker([_approval(new_runtime(), seen)])
        await asyncio.gather(*await worker.scan())
        assert [(o.reason, o.outcome) for o in worker.done] == [("signalled", "finished")]
        assert seen == [{"ok": True}]
        row = await new_runtime().store.session(Scope("pay", "ada"))
        assert row is not None and row.status == "finished" and row.inbox == ()

    async def test_a_worker_looks_only_at_runs_that_may_be_due(self, runtime: Runtime) -> None:
        for n in range(3):
            await _approval(runtime, []).run("Pay.", session_id=f"pay-{n}")
        await runtime.signal(Scope("pay-1"), "approve", {"ok": True})
        # sessions that wait with no signal and no deadline are never read, however many
        (row,) = await runtime.store.sessions_in_flight(limit=1)
        assert (row.session_id, row.status) == ("pay-1", "signalled")
        assert [s.name for s in row.inbox] == ["approve"]

    async def test_a_signal_to_another_users_or_an_unknown_session_is_not_found(
        self, runtime: Runtime
    ) -> None:
        await _approval(runtime, []).run("Pay.", session_id="pay", user_id="ada")
        before = await runtime.store.session(Scope("pay", "ada"))
        for scope in (Scope("pay", "bob"), Scope("pay"), Scope("nope", "ada")):
            with pytest.raises(SessionNotFoundError):
                await runtime.signal(scope, "approve", {"ok": True})
        assert await runtime.store.session(Scope("pay", "ada")) == before

    async def test_a_signal_after_its_wait_timed_out_is_refused_and_the_run_times_out(
        self, new_runtime: Opened[Runtime], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from loomflow.agent.worker import Worker

        seen: list[object] = []
        await _waited_an_hour_ago(_patient(new_runtime(), seen), monkeypatch)
        runtime = new_runtime()
        before = await runtime.store.session(Scope("pay"))
        with pytest.raises(SignalRefusedError, match=r"timed out at .*SignalTimeoutError"):
            await runtime.signal(Scope("pay"), "approve", {"ok": True})
        assert await runtime.store.session(Scope("pay")) == before  # nothing was appended
        worker = Worker([_patient(new_runtime(), seen)])
        await asyncio.gather(*await worker.scan())
        assert [(o.reason, o.outcome) for o in worker.done] == [("timed out", "finished")]
        assert seen == ["timed out"]

    async def test_a_signal_the_log_records_past_the_deadline_waits_for_a_later_wait(
        self, new_runtime: Opened[Runtime], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from loomflow.agent.worker import Worker

        seen: list[object] = []
        await _waited_an_hour_ago(_patient(new_runtime(), seen, again=True), monkeypatch)
        runtime = new_runtime()
        # as when a send checked the wait just before its deadline and appended just after
        late = SignalSentPayload(name="approve", data={"ok": True})
        await runtime.store.append_admin(Scope("pay"), SignalSent, late, claim=True)
        row = await runtime.store.session(Scope("pay"))
        assert row is not None and row.status == "waiting"  # not signalled: it came too late
        assert [s.name for s in row.inbox] == ["approve"]
        worker = Worker([_patient(new_runtime(), seen, again=True)])
        await asyncio.gather(*await worker.scan())
        assert [(o.reason, o.outcome) for o in worker.done] == [("timed out", "finished")]
        assert seen == ["timed out", {"ok": True}]  # the expired wait, then the next one
        row = await new_runtime().store.session(Scope("pay"))
        assert row is not None and row.status == "finished" and row.inbox == ()

    async def test_of_two_claims_after_the_same_seq_exactly_one_wins(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        await Research(passes=1).ran(new_runtime())
        row = await new_runtime().store.session(Scope("s1"))
        assert row is not None
        claims = [
            new_runtime().open_session(
                Scope("s1"), run_id=new_id("run"), claim_after=row.last_seq, worker=f"w{n}"
            )
            for n in range(2)
        ]
        outcomes = await asyncio.gather(*claims, return_exceptions=True)
        lost = [o for o in outcomes if isinstance(o, RunTakenError)]
        assert len(lost) == 1, outcomes
        after = await new_runtime().store.session(Scope("s1"))
        assert after is not None and after.epoch == row.epoch + 1 and after.attempts == 1
        # a claim after the same seq that comes once the session has moved past it loses
        # too, though the seq after the winner's claim is free for it to write at
        with pytest.raises(RunTakenError):
            await new_runtime().open_session(
                Scope("s1"), run_id=new_id("run"), claim_after=row.last_seq, worker="w-late"
            )
        assert await new_runtime().store.session(Scope("s1")) == after  # it wrote nothing


def _approval(runtime: Runtime, seen: list[object]) -> Agent:
    """An agent whose tool waits for the signal "approve" and returns what it carried."""

    async def approve(amount: int) -> str:
        """Ask a person to approve a payment."""
        answer = await wait_for_signal("approve")
        seen.append(answer)
        return f"approved: {answer}"

    model = ScriptedModel([ScriptedModel.tool_call("approve", amount=5), "Paid."])
    return Agent("You pay.", model=model, runtime=runtime, tools=[approve])


def _patient(runtime: Runtime, seen: list[object], *, again: bool = False) -> Agent:
    """An agent whose tool waits a minute for the signal "approve"; ``again``: once that
    wait timed out, it waits for "approve" once more, with no deadline."""

    async def approve(amount: int) -> str:
        """Ask a person to approve a payment within a minute."""
        try:
            answer = await wait_for_signal("approve", timeout=60)
        except SignalTimeoutError:
            seen.append("timed out")
            if not again:
                raise
            answer = await wait_for_signal("approve")
        seen.append(answer)
        return f"approved: {answer}"

    model = ScriptedModel([ScriptedModel.tool_call("approve", amount=5), "Paid."])
    return Agent("You pay.", model=model, runtime=runtime, tools=[approve])


async def _waited_an_hour_ago(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``agent`` on session "pay" until it waits, with the clock of its waits an
    hour behind: the minute its wait allows has passed when the run returns, and the
    test need not sleep through it."""
    from loomflow.runtime import journal

    with monkeypatch.context() as patch:
        patch.setattr(journal, "utcnow", lambda: utcnow() - timedelta(hours=1))
        result = await agent.run("Pay.", session_id="pay")
    assert (result.stop_reason, result.waiting_for) == ("waiting", "approve")
