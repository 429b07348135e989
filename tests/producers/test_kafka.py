"""The producer and topic admin against a real broker."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from loomflow.errors import StoreError
from loomflow.producers import EventProducer, Topics, ensure_topics, scope_key
from loomflow.producers import kafka as producers_kafka
from loomflow.schemas import Event, Message, RunStarted, TurnAppended, new_id
from loomflow.schemas.codec import decode_event
from tests.support.kafka_env import KafkaEnv, topic_configs
from tests.support.services import kafka_bootstrap

pytestmark = pytest.mark.kafka


@pytest.fixture
async def topics() -> Topics:
    made = Topics.prefixed(f"t-{uuid.uuid4().hex[:10]}", partitions=3)
    await ensure_topics(kafka_bootstrap(), made)
    return made


async def test_topics_get_the_designed_configs(topics: Topics) -> None:
    await ensure_topics(kafka_bootstrap(), topics)  # again: a no-op
    configs = await topic_configs(kafka_bootstrap(), topics.events, topics.snapshots)
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
    # key = scope: one partition, the one Kafka's own clients pick for the key (murmur2)
    every = list(range(topics.partitions))
    partition = DefaultPartitioner()(scope_key("alice", "s1"), every, every)
    assert {p.partition for p in positions} == {partition}
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
        seen: list[Event] = []
        where: set[TopicPartition] = set()
        while len(seen) < len(events):
            batch = await audit.getmany(timeout_ms=1000)
            assert batch, "the audit consumer saw nothing within a second"
            for tp, records in batch.items():
                where.add(tp)
                for record in records:
                    assert record.key == scope_key("alice", "s1")
                    assert record.value is not None
                    seen.append(decode_event(record.value))
    finally:
        await audit.stop()
    assert [e.seq for e in seen] == list(range(1, 30))
    assert seen == events
    assert where == {TopicPartition(topics.events, partition)}  # read where they were written


async def test_the_runtime_appends_with_acks_all_and_an_idempotent_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple[dict[str, Any], AIOKafkaProducer]] = []

    class Recording(AIOKafkaProducer):  # type: ignore[misc]
        """The producer aiokafka builds, and the configuration it was built with."""

        def __init__(self, **config: Any) -> None:
            super().__init__(**config)
            built.append((config, self))

    monkeypatch.setattr(producers_kafka, "AIOKafkaProducer", Recording)
    env = await KafkaEnv.create()
    runtime = env.runtime()
    try:
        claim = RunStarted(session_id="s1", run_id=new_id("run"), seq=1, epoch=1)
        await runtime.store.append([claim])  # acknowledged: no projector needed
        assert len(built) == 1, built
        config, producer = built[0]
        assert config["acks"] == "all" and config["enable_idempotence"] is True
        # as aiokafka took them: every in-sync replica acknowledges (-1), and the broker
        # gave the producer the id it deduplicates retried batches by
        assert producer._sender._acks == -1
        assert producer._txn_manager is not None and producer._txn_manager.has_pid()
    finally:
        await runtime.close()
        await env.close()


async def test_an_unreachable_broker_names_the_script() -> None:
    with pytest.raises(StoreError, match=r"dev/kafka\.sh start"):
        await ensure_topics("127.0.0.1:1", Topics(), timeout_ms=2000)


async def test_a_producer_the_broker_lost_track_of_is_replaced(topics: Topics) -> None:
    from aiokafka.errors import OutOfOrderSequenceNumber

    from loomflow.errors import StoreUnavailableError

    producer = EventProducer(kafka_bootstrap(), topics)
    await producer.start()
    try:
        broken = producer._producer
        assert broken is not None

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise OutOfOrderSequenceNumber()

        broken.send = refused
        event = RunStarted(session_id="s1", run_id=new_id("run"), seq=1, epoch=1)
        with pytest.raises(StoreUnavailableError, match="OutOfOrderSequenceNumber"):
            await producer.send([event])  # retriable: a new producer will do
        positions = await producer.send([event])
        assert producer._producer is not broken  # replaced, not left broken (aiokafka #1017)
        assert len(positions) == 1
    finally:
        await producer.stop()
