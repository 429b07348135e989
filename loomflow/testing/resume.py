"""Resume in the runtime conformance suite: the latest checkpoint and the log after it
restored verbatim, so a resumed run repeats no recorded model or tool call, with or
without a prompt, with or without checkpoints, and across runtimes."""

from __future__ import annotations

import pytest

from loomflow import Message, Role, Usage, new_id
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import ToolCall, TurnAppended
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.testing._support import Opened, follower
from loomflow.testing.scenario import CALLS_PER_PASS, Research, SimulatedCrash

__all__ = ["Resume"]


async def _dies(research: Research, runtime: Runtime, at: int, *, checkpoint: bool = True) -> None:
    """Run ``research`` on session s1 until its process dies at model call ``at``."""
    with pytest.raises(SimulatedCrash):
        await research.ran(runtime, crash_at=at, checkpoint=checkpoint)


class Resume:
    """Tests of resume after a crash or a finished run; mixed into RuntimeConformance."""

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
        agent = follower(new_runtime(), "Anything else?")
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
