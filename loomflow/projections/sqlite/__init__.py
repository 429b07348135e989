"""The SQLite dialect of the log and read model, one module per concern.

Functions here are synchronous and take a ``sqlite3.Connection``; the SQLite store calls
them on its own thread (or commits on the event loop's, see SqliteStore). The transcript
is not copied into the read model: the log table in the same file already holds every
turn's messages. ``schema``: opening the file, tables, migrations, the WAL; ``tables``:
how rows map to columns; ``writes``: its dialect of the apply step (projections/apply.py),
rounds of appends folded into the log and read model, prune; ``reads``: queries;
``thread``: a connection on a thread of its own, for the store and the consumers of an
embedded log.
"""

from __future__ import annotations

from loomflow.projections.sqlite.reads import (
    fetch_log_rows,
    get_checkpoint,
    get_step,
    list_checkpoints,
    list_sessions,
    load_session,
    read_events,
    read_transcript,
    sessions_in_flight,
)
from loomflow.projections.sqlite.schema import (
    SCHEMA_VERSION,
    OpenedFile,
    checkpoint_wal,
    connect,
    connect_direct,
    is_busy,
    migrate,
)
from loomflow.projections.sqlite.tables import EVENT_COLUMNS, decode_event_row, ts
from loomflow.projections.sqlite.thread import SqliteThread, open_own
from loomflow.projections.sqlite.writes import (
    KnownRows,
    SqliteDialect,
    apply,
    apply_events,
    commit_round,
    insert_event,
    prune,
    save_session,
)

__all__ = [
    "EVENT_COLUMNS",
    "SCHEMA_VERSION",
    "KnownRows",
    "OpenedFile",
    "SqliteDialect",
    "SqliteThread",
    "apply",
    "apply_events",
    "checkpoint_wal",
    "commit_round",
    "connect",
    "connect_direct",
    "decode_event_row",
    "fetch_log_rows",
    "get_checkpoint",
    "get_step",
    "insert_event",
    "is_busy",
    "list_checkpoints",
    "list_sessions",
    "load_session",
    "migrate",
    "open_own",
    "prune",
    "read_events",
    "read_transcript",
    "save_session",
    "sessions_in_flight",
    "ts",
]
