"""The journal in the runtime conformance suite: a step replays its recorded value for
the same inputs and runs again for changed ones, in tools and across a crash, beside
checkpoints in one log; JSON values unless the runtime opts into pickle."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from loomflow import Agent, Message, Role, SessionState, Tuning, new_id
from loomflow.errors import SequenceConflictError, SerializationError, UnsafeDeserializationError
from loomflow.models import ScriptedModel
from loomflow.runtime import Journal, Runtime, Scope
from loomflow.schemas import CheckpointWritten, StepRecorded, TurnAppended
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.testing._support import Opened
from loomflow.testing.scenario import Payment, SimulatedCrash

__all__ = ["JournalSteps"]


class JournalSteps:
    """Tests of the journal of steps; mixed into RuntimeConformance."""

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
