"""One log, folded by every dialect, reads the same through the public store API.

The log is written once, by agents on an in-process runtime whose store keeps what it was
asked to do, in order (each append it took, each prune): runs that finish, fail, crash
and resume, journal steps, checkpoints under retention, a fork, waits and a signal, a
cancel, a compaction, a heartbeat, checkpoints pruned by event, an erasure, and prunes of
a whole session and of what came before a time. The same appends and prunes are then made to a
new store of each dialect, and everything a caller can read of each session is compared.

Nothing is normalised before the comparison: every dialect keeps an event's time to the
microsecond, as Python's datetime has it (SQLite as ISO text, PostgreSQL as timestamptz),
and values as they were written, so any difference is one a caller would see.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from loomflow import Agent, Message, Tuning, wait_for_signal
from loomflow.models import ScriptedModel
from loomflow.runtime import (
    ANY_USER,
    EventStore,
    InProcStore,
    PruneResult,
    Runtime,
    Scope,
)
from loomflow.schemas import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    RunHeartbeat,
    StepRecorded,
    utcnow,
)
from loomflow.schemas.events import (
    CheckpointsPrunedPayload,
    RunHeartbeatPayload,
    event_adapter,
)
from loomflow.testing import SessionLog
from loomflow.testing.scenario import Payment, Research, SimulatedCrash
from tests.support.backends import BACKENDS

#: an append of these events, or a prune with these filters
Op = list[Event] | dict[str, Any]


class _Recorder(InProcStore):
    """An in-process store that keeps what it was asked to do, in the order it did it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []

    async def append(self, events: Sequence[Event]) -> None:
        await super().append(events)
        self.ops.append(list(events))  # taken: a refused append changed nothing

    async def prune(
        self,
        *,
        before: datetime | None = None,
        session_id: str | None = None,
        user_id: Any = ANY_USER,
    ) -> PruneResult:
        filters = {"before": before, "session_id": session_id, "user_id": user_id}
        result = await super().prune(**filters)
        self.ops.append(filters)
        return result


def _follower(runtime: Runtime, reply: str = "ok") -> Agent:
    return Agent(
        "x", model=ScriptedModel(lambda m: reply), runtime=runtime, tuning=Tuning(checkpoint=True)
    )


def _approval(runtime: Runtime) -> Agent:
    async def approve(amount: int) -> str:
        """Ask a person to approve a payment."""
        return f"approved: {await wait_for_signal('approve', timeout=3600)}"

    model = ScriptedModel([ScriptedModel.tool_call("approve", amount=5), "Paid."])
    return Agent("You pay.", model=model, runtime=runtime, tools=[approve])


class _Broken:
    name = "broken"

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the model is down")


async def _write_the_log() -> list[Op]:
    recorder = _Recorder()
    runtime = Runtime(recorder, max_checkpoints_per_session=2)  # retention at work
    try:
        await Research(passes=3).ran(runtime, session_id="research", user_id="ada")
        await Research(passes=1).ran(runtime, session_id="old")
        await _follower(runtime).run("Doomed.", session_id="doomed", user_id="ada")
        payment = Payment()
        pay = ScriptedModel([ScriptedModel.tool_call("pay", order="o-1"), "paid"])
        with pytest.raises(SimulatedCrash):  # after the charge was recorded
            await Agent("x", model=pay, runtime=runtime, tools=[payment.pay]).run(
                "Pay.", session_id="pay"
            )
        await Agent("x", model=pay, runtime=runtime, tools=[payment.pay]).resume(session_id="pay")
        cutoff = utcnow()  # what came before is pruned by time at the end
        await _follower(runtime).resume("Receipt?", session_id="pay")  # its step is older
        await _follower(runtime).resume("And then?", session_id="research", user_id="ada")
        (latest, *_) = await runtime.store.list_checkpoints(Scope("research", "ada"), 10)
        branch = await runtime.fork(
            Scope("research", "ada"), latest.checkpoint_id, session_id="branch"
        )
        await _follower(runtime, "a branch").resume(session_id=branch.session_id, user_id="ada")

        with pytest.raises(RuntimeError):
            await Agent("x", model=_Broken(), runtime=runtime).run("Hi.", session_id="failed")

        for waiting in ("waits", "signalled"):
            ran = await _approval(runtime).run("Pay.", session_id=waiting, user_id="bob")
            assert ran.stop_reason == "waiting"
        await runtime.signal(Scope("signalled", "bob"), "approve", {"ok": True, "n": 1.5})
        # cancelled as it waits: it keeps its wait, leaves the runs in flight
        await _approval(runtime).run("Pay.", session_id="cancelled", user_id="bob")
        await runtime.cancel(Scope("cancelled", "bob"), "paid by hand")

        # what no agent of these writes, through the store's append
        log = SessionLog("compacted", "ada")
        events: list[Event] = [log.claim(), log.turn("q1"), log.turn(Message.assistant("a1"))]
        first = log.checkpoint()
        events += [first, log.compact("Summary of q1."), log.turn("q2"), log.checkpoint()]
        events += [log.step("fetch", {"zeta": 1, "alpha": [None, 2.5]}), log.step("fetch", "2")]
        heartbeat = RunHeartbeat(payload=RunHeartbeatPayload(), **_next(log))
        pruned = CheckpointsPruned(
            payload=CheckpointsPrunedPayload(checkpoint_ids=[first.payload.checkpoint_id]),
            **_next(log),
        )
        await recorder.append([*events, heartbeat, pruned, log.finish()])
        silent = SessionLog("silent")  # a run whose writer went silent: in flight
        await recorder.append([silent.claim(), silent.turn("Still there?")])

        await _follower(runtime).run("Forget me.", session_id="gone", user_id="ada")
        assert await runtime.store.erase("gone", user_id="ada")
        assert (await runtime.store.prune(session_id="doomed")).sessions == 1
        result = await runtime.store.prune(before=cutoff)
        assert result.sessions == 1 and result.checkpoints > 0  # "old", and research's
        await _follower(runtime).resume("After the prune.", session_id="research", user_id="ada")
    finally:
        await runtime.close()
    return recorder.ops


def _next(log: SessionLog) -> dict[str, Any]:
    """The envelope of the session's next event, made by hand."""
    log.seq += 1
    return {
        "user_id": log.scope.user_id,
        "session_id": log.scope.session_id,
        "run_id": log.run_id,
        "seq": log.seq,
        "epoch": log.epoch,
    }


async def _replay(store: EventStore, ops: list[Op]) -> list[PruneResult]:
    """Make the same appends and prunes; return what each prune said it deleted."""
    pruned = []
    for op in ops:
        if isinstance(op, dict):
            pruned.append(await store.prune(**op))
        else:
            await store.append(op)
            for scope in dict.fromkeys(Scope(e.session_id, e.user_id) for e in op):
                await store.confirm(scope)
    return pruned


def _scopes(ops: list[Op]) -> list[Scope]:
    events = [e for op in ops if isinstance(op, list) for e in op]
    return list(dict.fromkeys(Scope(e.session_id, e.user_id) for e in events))


async def _read(store: EventStore, ops: list[Op]) -> dict[str, Any]:
    """Everything the public store API gives of the log's sessions."""
    events = [e for op in ops if isinstance(op, list) for e in op]
    read: dict[str, Any] = {"in flight": await store.sessions_in_flight()}
    for scope in _scopes(ops):
        row = await store.session(scope)
        listed = await store.list_checkpoints(scope, 1000)
        ours = [e for e in events if Scope(e.session_id, e.user_id) == scope]
        keys = dict.fromkeys(e.payload.step_key for e in ours if isinstance(e, StepRecorded))
        ids = [e.payload.checkpoint_id for e in ours if isinstance(e, CheckpointWritten)]
        read[f"{scope.session_id}:{scope.user_id}"] = {
            "session": row,
            "head": await store.head(scope, checkpoint=True),
            "checkpoints": listed,
            "latest": await store.checkpoint(scope, None),
            "each checkpoint": [await store.checkpoint(scope, i) for i in ids],
            "transcripts": [
                await store.transcript(scope, c.base_seq, c.seq, c.message_count) for c in listed
            ],
            "transcript": None
            if row is None
            else await store.transcript(scope, row.base_seq, row.last_seq, row.message_count),
            "steps": {key: await store.step(scope, key) for key in keys},
            "events": await store.read_events(scope),
        }
    return read


async def _read_on(backend: str, where: Path, ops: list[Op]) -> dict[str, Any]:
    """The ops made to a new store of ``backend`` (tests/support/backends.py), and what
    it reads of them, with what each prune said it deleted."""
    (where / backend).mkdir()
    made = BACKENDS[backend](where / backend)
    await made.open()
    try:
        store = made.store()
        try:
            pruned = await _replay(store, ops)
            return {"pruned": pruned, **await _read(store, ops)}
        finally:
            await store.close()
    finally:
        await made.close()


@pytest.mark.postgres
async def test_one_log_reads_the_same_in_every_dialect(tmp_path: Path) -> None:
    ops = await _write_the_log()
    types = {e.type for op in ops if isinstance(op, list) for e in op}
    assert types == set(event_adapter().json_schema()["discriminator"]["mapping"])
    assert any(isinstance(op, dict) for op in ops)
    inproc = await _read_on("inproc", tmp_path, ops)
    assert inproc["research:ada"]["checkpoints"]  # something to compare
    for backend in ("sqlite", "postgres"):
        read = await _read_on(backend, tmp_path, ops)
        for key in inproc:
            assert read[key] == inproc[key], (backend, key)


@pytest.mark.kafka
@pytest.mark.postgres
async def test_the_projector_reads_a_log_as_the_embedded_stores_do(tmp_path: Path) -> None:
    """The Kafka projector's PostgreSQL read model, up to the first prune: on Kafka a
    prune appends events (an erasure, ``checkpoints.pruned``) instead of deleting rows,
    so what follows it is another log there."""
    ops = await _write_the_log()
    first_prune = next(k for k, op in enumerate(ops) if isinstance(op, dict))
    ops = ops[:first_prune]
    inproc = await _read_on("inproc", tmp_path, ops)
    assert inproc["gone:ada"]["events"]  # the erasure is in the prefix
    kafka = await _read_on("kafka", tmp_path, ops)
    for key in inproc:
        assert kafka[key] == inproc[key], key
