"""Servers that go away under a running agent (and, on Kafka, a running processor): a
restart is ridden out; an outage longer than the runtime's ``retry_seconds`` fails the
run clearly, and the run resumes once the server is back, having lost nothing.

These tests stop and start the machine's PostgreSQL and broker with the dev/ scripts:
they run in CI, where tests run one at a time.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loomflow.errors import StoreError
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import EventBase
from tests.faults.conftest import Place
from tests.support.kafka_env import ROOT, KafkaEnv
from tests.support.readmodel import fold_of, in_postgres, log_events
from tests.support.scenario import Research
from tests.support.waiting import eventually


def _service(name: str, command: str) -> None:
    done = subprocess.run(
        [str(ROOT / "dev" / f"{name}.sh"), command], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=2)
    yield made
    await made.close()


@pytest.mark.kafka
@pytest.mark.parametrize("service", ["postgres", "kafka"])
async def test_a_restart_under_a_running_agent_and_processor_loses_nothing(
    env: KafkaEnv, service: str
) -> None:
    """The runtime and `loomflow processor` ride out a restart of PostgreSQL or the broker:
    the run in flight finishes, connections (the LISTEN one too) come back, and the read
    model ends equal to the fold of the log."""
    processor = env.processor_process()
    runtime = env.runtime()
    try:
        research = Research(passes=100)
        # ~10 s of model time, so the restart lands mid-run
        agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=200)
        run = asyncio.create_task(agent.run("Research.", session_id="s1"))
        await eventually(lambda: research.model_calls >= 10, what="the run to be under way")
        await asyncio.to_thread(_service, service, "restart")
        assert not run.done(), "the run ended before the restart: nothing was tested"
        result = await asyncio.wait_for(run, 180)
        assert result.turns == 300 and result.stop_reason == "completed"
        # the LISTEN connection is back: confirms are woken by notifications again
        await eventually(lambda: runtime.store.listening, what="the LISTEN connection")
        # and throughput: a new run goes through at its usual pace
        started = time.monotonic()
        again = await Research(passes=2).agent(runtime).run("Research.", session_id="s2")
        assert again.turns == 6
        print(
            f"\n{service} restarted: a 6-turn run after it took {time.monotonic() - started:.2f} s"
        )
        assert len(await runtime.list_checkpoints(Scope("s1"))) == 20
        assert processor.poll() is None, processor.output()[-3000:]
    finally:
        await runtime.close()
        processor.stop()
    expected = await fold_of(await log_events(env.bootstrap, env.topics))
    assert await in_postgres(env.dsn, env.schema) == expected


@pytest.mark.postgres
@pytest.mark.parametrize("place", ["postgres"], indirect=True)
async def test_postgres_runtime_rides_out_a_database_restart(place: Place, tmp_path: Path) -> None:
    """PostgresRuntime: a database restart mid-run is retried; the run completes with
    every turn recorded once."""
    runtime = place.runtime(tmp_path)
    try:
        research = Research(passes=100)
        agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=200)
        run = asyncio.create_task(agent.run("Research.", session_id="s1"))
        await eventually(lambda: research.model_calls >= 10, what="the run to be under way")
        await asyncio.to_thread(_service, "postgres", "restart")
        assert not run.done(), "the run ended before the restart: nothing was tested"
        result = await asyncio.wait_for(run, 180)
        assert result.turns == 300 and result.stop_reason == "completed"
        assert research.model_calls == 300  # nothing asked twice
        assert sum(research.tool_runs.values()) == 200
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    finally:
        await runtime.close()


@pytest.mark.parametrize(
    ("place", "service"),
    [
        pytest.param("postgres", "postgres", marks=pytest.mark.postgres),
        pytest.param("kafka", "kafka", marks=pytest.mark.kafka),
    ],
    indirect=["place"],
)
async def test_an_outage_longer_than_retry_seconds_fails_the_run_clearly_and_loses_nothing(
    place: Place, service: str, tmp_path: Path
) -> None:
    """The server stays down past the runtime's retry_seconds: the run fails with the
    store's error instead of hanging; every event the run was told was acknowledged is
    there once the server is back, and resume finishes it."""
    runtime: Runtime = place.runtime(tmp_path)
    runtime.retry_seconds = 2.0
    acknowledged: list[tuple[int, str]] = []

    async def note(item: object) -> None:
        if isinstance(item, EventBase):
            acknowledged.append((item.seq, item.event_id))

    research = Research(passes=100)
    agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=200)
    stopped = False
    try:
        run = asyncio.create_task(agent.run("Research.", session_id="s1", emit=note))
        await eventually(lambda: research.model_calls >= 10, what="the run to be under way")
        await asyncio.to_thread(_service, service, "stop")
        stopped = True
        started = time.monotonic()
        with pytest.raises(StoreError) as failed:
            await asyncio.wait_for(run, 120)
        took = time.monotonic() - started
        print(f"\n{service} down: the run failed after {took:.1f} s: {failed.value}")
        # retry_seconds, then the writes that record the failure, each given at least
        # MIN_ATTEMPT_SECONDS: seconds, not the client's own minutes-long timeouts
        assert took < 30, f"the run hung for {took:.0f} s past a 2 s retry_seconds"
    finally:
        if stopped:
            await asyncio.to_thread(_service, service, "start")
        await runtime.close()

    assert failed.value.retriable, failed.value
    again = place.runtime(tmp_path)
    try:
        result = (
            await Research(passes=100)
            .agent(again, max_stop_hook_iterations=200)
            .resume(session_id="s1")
        )
        assert result.turns == 300 and result.stop_reason == "completed"
        stored = {(e.seq, e.event_id) for e in await again.store.read_events(Scope("s1"))}
    finally:
        await again.close()
    assert [a for a in acknowledged if a not in stored] == []
