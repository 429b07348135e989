"""The otel consumer: OpenTelemetry traces of the runs in the log, one trace per run.

Spans follow the GenAI semantic conventions (``invoke_agent {agent}`` per run, ``chat
{model}`` per model call, ``execute_tool {tool}`` per tool call) with their times and
usage from the events, and ids derived from run and event ids, so a replay of the log
sends nothing new. ``spans`` is what a span is (plain data, no SDK); ``fold`` turns events
into spans (plain functions, no I/O); ``state`` keeps each session's run in flight, beside
an embedded log (a SQLite file) or in the read model's PostgreSQL schema; ``export`` hands
the spans to the SDK's OTLP/HTTP exporter; ``consumer`` reads the log, sends, and moves its
position only past what the receiver acknowledged.
"""

from loomflow.otel.consumer import Exported, TraceExporter
from loomflow.otel.export import ExportError, OtlpSink, Sink, endpoint
from loomflow.otel.fold import SessionTrace, fold
from loomflow.otel.spans import Span, SpanEvent, SpanLink
from loomflow.otel.state import PostgresState, SqliteState, TraceState, default_state_path

__all__ = [
    "ExportError",
    "Exported",
    "OtlpSink",
    "PostgresState",
    "SessionTrace",
    "Sink",
    "Span",
    "SpanEvent",
    "SpanLink",
    "SqliteState",
    "TraceExporter",
    "TraceState",
    "default_state_path",
    "endpoint",
    "fold",
]
