"""The SQLite dialect of the log and read model, and of the files beside an embedded log
(its audit trail, its stats database), one module per concern; all of its SQL is here.

Functions here are synchronous and take a ``sqlite3.Connection``; the SQLite store calls
them on its own thread (or commits on the event loop"s, see SqliteStore). The transcript
is not copied into the read model: the log table in the same file already holds every
turn"s messages. ``schema``: opening the files, the journal"s tables, the one runner of
every file"s migrations (``projections/migrations.py``), the WAL; ``tables``: how rows
map to columns; ``writes``: its dialect of the apply step (projections/apply.py), rounds
of appends folded into the log and read model, prune; ``reads``: queries, the log"s
reader"s among them; ``thread``: a connection on a thread of its own, for the store and
the consumers of an embedded log; ``audit``: the audit trail"s file (``SqliteTrail``);
``stats``: the stats database"s tables and statements.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomflow.projections.sqlite.reads import (
        get_checkpoint,
        get_step,
        last_position,
        list_checkpoints,
        list_sessions,
        load_session,
        log_rows_after,
        read_events,
        read_transcript,
        session_totals,
        sessions_in_flight,
    )
    from loomflow.projections.sqlite.schema import (
        JOURNAL,
        SCHEMA_VERSION,
        OpenedFile,
        checkpoint_wal,
        connect,
        connect_direct,
        connect_own,
        immediate,
        is_busy,
        migrate,
        open_own,
        stored_version,
    )
    from loomflow.projections.sqlite.tables import EVENT_COLUMNS, NOTE_COLUMNS, decode_event_row, ts
    from loomflow.projections.sqlite.thread import SqliteThread
    from loomflow.projections.sqlite.writes import (
        INSERT_EVENT,
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
    "INSERT_EVENT",
    "JOURNAL",
    "NOTE_COLUMNS",
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
    "connect_own",
    "decode_event_row",
    "get_checkpoint",
    "get_step",
    "immediate",
    "insert_event",
    "is_busy",
    "last_position",
    "list_checkpoints",
    "list_sessions",
    "load_session",
    "log_rows_after",
    "migrate",
    "open_own",
    "prune",
    "read_events",
    "read_transcript",
    "save_session",
    "session_totals",
    "sessions_in_flight",
    "stored_version",
    "ts",
]

#: the module of each name: loaded when the name is first asked for, so that a store opening no
#: file yet (``SqliteRuntime(path)``) loads neither the fold nor the reads and writes
_MODULES = {
    "get_checkpoint": "reads",
    "get_step": "reads",
    "last_position": "reads",
    "list_checkpoints": "reads",
    "list_sessions": "reads",
    "load_session": "reads",
    "log_rows_after": "reads",
    "read_events": "reads",
    "read_transcript": "reads",
    "session_totals": "reads",
    "sessions_in_flight": "reads",
    "JOURNAL": "schema",
    "OpenedFile": "schema",
    "SCHEMA_VERSION": "schema",
    "checkpoint_wal": "schema",
    "connect": "schema",
    "connect_direct": "schema",
    "connect_own": "schema",
    "immediate": "schema",
    "is_busy": "schema",
    "migrate": "schema",
    "open_own": "schema",
    "stored_version": "schema",
    "EVENT_COLUMNS": "tables",
    "NOTE_COLUMNS": "tables",
    "decode_event_row": "tables",
    "ts": "tables",
    "SqliteThread": "thread",
    "INSERT_EVENT": "writes",
    "KnownRows": "writes",
    "SqliteDialect": "writes",
    "apply": "writes",
    "apply_events": "writes",
    "commit_round": "writes",
    "insert_event": "writes",
    "prune": "writes",
    "save_session": "writes",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # found directly from now on
    return value
