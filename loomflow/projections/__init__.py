"""The read model: the fold from events to rows, and each dialect's SQL."""

from loomflow.projections.fold import (
    CheckpointRow,
    Mutation,
    StepRow,
    fold,
    materialise,
)

__all__ = ["CheckpointRow", "Mutation", "StepRow", "fold", "materialise"]
