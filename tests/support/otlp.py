"""A local OTLP/HTTP receiver: it decodes each ``ExportTraceServiceRequest`` it is sent
(with the ``opentelemetry-proto`` messages the exporter depends on) and keeps the spans.

``tree(spans)`` draws what it received as text, one trace after another: the README's
example of what a trace holds is drawn by it from a real run.
"""

from __future__ import annotations

import socket
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from loomflow.log.reader import LogReader, drain
from loomflow.otel.spans import call_span_id, run_span_id
from loomflow.schemas import Event, Role, RunStarted, TranscriptCompacted, TurnAppended

__all__ = [
    "README_KEYS",
    "OtlpReceiver",
    "Received",
    "free_port",
    "log_events",
    "recorded_spans",
    "tree",
]


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int  # SpanKind of the proto: 1 internal, 3 client
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, int, dict[str, Any]], ...]
    links: tuple[tuple[str, str, dict[str, Any]], ...]
    status: int  # 0 unset, 2 error
    status_message: str
    resource: dict[str, Any]
    scope: str

    @property
    def key(self) -> tuple[str, str]:
        return self.trace_id, self.span_id


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def free_port() -> int:
    """A port nothing listens on now (for a receiver that is down, then up)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OtlpReceiver:
    """An OTLP/HTTP endpoint on 127.0.0.1 (``url``); ``spans`` in the order received."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Received] = []
        self.requests = 0
        #: answer every request with this HTTP status instead of taking it (None: take it)
        self.refuse: int | None = None
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                if receiver.refuse is not None:
                    self.send_error(receiver.refuse)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # no line per request in the test's output

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Received(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            name=span.name,
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            events=tuple(
                                (e.name, e.time_unix_nano, _attributes(e.attributes))
                                for e in span.events
                            ),
                            links=tuple(
                                (k.trace_id.hex(), k.span_id.hex(), _attributes(k.attributes))
                                for k in span.links
                            ),
                            status=span.status.code,
                            status_message=span.status.message,
                            resource=resource,
                            scope=scope_spans.scope.name,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(received)

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.spans)

    def duplicates(self) -> list[tuple[str, str]]:
        """(trace, span) ids received more than once."""
        seen = Counter(span.key for span in self.received())
        return [key for key, n in seen.items() if n > 1]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


#: attributes a child span shares with its run, left out of its line
_SHARED = ("gen_ai.conversation.id", "user.id", "gen_ai.operation.name")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_text, value)) + "]"
    return str(value)


#: the attributes the README's example shows (every span carries more)
README_KEYS = frozenset(
    {
        "gen_ai.conversation.id",
        "user.id",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.tool.call.id",
        "error.type",
        "loomflow.run.mode",
        "loomflow.run.outcome",
        "loomflow.run.taken_over_by",
        "loomflow.run.model_calls",
        "loomflow.run.replayed_turns",
        "loomflow.turn",
        "loomflow.checkpoint.turn",
        "loomflow.resumed.after",
        "loomflow.link.type",
        "loomflow.billed",
    }
)


def _pairs(
    attributes: dict[str, Any], skip: Sequence[str] = (), keys: frozenset[str] | None = None
) -> str:
    return " ".join(
        f"{k}={_text(v)}"
        for k, v in sorted(attributes.items())
        if k not in skip and (keys is None or k in keys)
    )


def _cut(text: str, size: int = 60) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


def tree(spans: Sequence[Received], keys: frozenset[str] | None = None) -> str:
    """The spans as text: each trace, its spans nested under their parents in time order,
    each with its duration, status, attributes (only ``keys``, when given), span events
    and links."""
    by_parent: dict[str | None, list[Received]] = {}
    traces: dict[str, list[Received]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    lines: list[str] = []
    for trace_id, members in sorted(traces.items(), key=lambda t: min(s.start_ns for s in t[1])):
        ids = {s.span_id for s in members}
        by_parent = {}
        for span in members:
            parent = span.parent_id if span.parent_id in ids else None
            by_parent.setdefault(parent, []).append(span)
        lines.append(f"trace {trace_id}")
        lines.extend(_lines(by_parent, None, "", members, keys))
    return "\n".join(lines)


def _lines(
    by_parent: dict[str | None, list[Received]],
    parent: str | None,
    indent: str,
    members: Sequence[Received],
    keys: frozenset[str] | None,
) -> Iterator[str]:
    children = sorted(by_parent.get(parent, []), key=lambda s: (s.start_ns, s.end_ns))
    for n, span in enumerate(children):
        last = n == len(children) - 1
        branch, below = ("└─ ", "   ") if last else ("├─ ", "│  ")
        ms = (span.end_ns - span.start_ns) / 1e6
        status = f"  ERROR {_cut(span.status_message)!r}" if span.status == 2 else ""
        yield f"{indent}{branch}{span.name}  {ms:.0f} ms{status}"
        inner = indent + below
        skip = _SHARED if span.parent_id is not None else ("gen_ai.operation.name",)
        pairs = _pairs(span.attributes, skip, keys)
        yield from textwrap.wrap(
            pairs, 96, initial_indent=f"{inner}   ", subsequent_indent=f"{inner}   "
        )
        for name, at_ns, attributes in span.events:
            after = (at_ns - span.start_ns) / 1e6
            yield f"{inner}   event {name} +{after:.0f} ms {_pairs(attributes, (), keys)}".rstrip()
        for _, span_id, attributes in span.links:
            target = next((s.name for s in members if s.span_id == span_id), "another trace")
            yield f"{inner}   link -> {target} {_pairs(attributes, (), keys)}".rstrip()
        yield from _lines(by_parent, span.span_id, inner, members, keys)


def recorded_spans(events: Sequence[Event]) -> set[str]:
    """The ids of the spans a log's events record, found without the fold: one per run
    start, per model call (a model turn, a compaction) and per tool result."""
    ids: set[str] = set()
    for event in events:
        if isinstance(event, RunStarted):
            ids.add(run_span_id(event.session_id, event.run_id))
        elif isinstance(event, TranscriptCompacted):
            ids.add(call_span_id(event.session_id, event.event_id))
        elif isinstance(event, TurnAppended):
            if event.payload.model_call:
                ids.add(call_span_id(event.session_id, event.event_id))
            results = [m for m in event.payload.messages if m.role is Role.TOOL]
            ids.update(
                call_span_id(event.session_id, event.event_id, i) for i in range(len(results))
            )
    return ids


async def log_events(reader: LogReader) -> list[Event]:
    """Every event of a log, read by ``reader`` (not open yet) to its end."""
    events: list[Event] = []
    async with reader:
        async for batch in drain(reader):
            events.extend(r.event for r in batch if r.event is not None)
    return events
