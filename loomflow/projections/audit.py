"""Where the audit trail is kept, by one name: its interface (``projections/trail.py``)
and the trail of each dialect, a SQLite file beside an embedded log
(``projections/sqlite/audit.py``) or tables of the read model's PostgreSQL schema at
scale (``projections/postgres/audit.py``).

:class:`PostgresTrail` is imported when it is first asked for, so an embedded user never
needs asyncpg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomflow.projections.sqlite.audit import SqliteTrail
from loomflow.projections.trail import ANY_USER, Reject, Trail, default_trail_path

if TYPE_CHECKING:
    from loomflow.projections.postgres.audit import PostgresTrail

__all__ = ["ANY_USER", "PostgresTrail", "Reject", "SqliteTrail", "Trail", "default_trail_path"]


def __getattr__(name: str) -> Any:
    if name == "PostgresTrail":
        from loomflow.projections.postgres.audit import PostgresTrail

        return PostgresTrail
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
