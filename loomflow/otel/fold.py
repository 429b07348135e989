"""The fold of the log into spans: how each event changes a session's trace. Plain
Python, no I/O, tested directly.

A session's :class:`SessionTrace` is what the consumer keeps between two records of the
session: how far it was read (its last seq and writer epoch, so a record read again adds
nothing), the run in flight with what its span has gathered so far, and the latest run
that ended (which a resume continues). :func:`fold` applies one event and returns the
spans it finished:

- ``invoke_agent {agent}``, one per run, from its ``run.started`` to the event that ends
  it: ``run.finished``, ``run.failed``, ``run.waiting`` (the run stops to wait for a
  signal), the ``run.started`` of the run that took the session over (the run crashed or
  went silent; that claim is the record of its end), its ``run.cancelled`` or the
  session's erasure. Its span
  events are the run's lifecycle: ``gen_ai.agent.checkpointed``, ``gen_ai.agent.paused``,
  ``gen_ai.agent.resumed``, ``loomflow.run.taken_over``, ``loomflow.signal.sent`` and
  ``loomflow.signal.received``. It is exported when the run ends, its children as they do.
- ``chat {model}``, one per model call (a turn with ``model_call``, or a compaction's
  summary): it ends when its turn was recorded and lasted the turn's ``latency_ms``.
- ``execute_tool {tool}``, one per tool result: from the run's previous step (its start,
  a model call or the previous tool's result; a run calls its tools one at a time) to
  the result's event.
- A run that failed where its next step was a model call (or a tool call) gets that call
  as a failed span, ending at the failure: the call that raised is recorded nowhere else.

A run continues another (it joins its trace, and links to it) when it goes on with the
work of the session's previous run, which did not finish: that run crashed or went
silent and this one took the session over, it waits for a signal, or it failed and this
is its resume. A run after a finished one starts a trace of its own (a resume links to
the run it follows). Turns a continuing run restores from events recorded after the
session's latest checkpoint are the ones it replayed: neither called nor billed again,
so its span links to their ``chat`` spans (``loomflow.replayed``, ``loomflow.billed``
false) instead of holding a second copy, and its usage is its own calls' only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import TypeAdapter

from loomflow.otel.spans import (
    Attributes,
    Span,
    SpanEvent,
    SpanLink,
    call_span_id,
    run_span_id,
    trace_id_of,
)
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    Message,
    Role,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunStarted,
    RunWaiting,
    SessionErased,
    SessionForked,
    SignalSent,
    StepRecorded,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)
from loomflow.schemas.events import CLAIM_TYPES

__all__ = [
    "MAX_REPLAYED",
    "MAX_SPAN_EVENTS",
    "Folded",
    "OpenRun",
    "Outcome",
    "RunRef",
    "SessionTrace",
    "decode_state",
    "encode_state",
    "fold",
]

#: how a run ended, as its span's ``loomflow.run.outcome`` says
Outcome = Literal["finished", "failed", "stuck", "waiting", "interrupted", "erased", "cancelled"]
#: what the session's run does next, as its transcript says (for a failure's last step)
NextStep = Literal["model", "tools", "answer"]

#: span events kept on one run's span (a run of thousands of passes checkpoints each):
#: later ones are counted in ``loomflow.span_events.dropped``, as the SDK's limit does
MAX_SPAN_EVENTS = 128
#: replayed turns a run's span links to (a session without checkpoints replays them all)
MAX_REPLAYED = 128

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the exception a tool's error result starts with ("ValueError: ..."), for error.type
_ERROR_NAME = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Timeout|Refused))\b")


@dataclass
class RunRef:
    """A run that ended, as a run that continues it points at it."""

    run_id: str
    trace_id: str
    span_id: str
    outcome: Outcome


@dataclass
class TurnRef:
    """A model call's span, kept until a checkpoint covers its turn."""

    trace_id: str
    span_id: str
    turn: int


@dataclass
class PendingCall:
    """A tool call the model asked for that has no result yet."""

    call_id: str
    name: str


@dataclass
class SentSignal:
    """A signal in the session's inbox, not yet received by a wait."""

    seq: int
    name: str
    at_ns: int


@dataclass
class OpenRun:
    """The run in flight: its span as gathered so far."""

    run_id: str
    trace_id: str
    span_id: str
    name: str
    start_ns: int
    #: when the run's latest step ended (its start, a model call, a tool's result): where
    #: its next tool call starts
    cursor_ns: int
    attributes: Attributes
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    #: what this run's own model calls cost (restored turns are billed to their runs)
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    dropped_events: int = 0


@dataclass
class SessionTrace:
    """What the consumer keeps of one session between two of its records."""

    last_seq: int = 0
    epoch: int = 0
    erased: bool = False
    run: OpenRun | None = None
    last: RunRef | None = None
    #: model turns the session has recorded (what a later run restores)
    turns: int = 0
    #: the model calls since the session's latest checkpoint (the newest MAX_REPLAYED of
    #: them), and how many there are: what a run that continues the session replays
    since_checkpoint: list[TurnRef] = field(default_factory=list)
    replayed: int = 0
    pending: list[PendingCall] = field(default_factory=list)
    next_step: NextStep | None = None
    signals: list[SentSignal] = field(default_factory=list)
    #: (parent session, checkpoint) of a fork, for its first run's span
    forked_from: tuple[str, str] | None = None


_STATE = TypeAdapter(SessionTrace)


def encode_state(state: SessionTrace) -> str:
    """A session's trace state as JSON, to store."""
    return _STATE.dump_json(state).decode()


def decode_state(text: str | bytes) -> SessionTrace:
    """A stored session's trace state."""
    return _STATE.validate_json(text)


@dataclass(frozen=True)
class Folded:
    """What one event did: the spans it finished, or why it was not taken."""

    spans: list[Span] = field(default_factory=list)
    refused: str | None = None
    #: the event was read already (a redelivery): refused, and nothing to report
    duplicate: bool = False


def fold(state: SessionTrace, event: Event, *, contiguous: bool = True) -> Folded:
    """Apply ``event`` to its session's ``state`` (changed in place); return the spans it
    finished.

    The rules of what is taken are the projector's (``projections.fold``), so a trace
    holds what the read model does: a seq at or below the last one is a redelivery; an
    epoch older than the session's is a fenced writer's; a newer one is only taken by a
    run start, fork, erasure or signal; nothing after an erasure. ``contiguous`` (Kafka)
    also refuses a seq that skips ahead; the embedded log may have gaps where prune
    removed journal steps.
    """
    where = f"session {event.session_id!r} (user {event.user_id!r}) seq {event.seq}"
    seen = state.last_seq > 0
    if seen and event.seq <= state.last_seq:
        return Folded(refused=f"{where} was read already", duplicate=True)
    if state.erased:
        return Folded(refused=f"{where} comes after the session's erasure")
    if event.epoch < state.epoch:
        return Folded(refused=f"{where}: writer epoch {event.epoch} is older than {state.epoch}")
    if seen and event.epoch > state.epoch and not isinstance(event, CLAIM_TYPES):
        return Folded(
            refused=f"{where}: {event.type} claims epoch {event.epoch} (the session is at "
            f"{state.epoch}); only a run start, fork, erasure or signal does"
        )
    if contiguous and seen and event.seq != state.last_seq + 1:
        return Folded(refused=f"{where} skips ahead of seq {state.last_seq + 1}")
    state.last_seq = event.seq
    state.epoch = max(state.epoch, event.epoch)
    spans: list[Span] = []
    _apply(state, event, spans)
    return Folded(spans)


def _apply(state: SessionTrace, event: Event, spans: list[Span]) -> None:
    at = _ns(event.at)
    ended = state.last
    if state.run is None and ended is not None and event.run_id == ended.run_id:
        return  # after its end, nothing of a run is a span (its span was sent)
    match event:
        case RunStarted():
            _start(state, event, spans)
        case TurnAppended(payload=p):
            run = _current(state, event, spans)
            if p.model_call:
                spans.append(_chat(state, run, event, p.model, p.usage, p.latency_ms))
                state.turns += 1
            spans.extend(_tool_results(state, run, event, p.messages))
            _transcript(state, p.messages)
        case TranscriptCompacted(payload=p):
            run = _current(state, event, spans)
            spans.append(_chat(state, run, event, p.model, p.usage, p.latency_ms))
            state.pending = []
            _transcript(state, p.messages[-1:])
        case StepRecorded(payload=p) if p.signal_seq is not None:
            run = _current(state, event, spans)
            sent = next((s for s in state.signals if s.seq == p.signal_seq), None)
            state.signals = [s for s in state.signals if s.seq != p.signal_seq]
            attributes: Attributes = {"loomflow.signal.seq": p.signal_seq}
            if sent is not None:
                attributes["loomflow.signal.name"] = sent.name
            _event(run, "loomflow.signal.received", at, attributes)
        case CheckpointWritten(payload=p):
            run = _current(state, event, spans)
            state.since_checkpoint, state.replayed = [], 0
            _event(
                run,
                "gen_ai.agent.checkpointed",
                at,
                {
                    "loomflow.checkpoint.id": p.checkpoint_id,
                    "loomflow.checkpoint.turn": p.turn,
                    "loomflow.checkpoint.messages": p.message_count,
                },
            )
        case RunWaiting(payload=p):
            run = _current(state, event, spans)
            waiting: Attributes = {"loomflow.signal.name": p.signal, "loomflow.wait.where": p.where}
            if p.until is not None:
                waiting["loomflow.wait.until"] = p.until.isoformat()
            _event(run, "gen_ai.agent.paused", at, waiting)
            spans.append(_end(state, run, at, "waiting"))
        case RunFinished(payload=p):
            run = _current(state, event, spans)
            run.attributes["loomflow.run.stop_reason"] = p.stop_reason
            spans.append(_end(state, run, at, "finished"))
        case RunFailed(payload=p):
            run = _current(state, event, spans)
            spans.extend(_failed_step(state, run, event))
            run.attributes["error.type"] = p.error_type
            error = f"{p.error_type}: {p.error}"[:500]
            spans.append(_end(state, run, at, "stuck" if p.parked else "failed", error))
        case RunCancelled(payload=p):
            # a person stopped the run (`loomflow sessions cancel`): its span ends here, and
            # a resume of the session later goes on with it, in its trace
            if state.run is not None:
                error = f"cancelled: {p.reason}" if p.reason else "cancelled"
                spans.append(_end(state, state.run, at, "cancelled", error[:500]))
        case SignalSent(payload=p):
            state.signals.append(SentSignal(event.seq, p.name, at))
            if state.run is not None:
                _event(
                    state.run,
                    "loomflow.signal.sent",
                    at,
                    {"loomflow.signal.name": p.name, "loomflow.signal.seq": event.seq},
                )
        case SessionForked(payload=p):
            state.forked_from = (p.parent_session_id, p.parent_checkpoint_id)
            state.turns = p.turn
            _transcript(state, p.messages)
        case SessionErased():
            if state.run is not None:
                spans.append(_end(state, state.run, at, "erased", "the session was erased"))
            # nothing of an erased session is kept but that it was erased
            erased = SessionTrace(last_seq=state.last_seq, epoch=state.epoch, erased=True)
            for name in SessionTrace.__dataclass_fields__:
                setattr(state, name, getattr(erased, name))
        case _:
            pass  # heartbeats, prunes of checkpoints and future events end no span


def _ns(at: datetime) -> int:
    """Nanoseconds since the epoch, exactly (a float of them loses microseconds)."""
    return (at - _EPOCH) // timedelta(microseconds=1) * 1000


def _common(event: Event) -> Attributes:
    attributes: Attributes = {"gen_ai.conversation.id": event.session_id}
    if event.user_id is not None:
        attributes["user.id"] = event.user_id
    return attributes


def _continues(previous: RunRef | None, started: RunStarted) -> bool:
    """Whether a run goes on with the work of the session's previous run: that one did
    not finish (it crashed or went silent and this run took the session over, it waits
    for a signal, it failed or was parked) and this run is its resume, a worker's
    take-over, the claim that fenced it, or the end of its wait."""
    if previous is None or previous.outcome == "finished":
        return False
    p = started.payload
    return (
        p.mode == "resume"  # "run" when the session had no checkpoint to resume from
        or p.worker is not None
        or p.interrupted == previous.run_id
        or previous.outcome == "waiting"
    )


def _start(state: SessionTrace, event: RunStarted, spans: list[Span]) -> None:
    p = event.payload
    at = _ns(event.at)
    if state.run is not None:  # the run in flight stopped without recording its end
        _interrupted(state, state.run, event, spans)
    previous = state.last
    continues = _continues(previous, event)
    trace = trace_id_of(event.session_id, event.run_id)
    if continues and previous is not None:
        trace = previous.trace_id
    attributes: Attributes = {
        "gen_ai.operation.name": "invoke_agent",
        **_common(event),
        "loomflow.run.id": event.run_id,
        "loomflow.run.mode": p.mode,
        "loomflow.run.restored_turns": state.turns,
    }
    if p.agent is not None:
        attributes["gen_ai.agent.name"] = p.agent
    if p.model is not None:
        attributes["gen_ai.request.model"] = p.model
    if p.worker is not None:
        attributes["loomflow.run.worker"] = p.worker
    if p.from_checkpoint is not None:
        attributes["loomflow.run.from_checkpoint"] = p.from_checkpoint
    if p.mode == "fork" and state.forked_from is not None:
        attributes["loomflow.fork.parent_session_id"] = state.forked_from[0]
        attributes["loomflow.fork.parent_checkpoint_id"] = state.forked_from[1]
    run = OpenRun(
        run_id=event.run_id,
        trace_id=trace,
        span_id=run_span_id(event.session_id, event.run_id),
        name=f"invoke_agent {p.agent}" if p.agent else "invoke_agent",
        start_ns=at,
        cursor_ns=at,
        attributes=attributes,
    )
    state.run = run
    if previous is None or not (continues or p.mode == "resume"):
        return
    relation = "continues" if continues else "follows"  # a resume of a finished run
    run.links.append(
        SpanLink(
            previous.trace_id,
            previous.span_id,
            {"loomflow.link.type": relation, "loomflow.run.id": previous.run_id},
        )
    )
    if not continues:
        return
    replayed = state.since_checkpoint
    run.attributes["loomflow.run.replayed_turns"] = state.replayed
    for turn in replayed:  # restored from the log: neither called nor billed again
        run.links.append(
            SpanLink(
                turn.trace_id,
                turn.span_id,
                {
                    "loomflow.link.type": "replayed",
                    "loomflow.replayed": True,
                    "loomflow.billed": False,
                    "loomflow.turn": turn.turn,
                },
            )
        )
    resumed: Attributes = {
        "loomflow.resumed.run_id": previous.run_id,
        "loomflow.resumed.after": previous.outcome,
        "loomflow.run.restored_turns": state.turns,
        "loomflow.run.replayed_turns": state.replayed,
    }
    if p.from_checkpoint is not None:
        resumed["loomflow.checkpoint.id"] = p.from_checkpoint
    _event(run, "gen_ai.agent.resumed", at, resumed)


def _interrupted(state: SessionTrace, run: OpenRun, claim: RunStarted, spans: list[Span]) -> None:
    """End the run in flight at the claim of the run that took the session over."""
    at = _ns(claim.at)
    taken: Attributes = {"loomflow.run.taken_over_by": claim.run_id}
    if claim.payload.worker is not None:
        taken["loomflow.run.worker"] = claim.payload.worker
    _event(run, "loomflow.run.taken_over", at, taken)
    run.attributes["error.type"] = "interrupted"
    error = (
        f"run {run.run_id} stopped without recording its end (its process died or went "
        f"silent); run {claim.run_id} took the session over"
    )
    spans.append(_end(state, run, at, "interrupted", error))


def _current(state: SessionTrace, event: Event, spans: list[Span]) -> OpenRun:
    """The open run an event belongs to; one opened at this event when the log does not
    hold its start (a log read from a prune onwards)."""
    run = state.run
    if run is not None and run.run_id == event.run_id:
        return run
    if run is not None:
        spans.append(_end(state, run, _ns(event.at), "interrupted", "another run wrote next"))
    at = _ns(event.at)
    state.run = OpenRun(
        run_id=event.run_id,
        trace_id=trace_id_of(event.session_id, event.run_id),
        span_id=run_span_id(event.session_id, event.run_id),
        name="invoke_agent",
        start_ns=at,
        cursor_ns=at,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            **_common(event),
            "loomflow.run.id": event.run_id,
            "loomflow.run.partial": True,  # its start is not in the log
        },
    )
    return state.run


def _event(run: OpenRun, name: str, at: int, attributes: Attributes) -> None:
    if len(run.events) >= MAX_SPAN_EVENTS:
        run.dropped_events += 1
        return
    run.events.append(SpanEvent(name, at, attributes))


def _usage(usage: Usage) -> Attributes:
    """Usage as the conventions count it: input tokens include the cached ones."""
    attributes: Attributes = {
        "gen_ai.usage.input_tokens": (
            usage.input_tokens + usage.cached_input_tokens + usage.cache_write_tokens
        ),
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "loomflow.usage.cost_usd": usage.cost_usd,
    }
    if usage.cached_input_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
    if usage.cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
    return attributes


def _chat(
    state: SessionTrace,
    run: OpenRun,
    event: TurnAppended | TranscriptCompacted,
    model: str | None,
    usage: Usage,
    latency_ms: float | None,
) -> Span:
    end = _ns(event.at)
    start = end - int((latency_ms or 0.0) * 1_000_000)
    attributes: Attributes = {"gen_ai.operation.name": "chat", **_common(event)}
    if model is not None:
        attributes["gen_ai.request.model"] = model
    attributes.update(_usage(usage))
    span_id = call_span_id(event.session_id, event.event_id)
    if isinstance(event, TranscriptCompacted):
        attributes["loomflow.chat.purpose"] = "compaction"
    else:
        turn = _turn_number(event.payload.step_key, state.turns + 1)
        attributes["loomflow.turn"] = turn
        state.since_checkpoint = [
            *state.since_checkpoint[-(MAX_REPLAYED - 1) :],
            TurnRef(run.trace_id, span_id, turn),
        ]
        state.replayed += 1
    run.usage = run.usage + usage
    run.model_calls += 1
    run.cursor_ns = end
    return Span(
        name=f"chat {model}" if model else "chat",
        kind="client",
        trace_id=run.trace_id,
        span_id=span_id,
        parent_id=run.span_id,
        start_ns=min(start, end),
        end_ns=end,
        attributes=attributes,
    )


def _turn_number(step_key: str | None, default: int) -> int:
    if step_key is not None and step_key.startswith("model:"):
        number = step_key.removeprefix("model:")
        if number.isdigit():
            return int(number)
    return default


def _tool_results(
    state: SessionTrace, run: OpenRun, event: TurnAppended, messages: list[Message]
) -> list[Span]:
    spans = []
    end = _ns(event.at)
    results = [m for m in messages if m.role is Role.TOOL and m.tool_call_id is not None]
    for index, message in enumerate(results):
        call_id = message.tool_call_id or ""
        name = next((c.name for c in state.pending if c.call_id == call_id), None)
        state.pending = [c for c in state.pending if c.call_id != call_id]
        error = _tool_error(message.content) if message.is_error else None
        spans.append(_tool_span(run, event, index, call_id, name, run.cursor_ns, end, error))
    if results:
        run.cursor_ns = end
    return spans


def _tool_span(
    run: OpenRun,
    event: Event,
    index: int,
    call_id: str,
    name: str | None,
    start: int,
    end: int,
    error: tuple[str, str] | None,
) -> Span:
    attributes: Attributes = {
        "gen_ai.operation.name": "execute_tool",
        **_common(event),
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
    }
    if name is not None:
        attributes["gen_ai.tool.name"] = name
    if error is not None:
        attributes["error.type"] = error[0]
    return Span(
        name=f"execute_tool {name}" if name else "execute_tool",
        kind="internal",
        trace_id=run.trace_id,
        span_id=call_span_id(event.session_id, event.event_id, index),
        parent_id=run.span_id,
        start_ns=min(start, end),
        end_ns=end,
        attributes=attributes,
        error=None if error is None else error[1],
    )


def _tool_error(content: str) -> tuple[str, str]:
    """(error.type, description) of a tool's error result: the exception it names, or
    ``tool_error``; the description is its first line, cut at 200 characters."""
    first = content.strip().splitlines()[0] if content.strip() else "the tool returned an error"
    match = _ERROR_NAME.match(first)
    return (match.group(1) if match else "tool_error"), first[:200]


def _failed_step(state: SessionTrace, run: OpenRun, event: RunFailed) -> list[Span]:
    """The call a failed run was making when it failed, as a failed span: a model call
    when its transcript awaited one (not a budget's refusal, which comes before the
    call), the first pending tool call when a tool raised what fails a run."""
    p = event.payload
    end = _ns(event.at)
    error = f"{p.error_type}: {p.error}"[:500]
    if state.next_step == "model" and p.error_type != "RunBudgetExceededError":
        model = p.model or run.attributes.get("gen_ai.request.model")
        attributes: Attributes = {
            "gen_ai.operation.name": "chat",
            **_common(event),
            "error.type": p.error_type,
        }
        if isinstance(model, str):
            attributes["gen_ai.request.model"] = model
        return [
            Span(
                name=f"chat {model}" if isinstance(model, str) else "chat",
                kind="client",
                trace_id=run.trace_id,
                span_id=call_span_id(event.session_id, event.event_id),
                parent_id=run.span_id,
                start_ns=min(run.cursor_ns, end),
                end_ns=end,
                attributes=attributes,
                error=error,
            )
        ]
    if state.next_step == "tools" and state.pending:
        call = state.pending[0]
        return [
            _tool_span(
                run,
                event,
                0,
                call.call_id,
                call.name,
                run.cursor_ns,
                end,
                (p.error_type, error),
            )
        ]
    return []


def _transcript(state: SessionTrace, messages: list[Message]) -> None:
    """What the session's run does next, after ``messages`` joined its transcript."""
    for message in messages:
        if message.role is Role.ASSISTANT:
            state.pending = [PendingCall(c.id, c.name) for c in message.tool_calls]
            state.next_step = "tools" if message.tool_calls else "answer"
        elif message.role in (Role.USER, Role.TOOL):
            state.next_step = "tools" if state.pending else "model"


def _end(
    state: SessionTrace, run: OpenRun, at: int, outcome: Outcome, error: str | None = None
) -> Span:
    """The finished span of ``run``, which ends at ``at``; the session has no run in
    flight after it."""
    attributes = dict(run.attributes)
    attributes["loomflow.run.outcome"] = outcome
    attributes.update(_usage(run.usage))
    attributes["loomflow.run.model_calls"] = run.model_calls
    if run.dropped_events:
        attributes["loomflow.span_events.dropped"] = run.dropped_events
    state.run = None
    state.last = RunRef(run.run_id, run.trace_id, run.span_id, outcome)
    if outcome in ("finished", "failed"):
        # signals the run did not receive go with it, as in the read model's inbox
        state.signals = []
    return Span(
        name=run.name,
        kind="internal",
        trace_id=run.trace_id,
        span_id=run.span_id,
        parent_id=None,
        start_ns=run.start_ns,
        end_ns=max(at, run.start_ns),
        attributes=attributes,
        events=tuple(run.events),
        links=tuple(run.links),
        error=error,
    )
