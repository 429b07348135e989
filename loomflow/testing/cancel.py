"""Cancelled runs in the runtime conformance suite: a run cancelled from another runtime
stops at its next step with RunCancelledError, no worker resumes a cancelled session, a
cancel needs a run in flight, and ``resume`` continues a cancelled session on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from loomflow import Agent, Message, Role, Tuning, new_id
from loomflow.errors import (
    CancelRefusedError,
    RunCancelledError,
    SessionNotFoundError,
    SignalRefusedError,
)
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import TurnAppended, utcnow
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.testing._support import Opened, follower
from loomflow.testing.signals import _approval

__all__ = ["Cancellation"]


class Cancellation:
    """Tests of ``runtime.cancel``; mixed into RuntimeConformance."""

    async def test_a_run_cancelled_from_another_runtime_stops_at_its_next_step(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        looked: list[str] = []

        def lookup(topic: str) -> str:
            """Look a topic up."""
            looked.append(topic)
            return "a distributed log"

        entered, release = asyncio.Event(), asyncio.Event()

        async def held(messages: Sequence[Message]) -> None:
            if messages[-1].role is Role.TOOL:  # the second model call, after the tool's
                entered.set()
                await release.wait()

        model = ScriptedModel(
            [ScriptedModel.tool_call("lookup", topic="kafka"), "Kafka is a log."], on_call=held
        )
        agent = Agent(
            "You look things up.",
            model=model,
            runtime=new_runtime(),
            tools=[lookup],
            tuning=Tuning(checkpoint=True),
        )
        scope = Scope("s1", "ada")
        running = asyncio.create_task(agent.run("Look Kafka up.", session_id="s1", user_id="ada"))
        await entered.wait()  # the tool's result is in the log, the model call in flight
        seq = await new_runtime().cancel(scope, "wrong topic")
        release.set()
        # the answer is refused, whether the writer heard of the cancel before writing it
        # (a log-first runtime's notification) or its store refuses it, at the latest as
        # the run ends
        with pytest.raises(RunCancelledError, match="was cancelled"):
            await running
        assert len(model.calls) == 2 and looked == ["kafka"]

        reader = new_runtime()
        events = await reader.store.read_events(scope)
        assert (events[-1].type, events[-1].seq) == ("run.cancelled", seq)
        assert events[-1].run_id == events[0].run_id  # an event of the run it stops
        turns = [e.payload for e in events if isinstance(e, TurnAppended)]
        said = [m.content for turn in turns for m in turn.messages]
        assert "Kafka is a log." not in said and "a distributed log" in said
        row = await reader.store.session(scope)
        assert row is not None and row.status == "cancelled"
        assert row.last_error == "cancelled: wrong topic"
        assert scope.session_id not in [r.session_id for r in await reader.sessions_in_flight()]

    async def test_no_worker_resumes_a_cancelled_run(
        self, new_runtime: Opened[Runtime], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from loomflow.agent.worker import Worker, due
        from loomflow.runtime import base

        # a run that waits and got its signal: a worker would take it
        await _approval(new_runtime(), []).run("Pay.", session_id="pay")
        runtime = new_runtime()
        await runtime.signal(Scope("pay"), "approve", {"ok": True})
        # a run whose writer went silent (the clock an hour on): a worker would take it too
        silent = await runtime.open_session(Scope("silent"), run_id=new_id("run"), agent="agent")
        monkeypatch.setattr(base, "utcnow", lambda: utcnow() + timedelta(hours=1))
        for name, reason in (("pay", "signalled"), ("silent", "abandoned")):
            row = await runtime.session(Scope(name))
            assert row is not None and due(row) == reason

        for name in ("pay", "silent"):
            await runtime.cancel(Scope(name))
        seen: list[object] = []
        worker = Worker([_approval(new_runtime(), seen)])
        assert await worker.scan() == []
        assert worker.done == [] and seen == []
        for name in ("pay", "silent"):
            row = await new_runtime().session(Scope(name))
            assert row is not None and row.status == "cancelled" and due(row) is None
        # the silent writer, should it wake up, is refused
        with pytest.raises(RunCancelledError):
            await silent.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("back")]))
            await silent.confirm()
        with pytest.raises(SignalRefusedError, match="cancelled"):
            await runtime.signal(Scope("pay"), "approve", {"ok": False})

    async def test_a_workers_take_over_cancelled_mid_run_ends_there(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        from loomflow.agent.worker import Worker

        seen: list[object] = []
        await _approval(new_runtime(), seen).run("Pay.", session_id="pay")
        await new_runtime().signal(Scope("pay"), "approve", {"ok": True})
        entered, release = asyncio.Event(), asyncio.Event()

        async def held(messages: Sequence[Message]) -> None:
            entered.set()  # the resumed tool has its signal; the model call is in flight
            await release.wait()

        worker = Worker([_approval(new_runtime(), seen, on_call=held)])
        (take,) = await worker.scan()
        await entered.wait()
        await new_runtime().cancel(Scope("pay"), "refunded instead")
        release.set()
        await take
        assert [(o.reason, o.outcome) for o in worker.done] == [("signalled", "cancelled")]
        assert seen == [{"ok": True}]
        row = await new_runtime().session(Scope("pay"))
        assert row is not None and (row.status, row.last_error) == (
            "cancelled",
            "cancelled: refunded instead",
        )
        assert await worker.scan() == []

    async def test_a_cancel_needs_a_run_in_flight_of_this_users_session(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        runtime = new_runtime()
        await follower(runtime).run("Hi.", session_id="done", user_id="ada")
        await _approval(runtime, []).run("Pay.", session_id="pay", user_id="ada")
        finished = await runtime.session(Scope("done", "ada"))
        with pytest.raises(CancelRefusedError, match="it is finished"):
            await runtime.cancel(Scope("done", "ada"))
        for scope in (Scope("pay", "bob"), Scope("pay"), Scope("nope", "ada")):
            with pytest.raises(SessionNotFoundError):
                await runtime.cancel(scope)
        await runtime.cancel(Scope("pay", "ada"))
        cancelled = await runtime.session(Scope("pay", "ada"))
        with pytest.raises(CancelRefusedError, match="it is cancelled"):
            await runtime.cancel(Scope("pay", "ada"))
        (latest, *_) = await runtime.list_checkpoints(Scope("done", "ada"))
        fork = await runtime.fork(Scope("done", "ada"), latest.checkpoint_id, session_id="fork")
        with pytest.raises(CancelRefusedError, match="no run yet"):
            await runtime.cancel(fork)
        reader = new_runtime()  # nothing was appended by the refused ones
        assert await reader.session(Scope("done", "ada")) == finished
        assert await reader.session(Scope("pay", "ada")) == cancelled

    async def test_a_cancelled_session_is_resumed_on_purpose_where_it_stopped(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        from loomflow.agent.worker import Worker

        seen: list[object] = []
        first = await _approval(new_runtime(), seen).run("Pay.", session_id="pay")
        assert first.stop_reason == "waiting"
        await new_runtime().cancel(Scope("pay"), "hold on")
        row = await new_runtime().session(Scope("pay"))  # it keeps its wait, as parked runs do
        assert row is not None and row.status == "cancelled"
        assert row.waiting is not None and row.waiting.signal == "approve"
        resumer = _approval(new_runtime(), seen)
        again = await resumer.resume(session_id="pay")  # no prompt: back into its wait
        assert (again.stop_reason, again.waiting_for) == ("waiting", "approve")
        assert isinstance(resumer.model, ScriptedModel) and resumer.model.calls == []
        runtime = new_runtime()
        await runtime.signal(Scope("pay"), "approve", {"ok": True})
        worker = Worker([_approval(new_runtime(), seen)])
        await asyncio.gather(*await worker.scan())
        assert [(o.reason, o.outcome) for o in worker.done] == [("signalled", "finished")]
        assert seen == [{"ok": True}]
        row = await new_runtime().session(Scope("pay"))
        assert row is not None and row.status == "finished"
