"""The faust apps of the scaled path: the projector (``app``), snapshots, rebuild.

``app`` is the processor ``loomflow processor`` runs; ``projector`` its batch loop into
the PostgreSQL read model, which publishes ``snapshots``; ``rebuild`` replays the topic
into a new schema. ``Projector`` and ``DeadLetter`` load (with aiokafka and asyncpg) when
first named.
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
