"""Runtimes: where an Agent's events go and where its sessions are restored from."""

from loomflow.runtime.base import (
    ANY_USER,
    EventStore,
    Journal,
    PruneResult,
    RestoredState,
    Runtime,
    Scope,
    SessionWriter,
    current_journal,
)
from loomflow.runtime.inproc import InProcRuntime, InProcStore
from loomflow.runtime.kafka import KafkaRuntime, KafkaStore
from loomflow.runtime.postgres import PostgresRuntime, PostgresStore
from loomflow.runtime.sqlite import SqliteRuntime, SqliteStore

__all__ = [
    "ANY_USER",
    "EventStore",
    "InProcRuntime",
    "InProcStore",
    "Journal",
    "KafkaRuntime",
    "KafkaStore",
    "PostgresRuntime",
    "PostgresStore",
    "PruneResult",
    "RestoredState",
    "Runtime",
    "Scope",
    "SessionWriter",
    "SqliteRuntime",
    "SqliteStore",
    "current_journal",
]
