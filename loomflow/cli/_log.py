"""What the commands that read the log share: where the log is, and how to open it.

``--db PATH`` names an embedded log (a SQLite file a ``SqliteRuntime`` writes); without
it a command reads the Kafka topic and the PostgreSQL schema the ``LOOMFLOW_*`` settings
name, as ``loomflow processor`` does.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from loomflow.log.reader import LogReader
    from loomflow.projections.audit import Trail
    from loomflow.settings import Settings

__all__ = [
    "add_db_option",
    "count",
    "quiet_kafka",
    "reader_of",
    "settings_unless_db",
    "trail_of",
    "user_of",
]


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        type=Path,
        metavar="PATH",
        help="an embedded log (the SQLite file of a SqliteRuntime); without it, the Kafka "
        "topic and PostgreSQL schema of the LOOMFLOW_* settings",
    )


def user_of(text: str | None) -> str | None:
    """A --user value: an id, or None (the sessions of no user) for ''."""
    return text or None


def quiet_kafka() -> None:
    """Keep aiokafka's own log lines (a reconnect, a missing topic) out of a one-shot
    command's output: the command says what went wrong itself, once."""
    import logging

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``."""
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def settings_unless_db(db: Path | None) -> tuple[bool, Settings | None]:
    """Whether the command can go on, and the LOOMFLOW_* settings it reads (None for an
    embedded log, which needs none); invalid settings were reported."""
    if db is not None:
        return True, None
    from loomflow.cli import _settings

    settings = _settings()
    return settings is not None, settings


def reader_of(
    db: Path | None,
    settings: Settings | None,
    *,
    group: str | None = None,
    start: Literal["beginning", "end", "committed"] | dict[int, int] = "beginning",
) -> LogReader:
    """The reader of the embedded log ``db``, or of the settings' Kafka topic."""
    from loomflow.log.reader import kafka_reader, sqlite_reader

    if db is not None:
        if start == "committed":
            raise ValueError("an embedded log keeps no group positions")
        return sqlite_reader(db, start=start)
    if isinstance(start, dict):
        raise ValueError("a Kafka reader starts at its group's offsets")
    return kafka_reader(settings, group=group, start=start)


def trail_of(
    db: Path | None, trail: Path | None, settings: Settings | None, *, create: bool = True
) -> Trail:
    """The audit trail of the embedded log ``db`` (a file beside it unless ``trail`` names
    one), or the trail in the settings' PostgreSQL schema; ``create=False`` only opens an
    embedded trail that exists."""
    from loomflow.projections.audit import PostgresTrail, SqliteTrail, default_trail_path
    from loomflow.runtime.postgres import PostgresStore
    from loomflow.settings import Settings

    if db is not None:
        return SqliteTrail(trail or default_trail_path(db), create=create)
    settings = Settings.resolve(settings)
    store = PostgresStore.from_settings(settings, max_size=2)
    where = f"audit trail in PostgreSQL schema {settings.db_schema}"
    return PostgresTrail(store._call, where, on_close=store.close)
