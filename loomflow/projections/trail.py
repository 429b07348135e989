"""The audit trail's interface, which each dialect's trail implements: a SQLite file beside
an embedded log (``projections/sqlite/audit.py``), or tables of the read model's
PostgreSQL schema at scale (``projections/postgres/audit.py``). Both hold the same
entries (see ``audit/auditor.py``), keep what could not be chained among the rejects, each
session's :class:`~loomflow.projections.admission.Standing` (what the rule of validity
knows of it) and the digests written so far (``audit/digests.py``), with what each
session's chain had reached at the last one.

The trail is append-only but for one update: an erasure or prune sets the bodies of the
entries it removed to NULL (their digests and hashes stay, so the chain still verifies).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from loomflow.lifecycle import Resource
from loomflow.projections.admission import Standing
from loomflow.projections.chain import Chained, Entry, Head
from loomflow.projections.rows import stored_user
from loomflow.schemas.scope import Scope

__all__ = [
    "ANY_USER",
    "ENTRY_FIELDS",
    "STANDING_FIELDS",
    "Digested",
    "MakeDigest",
    "Reject",
    "SessionHead",
    "Trail",
    "default_trail_path",
    "entry_from_row",
    "entry_values",
    "standing_values",
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


#: the columns of a session's standing in both dialects, after (user_id, session_id)
STANDING_FIELDS = ("epoch", "last_seq", "message_count", "cancelled", "erased", "gapped")


@dataclass(frozen=True)
class SessionHead:
    """Where a session's chain stands: its newest entry ``n``, that entry's seq and hash."""

    user_id: str | None
    session_id: str
    n: int
    seq: int
    hash: str

    @property
    def scope(self) -> Scope:
        return Scope(self.session_id, self.user_id)


@dataclass(frozen=True)
class Digested:
    """The newest digest the trail wrote: its number, its hash, when, and how many entries
    the trail held then."""

    n: int
    hash: str
    at: datetime
    records: int


#: what writes a digest (``audit/digests.py``), given the trail's newest digest (None
#: before the first), the heads of the sessions whose chains grew since, and the count of
#: entries: the digest written to its place, and its bytes, for the trail to keep
MakeDigest = Callable[[Digested | None, list[SessionHead], int], Awaitable[tuple[Digested, bytes]]]


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


def standing_values(scope: Scope, st: Standing) -> tuple[object, ...]:
    """A session's standing as the values of (user_id, session_id, *STANDING_FIELDS)."""
    return (
        stored_user(scope.user_id),
        scope.session_id,
        st.epoch,
        st.last_seq,
        st.message_count,
        st.cancelled,
        st.erased,
        st.gapped,
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
    async def standings(self, scopes: Iterable[Scope]) -> dict[Scope, Standing]:
        """What the rule of validity knows of each session that has a standing."""

    @abstractmethod
    async def write(
        self,
        chained: Chained,
        rejects: Sequence[Reject],
        position: dict[int, int] | None,
        standings: Mapping[Scope, Standing],
    ) -> None:
        """Add the entries, apply their redactions, keep the rejects, the sessions' new
        standings and (embedded) the log position reached, in one transaction."""

    @abstractmethod
    async def digested(self) -> Digested | None:
        """The newest digest written, None before the first."""

    @abstractmethod
    async def entry_count(self) -> int:
        """How many entries the trail holds."""

    @abstractmethod
    async def write_digest(self, make: MakeDigest) -> Digested:
        """Write the next digest: holding the trail's digest lock (one writer at a time,
        across processes), read the newest digest, the heads of the sessions that grew
        since and the count of entries; ``make`` writes the digest to its place; then keep
        it and that it committed those heads. When ``make`` raises, nothing is kept."""

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
