"""The status a person reads off a session: the log's, or one read off the clock or the
lineage (``abandoned``, ``forked``), never written."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loomflow.schemas.sessions import SessionRecord

__all__ = ["STATUSES", "STORED", "status"]

#: the statuses a person reads (``status``), which ``sessions ls --status`` and the
#: console's filter take
STATUSES = (
    "running",
    "abandoned",
    "waiting",
    "signalled",
    "stuck",
    "finished",
    "failed",
    "forked",
    "cancelled",
)

#: the status the log gives a session that a person reads as abandoned; a forked one (no
#: run yet) may be in any (None)
STORED: dict[str, str | None] = {"abandoned": "running", "forked": None}


def status(row: SessionRecord) -> str:
    """The status a person reads: ``forked`` for a session `sessions fork` made that has
    had no run yet; ``abandoned`` for a running one whose writer has been silent past its
    lease (read off the lease and the clock now, never written: a worker takes it over);
    else the status the log gives it."""
    from loomflow.runtime.base import abandoned

    if row.last_run_id is None:
        return "forked"
    return "abandoned" if abandoned(row) else row.status
