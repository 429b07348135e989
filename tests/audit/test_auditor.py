"""What only the audit of an embedded log has to prove: rows of the log itself altered or
deleted after they were audited, and a trail entry rewritten as SQLite text. The rest
(chained, idempotent, tampering found, erasure, rejects) is loomflow.testing's trail
suite, run in test_conformance.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

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


async def _verify(db: Path, **filters: Any) -> Verification:
    async with SqliteTrail(default_trail_path(db)) as trail:
        audited = await trail.position() or {0: 1}
        async with sqlite_reader(db) as fresh:
            return await verify_trail(trail, fresh, audited, **filters)


def _tamper(path: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(path) as conn:
        changed = conn.execute(sql, args).rowcount
    assert changed >= 1, sql


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


async def test_an_entry_rewritten_as_text_is_one_finding_on_the_trail_side(
    tmp_path: Path,
) -> None:
    """Content rewritten as TEXT, not BLOB, as a hand-typed UPDATE stores it (the shared
    suite, loomflow.testing.trail, rewrites it as bytes)."""
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    await _audit(db)
    _tamper(
        default_trail_path(db),
        "UPDATE audit_entries SET body = 'tampered' WHERE session_id = 's1' AND n = 3",
    )
    (s1,) = (await _verify(db)).sessions
    assert [(f.kind, f.n) for f in s1.findings] == [("altered", 3)], s1.findings
    assert "does not match its hash" in s1.findings[0].detail
