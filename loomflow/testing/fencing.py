"""One writer per session in the runtime conformance suite: a claim takes a new epoch,
exactly one of two claims wins, and a stale writer is refused with the run it lost
named by the one that took over."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence

import pytest

from loomflow import Agent, Message, Role, SessionState, Tuning, new_id
from loomflow.errors import RunTakenError, StaleWriterError
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import TurnAppended
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.testing._support import Opened
from loomflow.testing.scenario import Research

__all__ = ["Fencing"]


class Fencing:
    """Tests of claims and the fenced stale writer; mixed into RuntimeConformance."""

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
