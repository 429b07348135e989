"""What an event of the log says, in a few words: a line of ``loomflow tail`` and of the
console's event history."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomflow.schemas import Event

__all__ = ["describe", "event_types"]

#: the characters of a text or arguments a line shows
_PREVIEW = 80


def event_types() -> tuple[str, ...]:
    """The type of every event of the log, in alphabetical order."""
    from typing import get_args

    from loomflow.schemas import Event

    union = get_args(Event)[0]
    return tuple(sorted(kind.model_fields["type"].default for kind in get_args(union)))


def describe(event: Event) -> str:
    """What an event says, in a few words."""
    import orjson

    from loomflow.schemas import (
        CheckpointWritten,
        RunCancelled,
        RunFailed,
        RunFinished,
        RunStarted,
        RunWaiting,
        SessionForked,
        SignalSent,
        StepRecorded,
        TurnAppended,
    )

    match event:
        case TurnAppended(payload=p):
            parts = []
            for m in p.messages:
                text = _short(m.content)
                calls = ", ".join(f"{c.name}({_args(c.arguments)})" for c in m.tool_calls)
                said = f"{m.role.value}: {text}" if text else m.role.value
                parts.append(f"{said} -> {calls}" if calls else said)
            usage = p.usage
            if p.model_call:
                parts.append(
                    f"[{usage.input_tokens} in / {usage.output_tokens} out tokens, "
                    f"${usage.cost_usd:.4f}]"
                )
            return " | ".join(parts)
        case RunStarted(payload=p):
            text = p.mode + (f" from {p.from_checkpoint}" if p.from_checkpoint else "")
            text += f" by worker {p.worker}" if p.worker else ""
            return text + (f", interrupting run {p.interrupted}" if p.interrupted else "")
        case RunWaiting(payload=p):
            until = f" until {p.until:%Y-%m-%d %H:%M:%S} UTC" if p.until else ""
            return f"for signal {p.signal!r} in a {p.where.replace('_', ' ')}{until}"
        case SignalSent(payload=p):
            return f"{p.name}: {_short(orjson.dumps(p.data).decode())}"
        case RunFinished(payload=p):
            # the session's totals as the run left them, not the run's own
            turns = "1 turn" if p.turns == 1 else f"{p.turns} turns"
            return (
                f"{p.stop_reason}; session totals {turns}, {p.usage.total_tokens} tokens, "
                f"${p.usage.cost_usd:.4f}: "
                + (_short(p.output) if p.output is not None else "its answer is the last above")
            )
        case RunFailed(payload=p):
            return ("parked: " if p.parked else "") + f"{p.error_type}: {_short(p.error)}"
        case RunCancelled(payload=p):
            return _short(p.reason) if p.reason else "no reason given"
        case CheckpointWritten(payload=p):
            return f"{p.checkpoint_id} at turn {p.turn}, {p.message_count} messages"
        case SessionForked(payload=p):
            return f"from {p.parent_session_id} at {p.parent_checkpoint_id}"
        case StepRecorded(payload=p):
            received = f" (received signal #{p.signal_seq})" if p.signal_seq else ""
            return p.step_key + received
    return ""


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _PREVIEW else flat[: _PREVIEW - 1] + "…"


def _args(arguments: dict[str, Any]) -> str:
    return _short(", ".join(f"{k}={v!r}" for k, v in arguments.items()))
