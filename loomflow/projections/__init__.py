"""The read model: the fold from events to rows (``fold``), the apply step written once
over a small dialect interface (``apply``), and each dialect: ``sqlite/``, ``postgres/``
(each holding all of its SQL) and ``memory`` (the in-process store's dicts)."""

from loomflow.projections.fold import (
    CheckpointRow,
    Mutation,
    StepRow,
    fold,
    materialise,
)

__all__ = ["CheckpointRow", "Mutation", "StepRow", "fold", "materialise"]
