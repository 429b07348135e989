"""Consumers of the log: the projector into PostgreSQL, analytics, the faust apps.

``Projector`` and ``DeadLetter`` load (with aiokafka and asyncpg) when first named, so the
embedded consumers here (``analytics``, ``stats_db``) need neither installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomflow.processors.projector import DeadLetter, Projector

__all__ = ["DeadLetter", "Projector"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from loomflow.processors import projector

        return getattr(projector, name)
    raise AttributeError(f"module 'loomflow.processors' has no attribute {name!r}")
