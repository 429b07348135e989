"""loomflow.testing's log-reader suite, run against our readers: the SQLite log by
position, and the Kafka topic with no consumer group and as a group's members. What only
one reader has to prove is in test_reader.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest

from loomflow.testing import LogReaderConformance, ReadableLog, SqliteLog
from tests.support.kafka_env import KafkaEnv
from tests.support.logs import KafkaGroupLog, KafkaLog


class TestSqliteReader(LogReaderConformance):
    @pytest.fixture
    def log(self, tmp_path: Path) -> ReadableLog:
        return SqliteLog(tmp_path / "journal.db")


@pytest.mark.kafka
@pytest.mark.postgres
class _OnKafka(LogReaderConformance):
    """The topic of a KafkaEnv of two partitions, read as ``reads_as`` reads it."""

    reads_as: ClassVar[type[KafkaLog]]

    @pytest.fixture
    async def log(self) -> AsyncIterator[ReadableLog]:
        env = await KafkaEnv.create(partitions=2)
        await env.start_projector()  # erase and prune read the read model
        yield self.reads_as(env)
        await env.close()


class TestKafkaReader(_OnKafka):
    reads_as = KafkaLog


class TestKafkaGroupReader(_OnKafka):
    reads_as = KafkaGroupLog
