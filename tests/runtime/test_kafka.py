"""What only KafkaRuntime has to prove: it needs its projector, and says so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from loomflow.errors import StoreError
from loomflow.runtime import KafkaRuntime, Scope
from loomflow.schemas import new_id
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
