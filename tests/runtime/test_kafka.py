"""What only KafkaRuntime has to prove: it needs its projector, and says so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from loomflow import Message
from loomflow.errors import StoreError
from loomflow.producers import EventProducer
from loomflow.runtime import KafkaRuntime, Scope
from loomflow.schemas import TurnAppended, new_id
from loomflow.schemas.events import TurnAppendedPayload
from tests.support.kafka_env import KafkaEnv
from tests.support.scenario import Research
from tests.support.services import postgres_dsn


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=2)
    yield made
    await made.close()


async def test_without_a_running_projector_an_append_fails_clearly(env: KafkaEnv) -> None:
    runtime = env.runtime(projection_timeout=1.5)
    with pytest.raises(StoreError, match="loomflow processor"):
        await runtime.open_session(Scope("s1"), run_id=new_id("run"))
    await runtime.close()
    # once a projector runs, the same log is applied and the session can be claimed
    await env.start_projector()
    runtime = env.runtime()
    writer = await runtime.open_session(Scope("s1"), run_id=new_id("run"))
    assert writer.next_seq == 3  # the first claim was projected too, then this one
    await runtime.close()


async def test_an_unreachable_kafka_names_the_script() -> None:
    runtime = KafkaRuntime("127.0.0.1:1", postgres_dsn())
    with pytest.raises(StoreError, match=r"dev/kafka\.sh start"):
        await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    await runtime.close()


async def test_restore_reads_the_log_past_a_lagging_read_model(env: KafkaEnv) -> None:
    projector = await env.start_projector()
    runtime = env.runtime()
    research = Research(passes=2)
    await research.agent(runtime).run("Research.", session_id="s1")
    row = await runtime.store.session(Scope("s1"))
    assert row is not None
    await env.stop_projector(projector)

    # acknowledged by Kafka while no projector runs: the read model does not have it
    late = TurnAppended(
        session_id="s1",
        run_id=new_id("run"),
        seq=row.last_seq + 1,
        epoch=row.epoch,
        payload=TurnAppendedPayload(messages=[Message.user("a late question")]),
    )
    producer = EventProducer(env.bootstrap, env.topics)
    await producer.send([late])
    await producer.stop()

    state = await runtime.restore(Scope("s1"))
    assert state is not None and state.seq == late.seq
    assert state.messages[-1] == Message.user("a late question")
    assert (await runtime.store.session(Scope("s1"))).last_seq == late.seq  # type: ignore[union-attr]

    await env.start_projector()  # the projector catches up; the resumed run goes on
    follow = Research(passes=3)
    result = await follow.agent(runtime).resume(session_id="s1")
    assert result.restored_turns == 6 and result.turns == 9
    first_request = follow.models[-1].inner.calls[0]
    assert first_request.count(Message.user("a late question")) == 1
    await runtime.close()
