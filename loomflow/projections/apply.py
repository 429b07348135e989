"""The step every store applies to a batch of events, written once over a dialect.

A batch's sessions are read, the event ids stored at the seqs a redelivery could hold are
looked up, :func:`~loomflow.projections.fold.project` folds what is new, and the dialect
writes it, in the caller's transaction. How a dialect reads and writes is its own: SQLite
folds from the rows of its own last commit and gives each batch of a round a savepoint;
PostgreSQL locks the rows it reads and applies a batch's mutations in waves, its log rows
by COPY; the in-process store keeps dicts. SQLite and the in-process store run the step
as plain calls (SQLite commits on the event loop's thread, see SqliteStore), PostgreSQL
awaits each phase: ``apply_batch`` and ``apply_batch_async`` are the same few lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from loomflow.projections.fold import Change, maybe_redelivered, project
from loomflow.schemas import Event
from loomflow.schemas.scope import Scope, scope_of
from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "AsyncDialect",
    "Dialect",
    "NewRows",
    "Seq",
    "StoredRows",
    "apply_batch",
    "apply_batch_async",
    "scopes",
]

#: (scope, seq): where in a session's log an event is
Seq = tuple[Scope, int]
#: the rows of a batch's sessions as stored (a session with none: missing, or None)
StoredRows = Mapping[Scope, SessionRecord | None]
#: the rows of a batch's sessions that it changed, as they are to be stored
NewRows = Mapping[Scope, SessionRecord]


class Dialect(Protocol):
    """What the apply step needs of a store, in the caller's transaction."""

    def rows(self, scopes: Sequence[Scope]) -> StoredRows:
        """The stored rows of these sessions; a session with no row is missing (or None)."""

    def event_ids(self, wanted: Sequence[Seq]) -> Mapping[Seq, str]:
        """The id of the event the log holds at each of these seqs; missing where none."""

    def write(self, changes: Sequence[Change], rows: NewRows, before: StoredRows) -> None:
        """Append each change's event to the log and apply its mutations, then save the
        changed ``rows`` (``before``: as ``rows()`` returned them). Raise an
        InvalidEventError subclass when something stored refuses one of them."""


class AsyncDialect(Protocol):
    """A :class:`Dialect` whose reads and writes are awaited (PostgreSQL)."""

    async def rows(self, scopes: Sequence[Scope]) -> StoredRows:
        """As ``Dialect.rows``."""

    async def event_ids(self, wanted: Sequence[Seq]) -> Mapping[Seq, str]:
        """As ``Dialect.event_ids``."""

    async def write(self, changes: Sequence[Change], rows: NewRows, before: StoredRows) -> None:
        """As ``Dialect.write``."""


def scopes(events: Iterable[Event]) -> list[Scope]:
    """The sessions of a batch's events, each once, in the order they first come."""
    return list(dict.fromkeys(scope_of(event) for event in events))


def apply_batch(dialect: Dialect, events: Sequence[Event]) -> dict[Scope, SessionRecord]:
    """Fold ``events`` into the read model and append them to the log through
    ``dialect``; return the sessions' changed rows.

    An event already stored at its seq (same event id) is skipped. One the fold refuses
    raises its InvalidEventError subclass before anything is written, one a stored row
    refuses raises from the write; either way the caller rolls its transaction (or
    savepoint) back.
    """
    rows = dialect.rows(scopes(events))
    wanted = maybe_redelivered(rows, events)
    changed, changes = project(rows, events, dialect.event_ids(wanted) if wanted else {})
    dialect.write(changes, changed, rows)
    return changed


async def apply_batch_async(
    dialect: AsyncDialect, events: Sequence[Event]
) -> dict[Scope, SessionRecord]:
    """:func:`apply_batch` over a dialect whose reads and writes are awaited."""
    rows = await dialect.rows(scopes(events))
    wanted = maybe_redelivered(rows, events)
    changed, changes = project(rows, events, await dialect.event_ids(wanted) if wanted else {})
    await dialect.write(changes, changed, rows)
    return changed
