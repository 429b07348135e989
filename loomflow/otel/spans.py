"""What a span of the log is, before any OpenTelemetry SDK sees it: plain frozen data.

The fold (``fold.py``) makes these from events and ``export.py`` turns them into the SDK's
spans, so the fold is tested without an exporter and the ``[otel]`` extra loads only to
send. Ids are derived from the log, never drawn at random: the span of a run is a hash of
its run id, the span of a model or tool call a hash of the event that recorded it, so a
replay of the log yields the same ids (and a receiver that gets a span again gets the same
span, not another one).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "AttributeValue",
    "Attributes",
    "Span",
    "SpanEvent",
    "SpanLink",
    "call_span_id",
    "run_span_id",
    "trace_id_of",
]

#: what an attribute holds: OpenTelemetry's primitive values and lists of strings
AttributeValue = str | bool | int | float | list[str]
Attributes = dict[str, AttributeValue]


def _digest(kind: str, *parts: str | None, size: int) -> str:
    """``size`` bytes of a hash of ``parts``, as hex; never all zeros (an invalid id)."""
    text = "\x00".join([kind, *(part or "" for part in parts)])
    raw = bytearray(hashlib.sha256(text.encode()).digest()[:size])
    if not any(raw):
        raw[-1] = 1
    return raw.hex()


def trace_id_of(session_id: str, run_id: str) -> str:
    """The trace a run starts (16 bytes, hex); a run that continues another joins its
    trace instead (the fold decides which)."""
    return _digest("trace", session_id, run_id, size=16)


def run_span_id(session_id: str, run_id: str) -> str:
    """The ``invoke_agent`` span of a run (8 bytes, hex)."""
    return _digest("run", session_id, run_id, size=8)


def call_span_id(session_id: str, event_id: str, index: int = 0) -> str:
    """The span of the ``index``-th call an event records (a model call, a tool's
    result, the step a failed run was at), 8 bytes, hex."""
    return _digest("call", session_id, event_id, str(index) if index else None, size=8)


@dataclass(frozen=True)
class SpanEvent:
    """Something that happened during a span, at ``at_ns`` (ns since the epoch)."""

    name: str
    at_ns: int
    attributes: Attributes = field(default_factory=dict)


@dataclass(frozen=True)
class SpanLink:
    """A pointer from one span to another (of this trace or another)."""

    trace_id: str
    span_id: str
    attributes: Attributes = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """One finished span: ids as hex, times in ns since the epoch; ``error`` is the
    status description of a span that failed (None: status unset)."""

    name: str
    kind: Literal["internal", "client"]
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: Attributes
    events: tuple[SpanEvent, ...] = ()
    links: tuple[SpanLink, ...] = ()
    error: str | None = None
