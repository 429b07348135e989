"""Every option of every loomflow process, in one settings object.

Every runtime (``InProcRuntime`` and ``SqliteRuntime`` included), ``loomflow processor``,
``loomflow rebuild``, the worker and every consumer of the log build a :class:`Settings`
the same way: constructor arguments first, ``LOOMFLOW_*`` environment variables second,
the defaults below last, each written here once. So a runtime and a processor started
with no options agree on the topics, the schema and the projector's group, and a
retention set in the environment holds for every runtime of the process.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from loomflow.errors import SigningKeyError
from loomflow.schemas.options import DEFAULT_LEASE_SECONDS, Serializer, SignatureMode

if TYPE_CHECKING:
    from loomflow.schemas.signing import Keyring, Role, Signatures, Signer

__all__ = ["Settings"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,180}")


#: the options that are numbers, each with the least value it takes
_COUNTS = {"max_checkpoints_per_session": None, "lease_seconds": 0.5, "retry_seconds": 0.0}


def _refusal(name: str | None, value: Any) -> str:
    least = _COUNTS.get(name or "")
    if least is None:
        return f"{name} must be a whole number (< 1 keeps all), not {value!r}"
    return f"{name} must be a number from {least:g} to 86400, not {value!r}"


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
    ``LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION``  checkpoints a session keeps (default 20; less
                                              than 1 keeps all)
    ``LOOMFLOW_SERIALIZER``                   how journaled step values are stored:
                                              ``json`` (default) or ``pickle``
    ``LOOMFLOW_LEASE_SECONDS``                how long a run's writer may stay silent
                                              before a worker may resume the run
    ``LOOMFLOW_RETRY_SECONDS``                how long a run's writes keep trying while
                                              the store is briefly away
    ``LOOMFLOW_POOL_MIN_SIZE``,               the PostgreSQL connection pool of a runtime
    ``LOOMFLOW_POOL_MAX_SIZE``
    ``LOOMFLOW_SQLITE_BUSY_TIMEOUT_MS``       how long a SQLite store's thread waits for
                                              another process's write lock
    ``LOOMFLOW_UI_HOST``, ``LOOMFLOW_UI_PORT``  where ``loomflow ui`` listens (default
                                              127.0.0.1:8765)
    ``LOOMFLOW_UI_TOKEN``                     the token ``loomflow ui`` asks for (a header
                                              or its cookie), 16 characters at least;
                                              unset, it makes one when it listens beyond
                                              the loopback
    ``LOOMFLOW_SIGNING_KEY_FILE``             the Ed25519 private key (PEM, from
                                              ``loomflow keys new``) this process signs
                                              every event it appends and every audit digest
                                              with; unset, it signs nothing
    ``LOOMFLOW_SIGNING_KEY``                  the same key given as text (its PEM, or its
                                              32-byte seed in base64), for a secret store
    ``LOOMFLOW_KEYRING``                      the public keys readers trust (a JSON file
                                              ``loomflow keys`` keeps); unset, only the
                                              signing key's own
    ``LOOMFLOW_SIGNATURES``                   ``off``, ``check`` (count an unsigned or
                                              mis-signed event, accept it) or ``require``
                                              (refuse it, to the dead letters); default
                                              ``require`` with a key or keyring, else ``off``
    ``LOOMFLOW_SIGNATURE_THREADS``            threads a projector checks a batch's
                                              signatures on beside its own (Ed25519
                                              verification releases the GIL); default 1,
                                              0 for none
    ``LOOMFLOW_AUDIT_DIGESTS``                where ``loomflow audit`` writes its signed
                                              digests: a directory, ``kafka:<topic>`` or
                                              ``-`` (standard output); unset, none
    ``LOOMFLOW_AUDIT_DIGEST_EVENTS``,         a digest after this many audited records
    ``LOOMFLOW_AUDIT_DIGEST_SECONDS``         (default 10000) or seconds (default 3600)
    ========================================  =================================================
    """

    model_config = SettingsConfigDict(
        env_prefix="LOOMFLOW_",
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        # a refused value is never echoed: a DSN's password, a console's token
        hide_input_in_errors=True,
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
    # what a runtime does with a run (every runtime, embedded ones included)
    max_checkpoints_per_session: int = 20
    serializer: Serializer = "json"
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    retry_seconds: float = 60.0
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0)
    ui_host: str = "127.0.0.1"
    ui_port: int = Field(default=8765, ge=0, le=65535)
    ui_token: SecretStr | None = Field(default=None, min_length=16)
    signing_key_file: Path | None = None
    signing_key: SecretStr | None = None
    keyring: Path | None = None
    signatures: SignatureMode | None = None
    signature_threads: int = Field(default=1, ge=0, le=64)
    audit_digests: str | None = None
    audit_digest_events: int = Field(default=10_000, ge=1)
    audit_digest_seconds: float = Field(default=3600.0, gt=0)

    @field_validator("kafka_bootstrap", "postgres_dsn")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("max_checkpoints_per_session", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        # a float or a bool is a mistake here, not a count to round
        if isinstance(value, str):
            value = value.strip()
            if value.lstrip("-").isdigit():
                return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"max_checkpoints_per_session must be a whole number (< 1 keeps all), not {value!r}"
            )
        return value

    @field_validator("lease_seconds", "retry_seconds", mode="before")
    @classmethod
    def _seconds(cls, value: Any, info: ValidationInfo) -> float:
        least = _COUNTS.get(info.field_name or "") or 0.0
        number = value
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # not a number: refused below
                number = float(value)
        if (
            isinstance(number, bool)
            or not isinstance(number, int | float)
            or not least <= number <= 86_400
        ):
            raise ValueError(_refusal(info.field_name, value))
        return float(number)

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
        if self.signing_key_file is not None and self.signing_key is not None:
            raise ValueError(
                "both LOOMFLOW_SIGNING_KEY_FILE and LOOMFLOW_SIGNING_KEY are set: give the "
                "signing key once"
            )
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(
                f"pool_min_size ({self.pool_min_size}) is more than pool_max_size "
                f"({self.pool_max_size})"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment: the two places the options come from (no
        ``.env`` file or secrets directory is configured, and asking those two sources
        for nothing cost every Settings() ~1 ms, a runtime's constructor included)."""
        return init_settings, env_settings

    @classmethod
    def resolve(cls, settings: Settings | None = None, **overrides: Any) -> Settings:
        """``settings`` (or a fresh read of the environment) with the non-None overrides."""
        given = {name: value for name, value in overrides.items() if value is not None}
        for name, value in given.items():
            # text is what the environment gives; from code, a number given as text is a slip
            if isinstance(value, str) and name in _COUNTS:
                raise ValueError(_refusal(name, value))
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
    def otel_group(self) -> str:
        """The consumer group of ``loomflow otel`` (its positions in the log)."""
        return f"{self.processor_id}-otel"

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}.events"

    @property
    def snapshots_topic(self) -> str:
        return f"{self.topic_prefix}.snapshots"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}.events.dlq"

    def signer(self, role: Role | None = None) -> Signer | None:
        """The signing key of ``signing_key_file`` or ``signing_key``; None when neither
        is set. Raises :class:`~loomflow.errors.SigningKeyError` naming the setting.

        Given the ``role`` it signs for (events: a writer; digests: the audit), a key that
        the keyring file (``keyring``) does not trust for it now (not held, another role,
        retired) is refused here, as its readers would refuse everything it signs: a
        writer left with its retired key, or the audit given a writer's, would otherwise
        find out only when the log or the digests are checked."""
        loaded = self._signing_key()
        if loaded is None:
            return None
        signer, where = loaded
        refusal = None if role is None else self._untrusted(signer, where, role)
        if refusal is not None:
            raise SigningKeyError(refusal)
        return signer

    def writer_key(self) -> tuple[Signer | None, str | None]:
        """The key a store signs the events it appends with (``signer()``), and why the
        keyring file does not let it sign events now (None: it does, or there is no key
        or no keyring file). The store raises that reason at its first append, not when
        it is made: a process that only reads the log with a key of another role (the
        audit, which signs its digests) is not refused."""
        loaded = self._signing_key()
        if loaded is None:
            return None, self._unsigned()
        signer, where = loaded
        return signer, self._untrusted(signer, where, "events")

    def _unsigned(self) -> str | None:
        """Why a process without a signing key may not append (None: it may): a keyring
        is set and signatures are required (the default then), so every reader would
        refuse its events as forgeries, which the log would keep."""
        if self.keyring is None or (self.signatures or "require") != "require":
            return None
        return (
            f"LOOMFLOW_KEYRING={self.keyring} is set and LOOMFLOW_SIGNATURES is "
            f"{self.signatures or 'unset (so require)'}, but this process has no signing key: "
            "every reader would refuse its events as forgeries. Set LOOMFLOW_SIGNING_KEY_FILE "
            "to a key the keyring trusts for events"
        )

    def _signing_key(self) -> tuple[Signer, str] | None:
        """The signing key, and the setting it came from; None when none is set."""
        if self.signing_key_file is None and self.signing_key is None:
            return None
        from loomflow.schemas.signing import Signer  # and the event models: only to sign

        if self.signing_key_file is not None:
            where = f"LOOMFLOW_SIGNING_KEY_FILE={self.signing_key_file}"
            return Signer.from_file(self.signing_key_file), where
        assert self.signing_key is not None
        text = self.signing_key.get_secret_value()
        return Signer.from_text(text, "LOOMFLOW_SIGNING_KEY"), "LOOMFLOW_SIGNING_KEY"

    def _untrusted(self, signer: Signer, where: str, role: Role) -> str | None:
        """Why the keyring file does not let ``signer`` (set by ``where``) sign ``role``
        now; None when it does, or when no keyring file is set."""
        if self.keyring is None:
            return None
        from loomflow.schemas.clock import utcnow
        from loomflow.schemas.signing import Keyring

        refusal = Keyring.load(self.keyring).refusal(signer.key_id, role, utcnow())
        if refusal is None:
            return None
        return (
            f"{where} cannot sign {role}: {refusal} (LOOMFLOW_KEYRING={self.keyring}), so its "
            "readers would refuse what it signs; set the key the keyring trusts for that"
        )

    def trusted_keys(self) -> Keyring | None:
        """The keys this process trusts: the keyring file's, else the signing key's own
        (for every role); None when neither is set."""
        from loomflow.schemas.signing import Keyring

        if self.keyring is not None:
            return Keyring.load(self.keyring)
        signer = self.signer()
        return None if signer is None else Keyring.of(signer.trusted())

    def signatures_policy(self) -> Signatures:
        """What every reader of the log does with signatures (:class:`Signatures`): the
        keyring file's keys, else the signing key's own; ``signatures`` unset is
        ``require`` when there is either, ``off`` otherwise."""
        from loomflow.schemas.signing import Signatures

        keyring = self.trusted_keys()
        mode = self.signatures or ("off" if keyring is None else "require")
        if mode == "off":
            return Signatures()
        if keyring is None:
            raise SigningKeyError(
                f"LOOMFLOW_SIGNATURES={mode} needs the keys to check against: set "
                "LOOMFLOW_KEYRING (or a signing key, whose own key is then trusted)"
            )
        return Signatures(mode, keyring)

    def describe(self) -> str:
        """Where this process looks, for error messages (the DSN without its password)."""
        return (
            f"Kafka {self.kafka_bootstrap}, topic {self.events_topic}, group "
            f"{self.projector_group}, PostgreSQL schema {self.db_schema}"
        )
