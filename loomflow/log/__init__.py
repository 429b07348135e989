"""Reading the log: its records in order, with their positions, from SQLite or Kafka.

``reader`` is the one :class:`LogReader` every consumer is written against (the SQLite
event table by position, through the SQLite dialect's queries, and the Kafka topic as a
consumer group); ``records`` decodes a
Kafka record into its event; ``apps`` configures every faust app of ours the same way.
"""

from loomflow.log.reader import (
    LogReader,
    LogRecord,
    PruneNote,
    committed_offsets,
    drain,
    kafka_reader,
    require_log,
    sqlite_reader,
)

__all__ = [
    "LogReader",
    "LogRecord",
    "PruneNote",
    "committed_offsets",
    "drain",
    "kafka_reader",
    "require_log",
    "sqlite_reader",
]
