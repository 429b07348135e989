"""One way to read a log: its records in order, with their positions, from Kafka or SQLite.

Audit, analytics, tail and the CLI are written once against :class:`LogReader`, so the
embedded default (a SQLite file) gets every consumer a Kafka user gets.

- :func:`sqlite_reader` reads the ``loomflow_events`` table of a SQLite log by position,
  with the notes ``store.prune`` leaves where it deleted rows (the queries are the SQLite
  dialect's, ``projections/sqlite/reads.py``). A consumer keeps its own position (in its
  own database, with what it wrote) and passes it back as ``start``.
- :func:`kafka_reader` reads the events topic, as a member of a consumer group whose
  committed offsets are its positions (``commit()``), or with no group, from the
  beginning or the end (``loomflow tail``).

A record that does not decode is returned with ``event=None`` and the reason, never
raised: no consumer stops on one bad record. Each reader applies the one rule of
signatures its ``signatures`` give (:class:`~loomflow.schemas.signing.Signatures`, the
settings' ``signatures_policy()`` where a command opens it): with ``require`` an event
whose signature does not hold comes back refused as such a record (``event=None``, its
reason in ``error``, its bytes in ``raw``), so every consumer skips it; with ``check``
it comes back with its ``signature_problem`` marked, for the consumer to count.
"""

from __future__ import annotations

import asyncio
import sqlite3
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson

from loomflow.errors import CorruptRecordError, InvalidEventError, SignatureError, StoreError
from loomflow.lifecycle import Resource
from loomflow.projections import sqlite as sql
from loomflow.schemas import Event
from loomflow.schemas.signing import NO_SIGNATURES, Signatures

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

    from loomflow.settings import Settings

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

T = TypeVar("T")

#: how often a reader of a SQLite log looks for new rows while it waits (SQLite cannot
#: notify another process; ``PRAGMA data_version`` makes each look cost one read)
_SQLITE_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class PruneNote:
    """``store.prune`` deleted log rows of a session (embedded logs; Kafka's log keeps
    its records, and prune appends events there instead)."""

    user_id: str | None
    session_id: str
    #: the deleted rows' seqs, or None for every row of the session through ``through_seq``
    seqs: tuple[int, ...] | None
    through_seq: int
    at: datetime


@dataclass(frozen=True)
class LogRecord:
    """One record of a log, at its position."""

    partition: int  # 0 in a SQLite log
    offset: int  # a SQLite log's position
    #: None when the record does not decode (``error`` says why) or is a note
    event: Event | None
    error: str | None = None
    note: PruneNote | None = None
    #: the bytes as stored, for records that did not decode
    raw: bytes | None = None
    #: False in a log with one sequence of positions (SQLite)
    partitioned: bool = True
    #: why the event's signature does not hold (None: it does, or none is checked); with
    #: signatures required the record is refused (``event`` None, ``error`` this too)
    signature_problem: str | None = None

    @property
    def position(self) -> str:
        """Where the record is, as a person would name it: ``12`` or ``3:1204``."""
        return f"{self.partition}:{self.offset}" if self.partitioned else str(self.offset)


class LogReader(Resource):
    """Records of one log in order (per partition), with their positions."""

    #: what is read, for messages: "SQLite log journal.db", "Kafka topic x (group g)"
    source: str
    #: True when a consumer keeps its position itself, with what it writes (a SQLite log
    #: has no groups); False when ``commit()`` keeps it in the log (a Kafka group)
    consumer_keeps_position: bool = True
    #: True when the log deletes records (an embedded log's prune and erasure), so that
    #: a consumer may find a session's seqs skipping; Kafka's log only ever appends
    removes_records: bool = False

    @abstractmethod
    async def read(self, wait: float = 1.0, max_records: int = 1000) -> list[LogRecord]:
        """The next records; an empty list when none arrived within ``wait`` seconds."""

    @abstractmethod
    def next_positions(self) -> dict[int, int]:
        """Partition -> the offset of the next record to read."""

    async def commit(self) -> None:
        """Record that every record read so far is handled (Kafka: the group's offsets).

        A SQLite log has no groups: its consumers keep their position themselves."""

    @abstractmethod
    async def at_end(self) -> bool:
        """Whether every record in the log when called has been returned by ``read``."""


def _signed(record: LogRecord, signatures: Signatures, raw: Callable[[], bytes]) -> LogRecord:
    """The record as the rule of ``signatures`` leaves it: as it is, marked with its
    signature's problem (``check``), or refused with it like a record that does not
    decode (``require``; ``raw`` gives its bytes)."""
    if record.event is None or signatures.mode == "off":
        return record
    try:
        problem = signatures.check(record.event)
    except SignatureError as exc:
        return replace(
            record, event=None, error=exc.reason, raw=raw(), signature_problem=exc.reason
        )
    return record if problem is None else replace(record, signature_problem=problem)


async def drain(reader: LogReader, max_records: int = 1000) -> AsyncIterator[list[LogRecord]]:
    """Batches of records until the reader has caught up with the log as it was."""
    while True:
        batch = await reader.read(wait=0.2, max_records=max_records)
        if batch:
            yield batch
        elif await reader.at_end():
            return


# -- SQLite -------------------------------------------------------------------------------


def sqlite_reader(
    path: str | Path,
    *,
    start: Literal["beginning", "end"] | dict[int, int] = "beginning",
    signatures: Signatures = NO_SIGNATURES,
) -> LogReader:
    """A reader of the SQLite log at ``path``; ``start`` is a position kept by the
    consumer (``{0: next_position}``, as ``next_positions()`` returned it); what it does
    with events' signatures, ``signatures`` says (by default nothing)."""
    return _SqliteReader(Path(path), start, signatures)


class _SqliteReader(LogReader):
    removes_records = True

    def __init__(
        self,
        path: Path,
        start: Literal["beginning", "end"] | dict[int, int],
        signatures: Signatures,
    ) -> None:
        self.path = path
        self.source = f"SQLite log {path}"
        self._start = start
        self._signatures = signatures
        self._after = 0 if not isinstance(start, dict) else start.get(0, 1) - 1
        self._thread = sql.SqliteThread(self._connect, f"the reader of {path}")

    def _connect(self) -> sqlite3.Connection:
        conn = _open_log(self.path)
        if self._start == "end":
            self._after = sql.last_position(conn)
        return conn

    async def open(self) -> None:
        await self._thread.call(lambda conn: None)

    async def close(self) -> None:
        await self._thread.close()

    async def read(self, wait: float = 1.0, max_records: int = 1000) -> list[LogRecord]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            records = await self._thread.call(self._fetch, max_records)
            if records or loop.time() >= deadline:
                return records
            await asyncio.sleep(min(_SQLITE_POLL_SECONDS, max(0.0, deadline - loop.time())))

    def _fetch(self, conn: sqlite3.Connection, limit: int) -> list[LogRecord]:
        rows, notes = sql.log_rows_after(conn, self._after, limit)
        records = sorted(
            [_event_record(row, self._signatures) for row in rows]
            + [_note_record(row) for row in notes],
            key=lambda r: r.offset,
        )[:limit]
        if records:
            self._after = records[-1].offset
        return records

    def next_positions(self) -> dict[int, int]:
        return {0: self._after + 1}

    async def at_end(self) -> bool:
        return self._after >= await self._thread.call(sql.last_position)


def _open_log(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise StoreError(f"no loomflow log at {path}: give the file a SqliteRuntime writes to")
    # never create or take over a file that is not a loomflow store: reading writes nothing
    return sql.connect(path, busy_timeout_ms=30_000, create=False)


async def require_log(path: str | Path) -> None:
    """Raise StoreError unless ``path`` is a loomflow SQLite log; for commands to call
    before they create anything beside it (a trail, a stats database)."""
    await asyncio.to_thread(lambda: _open_log(Path(path)).close())


def _row_bytes(columns: str, row: Sequence[Any]) -> bytes:
    """A row as JSON of its columns (bytes as escaped text): what a refused row keeps."""
    return orjson.dumps(
        dict(zip(columns.split(", "), row, strict=True)),
        default=lambda value: (
            value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else repr(value)
        ),
    )


def _unreadable(columns: str, row: Sequence[Any], error: str) -> LogRecord:
    """A row that does not decode, kept as JSON of its columns."""
    raw = _row_bytes(columns, row)
    return LogRecord(0, row[0], None, error=error, raw=raw, partitioned=False)


def _event_record(row: Sequence[Any], signatures: Signatures) -> LogRecord:
    try:
        event = sql.decode_event_row(row)
    except CorruptRecordError as exc:
        return _unreadable(sql.EVENT_COLUMNS, row, str(exc))
    record = LogRecord(0, row[0], event, partitioned=False)
    return _signed(record, signatures, lambda: _row_bytes(sql.EVENT_COLUMNS, row))


def _note_record(row: Sequence[Any]) -> LogRecord:
    position, user_id, session_id, seqs, through_seq, at = row
    try:
        # another program's row holds whatever SQLite keeps; a note is only what prune
        # writes (a value of another type failed the audit's chaining of it)
        if not (user_id is None or isinstance(user_id, str)) or not isinstance(session_id, str):
            raise TypeError(f"scope ({user_id!r}, {session_id!r}) is not text")
        if type(through_seq) is not int:
            raise TypeError(f"through_seq {through_seq!r} is not an integer")
        listed = None if seqs is None else orjson.loads(seqs)
        if listed is not None and not (
            isinstance(listed, list) and all(type(seq) is int for seq in listed)
        ):
            raise TypeError(f"seqs {seqs!r} is not a list of integers")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(f"at {at!r} has no time zone")
        note = PruneNote(
            user_id=user_id or None,
            session_id=session_id,
            seqs=None if listed is None else tuple(listed),
            through_seq=through_seq,
            at=when,
        )
    except (ValueError, TypeError) as exc:
        return _unreadable(sql.NOTE_COLUMNS, row, f"prune note {position} does not decode: {exc}")
    return LogRecord(0, position, None, note=note, partitioned=False)


# -- Kafka --------------------------------------------------------------------------------


def kafka_reader(
    settings: Settings | None = None,
    *,
    group: str | None,
    start: Literal["committed", "beginning", "end"] | dict[int, int] = "committed",
    signatures: Signatures = NO_SIGNATURES,
) -> LogReader:
    """A reader of the events topic the settings name.

    With a ``group`` it joins that consumer group and starts at the group's committed
    offsets (the beginning when it has none); ``commit()`` moves them. With no group it
    reads every partition from the ``beginning``, the ``end``, or the positions its
    consumer kept (partition -> next offset, as ``next_positions()`` gave them; a
    partition not named from its beginning). What it does with events' signatures,
    ``signatures`` says (by default nothing).
    """
    from loomflow.settings import Settings

    settings = Settings.resolve(settings)
    if group is None and start == "committed":
        raise ValueError("a reader with no consumer group starts at 'beginning' or 'end'")
    if group is not None and start != "committed":
        raise ValueError("a consumer group starts at its committed offsets")
    return _KafkaReader(settings, group, start, signatures)


class _KafkaReader(LogReader):
    def __init__(
        self,
        settings: Settings,
        group: str | None,
        start: Literal["committed", "beginning", "end"] | dict[int, int],
        signatures: Signatures,
    ) -> None:
        self.settings = settings
        self._signatures = signatures
        self.group = group
        self.topic = settings.events_topic
        self.source = f"Kafka topic {self.topic}" + (f" (group {group})" if group else "")
        self.consumer_keeps_position = group is None
        self._start = start
        self._consumer: AIOKafkaConsumer | None = None
        self._next: dict[int, int] = {}

    async def open(self) -> None:
        if self._consumer is not None:
            return
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from loomflow.producers.topics import started
        from loomflow.schemas.events import MAX_EVENT_BYTES

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="latest" if self._start == "end" else "earliest",
            max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
            fetch_max_wait_ms=100,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            rebalance_timeout_ms=10_000,
        )
        self._consumer = await started(consumer, self.settings.kafka_bootstrap)
        # a missing topic, said plainly, before a group waits for it forever
        partitions = await self._partitions()
        if self.group is not None:
            consumer.subscribe([self.topic])
            return
        tps = [TopicPartition(self.topic, p) for p in partitions]
        consumer.assign(tps)
        if self._start == "end":
            await consumer.seek_to_end(*tps)
        else:
            await consumer.seek_to_beginning(*tps)
        if isinstance(self._start, dict):
            for tp in tps:
                if tp.partition in self._start:
                    consumer.seek(tp, self._start[tp.partition])
        # where it starts is its position too: a consumer that keeps it and gives it back
        # before this reader read anything must not start again from the beginning
        self._next = {tp.partition: await consumer.position(tp) for tp in tps}

    async def _partitions(self) -> list[int]:
        assert self._consumer is not None
        partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            await self._consumer._client.force_metadata_update()
            partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            raise StoreError(
                f"topic {self.topic} does not exist on {self.settings.kafka_bootstrap}: "
                "nothing has written to it yet (or LOOMFLOW_TOPIC_PREFIX differs). The "
                "readers of the log read a SQLite log (--db) or a Kafka log; a "
                "PostgresRuntime's log in PostgreSQL is not one they read yet"
            )
        return sorted(partitions)

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def read(self, wait: float = 1.0, max_records: int = 1000) -> list[LogRecord]:
        await self.open()
        assert self._consumer is not None
        fetched = await self._consumer.getmany(timeout_ms=int(wait * 1000), max_records=max_records)
        records = []
        for tp, batch in sorted(fetched.items(), key=lambda item: item[0].partition):
            for record in batch:
                records.append(_kafka_record(record, self._signatures))
            if batch:
                self._next[tp.partition] = batch[-1].offset + 1
        return records

    def next_positions(self) -> dict[int, int]:
        return dict(self._next)

    async def commit(self) -> None:
        if self.group is None or not self._next or self._consumer is None:
            return
        from aiokafka import TopicPartition

        assigned = {tp.partition for tp in self._consumer.assignment()}
        offsets = {
            TopicPartition(self.topic, p): offset
            for p, offset in self._next.items()
            if p in assigned  # a partition another member took is no longer ours to commit
        }
        if offsets:
            await self._consumer.commit(offsets)

    async def at_end(self) -> bool:
        await self.open()
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        if not assigned:
            return False  # still joining its group
        ends = await self._consumer.end_offsets(list(assigned))
        for tp, end in ends.items():
            if await self._consumer.position(tp) < end:
                return False
        return True


def _kafka_record(record: Any, signatures: Signatures) -> LogRecord:
    from loomflow.log.records import decode_record

    try:
        event, _ = decode_record(record)
    except InvalidEventError as exc:
        return LogRecord(record.partition, record.offset, None, error=exc.reason, raw=record.value)
    read = LogRecord(record.partition, record.offset, event)
    return _signed(read, signatures, lambda: bytes(record.value))


async def committed_offsets(settings: Settings, group: str) -> dict[int, int]:
    """The offsets a consumer group has committed on the events topic (partition -> next
    offset), read without joining the group."""
    from aiokafka.admin import AIOKafkaAdminClient

    from loomflow.producers.topics import started

    admin = await started(
        AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap), settings.kafka_bootstrap
    )
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {
        tp.partition: meta.offset
        for tp, meta in offsets.items()
        if tp.topic == settings.events_topic and meta.offset >= 0
    }
