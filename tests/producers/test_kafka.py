"""The producer and topic admin against a real broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from loomflow.errors import StoreError
from loomflow.producers import EventProducer, Topics, ensure_topics, scope_key
from loomflow.schemas import Message, RunStarted, TurnAppended
from loomflow.schemas.codec import decode_event
from tests.support.services import kafka_bootstrap

pytestmark = pytest.mark.kafka


@pytest.fixture
async def topics() -> Topics:
    made = Topics.prefixed(f"t-{uuid.uuid4().hex[:10]}", partitions=3)
    await ensure_topics(kafka_bootstrap(), made)
    return made


async def test_topics_get_the_designed_configs(topics: Topics) -> None:
    await ensure_topics(kafka_bootstrap(), topics)  # again: a no-op
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap())
    await admin.start()
    try:
        described = await admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, name)
                for name in (topics.events, topics.snapshots)
            ]
        )
    finally:
        await admin.close()
    configs = {
        resource[3]: {entry[0]: entry[1] for entry in resource[4]}
        for response in described
        for resource in response.resources
    }
    assert configs[topics.events]["cleanup.policy"] == "delete"
    assert configs[topics.events]["retention.ms"] == "-1"
    assert configs[topics.snapshots]["cleanup.policy"] == "compact"


async def test_a_sessions_events_keep_their_order_and_any_group_reads_them_as_json(
    topics: Topics,
) -> None:
    producer = EventProducer(kafka_bootstrap(), topics)
    events = [RunStarted(user_id="alice", session_id="s1", run_id="r", seq=1, epoch=1)] + [
        TurnAppended(
            user_id="alice",
            session_id="s1",
            run_id="r",
            seq=n,
            epoch=1,
            payload={"messages": [Message.user(f"m{n}")]},
        )
        for n in range(2, 30)
    ]
    positions = await producer.send(events)
    await producer.stop()
    assert len({p.partition for p in positions}) == 1  # key = scope: one partition
    assert [p.offset for p in positions] == sorted(p.offset for p in positions)

    audit = AIOKafkaConsumer(
        topics.events,
        bootstrap_servers=kafka_bootstrap(),
        group_id=f"audit-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await audit.start()
    try:
        seen = []
        while len(seen) < len(events):
            batch = await audit.getmany(timeout_ms=1000)
            assert batch, "the audit consumer saw nothing within a second"
            for records in batch.values():
                for record in records:
                    assert record.key == scope_key("alice", "s1")
                    seen.append(decode_event(record.value))
    finally:
        await audit.stop()
    assert [e.seq for e in seen] == list(range(1, 30))
    assert seen == events
    assert TopicPartition(topics.events, positions[0].partition)


async def test_an_unreachable_broker_names_the_script() -> None:
    with pytest.raises(StoreError, match=r"dev/kafka\.sh start"):
        await ensure_topics("127.0.0.1:1", Topics(), timeout_ms=2000)
