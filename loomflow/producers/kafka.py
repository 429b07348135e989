"""Appending events to Kafka: acks=all, idempotent, JSON values, keyed by scope."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    KafkaError,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)
from aiokafka.partitioner import DefaultPartitioner

from loomflow.errors import InvalidEventError, StoreError, StoreUnavailableError
from loomflow.producers.topics import Topics, scope_key, started
from loomflow.schemas import Event
from loomflow.schemas.events import MAX_EVENT_BYTES

__all__ = ["EventProducer", "Position", "kafka_error"]

logger = logging.getLogger("loomflow.producers")

_partitioner = DefaultPartitioner()


#: errors after which an idempotent producer stays broken (its sequence numbers no longer
#: match the broker's, e.g. after a broker restart lost a batch in flight): the producer is
#: replaced, and a write may be tried again with the new one (aiokafka issue #1017)
_BROKEN_PRODUCER = (
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
)


def kafka_error(message: str, exc: KafkaError) -> StoreError:
    """The StoreError for an aiokafka error: retriable when aiokafka says it is (a broker
    away, a timeout, a leader moving) or when a new producer will do, not when the request
    itself is wrong."""
    retriable = getattr(exc, "retriable", False) or isinstance(exc, _BROKEN_PRODUCER)
    cls = StoreUnavailableError if retriable else StoreError
    return cls(f"{message}: {type(exc).__name__}: {exc}")


#: producers whose stop outlived the caller's wait: kept until they end (see EventProducer.stop)
_stopping: set[asyncio.Future[None]] = set()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # its caller was told already: no "never retrieved" warning


@dataclass(frozen=True, order=True)
class Position:
    """Where a record landed: partition and offset."""

    partition: int
    offset: int


class EventProducer:
    """Writes events to the events topic; a session's events keep their order.

    ``ack_timeout`` (seconds, None: no limit) bounds the wait for Kafka's acknowledgement
    of an append (see ``acked``), and ``stop``.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Topics | None = None,
        *,
        ack_timeout: float | None = None,
        **options: Any,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics or Topics()
        self.ack_timeout = ack_timeout
        self._options = options
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._partitions: dict[bytes, int] = {}
        self._broken = False

    async def start(self) -> None:
        async with self._lock:
            if self._producer is not None:
                return
            options = {"linger_ms": 0, **self._options}
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                enable_idempotence=True,
                max_request_size=MAX_EVENT_BYTES + 64 * 1024,
                **options,
            )
            self._producer = await started(producer, self.bootstrap)

    async def stop(self) -> None:
        """Stop the producer. aiokafka's ``stop`` first delivers what the producer holds,
        which on a cluster without enough brokers never ends: with an ``ack_timeout``, this
        returns after that long and the producer finishes in the background, delivering
        what it can once the cluster answers (until the process ends), so that closing a
        runtime never hangs."""
        async with self._lock:
            producer, self._producer = self._producer, None
            if producer is None:
                return
            stopping = asyncio.ensure_future(producer.stop())
            if self.ack_timeout is None:
                await stopping
                return
            done, _ = await asyncio.wait({stopping}, timeout=self.ack_timeout)
            if done:
                stopping.result()
                return
            logger.warning(
                "the Kafka producer still holds records Kafka has not acknowledged after %g s; "
                "it goes on delivering them in the background",
                self.ack_timeout,
            )
            _stopping.add(stopping)
            stopping.add_done_callback(_stopping.discard)

    async def _ready(self) -> AIOKafkaProducer:
        if self._broken:
            self._broken = False
            logger.warning("replacing the Kafka producer, whose state the broker refused")
            await self.stop()
        if self._producer is None:
            await self.start()
        assert self._producer is not None
        return self._producer

    async def partitions_for(self) -> set[int]:
        """The partitions of the events topic."""
        producer = await self._ready()
        return set(await producer.partitions_for(self.topics.events))

    async def partition_of(self, key: bytes) -> int:
        """The events topic's partition of a record key, as the producer's default
        partitioner picks it (murmur2 is pure Python here, so answers are kept)."""
        partition = self._partitions.get(key)
        if partition is None:
            available = sorted(await self.partitions_for())
            if len(self._partitions) >= 65_536:
                self._partitions.clear()
            partition = self._partitions[key] = int(_partitioner(key, available, available))
        return partition

    async def send(self, events: Sequence[Event]) -> list[Position]:
        """Append events and wait until every broker replica has them (acks=all)."""
        return await self.acked(await self.enqueue(events))

    async def enqueue(self, events: Sequence[Event]) -> list[asyncio.Future[Any]]:
        """Hand events to the producer, in order, without waiting for the broker; the
        futures resolve when it acknowledges them (pass them to ``acked``).

        Raise InvalidEventError, with none of them sent, for an event whose JSON is
        larger than MAX_EVENT_BYTES: every reader of the log refuses it (the projector
        would dead-letter it), and a writer counts on the projector taking what the
        fold takes (``KafkaStore.confirm``)."""
        values = [event.model_dump_json().encode() for event in events]
        for event, value in zip(events, values, strict=True):
            if len(value) > MAX_EVENT_BYTES:
                raise InvalidEventError(
                    f"{event.type} event at seq {event.seq} of session {event.session_id!r} "
                    f"is {len(value)} bytes of JSON; the log takes at most {MAX_EVENT_BYTES}"
                )
        producer = await self._ready()
        try:
            pending = []
            for event, value in zip(events, values, strict=True):
                key = scope_key(event.user_id, event.session_id)
                pending.append(
                    await producer.send(
                        self.topics.events,
                        value=value,
                        key=key,
                        partition=await self.partition_of(key),
                        headers=[("type", event.type.encode())],
                    )
                )
            return pending
        except KafkaError as exc:
            self._broken = self._broken or isinstance(exc, _BROKEN_PRODUCER)
            raise kafka_error(f"appending to Kafka topic {self.topics.events} failed", exc) from exc

    async def acked(self, pending: Sequence[asyncio.Future[Any]]) -> list[Position]:
        """Where enqueued events landed, once the broker acknowledged them all.

        Raise StoreUnavailableError if that takes longer than ``ack_timeout``. An
        idempotent producer tries a write again for as long as the partition has no
        reachable leader, or fewer in-sync replicas than its ``min.insync.replicas``, so on
        a cluster that lost too many brokers the wait would never end. The records stay
        with the producer, which delivers them if the cluster recovers.
        """
        if pending and self.ack_timeout is not None:
            _, unacknowledged = await asyncio.wait(pending, timeout=self.ack_timeout)
            if unacknowledged:
                for future in unacknowledged:
                    future.add_done_callback(_retrieved)
                raise StoreUnavailableError(
                    f"Kafka did not acknowledge {len(unacknowledged)} event(s) appended to "
                    f"{self.topics.events} within {self.ack_timeout:g} s: a partition has "
                    "no reachable leader, or fewer in-sync replicas than its "
                    "min.insync.replicas. Check that enough brokers are up; the events may "
                    "still land, and whatever Kafka acknowledged is kept"
                )
        try:
            records = [await future for future in pending]
        except KafkaError as exc:
            self._broken = self._broken or isinstance(exc, _BROKEN_PRODUCER)
            raise kafka_error(f"appending to Kafka topic {self.topics.events} failed", exc) from exc
        return [Position(r.partition, r.offset) for r in records]

    async def send_many(self, topic: str, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Write (key, value) records (a None value: a tombstone) and wait for all their
        acknowledgements at once."""
        producer = await self._ready()
        try:
            pending = [await producer.send(topic, value=v, key=k) for k, v in records]
            await asyncio.gather(*pending)
        except KafkaError as exc:
            self._broken = self._broken or isinstance(exc, _BROKEN_PRODUCER)
            raise kafka_error(f"writing to Kafka topic {topic} failed", exc) from exc

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
            self._broken = self._broken or isinstance(exc, _BROKEN_PRODUCER)
            raise kafka_error(f"writing to Kafka topic {topic} failed", exc) from exc
        return Position(record.partition, record.offset)
