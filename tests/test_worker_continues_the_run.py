"""A run started with metadata, an extra tool and an output schema dies (``os._exit``) in
its second model call; ``loomflow worker``, started as the README starts it, finishes the
same run: the tool offered, the metadata seen by the tool, the answer validated against
the schema. A worker that does not host the tool parks the run as stuck, naming it.

Each process is a user's: the app module is a file in the current directory, the worker
is ``loomflow worker geo:agents`` with no LOOMFLOW_* naming (on Kafka, a default
``loomflow processor`` beside it, as tests/test_readme.py starts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loomflow import Message
from loomflow.runtime import KafkaRuntime, Runtime, Scope, SqliteRuntime
from loomflow.schemas import Event, RunFailed, RunFinished, RunStarted, TurnAppended
from tests.support.waiting import eventually
from tests.test_readme import default_names, processor, user_env, user_settings

__all__ = ["default_names", "processor"]  # fixtures of the Kafka case, shared with the README's

BIN = Path(sys.executable).parent
ANSWER = '{"name": "Oslo", "population": 709000}'

GEO = '''\
# geo.py: runs given per-run options; `loomflow worker geo:agents` finishes them
import asyncio
import os
import time

from pydantic import BaseModel

from loomflow import Agent, RunContext, Tuning, get_run_context
from loomflow.models import ScriptedModel
from loomflow.runtime import KafkaRuntime, SqliteRuntime


class City(BaseModel):
    name: str
    population: int


def tenant() -> str:
    """The tenant this run works for."""
    return f"tenant {get_run_context().metadata['tenant']}"


def slow() -> str:
    """A lookup that takes a minute, in a thread."""
    open("slow.started", "w").close()
    time.sleep(60)
    return "done"


calls = 0


def count(messages):
    global calls
    calls += 1
    if calls == int(os.environ.get("GEO_DIE_AT", "0")):
        os._exit(3)  # the process dies inside this model call


def agents():
    if os.environ.get("GEO_KAFKA"):
        runtime = KafkaRuntime(lease_seconds=1)
    else:
        runtime = SqliteRuntime("journal.db", lease_seconds=1)
    script = [
        ScriptedModel.tool_call("tenant"),
        ScriptedModel.tool_call("tenant"),
        "not json at all",
        '{"name": "Oslo", "population": 709000}',
    ]
    if os.environ.get("GEO_SLOW"):
        script[1] = ScriptedModel.tool_call("slow")
    hosts = {"extra_tools": [tenant], "output_schemas": [City]}
    if os.environ.get("GEO_HOSTS_NOTHING"):
        hosts = {}
    model = ScriptedModel(script, on_call=count)
    return [
        Agent(
            "Answer with data.",
            model=model,
            runtime=runtime,
            tuning=Tuning(checkpoint=True),
            tools=[slow],
            name="geo",
            **hosts,
        )
    ]


async def main():
    (agent,) = agents()
    await agent.run(
        "How many people live in Oslo?",
        session_id="oslo",
        context=RunContext(user_id="ada", metadata={"tenant": "acme"}),
        extra_tools=[tenant],
        output_schema=City,
    )


if __name__ == "__main__":
    asyncio.run(main())
'''


def _user_env(kafka: bool) -> dict[str, str]:
    if kafka:
        return dict(user_env(), GEO_KAFKA="1")
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}


def _runtime(cwd: Path, kafka: bool) -> Runtime:
    if kafka:
        return KafkaRuntime(settings=user_settings())
    return SqliteRuntime(cwd / "journal.db")


async def _session(cwd: Path, kafka: bool) -> tuple[str | None, str | None, list[Event]]:
    runtime = _runtime(cwd, kafka)
    try:
        scope = Scope("oslo", "ada")
        row = await runtime.store.session(scope)
        events = await runtime.store.read_events(scope) if row is not None else []
    finally:
        await runtime.close()
    return (None, None, []) if row is None else (row.status, row.last_error, events)


async def _crash(cwd: Path, env: dict[str, str], kafka: bool) -> None:
    """The app's run dies in its second model call (``os._exit``)."""
    (cwd / "geo.py").write_text(GEO)
    victim = await asyncio.create_subprocess_exec(
        sys.executable, "geo.py", cwd=cwd, env=dict(env, GEO_DIE_AT="2"), stderr=PIPE
    )
    _, died = await asyncio.wait_for(victim.communicate(), 120)
    assert victim.returncode == 3, died.decode()
    status, _, _ = await _session(cwd, kafka)
    assert status == "running", status  # died mid-run: nobody resumed it yet


@contextlib.asynccontextmanager
async def _worker(cwd: Path, env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """``loomflow worker geo:agents`` in ``cwd``, as the README starts it; killed after,
    should it still run."""
    worker = await asyncio.create_subprocess_exec(
        str(BIN / "loomflow"), "worker", "geo:agents", cwd=cwd, env=env, stderr=PIPE
    )
    try:
        yield worker
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()


async def _terminated(worker: asyncio.subprocess.Process) -> None:
    """One SIGTERM stops the worker within seconds, cleanly."""
    worker.send_signal(signal.SIGTERM)
    began = time.monotonic()
    _, err = await asyncio.wait_for(worker.communicate(), 30)
    assert time.monotonic() - began < 10, err.decode()
    assert worker.returncode == 0, err.decode()


async def _crash_then_work(cwd: Path, kafka: bool, **worker_env: str) -> list[Event]:
    """The app's run dies in its second model call; then ``loomflow worker geo:agents``
    takes it until the session is finished or stuck; one SIGTERM stops the worker."""
    env = _user_env(kafka)
    await _crash(cwd, env, kafka)
    async with _worker(cwd, dict(env, **worker_env)) as worker:

        async def ended() -> bool:
            status, _, _ = await _session(cwd, kafka)
            return status in ("finished", "stuck")

        await eventually(ended, within=90, what="the worker to finish or park the run")
        await _terminated(worker)
    _, _, events = await _session(cwd, kafka)
    return events


def _take(events: list[Event]) -> tuple[RunStarted, list[Event]]:
    """The worker's claim, and the events after it."""
    claims = [e for e in events if isinstance(e, RunStarted) and e.payload.worker is not None]
    assert len(claims) == 1, [e.type for e in events]
    return claims[0], [e for e in events if e.seq > claims[0].seq]


def _tool_results(events: list[Event]) -> list[Message]:
    return [
        m
        for e in events
        if isinstance(e, TurnAppended)
        for m in e.payload.messages
        if m.role.value == "tool"
    ]


BACKENDS = [
    pytest.param(False, id="sqlite"),
    pytest.param(True, id="kafka", marks=[pytest.mark.kafka, pytest.mark.slow]),
]


@pytest.fixture
def kafka_processor(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A default ``loomflow processor`` on the default names, when the test is Kafka's."""
    if request.node.callspec.params.get("kafka"):
        request.getfixturevalue("default_names")
        request.getfixturevalue("processor")


@pytest.mark.parametrize("kafka", BACKENDS)
@pytest.mark.usefixtures("kafka_processor")
async def test_a_worker_finishes_the_run_with_its_recorded_options(
    tmp_path: Path, kafka: bool
) -> None:
    events = await _crash_then_work(tmp_path, kafka)
    claim, after = _take(events)
    first = events[0]
    assert isinstance(first, RunStarted) and first.payload.options is not None
    # the worker's run is the same run: its metadata and options, as recorded
    assert claim.payload.metadata == {"tenant": "acme"}
    assert claim.payload.options == first.payload.options
    assert [t.name for t in claim.payload.options.extra_tools] == ["tenant"]
    assert claim.payload.options.output_schema is not None
    assert claim.payload.options.output_schema.name == "City"
    # the tool was offered to the worker's run and saw the run's metadata
    results = _tool_results(after)
    assert [(r.content, r.is_error) for r in results] == [("tenant acme", False)]
    # the answer was validated: the invalid one was sent back, the valid one ended it
    asked_again = [
        m
        for e in after
        if isinstance(e, TurnAppended)
        for m in e.payload.messages
        if "not valid City JSON" in m.content
    ]
    assert len(asked_again) == 1
    said = [m for e in events if isinstance(e, TurnAppended) for m in e.payload.messages]
    assert isinstance(events[-1], RunFinished) and events[-1].payload.answer(said) == ANSWER


@pytest.mark.parametrize("kafka", BACKENDS)
@pytest.mark.usefixtures("kafka_processor")
async def test_a_worker_that_does_not_host_the_tool_parks_the_run_naming_it(
    tmp_path: Path, kafka: bool
) -> None:
    events = await _crash_then_work(tmp_path, kafka, GEO_HOSTS_NOTHING="1")
    claim, after = _take(events)
    # parked at once, with nothing run: no model call, no tool call after the claim
    assert [e.type for e in after] == ["run.failed"]
    failed = after[0]
    assert isinstance(failed, RunFailed) and failed.payload.parked
    assert "extra tool 'tenant'" in failed.payload.error
    assert "output schema 'City'" in failed.payload.error
    # the park carried the recorded options forward, for the person who resumes it
    assert claim.payload.options == events[0].payload.options  # type: ignore[union-attr]
    status, error, _ = await _session(tmp_path, kafka)
    assert status == "stuck" and error is not None and "'tenant'" in error


@pytest.mark.parametrize("kafka", BACKENDS)
@pytest.mark.usefixtures("kafka_processor")
async def test_one_sigterm_stops_a_worker_inside_a_long_tool_and_leaves_the_run(
    tmp_path: Path, kafka: bool
) -> None:
    # the worker's take is inside a plain def tool that sleeps for a minute in a thread
    env = dict(_user_env(kafka), GEO_SLOW="1")
    await _crash(tmp_path, env, kafka)
    async with _worker(tmp_path, env) as worker:
        await eventually((tmp_path / "slow.started").exists, within=60, what="the slow tool")
        await _terminated(worker)
    status, _, events = await _session(tmp_path, kafka)
    # nothing recorded after the take's tool call: the run is left for the next worker
    assert status == "running" and not [e for e in events if isinstance(e, RunFailed)]
    _, after = _take(events)
    kept = [e.type for e in after if e.type != "run.heartbeat"]
    assert kept == ["turn.appended", "turn.appended"]  # the nudge, the call of slow
