"""The read model: the fold from events to rows (``fold``), the apply step written once
over a small dialect interface (``apply``), and each dialect: ``sqlite/``, ``postgres/``
(each holding all of its SQL, the audit trail's and the stats database's included) and
``memory`` (the in-process store's dicts). ``migrations``: the one scheme every schema we
own is versioned by; ``chain`` and ``trail``: the audit trail's hash chain and the
interface each dialect's trail implements (``audit`` names them all)."""

from loomflow.projections.fold import (
    CheckpointRow,
    Mutation,
    StepRow,
    fold,
    materialise,
)

__all__ = ["CheckpointRow", "Mutation", "StepRow", "fold", "materialise"]
