"""Plain functions the processor's analytics agents call: no I/O, tested directly."""

from __future__ import annotations

from dataclasses import dataclass

from loomflow.errors import InvalidEventError
from loomflow.producers import scope_key
from loomflow.schemas import RunFinished, RunStarted, TurnAppended
from loomflow.schemas.codec import decode_event

__all__ = ["RunTransition", "UsageDelta", "run_transition", "usage_delta"]


@dataclass(frozen=True)
class UsageDelta:
    """What one turn cost, for the per-session usage table."""

    scope: str
    tokens: int
    cost_usd: float


@dataclass(frozen=True)
class RunTransition:
    """A session's run started or ended, for the crash watcher."""

    scope: str
    running: bool


def _scope(user_id: str | None, session_id: str) -> str:
    # the same text as the log's record key, so tables partition like the log
    return scope_key(user_id, session_id).decode()


def usage_delta(raw: bytes | None) -> UsageDelta | None:
    """The usage a record adds, or None when it adds none (or does not decode)."""
    try:
        event = decode_event(raw or b"")
    except InvalidEventError:
        return None  # the projector dead-letters it; analytics just skips it
    if not isinstance(event, TurnAppended) or not event.payload.model_call:
        return None
    usage = event.payload.usage
    return UsageDelta(_scope(event.user_id, event.session_id), usage.total_tokens, usage.cost_usd)


def run_transition(raw: bytes | None) -> RunTransition | None:
    """Whether a record starts or ends a run of its session."""
    try:
        event = decode_event(raw or b"")
    except InvalidEventError:
        return None
    scope = _scope(event.user_id, event.session_id)
    if isinstance(event, RunStarted):
        return RunTransition(scope, True)
    if isinstance(event, RunFinished) or event.type in ("run.failed", "session.erased"):
        return RunTransition(scope, False)
    return None
