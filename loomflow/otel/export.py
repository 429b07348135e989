"""Sending spans: the log's spans as the SDK's, through its OTLP/HTTP (protobuf) exporter.

The spans are built with their ids and times and handed to the exporter directly, as
``ReadableSpan``s: no tracer, no span processor and no id generator. A tracer draws ids
and reads the clock, and its batch processor exports in the background and drops what
fails; here the ids and times come from the log, and the consumer must know that the
receiver acknowledged a batch (``export`` returns SUCCESS) before its position moves past
the records the batch came from.

The endpoint is the standard one: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else ``http://localhost:4318/v1/traces``;
headers, timeout, compression and TLS from the exporter's own ``OTEL_EXPORTER_OTLP_*``
variables, the resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``
(``service.name`` is ``loomflow`` unless they name one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from loomflow.errors import LoomflowError
from loomflow.otel.spans import Span

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["ExportError", "OtlpSink", "Sink", "endpoint", "readable"]

#: spans per request: a batch of the log may finish thousands
_REQUEST_SPANS = 512


class ExportError(LoomflowError):
    """The receiver did not acknowledge a batch of spans (it is down, refused them, or is
    not an OTLP/HTTP endpoint). Nothing was lost: the position stays before them."""


class Sink(Protocol):
    """Where finished spans go; ``send`` returns once the receiver acknowledged them all
    and raises ExportError otherwise."""

    where: str

    async def send(self, spans: Sequence[Span]) -> None: ...

    def close(self) -> None: ...


def endpoint() -> str:
    """The traces endpoint the OTLP variables name; ValueError for one that is no
    http(s) URL (the exporter would fail every request on it)."""
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    given = traces or base  # checked as given: "http://" + "/v1/traces" would name a host
    parts = urlsplit(given)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"OTLP endpoint {given!r} is not an http(s) URL with a host: set "
            "OTEL_EXPORTER_OTLP_ENDPOINT to e.g. http://localhost:4318"
        )
    return traces or base.removesuffix("/") + "/v1/traces"


#: what an OSError says in the text of the exception requests wraps it in
_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")


def _short(exc: BaseException) -> str:
    """What went wrong with a request, in a few words: ``[Errno 111] Connection refused``."""
    text = str(exc)
    found = _ERRNO.search(text)
    if found:
        return found.group().strip()
    if "timed out" in text.lower():
        return "timed out"
    return f"{type(exc).__name__}: {text}"[:200]


def _recording_session() -> Any:
    """A requests session that remembers why its last request failed: the exporter keeps
    that to itself (its result is SUCCESS or FAILURE)."""
    import requests

    class Recording(requests.Session):
        failure: str | None = None

        def request(self, *args: Any, **kwargs: Any) -> Any:
            try:
                response = super().request(*args, **kwargs)
            except Exception as exc:
                self.failure = _short(exc)
                raise
            code = response.status_code
            self.failure = None if code < 300 else f"HTTP {code} {response.reason}"
            return response

    return Recording()


class _LastError(logging.Handler):
    """Keeps what the exporter logged of its last failure, for our one-line error (its
    own lines are kept out of the command's output)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


class OtlpSink:
    """The SDK's OTLP/HTTP exporter, called on a thread (it blocks on HTTP)."""

    def __init__(self, url: str | None = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.where = url or endpoint()
        self._session = _recording_session()
        self._exporter = OTLPSpanExporter(endpoint=self.where, session=self._session)
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "loomflow"}))
        self._resource = resource
        self._scope = InstrumentationScope("loomflow.otel", _version())
        self._errors = _LastError()
        exporter_logs = logging.getLogger("opentelemetry.exporter")
        exporter_logs.addHandler(self._errors)
        exporter_logs.propagate = False

    async def send(self, spans: Sequence[Span]) -> None:
        for start in range(0, len(spans), _REQUEST_SPANS):
            chunk = [
                readable(s, self._resource, self._scope)
                for s in spans[start : start + _REQUEST_SPANS]
            ]
            await asyncio.to_thread(self._export, chunk)

    def _export(self, spans: list[ReadableSpan]) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._errors.message = self._session.failure = None
        try:
            result = self._exporter.export(spans)
        except Exception as exc:  # older exporters raise what requests raised
            result, self._session.failure = SpanExportResult.FAILURE, _short(exc)
        if result is not SpanExportResult.SUCCESS:
            reason = self._session.failure or self._errors.message or "no reason given"
            raise ExportError(f"{self.where} did not accept {len(spans)} spans ({reason})")

    def close(self) -> None:
        self._exporter.shutdown()  # type: ignore[no-untyped-call]
        exporter_logs = logging.getLogger("opentelemetry.exporter")
        exporter_logs.removeHandler(self._errors)
        exporter_logs.propagate = True


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("loomflow-durable")
    except metadata.PackageNotFoundError:
        return "0"


def readable(span: Span, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """``span`` as the SDK's span, with its own ids and times."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

    def context(trace_id: str, span_id: str) -> SpanContext:
        return SpanContext(
            int(trace_id, 16),
            int(span_id, 16),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )

    own = context(span.trace_id, span.span_id)
    return ReadableSpan(
        name=span.name,
        context=own,
        parent=None if span.parent_id is None else context(span.trace_id, span.parent_id),
        resource=resource,
        attributes=dict(span.attributes),
        events=[Event(e.name, dict(e.attributes), e.at_ns) for e in span.events],
        links=[Link(context(k.trace_id, k.span_id), dict(k.attributes)) for k in span.links],
        kind=trace.SpanKind.CLIENT if span.kind == "client" else trace.SpanKind.INTERNAL,
        status=(
            Status(StatusCode.UNSET) if span.error is None else Status(StatusCode.ERROR, span.error)
        ),
        start_time=span.start_ns,
        end_time=span.end_ns,
        instrumentation_scope=scope,
    )
