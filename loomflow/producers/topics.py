"""The topics of the log and their creation with the design's configs."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Protocol, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from loomflow.errors import StoreError, StoreUnavailableError
from loomflow.schemas.events import MAX_EVENT_BYTES
from loomflow.settings import Settings

__all__ = ["Topics", "ensure_topics", "scope_key", "started", "unreachable"]


class _Client(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


C = TypeVar("C", bound=_Client)

logger = logging.getLogger("loomflow.producers")

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


@dataclass(frozen=True)
class Topics:
    """Names, partition counts and replication of the log's topics."""

    events: str = "loomflow.events"
    snapshots: str = "loomflow.snapshots"
    dlq: str = "loomflow.events.dlq"
    partitions: int = 6
    replication: int = 1
    #: ``min.insync.replicas`` of the topics; None: the broker's default
    min_insync_replicas: int | None = None

    def __post_init__(self) -> None:
        for name in (self.events, self.snapshots, self.dlq):
            if not _TOPIC.match(name):
                raise ValueError(f"invalid Kafka topic name {name!r}")
        if self.partitions < 1 or self.replication < 1:
            raise ValueError("partitions and replication must be at least 1")
        if self.min_insync_replicas is not None and not (
            1 <= self.min_insync_replicas <= self.replication
        ):
            raise ValueError("min_insync_replicas must be from 1 to the replication")

    @classmethod
    def from_settings(cls, settings: Settings) -> Topics:
        """The topics ``settings`` name, with the partitions and replication it asks for."""
        return cls.prefixed(
            settings.topic_prefix,
            partitions=settings.topic_partitions,
            replication=settings.topic_replication,
            min_insync_replicas=settings.topic_min_insync_replicas,
        )

    @classmethod
    def prefixed(
        cls,
        prefix: str,
        *,
        partitions: int = 6,
        replication: int = 1,
        min_insync_replicas: int | None = None,
    ) -> Topics:
        """The same topics under a prefix, e.g. one set per test or per tenant."""
        return cls(
            events=f"{prefix}.events",
            snapshots=f"{prefix}.snapshots",
            dlq=f"{prefix}.events.dlq",
            partitions=partitions,
            replication=replication,
            min_insync_replicas=min_insync_replicas,
        )


def scope_key(user_id: str | None, session_id: str) -> bytes:
    """The record key of a session's events: one session, one partition, one order.

    Ids cannot contain ``/`` (see schemas.ids), so the key is unambiguous.
    """
    return f"{user_id or ''}/{session_id}".encode()


def unreachable(bootstrap: str, exc: BaseException) -> StoreError:
    """Kafka could not be reached: retriable, nothing was written."""
    return StoreUnavailableError(
        f"Kafka at {bootstrap} is not reachable ({type(exc).__name__}: {exc}); "
        "start it with `dev/kafka.sh start` (or `docker compose up kafka`)"
    )


async def started(client: C, bootstrap: str) -> C:
    """``client`` (a producer, consumer or admin client) started; when Kafka cannot be
    reached it is stopped again and StoreUnavailableError raised."""
    try:
        await client.start()
    except KafkaError as exc:
        await client.stop()
        raise unreachable(bootstrap, exc) from exc
    return client


async def ensure_topics(
    bootstrap: str, topics: Topics, *, create: bool = True, timeout_ms: int = 30_000
) -> None:
    """Create the topics if missing: the log kept forever, snapshots compacted, a DLQ.

    With ``create`` False (automatic migration off) a missing topic is an error that says
    to run ``loomflow setup``, and nothing is created.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    try:
        await admin.start()
    except KafkaError as exc:
        raise unreachable(bootstrap, exc) from exc
    try:
        big = str(MAX_EVENT_BYTES + 64 * 1024)  # an event (or a snapshot) may be this large
        forever = {"cleanup.policy": "delete", "retention.ms": "-1", "max.message.bytes": big}
        compacted = {"cleanup.policy": "compact", "max.message.bytes": big}
        if topics.min_insync_replicas is not None:
            for configs in (forever, compacted):
                configs["min.insync.replicas"] = str(topics.min_insync_replicas)
        wanted = [
            NewTopic(name, topics.partitions, topics.replication, topic_configs=configs)
            for name, configs in (
                (topics.events, forever),
                (topics.snapshots, compacted),
                (topics.dlq, forever),
            )
        ]
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t.name not in existing]
        if missing and not create:
            raise StoreError(
                f"Kafka topics {', '.join(t.name for t in missing)} do not exist and automatic "
                "migration is off (LOOMFLOW_AUTO_MIGRATE): run `loomflow setup` first"
            )
        if missing:
            response = await admin.create_topics(missing, timeout_ms=timeout_ms)
            for name, code, *_ in response.topic_errors:
                # another process creating the same topic at once is not an error
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise StoreError(f"creating Kafka topic {name} failed: error code {code}")
            logger.info("created topics %s", [t.name for t in missing])
    except KafkaConnectionError as exc:
        raise unreachable(bootstrap, exc) from exc
    finally:
        await admin.close()
