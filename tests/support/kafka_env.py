"""A throwaway Kafka + PostgreSQL environment: own topics, own schema, own projectors."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import UnknownTopicOrPartitionError

from loomflow.processors import Projector
from loomflow.producers import Topics, ensure_topics
from loomflow.runtime.kafka import KafkaRuntime
from loomflow.schemas import CheckpointWritten, Event, Message, RunStarted, TurnAppended, Usage
from loomflow.schemas.events import CheckpointWrittenPayload, TurnAppendedPayload
from loomflow.settings import Settings
from tests.support.backends import drop_environment
from tests.support.services import kafka_bootstrap, postgres_dsn
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class KafkaEnv:
    """One test's topics, schema and processor id, as one Settings object."""

    settings: Settings
    tag: str
    running: list[tuple[Projector, asyncio.Event, asyncio.Task[None]]] = field(default_factory=list)
    extra_schemas: list[str] = field(default_factory=list)
    #: other topic prefixes a test created topics under
    extra_topics: list[str] = field(default_factory=list)

    @classmethod
    async def create(cls, partitions: int = 2, **settings: Any) -> KafkaEnv:
        """Topics made now; ``settings`` override the defaults (a ``kafka_bootstrap`` of
        another cluster, ``topic_replication``, ...)."""
        tag = secrets.token_hex(5)
        if "kafka_bootstrap" not in settings:
            settings["kafka_bootstrap"] = kafka_bootstrap()
        env = cls(
            settings=Settings(
                **{
                    "postgres_dsn": postgres_dsn(),
                    "db_schema": f"lf_test_{tag}",
                    "topic_prefix": f"lf-test-{tag}",
                    "topic_partitions": partitions,
                    "processor_id": f"lf-test-{tag}",
                    **settings,
                }
            ),
            tag=tag,
        )
        await ensure_topics(env.bootstrap, env.topics)
        return env

    @property
    def bootstrap(self) -> str:
        return self.settings.kafka_bootstrap

    @property
    def dsn(self) -> str:
        return self.settings.postgres_dsn

    @property
    def topics(self) -> Topics:
        return Topics.from_settings(self.settings)

    @property
    def schema(self) -> str:
        return self.settings.db_schema

    @property
    def group(self) -> str:
        return self.settings.projector_group

    def variables(self) -> dict[str, str]:
        """The LOOMFLOW_* variables that configure a process like this environment."""
        s = self.settings
        variables = {
            "LOOMFLOW_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "LOOMFLOW_POSTGRES_DSN": s.postgres_dsn,
            "LOOMFLOW_SCHEMA": s.db_schema,
            "LOOMFLOW_TOPIC_PREFIX": s.topic_prefix,
            "LOOMFLOW_TOPIC_PARTITIONS": str(s.topic_partitions),
            "LOOMFLOW_TOPIC_REPLICATION": str(s.topic_replication),
            "LOOMFLOW_PROCESSOR_ID": s.processor_id,
        }
        if s.topic_min_insync_replicas is not None:
            variables["LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS"] = str(s.topic_min_insync_replicas)
        return variables

    def projector(self, **options: Any) -> Projector:
        return Projector(
            self.settings,
            poll_ms=20,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=500,
            **options,
        )

    async def start_projector(self, **options: Any) -> Projector:
        projector = self.projector(**options)
        await projector.start()
        stop = asyncio.Event()
        self.running.append((projector, stop, asyncio.create_task(projector.run(stop))))
        return projector

    async def stop_projector(self, projector: Projector) -> None:
        for entry in list(self.running):
            if entry[0] is projector:
                entry[1].set()
                await entry[2]
                await projector.stop()
                self.running.remove(entry)

    def runtime(self, **kwargs: Any) -> KafkaRuntime:
        return KafkaRuntime(settings=self.settings, **kwargs)

    def processor_process(self) -> ProcessorProcess:
        """``loomflow processor`` (the faust app) as a child process on this environment."""
        return start_processor(self.variables())

    async def end_offsets(self) -> dict[int, int]:
        """Partition -> the offset after the last record of the events topic."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topics.events, p) for p in range(self.topics.partitions)]
            return {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
        finally:
            await consumer.stop()

    async def caught_up(self) -> bool:
        """Whether the projector's committed positions reached the end of the topic."""
        ends = await self.end_offsets()
        positions = await self.positions()
        return all(positions.get(p, 0) >= end for p, end in ends.items())

    async def positions(self, consumer: str | None = None) -> dict[int, int]:
        conn = await asyncpg.connect(self.dsn)
        try:
            rows = await conn.fetch(
                f'SELECT partition, next_offset FROM "{self.schema}".positions '
                "WHERE consumer = $1 AND topic = $2",
                consumer or self.group,
                self.topics.events,
            )
        except asyncpg.UndefinedTableError:
            return {}
        finally:
            await conn.close()
        return {r[0]: r[1] for r in rows}

    async def close(self) -> None:
        for projector, stop, task in self.running:
            stop.set()
            await task
            await projector.stop()
        conn = await asyncpg.connect(self.dsn)
        try:
            for schema in self.extra_schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
        await drop_environment(self.settings)
        # the faust apps run on this environment (`loomflow processor`, `loomflow analytics`)
        # made their tables' and assignors' topics
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            apps = f"{self.settings.processor_id}-"
            ours = [t for t in await admin.list_topics() if t.startswith(apps)]
            if ours:
                await admin.delete_topics(ours)
        finally:
            await admin.close()
        for prefix in self.extra_topics:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                names = [f"{prefix}.events", f"{prefix}.snapshots", f"{prefix}.events.dlq"]
                existing = set(await admin.list_topics())
                await admin.delete_topics([n for n in names if n in existing])
            finally:
                await admin.close()


class ProcessorProcess:
    """``loomflow processor`` (or another worker: ``argv``) as its own process; its output
    goes to a file.

    Not to a pipe: a pipe nobody reads fills up (aiokafka logs a line per failed
    reconnect while a broker restarts), and the processor then blocks on its own log.
    """

    def __init__(
        self,
        variables: dict[str, str],
        *,
        loglevel: str = "warn",
        argv: list[str] | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
        env.update(variables, PYTHONPATH=str(ROOT))
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.popen = subprocess.Popen(
            argv or [sys.executable, "-m", "loomflow.cli", "processor", "--loglevel", loglevel],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def output(self) -> str:
        """What the processor printed so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def kill(self) -> str:
        """SIGKILL it; return its output."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)
        return self.output()

    def stop(self, timeout: float = 60) -> str:
        """SIGTERM it, SIGKILL after ``timeout`` (then fail); return its output."""
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # never leave a worker behind
            self.popen.wait()
            raise
        return self.output()


def start_processor(variables: dict[str, str], *, loglevel: str = "warn") -> ProcessorProcess:
    """``loomflow processor`` as its own process, configured by ``variables`` alone.

    The LOOMFLOW_* variables of this test process are removed first, so that a test of the
    defaults runs the processor exactly as a user who set nothing would.
    """
    return ProcessorProcess(variables, loglevel=loglevel)


async def topic_configs(bootstrap: str, *topics: str) -> dict[str, dict[str, str]]:
    """Topic -> its configs as the broker describes them (set or defaulted).

    On a cluster, a broker that has not yet learned of a topic just created answers
    UNKNOWN_TOPIC_OR_PARTITION with no configs: such a topic is described again until
    its broker knows it. Any other error fails."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()

    async def described() -> dict[str, dict[str, str]] | None:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]
        )
        resources = [resource for response in responses for resource in response.resources]
        errors = {resource[3]: (resource[0], resource[1]) for resource in resources if resource[0]}
        assert all(code == UnknownTopicOrPartitionError.errno for code, _ in errors.values()), (
            errors
        )
        if errors:
            return None
        return {
            resource[3]: {entry[0]: entry[1] for entry in resource[4]} for resource in resources
        }

    try:
        configs: dict[str, dict[str, str]] = await eventually(
            described, what=f"the brokers to describe {', '.join(topics)}"
        )
    finally:
        await admin.close()
    return configs


def session_events(
    session: str, passes: int, *, user: str | None = None, retain: int = 3
) -> list[Event]:
    """A well-formed session: a run, then per pass two turn events and a checkpoint."""
    events: list[Event] = [RunStarted(user_id=user, session_id=session, run_id="r", seq=1, epoch=1)]
    usage = Usage()
    count = 0
    for k in range(1, passes + 1):
        turn_usage = Usage(input_tokens=100 + k, output_tokens=10, cost_usd=0.001)
        usage = usage + turn_usage
        common = {"user_id": user, "session_id": session, "run_id": "r", "epoch": 1}
        events.append(
            TurnAppended(
                seq=len(events) + 1,
                payload=TurnAppendedPayload(
                    messages=[Message.user(f"q{k} " * 20), Message.assistant(f"a{k} " * 50)],
                    usage=turn_usage,
                    model_call=True,
                ),
                **common,
            )
        )
        count += 2
        events.append(
            CheckpointWritten(
                seq=len(events) + 1,
                payload=CheckpointWrittenPayload(
                    checkpoint_id=f"ckpt-{session}-{k}",
                    turn=k,
                    cumulative_usage=usage,
                    message_count=count,
                    retain=retain,
                ),
                **common,
            )
        )
    return events
