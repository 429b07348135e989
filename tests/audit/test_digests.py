"""Signed digests as a verifier reads them back: each must decode, be signed by a key the
keyring trusts for digests, and chain to the one before, with none missing; and the
places they go to (a directory that never overwrites, a Kafka topic of their own). What
digests prove of a trail is loomflow.testing's trail suite (test_conformance.py)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loomflow.audit.auditor import Auditor, verify_trail
from loomflow.audit.digests import (
    Digest,
    DigestHead,
    DigestWriter,
    DirectoryPlace,
    KafkaPlace,
    check_digests,
    digest_hash,
    place_of,
)
from loomflow.errors import StoreError
from loomflow.log.reader import sqlite_reader
from loomflow.projections.audit import SqliteTrail, default_trail_path
from loomflow.projections.chain import GENESIS
from loomflow.runtime import SqliteStore
from loomflow.schemas import utcnow
from loomflow.schemas.signing import Keyring, Signatures, Signer
from loomflow.settings import Settings
from loomflow.testing import SessionLog
from loomflow.testing._support import commit
from loomflow.testing.trail import Keys
from tests.support.kafka_env import KafkaEnv


async def _audited(db: Path, place: DirectoryPlace, signer: Signer, digests: int) -> None:
    """A log of two sessions, audited, with ``digests`` digests written as it grew."""
    store = SqliteStore(db)
    try:
        for k in range(digests):
            await commit(store, SessionLog(f"s{k}").run(1))
            async with SqliteTrail(default_trail_path(db)) as trail:
                async with sqlite_reader(db, start=await trail.position() or "beginning") as r:
                    await Auditor(r, trail).catch_up()
                await DigestWriter(trail, place, signer, "SQLite log").write()
    finally:
        await store.close()


def _digest(n: int, signer: Signer, prev: str = GENESIS, **fields: Any) -> Digest:
    values: dict[str, Any] = {"at": utcnow(), "log": "a log", "records": 0, "sessions": ()}
    unsigned = Digest(n=n, prev=prev, **(values | fields))
    return unsigned.model_copy(update={"sig": signer.sign(unsigned.signed_bytes())})


def _read(place: DirectoryPlace) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(place.path.glob("digest-*.json"))]


async def test_digests_written_as_the_trail_grows_read_back_whole(tmp_path: Path) -> None:
    keys = Keys()
    place = DirectoryPlace(tmp_path / "digests")
    await _audited(tmp_path / "journal.db", place, keys.audit, 3)
    files = sorted(p.name for p in place.path.iterdir())
    assert files == ["digest-000001.json", "digest-000002.json", "digest-000003.json"]
    assert {oct(os.stat(place.path / f).st_mode & 0o777) for f in files} == {"0o644"}
    checked = check_digests(place.where, await place.read(), keys.keyring)
    assert checked.findings == [] and checked.count == 3
    assert checked.last is not None and checked.last.n == 3
    # each session is committed by the digest written after its run, through its last entry
    assert {(s.session_id, c.n, c.digest) for s, c in checked.sessions.items()} == {
        ("s0", 4, 1),
        ("s1", 4, 2),
        ("s2", 4, 3),
    }


async def test_what_is_wrong_with_the_digests_is_named_where_it_is(tmp_path: Path) -> None:
    keys = Keys()
    place = DirectoryPlace(tmp_path / "digests")
    await _audited(tmp_path / "journal.db", place, keys.audit, 4)
    path = place.path
    good = check_digests(place.where, _read(place), keys.keyring)
    assert good.findings == []

    # a digest deleted: the gap is named, the rest still read
    gone = [(w, b) for w, b in _read(place) if w != "digest-000002.json"]
    checked = check_digests(place.where, gone, keys.keyring)
    assert [(f.where, f.detail) for f in checked.findings] == [
        (
            "digest-000003.json",
            "digest 2 is missing before digest 3: deleted, or never written here",
        )
    ]
    # the newest ones deleted: nothing to find in the digests (what they committed is
    # then only pending, as verification reports it)
    assert check_digests(place.where, _read(place)[:2], keys.keyring).findings == []

    # a digest signed again by the audit's key, with its content changed: the next one
    # no longer chains to it
    second = Digest.model_validate_json((path / "digest-000002.json").read_bytes())
    replaced = _digest(2, keys.audit, second.prev, records=999)
    swapped = [(w, replaced.to_json() if w == "digest-000002.json" else b) for w, b in _read(place)]
    (finding,) = check_digests(place.where, swapped, keys.keyring).findings
    assert finding.where == "digest-000003.json"
    assert "does not chain to digest 2" in finding.detail

    # signed by a key the keyring does not hold, by a writer's key, or not at all
    stranger = Signer.generate()
    for signer, said in [
        (stranger, f"signed by key {stranger.key_id}, which the keyring does not hold"),
        (
            keys.writer,
            f"signed by key {keys.writer.key_id}, which the keyring trusts to sign "
            "events only, not digests",
        ),
    ]:
        forged = _digest(2, signer, second.prev)
        records = [
            (w, forged.to_json() if w == "digest-000002.json" else b) for w, b in _read(place)
        ]
        found = check_digests(place.where, records, keys.keyring).findings
        assert (found[0].where, found[0].detail) == (
            "digest-000002.json",
            f"digest 2 is {said}",
        )
    unsigned = second.model_copy(update={"sig": None}).to_json()
    records = [(w, unsigned if w == "digest-000002.json" else b) for w, b in _read(place)]
    found = check_digests(place.where, records, keys.keyring).findings
    assert found[0].detail == "digest 2 is not signed"

    # what is not a digest at all
    for junk in (b"not json", b'{"kind": "something else"}', b"{}"):
        records = [(w, junk if w == "digest-000004.json" else b) for w, b in _read(place)]
        (bad,) = check_digests(place.where, records, keys.keyring).findings
        assert bad.where == "digest-000004.json" and bad.detail.startswith("not a digest ("), bad

    # another trail's digests in the same place
    other = _digest(2, keys.audit, "1" * 64)
    both = [*_read(place), ("digest-000002-other.json", other.to_json())]
    details = [f.detail for f in check_digests(place.where, both, keys.keyring).findings]
    assert "two different digests numbered 2: not one trail's" in details, details

    # nothing there
    assert [f.detail for f in check_digests("an empty place", [], keys.keyring).findings] == [
        "holds no digest"
    ]


async def test_a_retired_digest_key_holds_only_for_digests_written_before(tmp_path: Path) -> None:
    keys = Keys()
    place = DirectoryPlace(tmp_path / "digests")
    await _audited(tmp_path / "journal.db", place, keys.audit, 2)
    first, second = (Digest.model_validate_json(b) for _, b in _read(place))
    between = first.at + (second.at - first.at) / 2
    retired = keys.keyring.retire(keys.audit.key_id, between)
    (finding,) = check_digests(place.where, _read(place), retired).findings
    assert finding.where == "digest-000002.json"
    assert f"signed by key {keys.audit.key_id}, retired at {between.isoformat()}" in finding.detail
    later = keys.keyring.retire(keys.audit.key_id, second.at + timedelta(seconds=1))
    assert check_digests(place.where, _read(place), later).findings == []


async def test_a_digest_again_after_its_trail_failed_to_keep_it_is_not_a_fork(
    tmp_path: Path,
) -> None:
    """The place took digest 2, then the trail could not keep it (its database went away):
    the next digest is numbered 2 again, chains to the same digest 1, and both are true."""
    keys = Keys()
    place = DirectoryPlace(tmp_path / "digests")
    await _audited(tmp_path / "journal.db", place, keys.audit, 1)
    (first,) = (Digest.model_validate_json(b) for _, b in _read(place))
    head = DigestHead(user_id=None, session_id="s0", n=4, seq=4, hash="a" * 64)
    lost = _digest(2, keys.audit, digest_hash(first), sessions=(head,))
    await place.write(lost)
    again = _digest(2, keys.audit, digest_hash(first))
    assert (await place.write(again)).endswith("digest-000002.2.json")
    assert check_digests(place.where, await place.read(), keys.keyring).findings == []
    # a digest numbered 2 chaining elsewhere is refused by the directory, never written
    with pytest.raises(StoreError, match="digest 2 of another trail is there already"):
        await place.write(_digest(2, keys.audit, "1" * 64))


async def test_the_place_of_the_digests_says_what_is_wrong_with_it(tmp_path: Path) -> None:
    settings = Settings()
    for text, said in [
        ("", "an empty digest place"),
        ("kafka:", "a Kafka topic name is 1-249 of"),
        ("kafka:bad topic", "a Kafka topic name is 1-249 of"),
    ]:
        with pytest.raises(StoreError, match=said):
            place_of(text, settings)
    missing = place_of(str(tmp_path / "nowhere"), settings)
    with pytest.raises(StoreError, match="does not exist or is not a directory"):
        await missing.read()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(StoreError, match="cannot write to the digest directory"):
        await place_of(str(blocked / "digests"), settings).write(_digest(1, Signer.generate()))


@pytest.mark.kafka
async def test_digests_on_a_topic_of_their_own_read_back_in_order() -> None:
    env = await KafkaEnv.create(partitions=1)
    try:
        keys = Keys()
        place = place_of(f"kafka:{env.settings.topic_prefix}.audit.digests", env.settings)
        assert isinstance(place, KafkaPlace)
        with pytest.raises(StoreError, match="does not exist: no digests were written"):
            await place.read()
        first = _digest(1, keys.audit)
        second = _digest(2, keys.audit, digest_hash(first))
        assert (await place.write(first)).endswith("at offset 0")
        assert (await place.write(second)).endswith("at offset 1")
        records = await place.read()
        assert [w.rsplit(" ", 1)[-1] for w, _ in records] == ["0", "1"]
        checked = check_digests(place.where, records, keys.keyring)
        assert checked.findings == [] and checked.count == 2
    finally:
        await env.close()


def test_a_keyring_that_trusts_no_digest_key_refuses_every_digest() -> None:
    keys = Keys()
    only_writers = Keyring.of(keys.writer.trusted(("events",)))
    found = check_digests("here", [("d1", _digest(1, keys.audit).to_json())], only_writers)
    assert [f.detail for f in found.findings] == [
        f"digest 1 is signed by key {keys.audit.key_id}, which the keyring does not hold"
    ]


async def test_the_audit_writes_a_digest_when_one_falls_due(tmp_path: Path) -> None:
    """As ``loomflow audit [--follow]`` with LOOMFLOW_AUDIT_DIGESTS: the first batch
    brings the first digest; then one after ``every_events`` new entries, or once
    ``every_seconds`` passed since the last, and none while nothing new was chained."""
    db = tmp_path / "journal.db"
    keys = Keys()
    place = DirectoryPlace(tmp_path / "digests")
    store = SqliteStore(db)

    async def audit(every_events: int, every_seconds: float) -> list[str]:
        async with SqliteTrail(default_trail_path(db)) as trail:
            digests = DigestWriter(
                trail, place, keys.audit, "SQLite log", every_events, every_seconds
            )
            async with sqlite_reader(db, start=await trail.position() or "beginning") as reader:
                await Auditor(reader, trail, digests).catch_up()
            return digests.written

    try:
        s1 = SessionLog("s1")
        await commit(store, s1.run(1))
        assert len(await audit(5, 3600)) == 1  # the first: none was written yet
        await commit(store, [s1.turn("a"), s1.turn("b"), s1.turn("c")])
        assert await audit(5, 3600) == []  # 3 new entries, and an hour has not passed
        await commit(store, [s1.turn("d"), s1.turn("e")])
        (written,) = await audit(5, 3600)  # 5 entries since the last digest
        assert written.endswith("digest-000002.json")
        await commit(store, [s1.turn("f")])
        assert len(await audit(5, 1e-6)) == 1  # one entry, but its time has come
        assert await audit(1, 1e-6) == []  # nothing new: no digest
    finally:
        await store.close()
    checked = check_digests(place.where, await place.read(), keys.keyring)
    assert checked.findings == [] and checked.count == 3
    assert checked.last is not None and checked.last.records == 10


async def test_a_key_rotated_in_the_middle_of_a_session(tmp_path: Path) -> None:
    """A session whose first events the old key signed and the rest the new one: it
    verifies once the old key is retired after a digest committed what it signed; retired
    before, each of those entries is named with the key id, the session and the seq."""
    db = tmp_path / "journal.db"
    keys = Keys()
    new = Signer.generate()
    keyring = keys.keyring.with_key(new.trusted(("events",)))
    place = DirectoryPlace(tmp_path / "digests")
    s1 = SessionLog("s1")
    store = SqliteStore(db)
    try:
        events = [*s1.run(1), s1.turn("then"), s1.finish()]
        await commit(store, [keys.writer.sign_event(e) for e in events[:3]])
        await commit(store, [new.sign_event(e) for e in events[3:]])
    finally:
        await store.close()
    required = Signatures("require", keyring)
    async with SqliteTrail(default_trail_path(db)) as trail:
        async with sqlite_reader(db, signatures=required) as reader:
            assert (await Auditor(reader, trail).catch_up()).entries == 6

        async def verify(ring: Keyring) -> list[str]:
            checked = check_digests(place.where, await place.read(), ring)
            async with sqlite_reader(db) as fresh:
                result = await verify_trail(
                    trail,
                    fresh,
                    await trail.position() or {0: 1},
                    signatures=Signatures("require", ring),
                    digests=checked,
                )
            return [f.detail for check in result.sessions for f in check.findings]

        # retired before any digest committed what it signed: its entries are named
        early = keyring.retire(keys.writer.key_id, utcnow())
        await DigestWriter(trail, place, keys.audit, "SQLite log").write()
        found = await verify(early)
        assert len(found) == 3, found
        assert found[0].startswith(
            f"entry 1 (seq 1, run.started) is signed by key {keys.writer.key_id}, retired at"
        ), found
        assert "no digest committed it before then (write a digest before retiring" in found[0]
        # retired after the digest: the session verifies whole
        assert await verify(keyring.retire(keys.writer.key_id, utcnow())) == []
