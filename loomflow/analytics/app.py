"""Analytics at scale: a faust-streaming app with its own consumer group, and its reader.

Run it with ``loomflow analytics`` (or ``faust -A loomflow.analytics.app worker
--without-web``). It consumes the events topic as the group ``Settings().analytics_group``
(``<processor id>-analytics``, also the app's id), independently of the projector, and
keeps one table, ``ledgers``, whose changelog topic ``<group>-ledgers-changelog`` is what
``loomflow stats`` reads.

Why the table is keyed by session scope (and summed when read) rather than by model, user
or hour: faust writes a table's change to the changelog partition of the event being
processed, so a key must only ever be updated from one partition of the source topic. The
events topic is keyed by scope, so a scope's ledger always is. A key such as a model name
would be updated from every partition, and its changelog would hold conflicting values
(the alternative, ``group_by`` through a repartition topic, adds a topic and a second hop
per event, and loses the next point). Keeping the session's mark (:class:`Mark`, its last
counted seq) in the same value as its aggregates makes the table exactly-once in effect:
after a crash faust replays events from the last committed offset, and the recovered
ledger already says which of them it counted. Records that do not decode, or whose key is
not their event's session, are counted in a ledger per source partition (key
``!partition/<n>``), which is likewise only written from that partition.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import MutableMapping
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from loomflow.analytics.tally import Stats, Tally
from loomflow.errors import InvalidEventError, SignatureError, StoreError
from loomflow.log.apps import new_app
from loomflow.log.reader import committed_offsets
from loomflow.producers import Topics, scope_key
from loomflow.producers.topics import started
from loomflow.schemas.codec import decode_event
from loomflow.schemas.signing import NO_SIGNATURES, Signatures
from loomflow.settings import Settings

__all__ = ["LEDGERS", "changelog_topic", "count_record", "create_app", "lag", "read_stats"]

logger = logging.getLogger("loomflow.analytics.app")

#: the table's name; its changelog topic is ``<app id>-ledgers-changelog``
LEDGERS = "ledgers"


def changelog_topic(settings: Settings) -> str:
    """The compacted topic holding every ledger's latest value."""
    return f"{settings.analytics_group}-{LEDGERS}-changelog"


def count_record(
    ledgers: MutableMapping[bytes, bytes],
    key: bytes | None,
    raw: bytes | None,
    where: str,
    signatures: Signatures = NO_SIGNATURES,
) -> bytes:
    """Count one record of the events topic into ``ledgers``; return the key it changed.

    ``where`` (``partition:offset``) names the record in the log messages of what is
    skipped. Never raises for a bad record: it is counted as skipped and logged. An event
    whose signature ``signatures`` refuses is skipped too (``unverified``); one it only
    marks (``check``) is counted, with a warning.
    """
    partition = where.split(":", 1)[0]
    try:
        event = decode_event(raw or b"")
    except InvalidEventError as exc:
        logger.warning("analytics: record %s skipped: %s", where, exc)
        return _skip(ledgers, partition, "undecodable")
    try:
        problem = signatures.check(event)
    except SignatureError as exc:
        logger.warning("analytics: record %s skipped: %s", where, exc)
        return _skip(ledgers, partition, "unverified")
    if problem is not None:
        logger.warning("analytics: record %s counted, but %s", where, problem)
    scope = scope_key(event.user_id, event.session_id)
    if key != scope:
        logger.warning(
            "analytics: record %s skipped: its key %r is not its event's session %r",
            where,
            key,
            scope,
        )
        return _skip(ledgers, partition, "refused")
    tally = Tally.from_ledger(ledgers.get(scope))
    verdict = tally.add(event, contiguous=True)
    if verdict.duplicate:  # a replay after a restart: expected, and not counted twice
        logger.info("analytics: record %s skipped: %s", where, verdict.refused)
    elif verdict.refused is not None:
        logger.warning("analytics: record %s skipped: %s", where, verdict.refused)
    ledgers[scope] = tally.to_ledger()
    return scope


def _skip(ledgers: MutableMapping[bytes, bytes], partition: str, kind: str) -> bytes:
    key = f"!partition/{partition}".encode()
    tally = Tally.from_ledger(ledgers.get(key))
    tally.skip(kind)
    ledgers[key] = tally.to_ledger()
    return key


def create_app(settings: Settings | None = None) -> faust.App:
    """Build the analytics app; ``settings`` default to the LOOMFLOW_* environment."""
    settings = Settings.resolve(settings)
    topics = Topics.from_settings(settings)
    app = new_app(settings.analytics_group, settings)
    signatures = settings.signatures_policy()
    events = app.topic(topics.events, key_type=bytes, value_type=bytes)
    # a faust table is a mapping that sends each change to its changelog
    ledgers = cast(
        "MutableMapping[bytes, bytes]",
        app.Table(LEDGERS, partitions=topics.partitions, key_type=bytes, value_type=bytes),
    )

    @app.agent(events)
    async def count(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            message = event.message
            where = f"{message.partition}:{message.offset}"
            count_record(ledgers, event.key, event.value, where, signatures)

    return app


@functools.cache
def _default_app() -> faust.App:
    return create_app()


def __getattr__(name: str) -> Any:
    # ``faust -A loomflow.analytics.app worker`` finds ``app``; built on that
    # first use, so importing this module (as ``loomflow stats`` does) starts no app
    if name == "app":
        return _default_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


async def read_stats(settings: Settings, *, within: float = 30.0) -> Stats:
    """Every ledger's latest value, from the changelog topic, summed into :class:`Stats`.

    Reads the topic from its beginning to its end as it was when called (no consumer
    group, nothing committed). Raises StoreError when the broker does not answer or the
    topic does not exist (the analytics app never ran on these settings).
    """
    topic = changelog_topic(settings)
    consumer = await started(
        AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            enable_auto_commit=False,
            request_timeout_ms=int(settings.connect_timeout * 1000),
        ),
        settings.kafka_bootstrap,
    )
    try:
        found = await _partitions(settings, topic)
        if not found:
            raise StoreError(
                f"no analytics tables on {settings.kafka_bootstrap}: topic {topic} does not "
                f"exist. Start `loomflow analytics` (group {settings.analytics_group}) and "
                "let it read the log first"
            )
        partitions = [TopicPartition(topic, p) for p in sorted(found)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        latest: dict[bytes, bytes | None] = {}
        pending = {tp for tp in partitions if ends[tp] > 0}

        async def fill() -> None:
            while pending:
                batches = await consumer.getmany(timeout_ms=500, max_records=5000)
                for tp, records in batches.items():
                    for record in records:
                        if record.offset < ends[tp]:
                            latest[record.key] = record.value  # None: a tombstone
                    if records and records[-1].offset + 1 >= ends[tp]:
                        pending.discard(tp)
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)

        try:
            await asyncio.wait_for(fill(), within)
        except TimeoutError:
            raise StoreError(f"reading {topic} took over {within:.0f} s; try again") from None
    finally:
        await consumer.stop()
    tallies = (Tally.from_ledger(value) for value in latest.values() if value)
    return Stats.of_tallies(tallies, f"Kafka {settings.kafka_bootstrap}, topic {topic}")


async def lag(settings: Settings) -> int | None:
    """Records of the events topic the analytics group has not counted yet (None when the
    group has committed nothing, or the broker does not say)."""
    try:
        ours = await committed_offsets(settings, settings.analytics_group)
        if not ours:
            return None
        consumer = await started(
            AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap),
            settings.kafka_bootstrap,
        )
        try:
            found = await _partitions(settings, settings.events_topic)
            ends = await consumer.end_offsets(
                [TopicPartition(settings.events_topic, p) for p in found]
            )
        finally:
            await consumer.stop()
    except (KafkaError, StoreError):
        return None
    behind: int = sum(max(0, end - ours.get(tp.partition, 0)) for tp, end in ends.items())
    return behind


async def _partitions(settings: Settings, topic: str) -> set[int]:
    """The topic's partitions; none when it does not exist."""
    admin = await started(
        AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap), settings.kafka_bootstrap
    )
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described["error_code"]:  # 3: no such topic
        return set()
    return {p["partition"] for p in described["partitions"]}
