"""The audit trail's interface, which each dialect's trail implements: a SQLite file beside
an embedded log (``projections/sqlite/audit.py``), or tables of the read model's
PostgreSQL schema at scale (``projections/postgres/audit.py``). Both hold the same
entries (see ``audit/auditor.py``) and keep what could not be chained among the rejects.

The trail is append-only but for one update: an erasure or prune sets the bodies of the
entries it removed to NULL (their digests and hashes stay, so the chain still verifies).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from loomflow.lifecycle import Resource
from loomflow.projections.chain import Chained, Entry, Head
from loomflow.projections.rows import stored_user
from loomflow.schemas.scope import Scope

__all__ = [
    "ANY_USER",
    "ENTRY_FIELDS",
    "Reject",
    "Trail",
    "default_trail_path",
    "entry_from_row",
    "entry_values",
]

#: every user's sessions (``user`` of :meth:`Trail.entries`)
ANY_USER: Any = ...

#: the columns of an entry in both dialects, in this order
ENTRY_FIELDS = (
    "user_id",
    "session_id",
    "n",
    "position",
    "key",
    "seq",
    "type",
    "at",
    "digest",
    "body",
    "prev",
    "hash",
)


@dataclass(frozen=True)
class Reject:
    """A record the audit could not chain (it does not decode, or claims another scope
    than its key, or repeats an event already audited), kept as it was."""

    position: str
    reason: str
    raw: bytes | None


def default_trail_path(log: Path) -> Path:
    """The trail file of an embedded log: ``journal.db`` -> ``journal.audit.db``."""
    return log.with_name(f"{log.stem}.audit{log.suffix or '.db'}")


def entry_from_row(row: Sequence[Any], at: datetime) -> Entry:
    """The entry of a row of ENTRY_FIELDS, with ``at`` as the dialect decoded it."""
    user_id, session_id, n, position, key, seq, type_, _, digest, body, prev, hash_ = row
    return Entry(
        user_id or None,
        session_id,
        n,
        position,
        key,
        seq,
        type_,
        at,
        digest,
        None if body is None else body.encode() if isinstance(body, str) else bytes(body),
        prev,
        hash_,
    )


def entry_values(e: Entry, at: object) -> tuple[object, ...]:
    """An entry as the values of ENTRY_FIELDS, with ``at`` as the dialect takes it."""
    return (
        stored_user(e.user_id),
        e.session_id,
        e.n,
        e.position,
        e.key,
        e.seq,
        e.type,
        at,
        e.digest,
        e.body,
        e.prev,
        e.hash,
    )


class Trail(Resource):
    """The audit trail: chains per session, the rejects, and (embedded) the position."""

    #: where it is, for messages
    where: str

    @abstractmethod
    async def heads(self, scopes: Iterable[Scope]) -> dict[Scope, Head]:
        """The newest entry of each session that has one."""

    @abstractmethod
    async def known(self, keys: Sequence[str]) -> dict[str, str]:
        """Of these entry keys (event ids), those already in the trail, with the position
        they were audited at."""

    @abstractmethod
    async def write(
        self, chained: Chained, rejects: Sequence[Reject], position: dict[int, int] | None
    ) -> None:
        """Add the entries, apply their redactions, keep the rejects and (embedded) the
        log position reached, in one transaction."""

    @abstractmethod
    async def position(self) -> dict[int, int] | None:
        """The embedded log's position the trail has reached (None at scale: Kafka keeps
        the audit group's offsets)."""

    @abstractmethod
    async def entries(self, user_id: Any = ANY_USER, session_id: str | None = None) -> list[Entry]:
        """Entries of the sessions selected, by session then ``n``."""

    @abstractmethod
    async def rejects(self) -> list[Reject]:
        """The records that could not be chained, in the order they were met."""
