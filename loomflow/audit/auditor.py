"""The audit consumer: it chains every record of the log into the trail, and verifies it.

Written once against :class:`~loomflow.log.reader.LogReader`, so the embedded log
(a SQLite file, the trail in another file beside it) and Kafka (the audit group, the
trail in the read model's PostgreSQL schema) are audited the same way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomflow.audit.digests import Committed, Digests, DigestWriter
from loomflow.errors import InvalidEventError
from loomflow.log.reader import LogReader, LogRecord, drain
from loomflow.projections.admission import Standing, admit
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
from loomflow.schemas.codec import decode_event
from loomflow.schemas.scope import Scope
from loomflow.schemas.signing import NO_SIGNATURES, Keyring, SignatureMode, Signatures

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
    again (after a crash between the trail's commit and the group's) adds nothing.

    A record is chained when the rule of validity admits it (:func:`admit`, the rule the
    read model's fold applies, against the session's standing the trail keeps), and kept
    among the rejects with the reason otherwise: so the trail holds what the read model
    holds. A ``digests`` writer is given its chance to write a digest after each batch.
    """

    def __init__(
        self, reader: LogReader, trail: Trail, digests: DigestWriter | None = None
    ) -> None:
        self.reader = reader
        self.trail = trail
        self.digests = digests
        self.done = Audited()

    async def handle(self, records: Sequence[LogRecord]) -> None:
        """Chain one batch into the trail, then move the reader's committed position."""
        links: list[tuple[Link, LogRecord]] = []
        rejects: list[Reject] = []
        for record in records:
            link = link_of(record)
            if link is None:
                reason = record.error or "not an event"
                logger.warning("audit: record at %s refused: %s", record.position, reason)
                rejects.append(Reject(record.position, reason, record.raw))
            else:
                links.append((link, record))
        known = await self.trail.known([link.key for link, _ in links])
        standings = await self.trail.standings(
            {link.scope for link, record in links if record.event is not None}
        )
        changed: dict[Scope, Standing] = {}
        fresh: list[Link] = []
        for link, record in links:
            first = known.get(link.key)
            if first is not None:
                if first != link.position:  # the same position again is a redelivery
                    reason = f"a second copy of event {link.key}, audited at {first}"
                    logger.warning("audit: record at %s not chained: %s", link.position, reason)
                    rejects.append(Reject(link.position, reason, link.body))
                continue
            if record.event is not None:
                try:
                    standing = admit(
                        standings.get(link.scope), record.event, gaps=self.reader.removes_records
                    )
                except InvalidEventError as exc:
                    reason = f"refused as the read model refuses it: {exc.reason}"
                    logger.warning("audit: record at %s %s", link.position, reason)
                    rejects.append(Reject(link.position, reason, link.body))
                    continue
                standings[link.scope] = changed[link.scope] = standing
            elif record.note is not None and record.note.seqs is None:
                # prune deleted the whole session (its row too): its id starts afresh
                standings[link.scope] = changed[link.scope] = Standing()
            known[link.key] = link.position
            fresh.append(link)
        heads = await self.trail.heads({link.scope for link in fresh})
        chained = chain(fresh, heads)
        keep = self.reader.consumer_keeps_position
        await self.trail.write(
            chained, rejects, self.reader.next_positions() if keep else None, changed
        )
        await self.reader.commit()
        self.done.records += len(records)
        self.done.entries += len(chained.entries)
        self.done.rejected += len(rejects)
        self.done.sessions.update(entry.scope for entry in chained.entries)
        if self.digests is not None:
            await self.digests.maybe(len(chained.entries))

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
    #: entries and records not committed by a digest yet (checked, not proven complete)
    pending: int = 0


@dataclass(frozen=True)
class Verification:
    """Every session's verification, and what could not be verified."""

    sessions: list[SessionCheck]
    unaudited: int  # records the log gained after the trail was brought up to date
    #: the digests checked against (None: verified without digests)
    digests: Digests | None = None
    #: events whose signature does not hold, counted where signatures are only checked
    unsigned: int = 0
    #: what was done with the events' signatures
    signatures: SignatureMode = "off"
    #: records the audit kept among its rejects (refused as the read model refuses them,
    #: not decoded, a second copy of an event): never chained, never expected in a chain
    refused: int = 0

    @property
    def problems(self) -> int:
        found = sum(len(s.findings) for s in self.sessions)
        return found + (len(self.digests.findings) if self.digests else 0)

    @property
    def pending(self) -> int:
        """Records the verification could check but not prove complete: not audited yet,
        or (with digests) newer than the last digest."""
        return self.unaudited + sum(s.pending for s in self.sessions)


async def verify_trail(
    trail: Trail,
    fresh_reader: LogReader,
    audited: dict[int, int],
    *,
    user_id: Any = ANY_USER,
    session_id: str | None = None,
    signatures: Signatures = NO_SIGNATURES,
    digests: Digests | None = None,
) -> Verification:
    """Compare the trail's chains with the log read again from the beginning by
    ``fresh_reader``, up to the positions ``audited`` (partition -> next offset) that
    the trail has reached; check every event's signature, in the log and in the trail,
    by ``signatures`` (``fresh_reader`` itself checks none, so that a record whose
    signature fails is still read, and named in its session); and, given ``digests``,
    that the trail still holds every entry they commit to, as committed."""
    chains: dict[Scope, list[Entry]] = defaultdict(list)
    for entry in await trail.entries(user_id, session_id):
        chains[entry.scope].append(entry)
    chained = {e.key: e for entries in chains.values() for e in entries}
    # records the audit kept among its rejects (a second copy of an event, say) are not
    # expected in any chain
    rejected = {reject.position for reject in await trail.rejects()}
    log: dict[Scope, list[Link]] = defaultdict(list)
    forged: dict[Scope, list[Finding]] = defaultdict(list)
    held: set[tuple[int, int]] = set()
    undecodable: dict[str, str] = {}
    unaudited = unsigned = 0
    forged_keys: set[str] = set()  # found in the log: not found again in the trail
    #: the records whose signature held, by key: their bytes' digest and the signing key,
    #: so that an entry of the same bytes is not checked again
    signed: dict[str, tuple[str, str]] = {}
    keyring = signatures.keyring if signatures.mode != "off" else None
    async for batch in drain(fresh_reader):
        for record in batch:
            link = link_of(record)
            if (
                keyring is not None
                and record.event is not None
                and link is not None
                and _selected(link.scope, user_id, session_id)
            ):
                problem = keyring.event_problem(record.event)
                if problem is None and record.event.sig is not None:
                    signed[link.key] = (link.digest, record.event.sig.key)
                elif problem is not None and signatures.mode == "require":
                    n = chained[link.key].n if link.key in chained else None
                    forged[link.scope].append(Finding("forged", n, record.position, problem))
                    forged_keys.add(link.key)
                elif problem is not None:
                    unsigned += 1
            if record.position in rejected:
                held.add((record.partition, record.offset))
                continue
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

    committed = (
        {scope: c for scope, c in digests.sessions.items() if _selected(scope, user_id, session_id)}
        if digests is not None
        else {}
    )
    checks = []
    scopes = set(log) | set(chains) | set(committed) | set(forged)
    for scope in sorted(scopes, key=lambda s: (s.user_id or "", s.session_id)):
        entries = chains.get(scope, [])
        findings = verify(
            entries,
            log.get(scope, []),
            vacated,
            undecodable,
            held=lambda p: _where(p) in held,
            chained_as=functools.partial(_chained_as, chained, scope),
        )
        findings += forged.get(scope, [])
        if signatures.keyring is not None and signatures.mode == "require":
            findings += _entry_signatures(
                [e for e in entries if e.key not in forged_keys],
                signatures.keyring,
                signed,
                committed.get(scope) if digests is not None else _UNDIGESTED,
            )
        pending = 0
        if digests is not None:
            found, pending = _against_digest(scope, entries, committed.get(scope))
            findings += found
        checks.append(
            SessionCheck(
                user_id=scope.user_id,
                session_id=scope.session_id,
                entries=len(entries),
                erased=any(e.type == "session.erased" for e in entries),
                pruned=sum(e.type == NOTE_TYPE for e in entries),
                findings=sorted(findings, key=lambda f: (f.n is None, f.n or 0)),
                pending=pending,
            )
        )
    return Verification(checks, unaudited, digests, unsigned, signatures.mode, len(rejected))


#: verified with no digests: a retired key's signature is taken at its date
_UNDIGESTED = object()


def _entry_signatures(
    entries: Sequence[Entry],
    keyring: Keyring,
    signed: Mapping[str, tuple[str, str]],
    committed: Committed | object | None,
) -> list[Finding]:
    """The trail's entries whose event's signature does not hold (the trail keeps each
    event's bytes, its signature with them, until an erasure or prune redacts them); an
    entry of the same bytes as a log record whose signature held (``signed``) is not
    decoded again. Verified against digests (``committed``: what they commit to of the
    session, None when nothing), an entry signed by a key retired since holds only if a
    digest committed it before the key's retirement: a signature's own date is the
    signer's word, and a retired key may be in anyone's hands."""
    findings = []
    for entry in entries:
        if entry.body is None or entry.type == NOTE_TYPE:
            continue
        what = f"entry {entry.n} (seq {entry.seq}, {entry.type})"
        digest, key_id = signed.get(entry.key, ("", ""))
        if digest != entry.digest:
            try:
                event = decode_event(entry.body)
            except InvalidEventError as exc:
                findings.append(Finding("altered", entry.n, entry.position, f"{what}: {exc}"))
                continue
            problem = keyring.event_problem(event)
            if problem is not None:
                findings.append(Finding("forged", entry.n, entry.position, problem))
                continue
            assert event.sig is not None  # a signature that held
            key_id = event.sig.key
        key = keyring.keys[key_id]
        if key.retired_at is None or committed is _UNDIGESTED:
            continue
        first = committed.first_committed(entry.n) if isinstance(committed, Committed) else None
        if first is None or first[1] > key.retired_at:
            findings.append(
                Finding(
                    "forged",
                    entry.n,
                    entry.position,
                    f"{what} is signed by key {key_id}, retired at "
                    f"{key.retired_at.isoformat()}, and no digest committed it before then "
                    "(write a digest before retiring a key)",
                )
            )
    return findings


def _against_digest(
    scope: Scope, entries: Sequence[Entry], committed: Committed | None
) -> tuple[list[Finding], int]:
    """What is wrong with a session's chain against what the digests committed to, and
    how many of its entries no digest has committed yet."""
    if committed is None:
        return [], len(entries)
    what = (
        f"digest {committed.digest} committed session {scope.session_id} (user "
        f"{scope.user_id or '-'}) through entry {committed.n} (seq {committed.seq})"
    )
    if not entries:
        detail = f"{what}, but the trail holds none of it: the whole session was deleted"
        return [Finding("deleted", None, None, detail)], 0
    by_n = {e.n: e for e in entries}
    newest = max(by_n)
    if newest < committed.n:
        cut = (
            f"entry {committed.n} was"
            if newest + 1 == committed.n
            else f"entries {newest + 1}..{committed.n} were"
        )
        detail = f"{what}, but the trail ends at entry {newest}: {cut} cut off"
        return [Finding("truncated", newest + 1, None, detail)], 0
    head = by_n.get(committed.n)
    if head is None or head.hash != committed.hash:
        detail = (
            f"{what}, but entry {committed.n} is not the one it committed to: the chain was "
            "rewritten since"
        )
        where = None if head is None else head.position
        return [Finding("rewritten", committed.n, where, detail)], 0
    return [], sum(1 for e in entries if e.n > committed.n)


def _chained_as(chained: dict[str, Entry], scope: Scope, key: str) -> str | None:
    """The other session whose chain holds the record ``key`` (None: none, or ``scope``)."""
    entry = chained.get(key)
    return None if entry is None or entry.scope == scope else entry.scope.describe()


def _where(position: str) -> tuple[int, int]:
    """(partition, offset) of a position as LogRecord.position writes it."""
    partition, _, offset = position.rpartition(":")
    return int(partition or 0), int(offset)


def _selected(scope: Scope, user_id: Any, session_id: str | None) -> bool:
    return (user_id is ANY_USER or scope.user_id == user_id) and (
        session_id is None or scope.session_id == session_id
    )
