"""A throwaway Kafka + PostgreSQL environment: own topics, own schema, own projectors."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from loomflow.processors import Projector
from loomflow.producers import Topics, ensure_topics
from loomflow.runtime.kafka import KafkaRuntime
from loomflow.schemas import CheckpointWritten, Event, Message, RunStarted, TurnAppended, Usage
from loomflow.schemas.events import CheckpointWrittenPayload, TurnAppendedPayload
from tests.support.services import kafka_bootstrap, postgres_dsn

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class KafkaEnv:
    bootstrap: str
    dsn: str
    topics: Topics
    schema: str
    group: str
    tag: str
    running: list[tuple[Projector, asyncio.Event, asyncio.Task[None]]] = field(default_factory=list)
    extra_schemas: list[str] = field(default_factory=list)

    @classmethod
    async def create(cls, partitions: int = 2) -> KafkaEnv:
        tag = secrets.token_hex(5)
        env = cls(
            bootstrap=kafka_bootstrap(),
            dsn=postgres_dsn(),
            topics=Topics.prefixed(f"lf-test-{tag}", partitions=partitions),
            schema=f"lf_test_{tag}",
            group=f"lf-test-{tag}-projector",
            tag=tag,
        )
        await ensure_topics(env.bootstrap, env.topics)
        return env

    def projector(self, **options: object) -> Projector:
        return Projector(
            self.bootstrap,
            self.dsn,
            topics=self.topics,
            schema=self.schema,
            group_id=self.group,
            poll_ms=20,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=500,
            **options,  # type: ignore[arg-type]
        )

    async def start_projector(self, **options: object) -> Projector:
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

    def runtime(self, **kwargs: object) -> KafkaRuntime:
        return KafkaRuntime(
            self.bootstrap,
            self.dsn,
            topics=self.topics,
            schema=self.schema,
            group_id=self.group,
            **kwargs,  # type: ignore[arg-type]
        )

    def processor_process(self) -> subprocess.Popen[str]:
        """``loomflow processor`` (the faust app) as a child process on this environment."""
        env = dict(
            os.environ,
            LOOMFLOW_KAFKA_BOOTSTRAP=self.bootstrap,
            LOOMFLOW_POSTGRES_DSN=self.dsn,
            LOOMFLOW_SCHEMA=self.schema,
            LOOMFLOW_TOPIC_PREFIX=f"lf-test-{self.tag}",
            LOOMFLOW_PROCESSOR_ID=f"lf-test-{self.tag}",
            LOOMFLOW_TOPIC_PARTITIONS=str(self.topics.partitions),
            PYTHONPATH=str(ROOT),
        )
        return subprocess.Popen(
            [sys.executable, "-m", "loomflow.cli", "processor", "--loglevel", "warn"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

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
            for schema in [self.schema, *self.extra_schemas]:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([self.topics.events, self.topics.snapshots, self.topics.dlq])
        finally:
            await admin.close()


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
