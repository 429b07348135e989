"""Appending events to Kafka: acks=all, idempotent, JSON values, keyed by scope."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from loomflow.errors import StoreError
from loomflow.producers.topics import Topics, scope_key, unreachable
from loomflow.schemas import Event
from loomflow.schemas.events import MAX_EVENT_BYTES

__all__ = ["EventProducer", "Position"]


@dataclass(frozen=True, order=True)
class Position:
    """Where a record landed: partition and offset."""

    partition: int
    offset: int


class EventProducer:
    """Writes events to the events topic; a session's events keep their order."""

    def __init__(self, bootstrap: str, topics: Topics | None = None, **options: Any) -> None:
        self.bootstrap = bootstrap
        self.topics = topics or Topics()
        self._options = options
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if self._producer is not None:
                return
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                enable_idempotence=True,
                max_request_size=MAX_EVENT_BYTES + 64 * 1024,
                linger_ms=self._options.pop("linger_ms", 0),
                **self._options,
            )
            try:
                await producer.start()
            except KafkaError as exc:
                await producer.stop()
                raise unreachable(self.bootstrap, exc) from exc
            self._producer = producer

    async def stop(self) -> None:
        async with self._lock:
            if self._producer is not None:
                await self._producer.stop()
                self._producer = None

    async def _ready(self) -> AIOKafkaProducer:
        if self._producer is None:
            await self.start()
        assert self._producer is not None
        return self._producer

    async def partitions_for(self) -> set[int]:
        """The partitions of the events topic."""
        producer = await self._ready()
        return set(await producer.partitions_for(self.topics.events))

    async def send(self, events: Sequence[Event]) -> list[Position]:
        """Append events and wait until every broker replica has them (acks=all)."""
        producer = await self._ready()
        try:
            pending = [
                await producer.send(
                    self.topics.events,
                    value=event.model_dump_json().encode(),
                    key=scope_key(event.user_id, event.session_id),
                    headers=[("type", event.type.encode())],
                )
                for event in events
            ]
            records = await asyncio.gather(*pending)
        except KafkaError as exc:
            raise StoreError(
                f"appending to Kafka topic {self.topics.events} failed: {exc}"
            ) from exc
        return [Position(r.partition, r.offset) for r in records]

    async def send_many(self, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Write (key, value) records and wait for all their acknowledgements at once."""
        producer = await self._ready()
        try:
            pending = [await producer.send(topic, value=v, key=k) for k, v in records]
            await asyncio.gather(*pending)
        except KafkaError as exc:
            raise StoreError(f"writing to Kafka topic {topic} failed: {exc}") from exc

    async def send_raw(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Position:
        """Write one record as given: snapshots, tombstones, dead letters."""
        producer = await self._ready()
        try:
            record = await (await producer.send(topic, value=value, key=key, headers=headers))
        except KafkaError as exc:
            raise StoreError(f"writing to Kafka topic {topic} failed: {exc}") from exc
        return Position(record.partition, record.offset)
