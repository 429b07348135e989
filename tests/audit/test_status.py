"""A session against its audit trail at a glance (``loomflow.audit.status``, the
console's audit line): verified, pending, unaudited, and each tampering the page must
not call verified."""

from __future__ import annotations

from pathlib import Path

from loomflow import new_id
from loomflow.audit.status import SessionAudit, session_audit
from loomflow.projections.audit import SqliteTrail, default_trail_path
from loomflow.runtime import Scope, SqliteRuntime
from tests.audit.test_auditor import _audit, _sessions, _tamper


async def _status(db: Path, session_id: str = "s1") -> SessionAudit:
    runtime = SqliteRuntime(db)
    try:
        events = await runtime.store.read_events(Scope(session_id))
    finally:
        await runtime.close()
    async with SqliteTrail(default_trail_path(db)) as trail:
        return session_audit(events, await trail.entries(None, session_id))


async def test_an_audited_session_is_verified_and_newer_events_are_pending(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None))
    before = await _status(db)
    assert (before.state, before.entries) == ("unaudited", 0) and before.pending > 0
    entries, _ = await _audit(db)
    audited = await _status(db)
    assert (audited.state, audited.entries, audited.pending) == ("verified", entries, 0)

    # an event the audit has not read yet: the next seq, after the audited ones
    runtime = SqliteRuntime(db)
    try:
        events = await runtime.store.read_events(Scope("s1"))
    finally:
        await runtime.close()
    newer = events[-1].model_copy(update={"event_id": new_id("evt"), "seq": events[-1].seq + 1})
    async with SqliteTrail(default_trail_path(db)) as trail:
        later = session_audit([*events, newer], await trail.entries(None, "s1"))
    assert later.state == "pending" and later.pending > 0 and not later.problems


async def test_a_row_altered_or_deleted_after_the_audit_is_a_mismatch(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    await _sessions(db, ("s1", None), ("s2", None))
    await _audit(db)
    _tamper(
        db,
        "UPDATE loomflow_events SET payload = replace(payload, 'research', 'nothing') "
        "WHERE session_id = 's1' AND seq = 2",
    )
    altered = await _status(db, "s1")
    assert altered.state == "mismatch"
    assert any(p.startswith("altered") for p in altered.problems), altered.problems

    _tamper(db, "DELETE FROM loomflow_events WHERE session_id = 's2' AND seq = 3")
    deleted = await _status(db, "s2")
    assert deleted.state == "mismatch"
    assert any(p.startswith("deleted") for p in deleted.problems), deleted.problems
