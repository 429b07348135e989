"""Runtimes: where an Agent's events go and where its sessions are restored from.

``PostgresRuntime`` and ``KafkaRuntime`` load on first use: their drivers (asyncpg,
aiokafka) come with the ``[postgres]`` and ``[kafka]`` extras, and an embedded user
imports none of them. The in-process runtime and the journal load on first use too: a
process that makes a SQLite runtime needs neither until it runs something.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loomflow.runtime.base import RestoredState, Runtime
from loomflow.runtime.sqlite import SqliteRuntime, SqliteStore
from loomflow.runtime.store import DatabaseStore, EventStore, PruneResult
from loomflow.runtime.writer import SessionWriter
from loomflow.schemas.scope import ANY_USER, Scope

if TYPE_CHECKING:
    from loomflow.runtime.inproc import InProcRuntime, InProcStore
    from loomflow.runtime.journal import Journal, current_journal
    from loomflow.runtime.kafka import KafkaRuntime, KafkaStore
    from loomflow.runtime.postgres import PostgresRuntime, PostgresStore

__all__ = [
    "ANY_USER",
    "DatabaseStore",
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

#: name -> (module, the extra that installs what it needs)
_LAZY = {
    "KafkaRuntime": ("loomflow.runtime.kafka", "kafka"),
    "KafkaStore": ("loomflow.runtime.kafka", "kafka"),
    "PostgresRuntime": ("loomflow.runtime.postgres", "postgres"),
    "PostgresStore": ("loomflow.runtime.postgres", "postgres"),
}


#: name -> its module, which needs nothing beyond what the embedded runtimes need
_ON_FIRST_USE = {
    "InProcRuntime": "loomflow.runtime.inproc",
    "InProcStore": "loomflow.runtime.inproc",
    "Journal": "loomflow.runtime.journal",
    "current_journal": "loomflow.runtime.journal",
}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        globals()[name] = value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
        return value
    return load_lazily(__name__, name, _LAZY)


def load_lazily(module: str, name: str, lazy: dict[str, tuple[str, str]]) -> Any:
    """The attribute ``name`` of ``module`` from its own module, imported now; an
    ImportError names the extra to install."""
    if name not in lazy:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    source, extra = lazy[name]
    try:
        return getattr(importlib.import_module(source), name)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{name} needs {exc.name!r}, which comes with an extra: "
            f"pip install 'loomflow-durable[{extra}]'",
            name=exc.name,
        ) from exc
