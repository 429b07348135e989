"""The log on a three-broker cluster, replicated as in production (replication 3, min ISR 2):
a run rides out the death of one broker; when a second dies, appends fail clearly instead
of hanging, and once the brokers are back the session resumes. Nothing Kafka acknowledged
is lost, and no model call whose turn was acknowledged runs again.

The cluster is ``dev/kafka-cluster.sh`` (three KRaft nodes, each broker and controller),
started once for the module and stopped after it, whatever happens.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.partitioner import DefaultPartitioner

from loomflow import Role
from loomflow.errors import StoreUnavailableError
from loomflow.producers import scope_key
from loomflow.runtime import KafkaRuntime
from loomflow.schemas import Event, TurnAppended
from tests.faults.conftest import Trials
from tests.support.kafka_env import ROOT, KafkaEnv, topic_configs
from tests.support.readmodel import fold_of, in_postgres, log_events
from tests.support.scenario import Research
from tests.support.waiting import eventually

pytestmark = pytest.mark.kafka

CLUSTER = ROOT / "dev" / "kafka-cluster.sh"
NODES = (1, 2, 3)
#: passes of the research agent (3 model calls each, 30 ms of model time a call) in the runs
#: that survive a broker's death (4.5 s of model time; the broker dies after 10 calls) and
#: that fail for lack of two
PASSES = 50
FAILING_PASSES = 30
#: how long an append waits for Kafka's acknowledgement, and a write keeps trying, once two
#: brokers are gone: short, so that the run fails within seconds
ACK_TIMEOUT = 3.0
RETRY_SECONDS = 5.0


def cluster(*args: str) -> str:
    """Run ``dev/kafka-cluster.sh`` with ``args``; its stdout (fails with its stderr)."""
    done = subprocess.run(
        [str(CLUSTER), *args], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, f"dev/kafka-cluster.sh {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    """The cluster's bootstrap list; the cluster is stopped after the module."""
    try:
        exports = cluster("start")
        yield exports.strip().removeprefix("export LOOMFLOW_KAFKA_BOOTSTRAP=")
    finally:
        subprocess.run([str(CLUSTER), "stop"], capture_output=True, timeout=120, check=False)


@pytest.fixture
async def env(bootstrap: str) -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(
        partitions=2,
        kafka_bootstrap=bootstrap,
        topic_replication=3,
        topic_min_insync_replicas=2,
        kafka_ack_timeout=ACK_TIMEOUT,
        projection_timeout=60.0,  # the processor rejoins its group after each broker death
    )
    yield made
    await asyncio.to_thread(cluster, "start")  # whatever a trial killed, to drop its topics
    await made.close()


async def leader_of(env: KafkaEnv, session: str) -> int:
    """The broker that leads the partition of ``session``'s events now."""
    every = list(range(env.topics.partitions))
    partition = DefaultPartitioner()(scope_key(None, session), every, every)
    client = AIOKafkaClient(bootstrap_servers=env.bootstrap)
    await client.bootstrap()
    try:
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(TopicPartition(env.topics.events, partition))
    finally:
        await client.close()
    assert leader in NODES, f"no leader for {env.topics.events}/{partition}"
    return int(leader)


def note_acknowledged(
    runtime: KafkaRuntime, acked: dict[str, Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Put every event Kafka acknowledges to ``runtime`` from now on in ``acked``."""
    landed = runtime.store._landed

    def noting(event: Event, partition: int, offset: int) -> None:
        acked[event.event_id] = event
        landed(event, partition, offset)

    monkeypatch.setattr(runtime.store, "_landed", noting)


def model_turns(research: Research) -> list[int]:
    """Which turn each model call answered (the assistant messages it was shown), in order."""
    return [
        sum(1 for m in messages if m.role is Role.ASSISTANT)
        for model in research.models
        for messages in model.inner.calls
    ]


def acknowledged_turns(acked: dict[str, Event], session: str) -> int:
    """How many model answers of ``session`` Kafka acknowledged."""
    return sum(
        1
        for e in acked.values()
        if isinstance(e, TurnAppended) and e.session_id == session and e.payload.model_call
    )


async def lost(env: KafkaEnv, acked: dict[str, Event]) -> list[Event]:
    """The acknowledged events that are not in the events topic."""
    logged = {e.event_id for e in await log_events(env.bootstrap, env.topics)}
    return [e for event_id, e in acked.items() if event_id not in logged]


async def test_a_run_survives_one_broker_and_fails_clearly_without_two(
    env: KafkaEnv, trials: Trials, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs = await topic_configs(env.bootstrap, env.topics.events)
    assert configs[env.topics.events]["min.insync.replicas"] == "2"  # as the settings asked
    processor = env.processor_process()
    runtime = env.runtime()
    acked: dict[str, Event] = {}
    note_acknowledged(runtime, acked, monkeypatch)
    try:
        for trial in range(trials(ci=1, soak=3)):
            dead = await survives_one_broker(env, runtime, acked, f"one-{trial}")
            # the second broker to die: the partition's leader, or (every other trial) the
            # one follower left in sync with it
            await fails_clearly_without_two(
                env, runtime, acked, f"two-{trial}", dead, leader=trial % 2 == 0, patch=monkeypatch
            )
            assert processor.poll() is None, processor.output()[-3000:]
    finally:
        await asyncio.to_thread(cluster, "start")
        await runtime.close()
        processor.stop()
    assert not await lost(env, acked)
    # the read model is the fold of the log: nothing acknowledged is missing from it either
    expected = await fold_of(await log_events(env.bootstrap, env.topics))
    assert await in_postgres(env.dsn, env.schema) == expected
    for event in acked.values():
        assert (event.seq, event.event_id) in expected[(None, event.session_id)]["events"]


async def survives_one_broker(
    env: KafkaEnv, runtime: KafkaRuntime, acked: dict[str, Event], session: str
) -> int:
    """SIGKILL the leader of the session's partition mid-run: the run completes, and no
    model call runs twice. Returns the broker killed."""
    research = Research(passes=PASSES)
    agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=2 * PASSES)
    run = asyncio.create_task(agent.run("Research.", session_id=session))
    await eventually(lambda: research.model_calls >= 10, what="the run to be under way")
    dead = await leader_of(env, session)
    await asyncio.to_thread(cluster, "kill", str(dead))
    assert not run.done(), "the run ended before the broker died: nothing was tested"
    result = await asyncio.wait_for(run, 120)
    assert result.turns == 3 * PASSES and result.stop_reason == "completed"
    assert model_turns(research) == list(range(3 * PASSES))  # each call once, in order
    assert sum(research.tool_runs.values()) == 2 * PASSES
    assert not await lost(env, acked)
    return dead


async def fails_clearly_without_two(
    env: KafkaEnv,
    runtime: KafkaRuntime,
    acked: dict[str, Event],
    session: str,
    dead: int,
    *,
    leader: bool,
    patch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL a second broker mid-run (``dead`` is down already; the one killed now is the
    session's partition leader if ``leader``): with one replica left, the run fails with
    the retriable StoreUnavailableError soon after the runtime's retry_seconds instead of
    hanging, and so does another process's run, whose runtime then closes at once. Once
    the brokers are back the session resumes and finishes, and only calls whose answer
    was not acknowledged run again."""
    research = Research(passes=FAILING_PASSES)
    agent = research.agent(runtime, latency=0.03, max_stop_hook_iterations=2 * FAILING_PASSES)
    other = env.runtime()  # another process's, closed when its run fails, as `async with` does
    note_acknowledged(other, acked, patch)
    bystander = Research(passes=FAILING_PASSES)
    riding_out = runtime.retry_seconds
    runtime.retry_seconds = other.retry_seconds = RETRY_SECONDS
    runs = [
        asyncio.create_task(agent.run("Research.", session_id=session)),
        asyncio.create_task(
            bystander.agent(other, latency=0.03).run("Research.", session_id=f"{session}-b")
        ),
    ]
    await eventually(
        lambda: min(research.model_calls, bystander.model_calls) >= 10,
        what="the runs to be under way",
    )
    lead = await leader_of(env, session)
    victim = lead if leader else next(n for n in NODES if n not in (dead, lead))
    await asyncio.to_thread(cluster, "kill", str(victim))
    # a hang is a failure too: the bound is the writer's retry time plus a few waits
    # for acknowledgements (the failed write, the look at what landed, the run's
    # failure event)
    bound = RETRY_SECONDS + 4 * ACK_TIMEOUT + 15
    await asyncio.wait(runs, timeout=bound)
    if not all(run.done() for run in runs):
        for run in runs:
            run.cancel()
        pytest.fail(f"a run neither went on nor failed {bound:.0f} s after the kill")
    for run in runs:
        with pytest.raises(StoreUnavailableError, match="acknowledge"):
            run.result()
    runtime.retry_seconds = riding_out
    await asyncio.wait_for(other.close(), ACK_TIMEOUT + 15)
    answered = acknowledged_turns(acked, session)

    await asyncio.to_thread(cluster, "start")
    before = len(model_turns(research))
    result = await asyncio.wait_for(agent.resume(session_id=session), 120)
    assert result.turns == 3 * FAILING_PASSES and result.stop_reason == "completed"
    # the resumed run asks only for the turns the log did not have, each once ...
    resumed = model_turns(research)[before:]
    assert resumed == list(range(resumed[0], 3 * FAILING_PASSES))
    # ... and none whose answer Kafka had acknowledged
    assert resumed[0] >= answered
    assert not await lost(env, acked)
