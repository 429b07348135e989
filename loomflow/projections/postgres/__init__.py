"""The PostgreSQL dialect of the log and read model, one module per concern; all of its
SQL is here.

Functions here are coroutines taking an asyncpg connection (and the schema) and run
inside the caller's transaction; the PostgreSQL store, the Kafka projector and rebuild
call them. ``schema``: tables, migrations (the read model's steps, the audit trail's
tables among them, and their runner), the schema's name; ``tables``: how rows map to
columns; ``writes``: its dialect of the apply step (projections/apply.py), folding
batches of events into the log and read model, prune; ``reads``: queries; ``consumers``:
what the log's consumers keep (positions, dead letters, heartbeats, notifications);
``audit``: the audit trail's statements (``PostgresTrail``).
"""

from __future__ import annotations

from loomflow.projections.postgres.consumers import (
    DeadLetterRow,
    Positions,
    ProcessorRow,
    add_dead_letters,
    consumed_topics,
    find_refusal,
    forget_processor,
    list_processors,
    load_positions,
    notify_sessions,
    positions_channel,
    preview,
    printable,
    report_processor,
    save_position,
    save_positions,
    schemas_with_processors,
    sessions_channel,
)
from loomflow.projections.postgres.reads import (
    get_checkpoint,
    get_step,
    holds_events,
    latest_snapshots,
    list_checkpoints,
    list_sessions,
    load_session,
    match_sessions,
    read_events,
    read_transcript,
    session_totals,
    sessions_in_flight,
)
from loomflow.projections.postgres.schema import (
    READ_MODEL,
    SCHEMA_VERSION,
    check_schema,
    check_version,
    connect_error,
    migrate,
    schema_version,
    store_error,
)
from loomflow.projections.postgres.writes import (
    PostgresDialect,
    apply,
    apply_events,
    apply_known,
    commit_round,
    prune,
    remember,
    save_sessions,
)

__all__ = [
    "READ_MODEL",
    "SCHEMA_VERSION",
    "DeadLetterRow",
    "Positions",
    "PostgresDialect",
    "ProcessorRow",
    "add_dead_letters",
    "apply",
    "apply_events",
    "apply_known",
    "check_schema",
    "check_version",
    "commit_round",
    "connect_error",
    "consumed_topics",
    "find_refusal",
    "forget_processor",
    "get_checkpoint",
    "get_step",
    "holds_events",
    "latest_snapshots",
    "list_checkpoints",
    "list_processors",
    "list_sessions",
    "load_positions",
    "load_session",
    "match_sessions",
    "migrate",
    "notify_sessions",
    "positions_channel",
    "preview",
    "printable",
    "prune",
    "read_events",
    "read_transcript",
    "remember",
    "report_processor",
    "save_position",
    "save_positions",
    "save_sessions",
    "schema_version",
    "schemas_with_processors",
    "session_totals",
    "sessions_channel",
    "sessions_in_flight",
    "store_error",
]
