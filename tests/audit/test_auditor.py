"""The audit trail on the embedded log: chained, idempotent, and tampering found."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from loomflow.audit.auditor import Auditor, Verification, verify_trail
from loomflow.log.reader import sqlite_reader
from loomflow.projections.audit import SqliteTrail, default_trail_path
from loomflow.runtime import SqliteRuntime
from tests.support.scenario import Research


async def _sessions(db: Path, *sessions: tuple[str, str | None]) -> None:
    runtime = SqliteRuntime(db)
    try:
        for session_id, user_id in sessions:
            await (
                Research(passes=2)
                .agent(runtime)
                .run("research", session_id=session_id, user_id=user_id)
            )
    finally:
        await runtime.close()


async def _audit(db: Path) -> tuple[int, int]:
    async with SqliteTrail(default_trail_path(db)) as trail:  # noqa: SIM117 - reader needs it
        async with sqlite_reader(db, start=await trail.position() or "beginning") as reader:
            done = await Auditor(reader, trail).catch_up()
    return done.entries, done.rejected


async def _verify(db: Path, **filters: str | None) -> Verification:
    async with SqliteTrail(default_trail_path(db)) as trail:
        audited = await trail.position() or {0: 1}
        async with sqlite_reader(db) as fresh:
            return await verify_trail(trail, fresh, audited, **filters)


def _log_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM loomflow_events").fetchone()[0])


async def test_every_record_is_chained_once_and_replaying_adds_nothing(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None), ("s2", "alice"))
    entries, rejected = await _audit(db)
    assert (entries, rejected) == (_log_rows(db), 0)
    assert await _audit(db) == (0, 0)  # nothing new

    # a trail rebuilt from the log by a second consumer is the same chain, hash for hash
    copy = tmp_path / "copy.db"
    copy.write_bytes(db.read_bytes())
    await _audit(copy)
    async with (
        SqliteTrail(default_trail_path(db)) as a,
        SqliteTrail(default_trail_path(copy)) as b,
    ):
        assert [e.hash for e in await a.entries()] == [e.hash for e in await b.entries()]

    result = await _verify(db)
    assert result.problems == 0
    assert {(s.user_id, s.session_id) for s in result.sessions} == {(None, "s1"), ("alice", "s2")}


async def test_erasure_and_prune_read_as_what_they_are(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("gone", None), ("old", None), ("kept", None))
    await _audit(db)
    runtime = SqliteRuntime(db)
    try:
        assert await runtime.store.erase("gone")
        result = await runtime.store.prune(session_id="old")
        assert result.sessions == 1
        # the pruned id is free again on the embedded store: its new chain goes on
        await Research(passes=1).agent(runtime).run("again", session_id="old")
    finally:
        await runtime.close()
    await _audit(db)
    verification = await _verify(db)
    assert verification.problems == 0, verification
    checks = {s.session_id: s for s in verification.sessions}
    assert checks["gone"].erased and not checks["kept"].erased
    assert checks["old"].pruned == 1
    async with SqliteTrail(default_trail_path(db)) as trail:
        gone = await trail.entries(None, "gone")
    # the erased records' content left the trail with the log; their hashes stayed
    assert gone[-1].type == "session.erased" and gone[-1].body is not None
    assert all(e.body is None for e in gone[:-1]) and all(e.hash for e in gone)


def _tamper(path: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(path) as conn:
        changed = conn.execute(sql, args).rowcount
    assert changed >= 1, sql


@pytest.mark.parametrize(
    ("kind", "statements", "breaks_at"),
    [
        ("deleted", ["DELETE FROM audit_entries WHERE session_id = 's1' AND n = 4"], 5),
        (
            "altered",
            [
                "UPDATE audit_entries SET body = CAST(replace(CAST(body AS TEXT), 'research', "
                "'RESEARCH') AS BLOB) WHERE session_id = 's1' AND n = 2"
            ],
            2,
        ),
        (
            "reordered",  # entries 3 and 4 swap places (n is the key: one steps aside first)
            [
                "UPDATE audit_entries SET n = -1 WHERE session_id = 's1' AND n = 3",
                "UPDATE audit_entries SET n = 3 WHERE session_id = 's1' AND n = 4",
                "UPDATE audit_entries SET n = 4 WHERE session_id = 's1' AND n = -1",
            ],
            3,
        ),
    ],
)
async def test_verify_finds_a_tampered_trail(
    tmp_path: Path, kind: str, statements: list[str], breaks_at: int
) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None), ("s2", None))
    await _audit(db)
    for statement in statements:
        _tamper(default_trail_path(db), statement)
    result = await _verify(db)
    s1 = next(s for s in result.sessions if s.session_id == "s1")
    s2 = next(s for s in result.sessions if s.session_id == "s2")
    assert s2.findings == []
    assert kind in {f.kind for f in s1.findings}, s1.findings
    assert min(f.n for f in s1.findings if f.n is not None) == breaks_at, s1.findings


async def test_verify_finds_an_entry_inserted_into_the_trail(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    await _audit(db)
    trail = default_trail_path(db)
    # a forged entry at the end, its hashes computed as the real ones are: the chain
    # holds, but the log has no such record
    from loomflow.projections.chain import entry_hash

    with sqlite3.connect(trail) as conn:
        n, last = conn.execute(
            "SELECT n, hash FROM audit_entries WHERE session_id = 's1' ORDER BY n DESC LIMIT 1"
        ).fetchone()
        import hashlib

        body = b'{"type":"turn.appended","forged":true}'
        digest = hashlib.sha256(body).hexdigest()
        conn.execute(
            "INSERT INTO audit_entries VALUES ('', 's1', ?, '999', 'evt_forged', 99, "
            "'turn.appended', ?, ?, ?, ?, ?)",
            (
                n + 1,
                datetime.now(UTC).isoformat(),
                digest,
                body,
                last,
                entry_hash(last, n + 1, digest),
            ),
        )
    result = await _verify(db)
    (s1,) = result.sessions
    assert [f.kind for f in s1.findings] == ["inserted"]
    assert s1.findings[0].n == n + 1


async def test_verify_finds_a_log_row_altered_or_deleted_after_it_was_audited(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    await _audit(db)
    _tamper(
        db,
        "UPDATE loomflow_events SET payload = replace(payload, 'research', 'nothing') "
        "WHERE session_id = 's1' AND seq = 2",
    )
    _tamper(db, "DELETE FROM loomflow_events WHERE session_id = 's1' AND seq = 5")
    (s1,) = (await _verify(db)).sessions
    kinds = {(f.kind, f.n) for f in s1.findings}
    assert ("altered", 2) in kinds and ("deleted", 5) in kinds, s1.findings


async def test_a_row_that_does_not_decode_is_kept_among_the_rejects(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO loomflow_events (user_id, session_id, seq, type, event_id, run_id, "
            "epoch, v, at, payload) VALUES ('', 's9', 1, 'no.such.type', 'evt_x', 'r', 0, 1, "
            "?, '{}')",
            ((datetime.now(UTC) - timedelta(seconds=1)).isoformat(),),
        )
    await _sessions(db, ("s2", None))  # records after the bad one are still audited
    entries, rejected = await _audit(db)
    assert rejected == 1 and entries == _log_rows(db) - 1
    async with SqliteTrail(default_trail_path(db)) as trail:
        (reject,) = await trail.rejects()
    assert "no.such.type" in reject.reason and reject.raw is not None
    assert (await _verify(db)).problems == 0


@pytest.mark.parametrize(
    "statement",
    [
        # the hash alone rewritten (its first digit always changed: a hash that already
        # began with 'f' once made this test pass a tampering it had not done)
        "UPDATE audit_entries SET hash = CASE WHEN substr(hash, 1, 1) = 'f' THEN 'e' ELSE 'f' "
        "END || substr(hash, 2) WHERE session_id = 's1' AND n = 3",
        # content and digest rewritten together, the hash left as it was
        "UPDATE audit_entries SET body = CAST('{}' AS BLOB), "
        "digest = '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a' "
        "WHERE session_id = 's1' AND n = 3",
        # content rewritten as TEXT, not BLOB, as a hand-typed UPDATE stores it
        "UPDATE audit_entries SET body = 'tampered' WHERE session_id = 's1' AND n = 3",
    ],
)
async def test_an_altered_entry_is_one_finding_on_the_trail_side(
    tmp_path: Path, statement: str
) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    await _audit(db)
    _tamper(default_trail_path(db), statement)
    (s1,) = (await _verify(db)).sessions
    assert [(f.kind, f.n) for f in s1.findings] == [("altered", 3)], s1.findings
    assert "does not match its hash" in s1.findings[0].detail


async def test_the_last_entry_deleted_from_the_trail_reads_as_deleted(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    await _audit(db)
    _tamper(
        default_trail_path(db),
        "DELETE FROM audit_entries WHERE session_id = 's1' AND n = "
        "(SELECT max(n) FROM audit_entries WHERE session_id = 's1')",
    )
    (s1,) = (await _verify(db)).sessions
    ((kind, detail),) = [(f.kind, f.detail) for f in s1.findings]
    assert kind == "deleted" and "deleted from the trail" in detail, s1.findings
