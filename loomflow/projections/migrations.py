"""How every schema we own is versioned: the journal, the audit trail and the stats
database (SQLite files), and the read model (a PostgreSQL schema).

A schema's :class:`Migrations` are numbered steps; each runs once, in order, and the
version reached is kept in the schema's meta table, in the transaction of the steps. A
schema at a newer version than the code knows is refused, saying to upgrade loomflow.
Each dialect has one runner that applies them: ``projections/sqlite/schema.py``
(``migrate``, under ``BEGIN IMMEDIATE``) and ``projections/postgres/schema.py``
(``migrate``, under an advisory lock), so several processes opening one schema at once
all get it migrated once.

A step is fixed text: once released it never changes (a file at its version has what it
made), and what changes later is a step of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from loomflow.errors import StoreError

__all__ = ["Migrations"]


@dataclass(frozen=True)
class Migrations:
    """The numbered steps of one schema; ``steps[0]`` makes version 1 from nothing.

    ``meta`` is the table its runner keeps the version reached in (created by the runner
    with the first step), named as the schema's other tables are: a SQLite file beside a
    journal holds only tables of its own prefix.
    """

    meta: str
    steps: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a schema's migrations have at least the step that makes it")

    @property
    def version(self) -> int:
        """The version the steps bring a schema to: the one this code reads and writes."""
        return len(self.steps)

    def check(self, current: int, where: str) -> None:
        """Refuse a schema at a newer version than this code knows (``where`` names it:
        "the SQLite store journal.db")."""
        if current > self.version:
            raise StoreError(
                f"{where} is at schema version {current}, newer than version {self.version} "
                "that this loomflow knows: upgrade loomflow to open it"
            )

    def pending(self, current: int, where: str) -> list[tuple[int, str]]:
        """The steps a schema at version ``current`` has not run, with their numbers, in
        order; refused (:meth:`check`) when it is newer than this code."""
        self.check(current, where)
        return [(n, self.steps[n - 1]) for n in range(current + 1, self.version + 1)]
