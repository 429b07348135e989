"""Waiting runs in the runtime conformance suite: a run that waits for a signal goes on
in a worker once it arrives, a worker reads only runs that may be due, and a signal to
an unknown session or past its wait's deadline is refused or kept for a later wait."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import pytest

from loomflow import Agent, Message, Tuning, wait_for_signal
from loomflow.errors import SessionNotFoundError, SignalRefusedError, SignalTimeoutError
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import SignalSent, utcnow
from loomflow.schemas.events import SignalSentPayload
from loomflow.testing._support import Opened

__all__ = ["Signals"]


def _approval(
    runtime: Runtime,
    seen: list[object],
    on_call: Callable[[Sequence[Message]], Awaitable[None]] | None = None,
) -> Agent:
    """An agent whose tool waits for the signal "approve" and returns what it carried;
    its model awaits ``on_call`` with each request first, when given."""

    async def approve(amount: int) -> str:
        """Ask a person to approve a payment."""
        answer = await wait_for_signal("approve")
        seen.append(answer)
        return f"approved: {answer}"

    model = ScriptedModel([ScriptedModel.tool_call("approve", amount=5), "Paid."], on_call=on_call)
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


class Signals:
    """Tests of waiting runs, signals and workers; mixed into RuntimeConformance."""

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
        # a fork no run has continued (`loomflow sessions fork`) has no run to take over,
        # however long ago it was made: older than every run here, it is never read
        tuning = Tuning(checkpoint=True)
        done = Agent("x", model=ScriptedModel(["Done."]), runtime=runtime, tuning=tuning)
        await done.run("Go.", session_id="done")
        (checkpoint,) = await runtime.list_checkpoints(Scope("done"))
        await runtime.fork(Scope("done"), checkpoint.checkpoint_id, session_id="forked")
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
