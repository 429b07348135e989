"""The read model held in memory: how the in-process store applies the fold's mutations."""

from __future__ import annotations

from dataclasses import dataclass, field

from loomflow.projections.fold import (
    AddTranscript,
    CheckpointRow,
    DeleteCheckpoints,
    EraseSession,
    Mutation,
    PutCheckpoint,
    PutStep,
    RetainCheckpoints,
    StepRow,
)

__all__ = ["MemorySession", "apply"]


@dataclass
class MemorySession:
    """One session's read-model rows; the transcript stays in the log itself."""

    checkpoints: list[CheckpointRow] = field(default_factory=list)  # ascending seq
    steps: dict[str, StepRow] = field(default_factory=dict)


def apply(target: MemorySession, mutation: Mutation) -> None:
    """Apply one mutation. Transcript rows need nothing: the log already holds them."""
    match mutation:
        case AddTranscript():
            pass
        case PutCheckpoint(row=row):
            target.checkpoints.append(row)
        case RetainCheckpoints(keep=keep):
            if len(target.checkpoints) > keep:
                del target.checkpoints[:-keep]
        case DeleteCheckpoints(checkpoint_ids=ids):
            drop = set(ids)
            target.checkpoints = [c for c in target.checkpoints if c.checkpoint_id not in drop]
        case PutStep(row=row):
            target.steps[row.step_key] = row
        case EraseSession():
            target.checkpoints.clear()
            target.steps.clear()
