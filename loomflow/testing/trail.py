"""The audit-trail conformance suite: what every :class:`loomflow.projections.audit.Trail`
keeps of a log, driven as ``loomflow audit`` drives it (:class:`~loomflow.audit.Auditor`,
then :func:`~loomflow.audit.verify_trail`).

A trail built from a log verifies, hash for hash the chain of that log; auditing again
adds nothing; an entry deleted from the trail, inserted into it, moved or altered in it
is found and named, and nothing else is; an erasure or a prune reads as what it is, not
as tampering; a record the audit cannot chain is kept among the rejects, and the audit
goes on. The tampering is done behind the trail's back, on its storage
(:class:`TrailTampering`), as someone who can write to it would.
"""

from __future__ import annotations

import hashlib
import itertools
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loomflow.audit import Auditor, Verification, verify_trail
from loomflow.audit.auditor import Audited, link_of
from loomflow.audit.digests import Digest, DigestWriter, DirectoryPlace, check_digests, digest_hash
from loomflow.projections.audit import Reject, Trail
from loomflow.projections.chain import GENESIS, Entry, Finding, Link, canonical, chain, entry_hash
from loomflow.runtime import EventStore, Scope
from loomflow.schemas import Event, Usage, utcnow
from loomflow.schemas.signing import NO_SIGNATURES, Keyring, Signatures, Signer
from loomflow.testing._support import Opened, commit, opened_fixture, required_fixture
from loomflow.testing.log import AuditedLog, LogSuite, read_all
from loomflow.testing.sqlite_log import SqliteLog
from loomflow.testing.store import SessionLog

__all__ = ["AuditTrailConformance", "Auditing", "Keys", "TrailTampering"]


class TrailTampering(ABC):
    """Changes to a trail's storage behind its back. Each changes exactly one stored
    entry of the session (``user_id``, ``session_id``) and fails when it changed none."""

    @abstractmethod
    async def delete(self, user_id: str | None, session_id: str, n: int) -> None:
        """Delete entry ``n``."""

    @abstractmethod
    async def update(self, user_id: str | None, session_id: str, n: int, /, **columns: Any) -> None:
        """Set fields of entry ``n`` as stored (named as :class:`Entry`'s: ``n``,
        ``body`` as bytes, ``digest``, ``prev``, ``hash``)."""

    @abstractmethod
    async def insert(self, entry: Entry) -> None:
        """Store an entry the audit never wrote."""


def _flipped(text: str) -> str:
    """``text`` with its first hex digit changed (always changed, whatever it was)."""
    return ("e" if text[0] == "f" else "f") + text[1:]


class Keys:
    """A writer's signing key, the audit's, and the keyring that trusts each for its role
    (``loomflow keys new`` and ``--role digests``)."""

    def __init__(self) -> None:
        self.writer = Signer.generate()
        self.audit = Signer.generate()
        self.keyring = Keyring.of(
            self.writer.trusted(("events",)), self.audit.trusted(("digests",))
        )

    @property
    def required(self) -> Signatures:
        return Signatures("require", self.keyring)


class Auditing:
    """``loomflow audit``, ``audit digest`` and ``audit verify`` of one log, each in a
    trail of its own opened anew, as each command opens one; digests go to ``place``,
    signed by the audit's key of ``keys``."""

    def __init__(
        self, log: AuditedLog, trails: Opened[Trail], place: DirectoryPlace, keys: Keys
    ) -> None:
        self.log = log
        self.trails = trails
        self.place = place
        self.keys = keys
        #: what the audit's reader does with signatures (``LOOMFLOW_SIGNATURES``)
        self.signatures = NO_SIGNATURES

    @asynccontextmanager
    async def trail(self) -> AsyncIterator[Trail]:
        trail = self.trails()
        try:
            yield trail
        finally:
            await trail.close()

    async def __call__(self) -> Audited:
        """One audit: the log read from where the audit left off."""
        async with (
            self.trail() as trail,
            await self.log.audit_reader(trail, self.signatures) as reader,
        ):
            return await Auditor(reader, trail).catch_up()

    async def again(self) -> Audited:
        """One audit that reads every record again (a crash between the trail's commit
        and the reader's)."""
        async with self.trail() as trail, self.log.reader("beginning") as reader:
            return await Auditor(reader, trail).catch_up()

    async def digest(self) -> Digest:
        """``loomflow audit digest``: a digest of the trail as it is, written now."""
        async with self.trail() as trail:
            return await DigestWriter(trail, self.place, self.keys.audit, "the test's log").write()

    async def verify(
        self, *, digests: bool = False, signatures: Signatures = NO_SIGNATURES, **filters: Any
    ) -> Verification:
        """One verification: the trail against the log read again (and the digests
        written to ``place`` so far, checked against the keyring, with ``digests``)."""
        checked = None
        if digests:
            checked = check_digests(self.place.where, await self.place.read(), self.keys.keyring)
        async with self.trail() as trail, self.log.fresh_reader() as fresh:
            return await verify_trail(
                trail,
                fresh,
                await self.log.audited(trail),
                signatures=signatures,
                digests=checked,
                **filters,
            )

    async def findings(self, session_id: str, **verify: Any) -> list[Finding]:
        """What a verification finds in the session ``session_id`` (its one user's)."""
        result = await self.verify(**verify)
        (check,) = [c for c in result.sessions if c.session_id == session_id]
        return check.findings

    async def audited(self) -> dict[int, int]:
        """How far the audit got, as verification is told."""
        async with self.trail() as trail:
            return await self.log.audited(trail)

    async def entries(self, user_id: str | None, session_id: str) -> list[Entry]:
        async with self.trail() as trail:
            return await trail.entries(user_id, session_id)

    async def rejects(self) -> list[Reject]:
        async with self.trail() as trail:
            return await trail.rejects()

    async def two_sessions(self, store: EventStore) -> None:
        """s1 (10 records, no user) and s2 (7, alice's), audited."""
        for events in (SessionLog("s1").run(3), SessionLog("s2", "alice").run(2)):
            await commit(store, events)
        done = await self()
        assert (done.entries, done.rejected) == (17, 0)

    async def s1_findings(self) -> list[Finding]:
        """What verification finds in s1; in s2, left alone, it finds nothing."""
        result = await self.verify()
        checks = {(c.user_id, c.session_id): c for c in result.sessions}
        assert checks[("alice", "s2")].findings == []
        return checks[(None, "s1")].findings


class AuditTrailConformance(LogSuite):
    """Subclass in a test module and define the fixtures ``open_trail`` (a callable that
    returns a new trail on the test's storage, each seeing what the earlier ones wrote)
    and ``tamper`` (a :class:`TrailTampering` of that storage).

    The log audited is the fixture ``log``, an :class:`~loomflow.testing.AuditedLog`: by
    default an embedded log in the test's ``tmp_path`` (:class:`~loomflow.testing.SqliteLog`,
    whose audit resumes at the position the trail keeps); a trail that keeps none (the
    audit's consumer group keeps it) is tested on a log with consumer groups instead.
    """

    factory = "open_trail"
    open_trail = required_fixture("open_trail", "Trail")
    new_trail = opened_fixture("new_trail")
    tamper = required_fixture("tamper", "TrailTampering", factory=False)

    @pytest.fixture
    def log(self, tmp_path: Path) -> AuditedLog:
        return SqliteLog(tmp_path / "journal.db")

    @pytest.fixture
    def audit(self, log: AuditedLog, new_trail: Opened[Trail], tmp_path: Path) -> Auditing:
        return Auditing(log, new_trail, DirectoryPlace(tmp_path / "digests"), Keys())

    # --- a trail as the audit builds it -------------------------------------------

    async def test_a_trail_built_from_a_log_is_its_chain_and_verifies(
        self, log: AuditedLog, store: EventStore, audit: Auditing
    ) -> None:
        written: list[Event] = SessionLog("s1").run(3) + SessionLog("s2", "alice").run(2)
        await commit(store, written)
        done = await audit()
        assert (done.records, done.entries, done.rejected) == (17, 17, 0)
        assert done.sessions == {Scope("s1"), Scope("s2", "alice")}

        # entry for entry the chain of the log read again, whoever builds it
        async with log.fresh_reader() as fresh:
            records = await read_all(fresh)
        links = [link_of(r) for r in records]
        # and it got as far as the log goes, in every partition that holds records
        assert await audit.audited() == {r.partition: r.offset + 1 for r in records}
        expected: dict[Scope, list[Entry]] = defaultdict(list)
        for entry in chain([link for link in links if link is not None], {}).entries:
            expected[entry.scope].append(entry)
        for scope, entries in expected.items():
            stored = await audit.entries(scope.user_id, scope.session_id)
            assert stored == entries
            assert [e.n for e in stored] == list(range(1, len(entries) + 1))
            assert stored[0].prev == GENESIS
            assert all(e.prev == before.hash for before, e in itertools.pairwise(stored))

        result = await audit.verify()
        assert (result.problems, result.unaudited) == (0, 0)
        assert [(c.user_id, c.session_id, c.entries) for c in result.sessions] == [
            (None, "s1", 10),
            ("alice", "s2", 7),
        ]
        assert not any(c.erased or c.pruned for c in result.sessions)
        alices = await audit.verify(user_id="alice")
        assert [c.session_id for c in alices.sessions] == ["s2"]
        nobodys = await audit.verify(user_id=None)
        assert [c.session_id for c in nobodys.sessions] == ["s1"]
        one = await audit.verify(session_id="s2")
        assert [(c.user_id, c.entries) for c in one.sessions] == [("alice", 7)]

    async def test_auditing_again_adds_nothing(self, store: EventStore, audit: Auditing) -> None:
        s1 = SessionLog("s1")
        await commit(store, s1.run(2))
        assert (await audit()).entries == 7
        before = await audit.entries(None, "s1")
        again = await audit()
        assert (again.entries, again.rejected) == (0, 0)
        redelivered = await audit.again()
        assert (redelivered.records, redelivered.entries, redelivered.rejected) == (7, 0, 0)
        assert await audit.entries(None, "s1") == before

        await commit(store, [s1.turn("later"), s1.finish()])  # what is new, only that
        later = await audit()
        assert (later.entries, later.rejected) == (2, 0)
        after = await audit.entries(None, "s1")
        assert after[:7] == before and [e.n for e in after[7:]] == [8, 9]
        assert after[7].prev == before[-1].hash
        assert (await audit.verify()).problems == 0

    async def test_records_the_audit_has_not_reached_are_unaudited_not_missing(
        self, store: EventStore, audit: Auditing
    ) -> None:
        s1 = SessionLog("s1")
        await commit(store, s1.run(2))
        await audit()
        await commit(store, [s1.turn("later"), s1.finish(), *SessionLog("s2").run(1)])
        result = await audit.verify()
        assert (result.problems, result.unaudited) == (0, 6)
        assert [(c.session_id, c.entries) for c in result.sessions] == [("s1", 7)]

    # --- tampering, found and named -----------------------------------------------

    async def test_an_entry_deleted_from_the_trail_is_found(
        self, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        await tamper.delete(None, "s1", 4)
        found = await audit.s1_findings()
        assert "deleted" in {f.kind for f in found}, found
        assert min(f.n for f in found if f.n is not None) == 5, found  # where it breaks

    async def test_the_last_entry_deleted_from_the_trail_is_found(
        self, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        await tamper.delete(None, "s1", 10)  # no later entry's link breaks
        found = await audit.s1_findings()
        assert [f.kind for f in found] == ["deleted"], found
        assert "deleted from the trail" in found[0].detail

    async def test_an_entry_inserted_into_the_trail_is_found(
        self, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        last = (await audit.entries(None, "s1"))[-1]
        # a forged entry at the end, hashed as real ones are: the chain holds, the log
        # has no such record
        body = b'{"type":"turn.appended","forged":true}'
        digest = hashlib.sha256(body).hexdigest()
        n = last.n + 1
        forged = Entry(
            None,
            "s1",
            n,
            "999",
            "evt_forged",
            99,
            "turn.appended",
            datetime.now(UTC),
            digest,
            body,
            last.hash,
            entry_hash(last.hash, n, digest),
        )
        await tamper.insert(forged)
        found = await audit.s1_findings()
        assert [(f.kind, f.n) for f in found] == [("inserted", n)], found

    async def test_entries_reordered_in_the_trail_are_found(
        self, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        # entries 3 and 4 swap places (n is the key: one steps aside first)
        await tamper.update(None, "s1", 3, n=-1)
        await tamper.update(None, "s1", 4, n=3)
        await tamper.update(None, "s1", -1, n=4)
        found = await audit.s1_findings()
        assert "reordered" in {f.kind for f in found}, found
        assert min(f.n for f in found if f.n is not None) == 3, found

    @pytest.mark.parametrize("rewritten", ["body", "hash", "body and digest"])
    async def test_an_entry_altered_in_the_trail_is_one_finding(
        self, store: EventStore, audit: Auditing, tamper: TrailTampering, rewritten: str
    ) -> None:
        await audit.two_sessions(store)
        third = (await audit.entries(None, "s1"))[2]
        body = b'{"altered":true}'
        rewrites: dict[str, dict[str, Any]] = {
            "body": {"body": body},
            "hash": {"hash": _flipped(third.hash)},
            # content and digest rewritten together, the hash left as it was
            "body and digest": {"body": body, "digest": hashlib.sha256(body).hexdigest()},
        }
        await tamper.update(None, "s1", 3, **rewrites[rewritten])
        found = await audit.s1_findings()
        assert [(f.kind, f.n) for f in found] == [("altered", 3)], found
        assert "does not match its hash" in found[0].detail

    # --- what the log lost on purpose -----------------------------------------------

    async def test_erasure_and_prune_read_as_what_they_are(
        self, log: AuditedLog, store: EventStore, audit: Auditing
    ) -> None:
        for events in (SessionLog(s).run(2) for s in ("kept", "old")):
            await commit(store, events)
        await commit(store, SessionLog("gone", "alice").run(2))
        await audit()
        assert await store.erase("gone", user_id="alice")
        assert (await store.prune(session_id="old")).sessions == 1
        if log.deletes_records:
            # the pruned id is free again in a log that deleted it: its chain goes on
            await commit(store, SessionLog("old").run(1))
        await audit()

        result = await audit.verify()
        assert result.problems == 0, result
        checks = {c.session_id: c for c in result.sessions}
        assert checks["gone"].erased and not checks["kept"].erased
        assert not checks["kept"].pruned and checks["kept"].entries == 7
        gone = await audit.entries("alice", "gone")
        # the erased records' content left the trail with the log; their hashes stayed
        assert gone[-1].type == "session.erased" and gone[-1].body is not None
        assert all(e.body is None for e in gone[:-1]) and len(gone) == 8
        assert all(e.hash and e.digest for e in gone)
        old = await audit.entries(None, "old")
        if log.deletes_records:  # a note of what prune deleted, then the new run
            assert (checks["old"].pruned, checks["old"].erased) == (1, False)
            assert [e.body is None for e in old] == [True] * 7 + [False] * 5
            assert old[7].type == "log.pruned"
        else:  # a whole session goes by its erasure
            assert checks["old"].erased and old[-1].type == "session.erased"
        assert (await audit.verify(session_id="gone")).problems == 0

    async def test_the_audit_refuses_what_the_read_model_refuses(
        self, log: AuditedLog, store: EventStore, audit: Auditing
    ) -> None:
        s1 = SessionLog("s1")
        await commit(store, [*s1.run(1), s1.finish()])
        # behind the store's back, a turn after the session finished, at a new epoch: only
        # a claim takes one, so the read model refuses it (Kafka's projector dead-letters it)
        forged = s1.turn("charge me $999", epoch=s1.epoch + 1)
        await log.forge(forged)
        done = await audit()
        assert (done.records, done.entries, done.rejected) == (6, 5, 1)
        (reject,) = await audit.rejects()
        assert "refused as the read model refuses it" in reject.reason, reject
        assert "only run.started or session.forked claims a new epoch" in reject.reason
        entries = await audit.entries(None, "s1")
        assert entries[-1].type == "run.finished"
        assert forged.event_id not in {e.key for e in entries}
        result = await audit.verify()
        assert (result.problems, result.refused, result.unaudited) == (0, 1, 0), result
        if not log.deletes_records:
            # the session goes on from where the read model has it, and so does its chain
            # (in an embedded log the forged row holds the seq: whoever can write the file
            # can stop its sessions, as they can delete it)
            await commit(store, s1.run(1))
            assert (await audit()).entries == 4
            assert (await audit.verify()).problems == 0

    # --- against signed digests ---------------------------------------------------------

    async def test_digests_commit_the_trail_and_what_came_after_is_pending(
        self, store: EventStore, audit: Auditing
    ) -> None:
        s1 = SessionLog("s1")
        await commit(store, s1.run(2))
        await audit()
        first = await audit.digest()
        assert (first.n, first.prev, first.records) == (1, GENESIS, 7)
        assert [(h.session_id, h.n, h.seq) for h in first.sessions] == [("s1", 7, 7)]
        result = await audit.verify(digests=True)
        assert (result.problems, result.pending) == (0, 0), result

        await commit(store, [s1.turn("later"), s1.finish(), *SessionLog("s2", "alice").run(1)])
        await audit()
        result = await audit.verify(digests=True)
        # checked against the log, but newer than the last digest: not proven yet
        assert (result.problems, result.pending) == (0, 6), result
        assert {c.session_id: c.pending for c in result.sessions} == {"s1": 2, "s2": 4}
        second = await audit.digest()
        assert (second.n, second.prev, second.records) == (2, digest_hash(first), 13)
        assert {(h.user_id, h.session_id, h.n) for h in second.sessions} == {
            (None, "s1", 9),
            ("alice", "s2", 4),
        }
        assert (await audit.verify(digests=True)).pending == 0
        third = await audit.digest()  # nothing grew: it names no session
        assert (third.n, third.sessions, third.records) == (3, (), 13)
        assert (await audit.verify(digests=True)).problems == 0

    async def test_a_session_cut_short_in_log_and_trail_is_found_by_the_digest(
        self, log: AuditedLog, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        await audit.digest()
        # the last two records of s1 go from the trail and, where it can lose them, the log
        if log.deletes_records:
            await log.cut(Scope("s1"), [9, 10])
        for n in (10, 9):
            await tamper.delete(None, "s1", n)
        if log.deletes_records:  # the chain and the log agree: only a digest can tell
            assert (await audit.verify()).problems == 0
        found = await audit.findings("s1", digests=True)
        (cut,) = [f for f in found if f.kind == "truncated"]
        assert cut.n == 9 and "digest 1" in cut.detail and "entries 9..10" in cut.detail, cut

    async def test_a_session_deleted_whole_from_log_and_trail_is_found_by_the_digest(
        self, log: AuditedLog, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        await audit.digest()
        if log.deletes_records:
            await log.cut(Scope("s1"), range(1, 11))
        for n in range(10, 0, -1):
            await tamper.delete(None, "s1", n)
        if log.deletes_records:
            result = await audit.verify()
            assert result.problems == 0 and {c.session_id for c in result.sessions} == {"s2"}
        found = await audit.findings("s1", digests=True)
        (gone,) = [f for f in found if f.n is None and "whole session" in f.detail]
        assert gone.kind == "deleted" and "digest 1" in gone.detail, found

    async def test_a_consistent_rewrite_of_log_and_trail_is_found_by_the_digest(
        self, log: AuditedLog, store: EventStore, audit: Auditing, tamper: TrailTampering
    ) -> None:
        await audit.two_sessions(store)
        await audit.digest()
        async with log.fresh_reader() as fresh:
            records = [r for r in await read_all(fresh) if r.event and r.event.session_id == "s1"]
        # the record at seq 3 is changed, and the trail's chain made again from it on: the
        # chain holds, and where the log can be rewritten, it matches the log
        original = records[2].event
        assert original is not None
        changed = original.model_copy(update={"run_id": "run_someone_else"})
        if log.deletes_records:
            await log.rewrite(changed)
        links = [link_of(r) for r in records]
        links[2] = Link(
            None,
            "s1",
            records[2].position,
            changed.event_id,
            3,
            changed.type,
            changed.at,
            canonical(changed),
        )
        for entry in chain([link for link in links if link is not None], {}).entries[2:]:
            await tamper.update(
                None,
                "s1",
                entry.n,
                body=entry.body,
                digest=entry.digest,
                prev=entry.prev,
                hash=entry.hash,
            )
        if log.deletes_records:
            assert await audit.findings("s1") == []
        found = await audit.findings("s1", digests=True)
        (rewritten,) = [f for f in found if f.kind == "rewritten"]
        assert rewritten.n == 10 and "digest 1" in rewritten.detail, found

    # --- signed events --------------------------------------------------------------------

    async def test_an_event_forged_without_the_key_is_refused_and_named(
        self, log: AuditedLog, store: EventStore, audit: Auditing
    ) -> None:
        keys = audit.keys
        s1 = SessionLog("s1")
        await commit(store, [keys.writer.sign_event(e) for e in [*s1.run(1), s1.finish()]])
        audit.signatures = keys.required
        assert (await audit()).entries == 5
        # at the finished session's next seq, in its epoch: what the read model's rule
        # alone admits. Unsigned, or signed by a key the keyring does not hold.
        usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cost_usd=999.0)
        unsigned = s1.turn("charge me", usage=usage, seq=6)
        stranger = Signer.generate().sign_event(s1.turn("charge me", usage=usage, seq=7))
        await log.forge(unsigned)
        await log.forge(stranger)
        done = await audit()
        assert (done.entries, done.rejected) == (0, 2)
        reasons = sorted(r.reason for r in await audit.rejects())
        assert "seq 6) is not signed" in reasons[0], reasons
        assert "which the keyring does not hold" in reasons[1], reasons
        result = await audit.verify(signatures=keys.required)
        forged = [f for f in await audit.findings("s1", signatures=keys.required)]
        assert [(f.kind, f.n) for f in forged] == [("forged", None), ("forged", None)], forged
        assert "seq 6" in forged[0].detail and forged[0].position is not None
        assert result.problems == 2 and result.refused == 2
        # read by a reader that checks none, both are still named (``check`` counts them)
        assert (await audit.verify(signatures=Signatures("check", keys.keyring))).unsigned == 2

    async def test_an_event_signed_by_a_retired_key_after_its_retirement_is_forged(
        self, log: AuditedLog, store: EventStore, audit: Auditing
    ) -> None:
        keys = audit.keys
        s1 = SessionLog("s1")
        await commit(store, [keys.writer.sign_event(e) for e in [*s1.run(1), s1.finish()]])
        audit.signatures = keys.required
        await audit()
        await audit.digest()  # what the old key signed, committed before its retirement
        retired_at = utcnow()
        audit.keys.keyring = keys.keyring.retire(keys.writer.key_id, retired_at)
        audit.signatures = keys.required
        # the old key in someone's hands: an event dated after the retirement, and one
        # dated before it (a signature's date is its signer's word)
        early = s1.turn("backdated", seq=6).model_copy(
            update={"at": retired_at - timedelta(hours=1)}
        )
        early = keys.writer.sign_event(early)
        late = keys.writer.sign_event(s1.turn("late", seq=7))
        await log.forge(early)
        await log.forge(late)
        done = await audit()
        (reject,) = await audit.rejects()
        assert f"signed by key {keys.writer.key_id}, retired at" in reject.reason
        assert (done.entries, done.rejected) == (1, 1)  # the backdated one passes the reader
        found = await audit.findings("s1", digests=True, signatures=keys.required)
        # the late one in the log (the audit refused it), the backdated one in the trail
        assert sorted((f.kind, f.n or 0) for f in found) == [("forged", 0), ("forged", 6)], found
        backdated = next(f for f in found if f.n == 6)
        # and nothing else: what the key signed before its retirement, which a digest
        # committed then, holds
        assert "no digest committed it before then" in backdated.detail

    # --- what the audit cannot chain --------------------------------------------------

    async def test_a_record_it_cannot_chain_is_kept_among_the_rejects(
        self, log: AuditedLog, store: EventStore, audit: Auditing
    ) -> None:
        await commit(store, SessionLog("s1").run(1))
        await log.write_undecodable(Scope("s9"))
        await commit(store, SessionLog("s2").run(1))  # records after it are still audited
        done = await audit()
        assert (done.records, done.entries, done.rejected) == (9, 8, 1)
        async with log.fresh_reader() as fresh:
            (bad,) = [r for r in await read_all(fresh) if r.event is None]
        (reject,) = await audit.rejects()
        assert (reject.position, reject.reason, reject.raw) == (bad.position, bad.error, bad.raw)
        assert (await audit.verify()).problems == 0
        again = await audit.again()  # read again: kept once
        assert (again.entries, again.rejected) == (0, 1)
        assert len(await audit.rejects()) == 1
