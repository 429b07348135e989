"""The audit consumer: it chains every record of the log into the trail, and verifies it.

Written once against :class:`~loomflow.log.reader.LogReader`, so the embedded log
(a SQLite file, the trail in another file beside it) and Kafka (the audit group, the
trail in the read model's PostgreSQL schema) are audited the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomflow.log.reader import LogReader, LogRecord, drain
from loomflow.projections.audit import ANY_USER, Reject, Trail
from loomflow.projections.chain import (
    NOTE_TYPE,
    Entry,
    Finding,
    Link,
    canonical,
    chain,
    note_body,
    verify,
)
from loomflow.schemas.scope import Scope

__all__ = ["Auditor", "SessionCheck", "Verification", "link_of", "verify_trail"]

logger = logging.getLogger("loomflow.audit.auditor")


def link_of(record: LogRecord) -> Link | None:
    """The link a record adds to its session's chain; None for a record that does not
    decode (the auditor keeps it among the rejects)."""
    if record.event is not None:
        e = record.event
        return Link(
            e.user_id, e.session_id, record.position, e.event_id, e.seq, e.type, e.at, canonical(e)
        )
    if record.note is not None:
        note = record.note
        return Link(
            note.user_id,
            note.session_id,
            record.position,
            f"note:{record.position}",
            note.through_seq,
            NOTE_TYPE,
            note.at,
            note_body(note.user_id, note.session_id, note.seqs, note.through_seq, note.at),
        )
    return None


@dataclass
class Audited:
    """What an auditor has done since it started."""

    records: int = 0
    entries: int = 0
    rejected: int = 0
    sessions: set[Scope] = field(default_factory=set)


class Auditor:
    """Reads the log and appends each record to the trail; idempotent, so a record read
    again (after a crash between the trail's commit and the group's) adds nothing."""

    def __init__(self, reader: LogReader, trail: Trail) -> None:
        self.reader = reader
        self.trail = trail
        self.done = Audited()

    async def handle(self, records: Sequence[LogRecord]) -> None:
        """Chain one batch into the trail, then move the reader's committed position."""
        links: list[Link] = []
        rejects: list[Reject] = []
        for record in records:
            link = link_of(record)
            if link is None:
                reason = record.error or "not an event"
                logger.warning("audit: record at %s refused: %s", record.position, reason)
                rejects.append(Reject(record.position, reason, record.raw))
            else:
                links.append(link)
        known = await self.trail.known([link.key for link in links])
        fresh: list[Link] = []
        for link in links:
            first = known.get(link.key)
            if first is None:
                known[link.key] = link.position
                fresh.append(link)
            elif first != link.position:  # the same position again is a redelivery
                reason = f"a second copy of event {link.key}, audited at {first}"
                logger.warning("audit: record at %s not chained: %s", link.position, reason)
                rejects.append(Reject(link.position, reason, link.body))
        heads = await self.trail.heads({link.scope for link in fresh})
        chained = chain(fresh, heads)
        keep = self.reader.consumer_keeps_position
        await self.trail.write(chained, rejects, self.reader.next_positions() if keep else None)
        await self.reader.commit()
        self.done.records += len(records)
        self.done.entries += len(chained.entries)
        self.done.rejected += len(rejects)
        self.done.sessions.update(entry.scope for entry in chained.entries)

    async def catch_up(self) -> Audited:
        """Audit every record the log holds now."""
        async for batch in drain(self.reader):
            await self.handle(batch)
        return self.done

    async def follow(self, stop: asyncio.Event, on_batch: Callable[[], Any] | None = None) -> None:
        """Audit records as they arrive, until ``stop`` is set."""
        while not stop.is_set():
            batch = await self.reader.read(wait=0.5)
            if batch:
                await self.handle(batch)
                if on_batch is not None:
                    on_batch()


@dataclass(frozen=True)
class SessionCheck:
    """One session's verification."""

    user_id: str | None
    session_id: str
    entries: int
    erased: bool
    pruned: int
    findings: list[Finding]


@dataclass(frozen=True)
class Verification:
    """Every session's verification, and what could not be verified."""

    sessions: list[SessionCheck]
    unaudited: int  # records the log gained after the trail was brought up to date

    @property
    def problems(self) -> int:
        return sum(len(s.findings) for s in self.sessions)


async def verify_trail(
    trail: Trail,
    fresh_reader: LogReader,
    audited: dict[int, int],
    *,
    user_id: Any = ANY_USER,
    session_id: str | None = None,
) -> Verification:
    """Compare the trail's chains with the log read again from the beginning by
    ``fresh_reader``, up to the positions ``audited`` (partition -> next offset) that
    the trail has reached."""
    chains: dict[Scope, list[Entry]] = defaultdict(list)
    for entry in await trail.entries(user_id, session_id):
        chains[entry.scope].append(entry)
    chained = {e.key for entries in chains.values() for e in entries}
    # records the audit kept among its rejects (a second copy of an event, say) are not
    # expected in any chain
    rejected = {reject.position for reject in await trail.rejects()}
    log: dict[Scope, list[Link]] = defaultdict(list)
    held: set[tuple[int, int]] = set()
    undecodable: dict[str, str] = {}
    unaudited = 0
    async for batch in drain(fresh_reader):
        for record in batch:
            if record.position in rejected:
                held.add((record.partition, record.offset))
                continue
            link = link_of(record)
            beyond = record.offset >= audited.get(record.partition, 0)
            # past the group's commit, a record is audited when its entry was written (a
            # crash between the trail's commit and the group's)
            if beyond and (link is None or link.key not in chained):
                unaudited += 1
                continue
            held.add((record.partition, record.offset))
            if link is None:
                undecodable[record.position] = record.error or "not an event"
                continue
            if not _selected(link.scope, user_id, session_id):
                continue
            log[link.scope].append(link)

    def vacated(position: str) -> bool:
        where = _where(position)
        return where[1] < audited.get(where[0], 0) and where not in held

    checks = []
    for scope in sorted(set(log) | set(chains), key=lambda s: (s.user_id or "", s.session_id)):
        entries = chains.get(scope, [])
        checks.append(
            SessionCheck(
                user_id=scope.user_id,
                session_id=scope.session_id,
                entries=len(entries),
                erased=any(e.type == "session.erased" for e in entries),
                pruned=sum(e.type == NOTE_TYPE for e in entries),
                findings=verify(entries, log.get(scope, []), vacated, undecodable),
            )
        )
    return Verification(checks, unaudited)


def _where(position: str) -> tuple[int, int]:
    """(partition, offset) of a position as LogRecord.position writes it."""
    partition, _, offset = position.rpartition(":")
    return int(partition or 0), int(offset)


def _selected(scope: Scope, user_id: Any, session_id: str | None) -> bool:
    return (user_id is ANY_USER or scope.user_id == user_id) and (
        session_id is None or scope.session_id == session_id
    )
