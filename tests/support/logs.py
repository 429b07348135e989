"""The Kafka logs the log suites of loomflow.testing read: the events topic of a
KafkaEnv, read with no consumer group or as a group's members."""

from __future__ import annotations

from loomflow.log import LogReader, committed_offsets, kafka_reader
from loomflow.producers import EventProducer, scope_key
from loomflow.projections.audit import Trail
from loomflow.runtime import EventStore, KafkaStore, Scope
from loomflow.schemas import Event
from loomflow.schemas.signing import NO_SIGNATURES, Signatures
from loomflow.testing import AuditedLog, ReadableLog, Start
from tests.support.kafka_env import KafkaEnv


class KafkaLog(ReadableLog):
    """The events topic read by partition from where a consumer says (``loomflow tail``,
    ``audit verify``); written by a KafkaStore, whose reads the env's projector serves.

    The topic keeps every record: erase and prune append events to it.
    """

    deletes_records = False

    def __init__(self, env: KafkaEnv) -> None:
        self.env = env

    def store(self) -> EventStore:
        return KafkaStore(self.env.settings)

    def reader(self, start: Start) -> LogReader:
        if start == "committed":
            raise ValueError("a reader with no consumer group keeps no committed offsets")
        return kafka_reader(self.env.settings, group=None, start=start)

    async def forge(self, event: Event) -> None:
        producer = EventProducer(self.env.bootstrap, self.env.topics)
        try:
            key = scope_key(event.user_id, event.session_id)
            await producer.send_raw(
                self.env.topics.events, event.model_dump_json().encode(), key=key
            )
        finally:
            await producer.stop()

    async def write_undecodable(self, scope: Scope) -> None:
        producer = EventProducer(self.env.bootstrap, self.env.topics)
        try:
            key = scope_key(scope.user_id, scope.session_id)
            await producer.send_raw(self.env.topics.events, b"{not json", key=key)
        finally:
            await producer.stop()


class KafkaGroupLog(KafkaLog, AuditedLog):
    """The events topic read as a member of a consumer group, whose committed offsets
    are its positions; the audit reads it as the audit group, as ``loomflow audit`` does.
    """

    starts_at_end = False  # a group starts where it committed

    def __init__(self, env: KafkaEnv) -> None:
        super().__init__(env)
        self.groups: list[str] = []

    def reader(self, start: Start) -> LogReader:
        settings = self.env.settings
        if start == "beginning":  # a new consumer: a group that never committed
            self.groups.append(f"lf-test-{self.env.tag}-reader-{len(self.groups)}")
            return kafka_reader(settings, group=self.groups[-1])
        if start == "committed":
            return kafka_reader(settings, group=self.groups[-1])
        return kafka_reader(settings, group=f"lf-test-{self.env.tag}-reader", start=start)

    async def audit_reader(self, trail: Trail, signatures: Signatures = NO_SIGNATURES) -> LogReader:
        settings = self.env.settings
        return kafka_reader(settings, group=settings.audit_group, signatures=signatures)

    async def audited(self, trail: Trail) -> dict[int, int]:
        return await committed_offsets(self.env.settings, self.env.settings.audit_group)

    def fresh_reader(self) -> LogReader:
        return kafka_reader(self.env.settings, group=None, start="beginning")
