"""The read model: the fold from events to rows (``fold``), the apply step written once
over a small dialect interface (``apply``), and each dialect: ``sqlite/``, ``postgres/``
(each holding all of its SQL, the audit trail's and the stats database's included) and
``memory`` (the in-process store's dicts). ``migrations``: the one scheme every schema we
own is versioned by; ``chain`` and ``trail``: the audit trail's hash chain and the
interface each dialect's trail implements (``audit`` names them all).

The fold's names below load with their module when first asked for: a store made but not
yet used (``SqliteRuntime(path)``) needs none of them. ``fold`` here is the module, so the
function is ``loomflow.projections.fold.fold``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomflow.projections.fold import (
        CheckpointRow,
        Mutation,
        StepRow,
        materialise,
    )

__all__ = ["CheckpointRow", "Mutation", "StepRow", "materialise"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("loomflow.projections.fold"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
