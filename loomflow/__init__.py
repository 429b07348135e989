"""loomflow: agent runs that survive crashes, resume without re-billing, and fork."""

from loomflow.agent import Agent, SessionState, Tool, Tuning
from loomflow.errors import (
    CheckpointNotFoundError,
    InvalidIdError,
    LoomflowError,
    SerializationError,
)
from loomflow.runtime import (
    InProcRuntime,
    KafkaRuntime,
    PostgresRuntime,
    SqliteRuntime,
    current_journal,
)
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

__all__ = [
    "Agent",
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointNotFoundError",
    "InProcRuntime",
    "InvalidIdError",
    "KafkaRuntime",
    "LoomflowError",
    "Message",
    "PostgresRuntime",
    "Role",
    "RunResult",
    "SerializationError",
    "SessionState",
    "SqliteRuntime",
    "Tool",
    "ToolCall",
    "Tuning",
    "Usage",
    "current_journal",
    "new_id",
]
