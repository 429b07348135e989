"""The log-reader conformance suite: what every :class:`loomflow.log.LogReader` gives
the consumers written against it (audit, analytics, tail, the CLI), whatever log it reads.

Events are appended through the log's own store (:meth:`ReadableLog.store`) as
:class:`~loomflow.testing.SessionLog` makes them, so what a reader returns can be held
against what was written: every record once, in log order, at positions that only
grow; a consumer's position given back resumes right after what it handled; a record
that does not decode is returned with its reason, never raised; ``drain`` ends once the
reader caught up with the log as it was; and what ``erase`` and ``prune`` leave for a
reader that had passed the session's records, and for one that reads the log anew.

A log is what a subclass gives as the fixture ``log``: a :class:`ReadableLog`, or an
:class:`AuditedLog` (one the audit also reads) for the trail suite,
:mod:`loomflow.testing.trail`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import ClassVar, Literal

import pytest
import pytest_asyncio

from loomflow.log import LogReader, LogRecord, PruneNote, drain
from loomflow.projections.audit import Trail
from loomflow.runtime import EventStore, Scope
from loomflow.schemas import CheckpointsPruned, CheckpointWritten, Event, SessionErased
from loomflow.schemas.signing import NO_SIGNATURES, Signatures
from loomflow.testing._support import Opened, Suite, commit, required_fixture
from loomflow.testing.store import SessionLog

__all__ = [
    "AuditedLog",
    "LogReaderConformance",
    "LogSuite",
    "ReadableLog",
    "Start",
    "read_all",
]

#: where a new reader starts (see :meth:`ReadableLog.reader`)
Start = Literal["beginning", "end", "committed"] | dict[int, int]

#: how long the suite waits for a reader to catch up before it fails the test
_WITHIN = 60.0


class ReadableLog(ABC):
    """A log on the test's storage, as the reader suite writes to it and reads it.

    Each call opens something new on the same log; the suite closes what it opened.
    The class attributes say what the log does where logs differ.
    """

    #: ``erase`` and ``prune`` delete the session's records from the log (an embedded
    #: log): a reader that reads it anew no longer meets them, and ``prune`` leaves a
    #: :class:`~loomflow.log.PruneNote` at the next position instead. False: the log keeps
    #: every record (Kafka), and ``erase`` and ``prune`` append events to it.
    deletes_records: ClassVar[bool] = True
    #: a new reader can start at the end of the log (``start="end"``); False: the log's
    #: readers refuse it with ValueError (a consumer group starts where it committed)
    starts_at_end: ClassVar[bool] = True

    @abstractmethod
    def store(self) -> EventStore:
        """A store whose appends, erasures and prunes go to this log (a runtime's)."""

    @abstractmethod
    def reader(self, start: Start) -> LogReader:
        """A new reader of this log, starting at:

        - ``"beginning"``: the log's first record, for a new consumer (a reader in a
          consumer group: a group that never committed);
        - ``"end"``: right after the log's last record (see ``starts_at_end``);
        - a dict: the positions a consumer kept, as ``next_positions()`` returned them
          (readers whose consumer keeps its position);
        - ``"committed"``: where the consumer of the reader opened before this one
          committed (readers whose position the log keeps: ``commit()``).
        """

    @abstractmethod
    async def write_undecodable(self, scope: Scope) -> None:
        """Put into the log, among ``scope``'s records, one record that does not decode
        (bytes that are not JSON, a row of an unknown event type): what no writer of
        ours makes, but a damaged row or another program's record is."""

    # what someone who can write to the log's storage does behind its stores' backs (the
    # audit suite's attacks)

    @abstractmethod
    async def forge(self, event: Event) -> None:
        """Put ``event`` into the log as it is, as no store of ours writes it: a row
        inserted with the file open in another program, a record produced to the topic."""

    async def cut(self, scope: Scope, seqs: Sequence[int]) -> None:
        """Delete ``scope``'s records at ``seqs`` from the log (a log that can lose
        records: ``deletes_records``); a log that keeps every record refuses."""
        raise NotImplementedError(f"{type(self).__name__} keeps every record")

    async def rewrite(self, event: Event) -> None:
        """Replace the record of ``event``'s session and seq with ``event`` (a log that can
        lose records: ``deletes_records``); a log that keeps every record refuses."""
        raise NotImplementedError(f"{type(self).__name__} keeps every record")


class AuditedLog(ReadableLog):
    """A log as the audit consumer reads it: where the audit resumes, how far it got."""

    @abstractmethod
    async def audit_reader(self, trail: Trail, signatures: Signatures = NO_SIGNATURES) -> LogReader:
        """The audit's reader, where the audit of ``trail`` left off: at the position
        the trail keeps (``trail.position()``, a log whose consumers keep theirs), or
        where the audit's consumer group committed; it applies ``signatures``."""

    @abstractmethod
    async def audited(self, trail: Trail) -> dict[int, int]:
        """How far the audit of ``trail`` got (partition -> next offset), as
        ``audit verify`` hands it to :func:`~loomflow.audit.verify_trail`."""

    def fresh_reader(self) -> LogReader:
        """A reader of the whole log, for the verification to read it again."""
        return self.reader("beginning")


async def read_all(reader: LogReader, max_records: int = 1000) -> list[LogRecord]:
    """Every record ``drain`` gives until the reader caught up; fails after a minute."""

    async def drained() -> list[LogRecord]:
        return [r async for batch in drain(reader, max_records) for r in batch]

    return await asyncio.wait_for(drained(), _WITHIN)


async def _read_some(reader: LogReader, at_least: int, max_records: int) -> list[LogRecord]:
    """Batches of ``max_records`` until at least ``at_least`` records came."""
    records: list[LogRecord] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _WITHIN
    while len(records) < at_least:
        assert loop.time() < deadline, f"{len(records)} of {at_least} records within a minute"
        batch = await reader.read(wait=0.5, max_records=max_records)
        assert len(batch) <= max_records
        records += batch
    return records


def _ids(records: Sequence[LogRecord]) -> list[str]:
    return [r.event.event_id for r in records if r.event is not None]


def _of(records: Sequence[LogRecord], scope: Scope) -> list[LogRecord]:
    """The records of one session, events and notes."""
    return [r for r in records if _scope(r) == scope]


def _scope(record: LogRecord) -> Scope | None:
    if record.event is not None:
        return Scope(record.event.session_id, record.event.user_id)
    if record.note is not None:
        return Scope(record.note.session_id, record.note.user_id)
    return None


def _assert_in_log_order(records: Sequence[LogRecord], written: Sequence[Event]) -> None:
    """``records`` are ``written``, each once, and each partition in the order written."""
    assert sorted(_ids(records)) == sorted(e.event_id for e in written)
    assert all(r.event is not None and r.error is None and r.note is None for r in records)
    landed = {r.event.event_id: r.partition for r in records if r.event is not None}
    by_partition: dict[int, list[LogRecord]] = defaultdict(list)
    for record in records:
        by_partition[record.partition].append(record)
    for partition, held in by_partition.items():
        offsets = [r.offset for r in held]
        assert offsets == sorted(set(offsets)), f"partition {partition} read out of order"
        assert [r.event for r in held] == [e for e in written if landed[e.event_id] == partition]
    # one session's records are in one partition, in its order
    for scope in {Scope(e.session_id, e.user_id) for e in written}:
        assert len({r.partition for r in _of(records, scope)}) == 1, scope


class LogSuite(Suite):
    """What both log suites share: the fixture ``log`` they read, and a store writing it."""

    @pytest_asyncio.fixture
    async def store(self, log: ReadableLog) -> AsyncIterator[EventStore]:
        """The store that writes the test's events, opened (so the log exists)."""
        opened = Opened(log.store)
        made = opened()
        await made.open()
        yield made
        await opened.close_all()


class LogReaderConformance(LogSuite):
    """Subclass in a test module and define the fixture ``log``: a :class:`ReadableLog`
    on the test's storage (its class attributes say what the log does where logs differ).
    """

    log = required_fixture("log", "ReadableLog", factory=False)

    @pytest_asyncio.fixture
    async def new_reader(self, log: ReadableLog) -> AsyncIterator[Opened[LogReader]]:
        """``log.reader``, closing what it opened when the test ends."""
        opened = Opened(log.reader)
        yield opened
        await opened.close_all()

    async def resumed(self, reader: LogReader, new_reader: Opened[LogReader]) -> LogReader:
        """The reader a consumer opens next, after handling what ``reader`` returned:
        from the positions it kept, or (a consumer group) from what it committed."""
        if reader.consumer_keeps_position:
            positions = reader.next_positions()
            await reader.close()
            return new_reader(start=positions)
        await reader.commit()
        await reader.close()
        return new_reader(start="committed")

    # --- order and positions ----------------------------------------------------------

    async def test_records_come_in_log_order_with_their_positions(
        self, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        logs = [SessionLog("s1"), SessionLog("s2", "alice"), SessionLog("s3", "bob")]
        written: list[Event] = []
        for turn in range(3):  # the sessions' appends interleave
            for log in logs:
                batch = log.run(1) if turn == 0 else [log.turn(f"more {turn}")]
                await commit(store, batch)
                written += batch
        reader = new_reader(start="beginning")
        records = await read_all(reader, max_records=4)
        _assert_in_log_order(records, written)
        for record in records:
            named = f"{record.partition}:{record.offset}" if record.partitioned else record.offset
            assert record.position == str(named)
        if not records[0].partitioned:  # one sequence of positions: the order appended
            assert [r.event for r in records] == written
            assert {r.partition for r in records} == {0}
        last: dict[int, int] = {}
        for record in records:
            last[record.partition] = record.offset
        positions = reader.next_positions()
        assert {p: positions[p] for p in last} == {p: o + 1 for p, o in last.items()}
        assert await reader.at_end()

    async def test_a_position_given_back_resumes_exactly_after_what_was_read(
        self, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        a, b = SessionLog("a"), SessionLog("b", "alice")
        first = a.run(2) + b.run(1)
        await commit(store, first)
        reader = new_reader(start="beginning")
        head = await _read_some(reader, 3, max_records=2)  # a consumer stops mid-log
        reader = await self.resumed(reader, new_reader)
        later: list[Event] = [a.turn("later"), b.turn("later")]
        await commit(store, later)
        tail = await read_all(reader, max_records=3)
        _assert_in_log_order(head + tail, first + later)  # nothing twice, nothing lost

        # given back again before reading anything: it goes on from there, not from the start
        reader = await self.resumed(reader, new_reader)
        assert await read_all(reader) == []
        reader = await self.resumed(reader, new_reader)
        last = [a.finish()]
        await commit(store, last)
        assert _ids(await read_all(reader)) == [last[0].event_id]

    async def test_a_reader_started_at_the_end_reads_only_what_comes_after(
        self, log: ReadableLog, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        a = SessionLog("a")
        await commit(store, a.run(1))
        if not log.starts_at_end:
            with pytest.raises(ValueError):
                new_reader(start="end")
            return
        reader = new_reader(start="end")
        await reader.open()
        assert await reader.at_end()
        assert await reader.read(wait=0.05) == []
        idle = new_reader(start="end")  # a consumer that starts at the end and reads nothing
        await idle.open()
        idle = await self.resumed(idle, new_reader)
        b = SessionLog("b")
        later = b.run(1)
        await commit(store, later)
        for each in (reader, idle):
            _assert_in_log_order(await read_all(each), later)

    # --- what a reader cannot use ---------------------------------------------------

    async def test_a_record_that_does_not_decode_comes_back_with_its_reason(
        self, log: ReadableLog, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        s = SessionLog("s1", "alice")
        before = s.run(1)
        await commit(store, before)
        await log.write_undecodable(s.scope)
        after: list[Event] = [s.turn("still read"), s.finish()]
        await commit(store, after)
        reader = new_reader(start="beginning")
        records = await read_all(reader, max_records=2)  # never raised: reading goes on
        (bad,) = [r for r in records if r.event is None]
        assert bad.note is None and bad.error and isinstance(bad.error, str)
        assert bad.raw is not None  # kept as it was, for the consumer's dead letters
        good = [r for r in records if r.event is not None]
        _assert_in_log_order(good, before + after)
        # in its place among the session's records
        ours = [r for r in records if r.partition == bad.partition]
        assert [r.event.event_id if r.event else None for r in ours] == [
            *[e.event_id for e in before],
            None,
            *[e.event_id for e in after],
        ]
        assert await reader.at_end()
        # a consumer that resumes past it does not meet it again
        reader = await self.resumed(reader, new_reader)
        assert await read_all(reader) == []

    # --- drain ------------------------------------------------------------------------

    async def test_drain_ends_once_caught_up_with_the_log_as_it_was(
        self, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        reader = new_reader(start="beginning")
        assert await read_all(reader) == []  # an empty log: nothing, and no wait forever
        s = SessionLog("s1")
        written = s.run(2)
        await commit(store, written)
        batches = await asyncio.wait_for(_batches(reader, 3), _WITHIN)
        assert batches and all(0 < len(batch) <= 3 for batch in batches)
        _assert_in_log_order([r for batch in batches for r in batch], written)
        assert await reader.at_end()
        more: list[Event] = [s.turn("more"), s.finish()]
        await commit(store, more)
        assert not await reader.at_end()
        _assert_in_log_order(await read_all(reader), more)  # drained again: only what is new

    # --- erase and prune --------------------------------------------------------------

    async def test_an_erasure_comes_after_every_position_read(
        self, log: ReadableLog, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        kept, gone = SessionLog("kept"), SessionLog("gone", "alice")
        first = kept.run(1) + gone.run(2)  # the erased rows are the newest
        await commit(store, first)
        reader = new_reader(start="beginning")
        read = await read_all(reader)
        assert await store.erase("gone", user_id="alice")
        (tombstone,) = await read_all(reader)  # a reader that had passed them meets it
        assert isinstance(tombstone.event, SessionErased)
        assert Scope(tombstone.event.session_id, tombstone.event.user_id) == gone.scope
        assert tombstone.offset > max(r.offset for r in read if r.partition == tombstone.partition)

        anew = await read_all(new_reader(start="beginning"))
        assert [r.event for r in _of(anew, kept.scope)] == [r.event for r in _of(read, kept.scope)]
        theirs = [r.event for r in _of(anew, gone.scope)]
        if log.deletes_records:  # only the tombstone is left of the session
            assert theirs == [tombstone.event]
        else:
            assert theirs == [*[r.event for r in _of(read, gone.scope)], tombstone.event]

    async def test_prune_of_a_whole_session_is_left_in_log_order(
        self, log: ReadableLog, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        old, live = SessionLog("old", "alice"), SessionLog("live")
        await commit(store, old.run(2))
        await commit(store, live.run(1))
        reader = new_reader(start="beginning")
        read = await read_all(reader)
        result = await store.prune(session_id="old")
        assert result.sessions == 1
        (left,) = await read_all(reader)
        assert left.offset > max(r.offset for r in read if r.partition == left.partition)
        anew = await read_all(new_reader(start="beginning"))
        assert [r.event for r in _of(anew, live.scope)] == [r.event for r in _of(read, live.scope)]
        if log.deletes_records:  # the rows went; a note says which, where they went
            assert left.event is None and left.error is None and left.note is not None
            _assert_note(left.note, old.scope, seqs=None, through_seq=old.seq)
            assert _of(anew, old.scope) == [left]
        else:  # the log keeps them: a whole session goes by its erasure
            assert isinstance(left.event, SessionErased) and _scope(left) == old.scope
            assert [r.event for r in _of(anew, old.scope)] == [
                *[r.event for r in _of(read, old.scope)],
                left.event,
            ]

    async def test_prune_before_a_time_is_left_in_log_order(
        self, log: ReadableLog, store: EventStore, new_reader: Opened[LogReader]
    ) -> None:
        cutoff = datetime.now(UTC) - timedelta(days=30)
        s = SessionLog("s1", at=cutoff - timedelta(days=1))
        early: list[Event] = [s.claim(), s.turn("q"), s.step("fetch", 1), s.checkpoint()]
        await commit(store, early)
        s.at = cutoff + timedelta(days=1)
        await commit(store, [s.turn("r"), s.checkpoint()])  # the session is live after it
        reader = new_reader(start="beginning")
        read = await read_all(reader)
        await store.prune(before=cutoff)
        (left,) = await read_all(reader)
        assert left.offset > max(r.offset for r in read if r.partition == left.partition)
        step, checkpoint = early[2], early[3]
        assert isinstance(checkpoint, CheckpointWritten)
        anew = [r for r in await read_all(new_reader(start="beginning")) if r.note is None]
        if log.deletes_records:  # the old journal step's row went; a note says so
            assert left.note is not None
            _assert_note(left.note, s.scope, seqs=(step.seq,), through_seq=step.seq)
            assert _ids(anew) == [e for e in _ids(read) if e != step.event_id]
        else:  # the log keeps its records: the old checkpoint goes by an event
            assert isinstance(left.event, CheckpointsPruned) and _scope(left) == s.scope
            assert left.event.payload.checkpoint_ids == [checkpoint.payload.checkpoint_id]
            assert _ids(anew) == [*_ids(read), left.event.event_id]


async def _batches(reader: LogReader, max_records: int) -> list[list[LogRecord]]:
    return [batch async for batch in drain(reader, max_records)]


def _assert_note(
    note: PruneNote, scope: Scope, *, seqs: tuple[int, ...] | None, through_seq: int
) -> None:
    assert (note.user_id, note.session_id) == (scope.user_id, scope.session_id)
    assert (note.seqs, note.through_seq) == (seqs, through_seq)
    assert note.at.tzinfo is not None
