"""loomflow: agent runs that survive crashes, resume without re-billing, and fork."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomflow.errors import (
    CheckpointNotFoundError,
    InvalidIdError,
    LoomflowError,
    OutputValidationError,
    RunBudgetExceededError,
    RunOptionsError,
    RunTakenError,
    SerializationError,
    SessionBusyError,
    SessionNotFoundError,
    SignalRefusedError,
    SignalTimeoutError,
)
from loomflow.runtime import SqliteRuntime

if TYPE_CHECKING:
    from loomflow.agent import (
        Agent,
        RunContext,
        SessionState,
        TextDelta,
        Tool,
        Tuning,
        get_run_context,
        wait_for_signal,
    )
    from loomflow.models.base import Effort
    from loomflow.runtime.inproc import InProcRuntime
    from loomflow.runtime.journal import current_journal
    from loomflow.runtime.kafka import KafkaRuntime
    from loomflow.runtime.postgres import PostgresRuntime
    from loomflow.schemas import (
        Checkpoint,
        CheckpointMeta,
        Message,
        Role,
        RunResult,
        ToolCall,
        Usage,
        new_id,
    )

    #: the version of the installed distribution (loomflow-durable), as ``loomflow
    #: --version`` reports it; read from its metadata on first use
    __version__: str

__all__ = [
    "Agent",
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointNotFoundError",
    "Effort",
    "InProcRuntime",
    "InvalidIdError",
    "KafkaRuntime",
    "LoomflowError",
    "Message",
    "OutputValidationError",
    "PostgresRuntime",
    "Role",
    "RunBudgetExceededError",
    "RunContext",
    "RunOptionsError",
    "RunResult",
    "RunTakenError",
    "SerializationError",
    "SessionBusyError",
    "SessionNotFoundError",
    "SessionState",
    "SignalRefusedError",
    "SignalTimeoutError",
    "SqliteRuntime",
    "TextDelta",
    "Tool",
    "ToolCall",
    "Tuning",
    "Usage",
    "current_journal",
    "get_run_context",
    "new_id",
    "wait_for_signal",
]


#: names loaded when first used: the agent loop, its tools' schema generation and the
#: model adapters are a third of ``import loomflow``, which a process that opens a runtime
#: (a reader, a worker's store, the console) does not need; nor does it need the
#: in-process runtime, the journal or the models of the transcript until it runs something
_ON_FIRST_USE = {
    "Checkpoint": "loomflow.schemas",
    "CheckpointMeta": "loomflow.schemas",
    "Message": "loomflow.schemas",
    "Role": "loomflow.schemas",
    "RunResult": "loomflow.schemas",
    "ToolCall": "loomflow.schemas",
    "Usage": "loomflow.schemas",
    "new_id": "loomflow.schemas",
    "Agent": "loomflow.agent",
    "RunContext": "loomflow.agent",
    "SessionState": "loomflow.agent",
    "TextDelta": "loomflow.agent",
    "Tool": "loomflow.agent",
    "Tuning": "loomflow.agent",
    "get_run_context": "loomflow.agent",
    "wait_for_signal": "loomflow.agent",
    "Effort": "loomflow.models.base",
    "InProcRuntime": "loomflow.runtime.inproc",
    "current_journal": "loomflow.runtime.journal",
}


def __getattr__(name: str) -> Any:
    """The names above, ``KafkaRuntime`` and ``PostgresRuntime`` load on first use (see
    loomflow.runtime), and ``__version__`` is read from the distribution's metadata
    then."""
    if name == "__version__":
        globals()["__version__"] = version = _version()  # read once
        return version
    if name in _ON_FIRST_USE:
        import importlib

        globals()[name] = value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
        return value
    from loomflow.runtime import _LAZY, load_lazily

    return load_lazily(__name__, name, _LAZY)


def _version() -> str:
    """The installed distribution's version; ``0+unknown`` when this package runs from a
    tree that was never installed (no metadata to read)."""
    from importlib import metadata

    try:
        return metadata.version("loomflow-durable")
    except metadata.PackageNotFoundError:
        return "0+unknown"
