"""A worker's bounds, on SQLite and on Kafka: a run's budget (take-overs, model calls)
is counted in the log and no worker spends past it however the run progresses; a worker
that stops leaves its runs in progress at their next step, recording nothing, for the
next worker."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from loomflow import Agent, Message, Tuning, wait_for_signal
from loomflow.agent.worker import Budget, Worker, due
from loomflow.errors import ModelError
from loomflow.models import ScriptedModel
from loomflow.models.base import ModelResponse, ToolSpec
from loomflow.runtime import Runtime, Scope, SqliteRuntime
from loomflow.schemas import RunFailed, RunOptions, RunStarted, TurnAppended, new_id
from loomflow.schemas.events import EventBase, TurnAppendedPayload
from tests.support.backends import BACKENDS, Backend
from tests.support.waiting import eventually

LEASE = 0.5


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.postgres]),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = BACKENDS[request.param](tmp_path)
    await made.open()
    yield made
    await made.close()


async def _abandoned(
    runtime: Runtime, session: str, user_id: str | None = None, agent: str = "agent"
) -> None:
    """What a process that died right after its prompt leaves: a started run, silent."""
    writer = await runtime.open_session(
        Scope(session, user_id),
        run_id=new_id("run"),
        agent=agent,
        model="flaky",
        options=RunOptions(),
    )
    prompt = [Message.system("You look things up."), Message.user("Look Oslo up.")]
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=prompt))
    await writer.confirm()


def _lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: 709000"


class EverySecondCallFails:
    """A provider that answers one request (a tool call) and refuses the next."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0
        self.inner = ScriptedModel(lambda messages: ScriptedModel.tool_call("_lookup", city="Oslo"))

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        self.calls += 1
        if self.calls % 2 == 0:
            raise ModelError("the provider refuses requests after this tool result")
        return await self.inner.complete(messages, tools)


async def _work(worker: Worker, done: Any) -> None:
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await eventually(done, within=60, what="the worker to park the run")
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


@pytest.mark.parametrize(
    ("budget", "said", "claims"),
    [
        # four takes, then a fifth claim only to park it
        (Budget(takes=4), "workers took the run over 4 times, its budget (takes=4)", 5),
        # parked inside the third take, before the call past its budget
        (Budget(takes=50, model_calls=3), "the run made 3 model calls, its budget", 3),
    ],
)
async def test_a_run_whose_model_fails_every_second_call_is_parked_at_its_budget(
    backend: Backend, budget: Budget, said: str, claims: int
) -> None:
    runtime = backend.runtime(lease_seconds=LEASE)
    model = EverySecondCallFails()
    agent = Agent("x", model=model, runtime=runtime, tools=[_lookup], tuning=Tuning())
    try:
        await _abandoned(runtime, "flaky")
        worker = Worker([agent], poll_seconds=0.05, backoff_seconds=0.01, budget=budget)

        async def parked() -> bool:
            row = await runtime.store.session(Scope("flaky"))
            return row is not None and row.status == "stuck"

        await _work(worker, parked)
        row = await runtime.store.session(Scope("flaky"))
        events = await runtime.store.read_events(Scope("flaky"))
    finally:
        await runtime.close()
    assert row is not None and row.last_error is not None and said in row.last_error
    turns = [e for e in events if isinstance(e, TurnAppended) and e.payload.model_call]
    takes = [e for e in events if isinstance(e, RunStarted) and e.payload.worker]
    # each take was one answered call and one refused one, up to the budget
    limit = budget.model_calls or budget.takes
    assert len(turns) == limit and model.calls <= 2 * limit
    assert len(takes) == claims
    # the spend is bounded and in the log: exactly the answered calls' usage
    assert row.spent_calls == limit
    assert row.spent.cost_usd == pytest.approx(sum(t.payload.usage.cost_usd for t in turns))
    last = events[-1]
    assert isinstance(last, RunFailed) and last.payload.parked
    park = worker.done[-1]
    assert (park.reason, park.outcome) == ("abandoned", "parked") and said in park.detail


class Hanging:
    """A model that answers its first call with a tool call and never answers the rest."""

    name = "hanging"

    def __init__(self) -> None:
        self.calls = 0
        self.inside = asyncio.Event()

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            return await ScriptedModel([ScriptedModel.tool_call("_slow", city="Oslo")]).complete(
                messages, tools
            )
        self.inside.set()
        await asyncio.Event().wait()  # a model call that takes for ever
        raise AssertionError("unreachable")


async def test_a_stopping_worker_leaves_its_runs_at_their_next_step(backend: Backend) -> None:
    """Stopped while a tool runs, the run records the tool's result and stops before the
    next model call; stopped inside a model call, the run is cut off after the grace.
    Neither records a failure: a worker started after the lease takes the run over."""
    runtime = backend.runtime(lease_seconds=LEASE)
    in_tool, release = asyncio.Event(), asyncio.Event()

    async def _slow(city: str) -> str:
        """A tool that takes its time."""
        in_tool.set()
        await release.wait()
        return f"{city}: 709000"

    model = Hanging()
    agent = Agent("x", model=model, runtime=runtime, tools=[_slow], name="agent")
    try:
        await _abandoned(runtime, "slow")
        worker = Worker([agent], poll_seconds=0.05, stop_grace_seconds=1.0)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(in_tool.wait(), 30)
        stop.set()  # as SIGTERM does: the tool's step ends, and the run stops there
        await eventually(worker.stopping.is_set, what="the worker to stop")
        release.set()
        await asyncio.wait_for(running, 10)
        assert model.calls == 1  # no model call after the stop
        assert [t.outcome for t in worker.done] == ["released"]
        events = await runtime.store.read_events(Scope("slow"))
        assert events[-1].type == "turn.appended"  # the tool's result, then nothing
        assert not [e for e in events if isinstance(e, RunFailed)]

        # a second worker takes it after the lease; stopped inside the endless model
        # call, it cuts the run off after its grace, again recording nothing
        worker = Worker([agent], poll_seconds=0.05, stop_grace_seconds=0.5)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(model.inside.wait(), 30)
        stop.set()
        await asyncio.wait_for(running, 10)
        row = await runtime.store.session(Scope("slow"))
        events = await runtime.store.read_events(Scope("slow"))
    finally:
        await runtime.close()
    assert row is not None and row.status == "running"  # left for the next worker
    assert not [e for e in events if isinstance(e, RunFailed)]
    assert len([e for e in events if isinstance(e, RunStarted) and e.payload.worker]) == 2


async def _claimed(runtime: Runtime, scope: Scope, after_seq: int, worker: str) -> None:
    """What a worker that claims the run after ``after_seq`` and dies at once leaves."""
    await runtime.open_session(
        scope,
        run_id=new_id("run"),
        agent="agent",
        model="flaky",
        worker=worker,
        claim_after=after_seq,
        options=RunOptions(),
    )


async def _due(runtime: Runtime, scope: Scope) -> Any:
    row = await runtime.store.session(scope)
    return row if row is not None and due(row) is not None else None


async def test_a_users_run_is_finished_in_that_users_scope_and_heard_by_the_workers_emit(
    backend: Backend,
) -> None:
    runtime = backend.runtime(lease_seconds=LEASE)
    heard: list[Any] = []

    async def emit(item: Any) -> None:
        heard.append(item)

    agent = Agent("x", model=ScriptedModel(["Oslo: 709000."]), runtime=runtime, tuning=Tuning())
    alice = Scope("flaky", "alice")
    try:
        await _abandoned(runtime, "flaky", "alice")
        await eventually(lambda: _due(runtime, alice), within=30, what="the lease to pass")
        worker = Worker([agent], emit=emit)
        await asyncio.gather(*await worker.scan())
        row = await runtime.store.session(alice)
        events = await runtime.store.read_events(alice)
        nobody = await runtime.store.session(Scope("flaky"))
    finally:
        await runtime.close()
    [done] = worker.done
    assert (done.session_id, done.user_id, done.reason, done.outcome) == (
        "flaky",
        "alice",
        "abandoned",
        "finished",
    )
    assert row is not None and row.status == "finished" and nobody is None
    # the worker's emit heard the take's events, as the log holds them, and nothing else
    take = next(i for i, e in enumerate(events) if isinstance(e, RunStarted) and e.payload.worker)
    said = [e.event_id for e in heard if isinstance(e, EventBase)]
    assert said == [e.event_id for e in events[take:]]


async def test_a_run_whose_takes_all_died_is_parked_without_another(backend: Backend) -> None:
    # each take killed its worker's process (nothing recorded but the claim): at
    # max_attempts the next worker parks the run instead of taking it once more
    runtime = backend.runtime(lease_seconds=LEASE)
    model = EverySecondCallFails()
    agent = Agent("x", model=model, runtime=runtime, tools=[_lookup], tuning=Tuning())
    scope = Scope("flaky", "alice")
    try:
        await _abandoned(runtime, "flaky", "alice")
        for _ in range(2):
            row = await eventually(lambda: _due(runtime, scope), within=30, what="the lease")
            await _claimed(runtime, scope, row.last_seq, "died")
        await eventually(lambda: _due(runtime, scope), within=30, what="the lease to pass")
        worker = Worker([agent], max_attempts=2)
        await asyncio.gather(*await worker.scan())
        row = await runtime.store.session(scope)
        events = await runtime.store.read_events(scope)
    finally:
        await runtime.close()
    # the park is a claim like any other: by this worker, for its agent, with the run's
    # recorded options carried on for the person who resumes it
    first, *_, park = [e for e in events if isinstance(e, RunStarted)]
    assert (park.payload.worker, park.payload.agent, park.payload.model) == (
        worker.name,
        agent.name,
        "flaky",
    )
    assert park.payload.options == first.payload.options is not None
    assert row is not None and row.run_options == first.payload.options
    said = "gave up after 2 attempts by workers; last error: none recorded (its process died)"
    [done] = worker.done
    assert (done.user_id, done.reason, done.outcome, done.detail) == (
        "alice",
        "abandoned",
        "parked",
        said,
    )
    assert row is not None and row.status == "stuck" and row.last_error == f"Parked: {said}"
    assert model.calls == 0


async def test_one_scan_takes_every_due_run_of_every_runtime_it_hosts_and_only_those(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # in flight, oldest first: a run waiting with no deadline (not due), a run of an
    # agent this worker does not host, then a due run on each of two runtimes
    first = SqliteRuntime(tmp_path / "a.db", lease_seconds=LEASE)
    second = SqliteRuntime(tmp_path / "b.db", lease_seconds=LEASE)

    async def ask(question: str) -> str:
        """Ask a person."""
        return str(await wait_for_signal("answer"))

    asking = ScriptedModel([ScriptedModel.tool_call("ask", question="?"), "Done."])
    waits = Agent("x", model=asking, runtime=first, tools=[ask], tuning=Tuning())
    assert (await waits.run("Ask.", session_id="waits")).stop_reason == "waiting"
    await _abandoned(first, "unhosted", agent="someone-else")
    await _abandoned(first, "due-a")
    await _abandoned(second, "due-b", "bob", agent="other")
    for runtime, scope in ((first, Scope("due-a")), (second, Scope("due-b", "bob"))):
        passed = functools.partial(_due, runtime, scope)
        await eventually(passed, within=30, what="the leases to pass")
    hosted = [
        Agent("x", model=ScriptedModel(["A."]), runtime=first, tools=[ask], tuning=Tuning()),
        Agent("x", model=ScriptedModel(["B."]), runtime=second, name="other", tuning=Tuning()),
    ]
    worker = Worker(hosted)
    with caplog.at_level(logging.WARNING, logger="loomflow.worker"):
        await asyncio.gather(*await worker.scan())
        await asyncio.gather(*await worker.scan())  # the unhosted run is told of once
    rows = {s: await first.store.session(Scope(s)) for s in ("waits", "unhosted", "due-a")}
    rows["due-b"] = await second.store.session(Scope("due-b", "bob"))
    await first.close()
    await second.close()
    assert sorted((o.session_id, o.user_id, o.reason, o.outcome) for o in worker.done) == [
        ("due-a", None, "abandoned", "finished"),
        ("due-b", "bob", "abandoned", "finished"),
    ]
    assert {s: r.status for s, r in rows.items() if r is not None} == {
        "waits": "waiting",
        "unhosted": "running",
        "due-a": "finished",
        "due-b": "finished",
    }
    said = [r.getMessage() for r in caplog.records if "does not host" in r.getMessage()]
    assert said == [
        f"{Scope('unhosted').describe()}: its run belongs to agent 'someone-else', which "
        "this worker does not host (it hosts agent, other); left for a worker that does"
    ]


async def test_a_park_that_loses_the_session_to_another_claim_writes_nothing(
    tmp_path: Path,
) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db", lease_seconds=LEASE)
    scope = Scope("s1", "alice")
    agent = Agent("x", model=ScriptedModel(["A."]), runtime=runtime, tuning=Tuning())
    worker = Worker([agent])
    try:
        await _abandoned(runtime, "s1", "alice")
        seen = await eventually(lambda: _due(runtime, scope), within=30, what="the lease")
        # another worker claims the run after this one read the row
        await _claimed(runtime, scope, seen.last_seq, "other")
        before = await runtime.store.read_events(scope)
        done = await worker._park(agent, seen, "abandoned", "over budget: test")
        after = await runtime.store.read_events(scope)
    finally:
        await runtime.close()
    assert (done.session_id, done.user_id, done.reason, done.outcome) == (
        "s1",
        "alice",
        "abandoned",
        "taken",
    )
    assert done.detail and [e.event_id for e in after] == [e.event_id for e in before]
