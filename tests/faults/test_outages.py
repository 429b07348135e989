"""Servers that go away under a running agent (and, on Kafka, a running processor): a
restart is ridden out, and appends return to their usual pace soon after; an outage longer
than the runtime's ``retry_seconds`` fails the run clearly, and the run resumes once the
server is back, having lost nothing.

The servers are the module's own (tests/support/own_servers.py): a PostgreSQL cluster and
a Kafka broker on ports nobody else uses, started before the first test and stopped after
the last. Each stop is checked to have taken the server away (its port refuses
connections) before anything is asserted about the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from loomflow.errors import StoreError
from loomflow.runtime import PostgresRuntime, Runtime, Scope
from loomflow.schemas import EventBase
from tests.support.kafka_env import KafkaEnv
from tests.support.own_servers import OwnServer, outage_kafka, outage_postgres
from tests.support.readmodel import fold_of, in_postgres, log_events
from tests.support.scenario import Research
from tests.support.waiting import eventually

#: the pace of appends is the median time of this many short runs in a row
WINDOW = 5
#: short runs whose median is the usual pace, measured before the server goes away
USUAL_RUNS = 9
#: appends are back to their pace once a window's median is within this factor of the usual
SLOWER = 2.0
#: how soon after the server is back that must be: generous for a loaded 2-core machine
#: (the run in flight catches up meanwhile), short of never
RECOVERY_SECONDS = 90.0


@dataclass
class Servers:
    postgres: OwnServer
    kafka: OwnServer

    def __getitem__(self, name: str) -> OwnServer:
        return {"postgres": self.postgres, "kafka": self.kafka}[name]


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """The module's PostgreSQL and broker, stopped after it (if a test left them up)."""
    postgres, kafka = outage_postgres(), outage_kafka()
    try:
        postgres.start()
        kafka.start()
        yield Servers(postgres, kafka)
    finally:
        for server in (kafka, postgres):
            if server.started:
                server.stop()


@pytest.fixture
async def env(servers: Servers) -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(
        partitions=2,
        kafka_bootstrap=servers.kafka.address,
        postgres_dsn=servers.postgres.address,
    )
    yield made
    await made.close()


async def restart(server: OwnServer) -> float:
    """Stop ``server`` (failing unless it went away) and start it again; when it was back
    (``time.monotonic()``)."""
    await asyncio.to_thread(server.stop)
    await asyncio.to_thread(server.start)
    return time.monotonic()


async def short_run(runtime: Runtime, session: str) -> float:
    """Seconds a 3-turn run takes, its model answering at once: its claim, its turns and
    checkpoint appended, its end confirmed."""
    started = time.monotonic()
    result = await Research(passes=1).agent(runtime).run("Research.", session_id=session)
    assert result.turns == 3 and result.stop_reason == "completed"
    return time.monotonic() - started


async def usual_pace(runtime: Runtime, tag: str) -> float:
    """The median of USUAL_RUNS short runs, after one to warm up (connections, caches)."""
    await short_run(runtime, f"{tag}-warm-up")
    return statistics.median([await short_run(runtime, f"{tag}-{n}") for n in range(USUAL_RUNS)])


async def back_to_pace(runtime: Runtime, usual: float, back: float, tag: str) -> float:
    """Short runs one after another until the median of the last WINDOW is within SLOWER
    times ``usual``; how many seconds after ``back`` that was. Fails when it is not so
    within RECOVERY_SECONDS, with the times seen."""
    times: list[float] = []
    while True:
        remaining = back + RECOVERY_SECONDS - time.monotonic()
        recent = times[-WINDOW:]
        if len(recent) == WINDOW and statistics.median(recent) <= SLOWER * usual:
            return time.monotonic() - back
        if remaining <= 0:
            break
        try:
            times.append(
                await asyncio.wait_for(short_run(runtime, f"{tag}-{len(times)}"), remaining)
            )
        except TimeoutError:
            break
    paces = ", ".join(f"{t:.3f}" for t in times)
    raise AssertionError(
        f"appends did not return to within {SLOWER:g}x their usual pace ({usual:.3f} s a "
        f"short run, the median of {USUAL_RUNS}) within {RECOVERY_SECONDS:.0f} s of the "
        f"server being back: short runs took {paces or 'nothing: none ended'} s"
    )


async def ride_out(
    server: OwnServer,
    runtime: Runtime,
    research: Research,
    run: asyncio.Task[object],
    usual: float,
) -> float:
    """Restart ``server`` under the ``run`` of ``research``; return how soon after the
    server was back appends returned to their ``usual`` pace (measured while the run
    finishes)."""
    await eventually(lambda: research.model_calls >= 10, what="the run to be under way")
    back = await restart(server)
    assert not run.done(), "the run ended before the restart: nothing was tested"
    return await back_to_pace(runtime, usual, back, "after")


@pytest.mark.kafka
@pytest.mark.parametrize("service", ["postgres", "kafka"])
async def test_a_restart_under_a_running_agent_and_processor_loses_nothing(
    env: KafkaEnv, servers: Servers, service: str
) -> None:
    """The runtime and `loomflow processor` ride out a restart of PostgreSQL or the broker:
    the run in flight finishes, connections (the LISTEN one too) come back, appends return
    to their usual pace, and the read model ends equal to the fold of the log."""
    processor = env.processor_process()
    runtime = env.runtime()
    try:
        usual = await usual_pace(runtime, "usual")
        research = Research(passes=100)
        # ~10 s of model time, so the restart lands mid-run
        agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=200)
        run = asyncio.create_task(agent.run("Research.", session_id="s1"))
        recovered = await ride_out(servers[service], runtime, research, run, usual)
        result = await asyncio.wait_for(run, 180)
        assert result.turns == 300 and result.stop_reason == "completed"
        # the LISTEN connection is back: confirms are woken by notifications again
        await eventually(lambda: runtime.store.listening, what="the LISTEN connection")
        print(
            f"\n{service} restarted: a short run took {usual:.3f} s before (median); the "
            f"median was within {SLOWER:g}x of that {recovered:.1f} s after the restart"
        )
        assert len(await runtime.list_checkpoints(Scope("s1"))) == 20
        assert processor.poll() is None, processor.output()[-3000:]
    finally:
        await runtime.close()
        processor.stop()
    expected = await fold_of(await log_events(env.bootstrap, env.topics))
    assert await in_postgres(env.dsn, env.schema) == expected


@pytest.fixture
async def postgres_runtime(servers: Servers) -> AsyncIterator[Callable[[], PostgresRuntime]]:
    """PostgresRuntimes on a schema of the module's PostgreSQL, dropped after the test."""
    async with _postgres_runtimes(servers) as made:
        yield made


@contextlib.asynccontextmanager
async def _postgres_runtimes(servers: Servers) -> AsyncIterator[Callable[[], PostgresRuntime]]:
    schema = f"lf_test_{secrets.token_hex(6)}"
    try:
        yield lambda: PostgresRuntime(servers.postgres.address, schema=schema)
    finally:
        conn = await asyncpg.connect(servers.postgres.address)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


@pytest.mark.postgres
async def test_postgres_runtime_rides_out_a_database_restart(
    servers: Servers, postgres_runtime: Callable[[], PostgresRuntime]
) -> None:
    """PostgresRuntime: a database restart mid-run is retried; the run completes with
    every turn recorded once, and appends return to their usual pace."""
    runtime = postgres_runtime()
    try:
        usual = await usual_pace(runtime, "usual")
        research = Research(passes=100)
        agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=200)
        run = asyncio.create_task(agent.run("Research.", session_id="s1"))
        recovered = await ride_out(servers.postgres, runtime, research, run, usual)
        result = await asyncio.wait_for(run, 180)
        assert result.turns == 300 and result.stop_reason == "completed"
        assert research.model_calls == 300  # nothing asked twice
        assert sum(research.tool_runs.values()) == 200
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        print(
            f"\nPostgreSQL restarted: a short run took {usual:.3f} s before (median); the "
            f"median was within {SLOWER:g}x of that {recovered:.1f} s after the restart"
        )
    finally:
        await runtime.close()


@pytest.fixture
async def runtimes(
    request: pytest.FixtureRequest, servers: Servers
) -> AsyncIterator[Callable[[], Runtime]]:
    """Runtimes on the module's server named by the test's ``service``: PostgresRuntime,
    or KafkaRuntime with a projector running in this process."""
    if request.node.callspec.params["service"] == "postgres":
        async with _postgres_runtimes(servers) as made:
            yield made
        return
    env = await KafkaEnv.create(
        kafka_bootstrap=servers.kafka.address, postgres_dsn=servers.postgres.address
    )
    try:
        await env.start_projector()
        yield env.runtime
    finally:
        await env.close()


@pytest.mark.parametrize(
    "service",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("kafka", marks=pytest.mark.kafka),
    ],
)
async def test_an_outage_longer_than_retry_seconds_fails_the_run_clearly_and_loses_nothing(
    servers: Servers, runtimes: Callable[[], Runtime], service: str
) -> None:
    """The server stays down past the runtime's retry_seconds: the run fails with the
    store's error instead of hanging; every event the run was told was acknowledged is
    there once the server is back, and resume finishes it."""
    server = servers[service]
    runtime = runtimes()
    runtime.retry_seconds = 2.0
    acknowledged: list[tuple[int, str]] = []

    async def note(item: object) -> None:
        if isinstance(item, EventBase):
            acknowledged.append((item.seq, item.event_id))

    research = Research(passes=100)
    agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=200)
    try:
        run = asyncio.create_task(agent.run("Research.", session_id="s1", emit=note))
        await eventually(lambda: research.model_calls >= 10, what="the run to be under way")
        await asyncio.to_thread(server.stop)  # fails unless the server went away
        started = time.monotonic()
        with pytest.raises(StoreError) as failed:
            await asyncio.wait_for(run, 120)
        took = time.monotonic() - started
        print(f"\n{service} down: the run failed after {took:.1f} s: {failed.value}")
        # retry_seconds, then the writes that record the failure, each given at least
        # MIN_ATTEMPT_SECONDS: seconds, not the client's own minutes-long timeouts
        assert took < 30, f"the run hung for {took:.0f} s past a 2 s retry_seconds"
    finally:
        if not server.started:
            await asyncio.to_thread(server.start)
        await runtime.close()

    assert failed.value.retriable, failed.value
    again = runtimes()
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
