"""Plain functions the processor's analytics agents call: no I/O, tested directly."""

from __future__ import annotations

from dataclasses import dataclass

from loomflow.errors import InvalidEventError
from loomflow.schemas import RunFinished, RunStarted, TurnAppended
from loomflow.schemas.codec import decode_event

__all__ = ["RunTransition", "UsageDelta", "run_transition", "usage_delta"]


@dataclass(frozen=True)
class UsageDelta:
    """What one turn cost, for the per-user usage table."""

    user: str
    tokens: int
    cost_usd: float


@dataclass(frozen=True)
class RunTransition:
    """A session's run started or ended, for the crash watcher."""

    scope: str
    running: bool


def usage_delta(raw: bytes | None) -> UsageDelta | None:
    """The usage a record adds, or None when it adds none (or does not decode)."""
    try:
        event = decode_event(raw or b"")
    except InvalidEventError:
        return None  # the projector dead-letters it; analytics just skips it
    if not isinstance(event, TurnAppended) or not event.payload.model_call:
        return None
    usage = event.payload.usage
    return UsageDelta(event.user_id or "", usage.total_tokens, usage.cost_usd)


def run_transition(raw: bytes | None) -> RunTransition | None:
    """Whether a record starts or ends a run of its session."""
    try:
        event = decode_event(raw or b"")
    except InvalidEventError:
        return None
    scope = f"{event.user_id or ''}/{event.session_id}"
    if isinstance(event, RunStarted):
        return RunTransition(scope, True)
    if isinstance(event, RunFinished) or event.type in ("run.failed", "session.erased"):
        return RunTransition(scope, False)
    return None
