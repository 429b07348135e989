"""Where every loomflow process finds Kafka, PostgreSQL and its names: one settings object.

``KafkaRuntime``, ``PostgresRuntime``, ``loomflow processor``, ``loomflow rebuild`` and every
consumer of the log build a :class:`Settings` the same way: constructor arguments first,
``LOOMFLOW_*`` environment variables second, the defaults below last. So a runtime and a
processor started with no options agree on the topics, the schema and the projector's group.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,180}")


class Settings(BaseSettings):
    """Kafka, PostgreSQL, topic and group names, timeouts: read once, the same everywhere.

    Environment variables (each optional):

    ========================================  =================================================
    ``LOOMFLOW_KAFKA_BOOTSTRAP``              broker list, ``host:port[,host:port]``
    ``LOOMFLOW_POSTGRES_DSN``                 the read model's ``postgresql://`` URL
    ``LOOMFLOW_SCHEMA``                       PostgreSQL schema of the read model
    ``LOOMFLOW_TOPIC_PREFIX``                 topics ``<prefix>.events``, ``.snapshots``,
                                              ``.events.dlq``
    ``LOOMFLOW_TOPIC_PARTITIONS``             partitions of topics this process creates
    ``LOOMFLOW_TOPIC_REPLICATION``            replication factor of topics it creates
    ``LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS``    ``min.insync.replicas`` of topics it creates:
                                              how many replicas must have an append before
                                              Kafka acknowledges it (acks=all); unset, the
                                              broker's default. With replication 3 and 2, an
                                              acknowledged event survives the loss of any
                                              one broker, and appends fail (retriable)
                                              rather than go to a single replica
    ``LOOMFLOW_PROCESSOR_ID``                 the processor's name; its projector commits
                                              positions as ``<id>-projector``, the audit
                                              and analytics consumers as ``<id>-audit``
                                              and ``<id>-analytics``
    ``LOOMFLOW_PROJECTION_TIMEOUT``           seconds a runtime waits for the projector
    ``LOOMFLOW_CONNECT_TIMEOUT``              seconds to wait for a connection
    ``LOOMFLOW_KAFKA_ACK_TIMEOUT``            seconds an append waits for Kafka's
                                              acknowledgement before it fails, retriable
                                              (a partition without a leader, or with fewer
                                              in-sync replicas than min.insync.replicas)
    ``LOOMFLOW_AUTO_MIGRATE``                 create and migrate the schema and topics on
                                              first use (default true); false: only check,
                                              after ``loomflow setup`` ran ahead of a deploy
    ========================================  =================================================
    """

    model_config = SettingsConfigDict(
        env_prefix="LOOMFLOW_", frozen=True, extra="forbid", populate_by_name=True
    )

    kafka_bootstrap: str = "127.0.0.1:9092"
    postgres_dsn: str = Field(
        default="postgresql://loomflow:loomflow@127.0.0.1:5432/loomflow", repr=False
    )
    # ``schema`` would shadow a BaseModel attribute; the variable is still LOOMFLOW_SCHEMA
    db_schema: str = Field(
        default="loomflow", validation_alias=AliasChoices("db_schema", "LOOMFLOW_SCHEMA")
    )
    topic_prefix: str = "loomflow"
    topic_partitions: int = Field(default=6, ge=1)
    topic_replication: int = Field(default=1, ge=1)
    topic_min_insync_replicas: int | None = Field(default=None, ge=1)
    processor_id: str = "loomflow-processor"
    projection_timeout: float = Field(default=30.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    kafka_ack_timeout: float = Field(default=30.0, gt=0)
    auto_migrate: bool = True

    @field_validator("kafka_bootstrap", "postgres_dsn")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("db_schema")
    @classmethod
    def _schema_name(cls, value: str) -> str:
        if not _SCHEMA_NAME.fullmatch(value) or value.startswith("pg_"):
            raise ValueError(
                f"invalid PostgreSQL schema name {value!r}: use 1-48 characters from a-z, "
                "0-9 and _, not starting with a digit or pg_"
            )
        return value

    @field_validator("topic_prefix", "processor_id")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} must be 1-180 characters from A-Z, a-z, 0-9, '.', '_', '-'"
            )
        return value

    @model_validator(mode="after")
    def _insync_within_replication(self) -> Settings:
        wanted = self.topic_min_insync_replicas
        if wanted is not None and wanted > self.topic_replication:
            raise ValueError(
                f"topic_min_insync_replicas ({wanted}) is more than topic_replication "
                f"({self.topic_replication}): Kafka would refuse every append; set "
                "LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS at most LOOMFLOW_TOPIC_REPLICATION"
            )
        return self

    @classmethod
    def resolve(cls, settings: Settings | None = None, **overrides: Any) -> Settings:
        """``settings`` (or a fresh read of the environment) with the non-None overrides."""
        given = {name: value for name, value in overrides.items() if value is not None}
        if settings is None:
            return cls(**given)
        if not given:
            return settings
        return cls(**{**settings.model_dump(), **given})  # validated like the rest

    @property
    def projector_group(self) -> str:
        """The consumer group (and positions key) of the processor's projector."""
        return f"{self.processor_id}-projector"

    @property
    def audit_group(self) -> str:
        """The consumer group of ``loomflow audit`` (its positions in the log)."""
        return f"{self.processor_id}-audit"

    @property
    def analytics_group(self) -> str:
        """The consumer group (and faust app id) of ``loomflow analytics``."""
        return f"{self.processor_id}-analytics"

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}.events"

    @property
    def snapshots_topic(self) -> str:
        return f"{self.topic_prefix}.snapshots"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}.events.dlq"

    def describe(self) -> str:
        """Where this process looks, for error messages (the DSN without its password)."""
        return (
            f"Kafka {self.kafka_bootstrap}, topic {self.events_topic}, group "
            f"{self.projector_group}, PostgreSQL schema {self.db_schema}"
        )
