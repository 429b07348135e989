"""The checkpoints of the runtime conformance suite: one per pass (and none unless asked
for), listing, scoping by user, what a checkpoint holds and what its event does not,
and the compacted transcript of the first checkpoint after auto-compaction."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from loomflow import Agent, Message, Role, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import CheckpointWritten
from loomflow.testing._support import Opened
from loomflow.testing.scenario import Research, digging_agent

__all__ = ["Checkpoints"]


class Checkpoints:
    """Tests of checkpoints, listing and storage; mixed into RuntimeConformance."""

    # --- checkpoints per pass, listing, scoping ---------------------------------------

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

    # --- storage ----------------------------------------------------------------------

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

    # --- compaction -------------------------------------------------------------------

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
