"""Where one session stands with the audit trail: its events as the store reads them
now against its chain, by the verification ``loomflow audit verify`` runs
(:func:`loomflow.projections.chain.verify`), for a page to show.

The events newer than the session's last audited one are pending (the audit has not
read them yet), not findings. Unlike ``audit verify``, which reads the whole log again
by position, this sees only the session's events in seq order, so a record deleted from
the log is told from one inserted into the trail by whether the trail expects it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from loomflow.projections.chain import Entry, Link, canonical, verify
from loomflow.schemas import Event

__all__ = ["SessionAudit", "session_audit"]


@dataclass(frozen=True)
class SessionAudit:
    """A session against its chain. ``state``: ``verified`` (every event chained and as
    audited), ``pending`` (so far, with ``pending`` newer events not audited yet),
    ``unaudited`` (no entry yet) or ``mismatch`` (``problems`` says what differs)."""

    entries: int
    pending: int
    state: Literal["verified", "pending", "unaudited", "mismatch"]
    problems: list[str] = field(default_factory=list)


def session_audit(events: Sequence[Event], entries: Sequence[Entry]) -> SessionAudit:
    """Compare ``events`` (the session's, in seq order) with its trail ``entries`` (in
    ``n`` order)."""
    if not entries:
        return SessionAudit(0, len(events), "unaudited")
    chained = {entry.key for entry in entries}
    newest = max(entry.seq for entry in entries)
    pending = [e for e in events if e.event_id not in chained and e.seq > newest]
    links = [
        Link(e.user_id, e.session_id, f"seq {e.seq}", e.event_id, e.seq, e.type, e.at, canonical(e))
        for e in events
        if e.event_id in chained or e.seq <= newest
    ]
    findings = verify(entries, links, vacated=lambda position: True)
    problems = [f"{finding.kind}: {finding.detail}" for finding in findings]
    if problems:
        return SessionAudit(len(entries), len(pending), "mismatch", problems)
    return SessionAudit(len(entries), len(pending), "pending" if pending else "verified")
