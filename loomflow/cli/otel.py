"""``loomflow otel``: the runs of the log as OpenTelemetry traces, sent over OTLP/HTTP."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from loomflow.cli.options import add_db_option
from loomflow.cli.render import count
from loomflow.control.source import Source, quiet_kafka

if TYPE_CHECKING:
    from loomflow.otel import TraceState

NAMES = ("otel",)

#: the exit code when the receiver did not take the spans (nothing lost: run again)
EXIT_UNSENT = 3


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    otel = commands.add_parser(
        "otel",
        help="send the log's runs as OpenTelemetry traces (OTLP/HTTP)",
        description="Read the log (its own consumer group on Kafka, <processor id>-otel) "
        "and send one trace per run to the OTLP/HTTP endpoint of OTEL_EXPORTER_OTLP_ENDPOINT "
        "(or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; default http://localhost:4318), with the "
        "GenAI semantic conventions: invoke_agent per run, chat per model call, "
        "execute_tool per tool call. Replaying sends nothing twice. Then exit, or go on "
        "with --follow. Exit codes: 0 done, 1 the log or state could not be read, 2 a "
        f"usage error, {EXIT_UNSENT} the endpoint did not take the spans within "
        "--retry-for (nothing is lost: the position stays before them).",
    )
    add_db_option(otel)
    otel.add_argument(
        "--state",
        type=Path,
        metavar="PATH",
        help="where an embedded log's exporter keeps its position and runs in flight "
        "(default: beside it, journal.db -> journal.otel.db); at scale, in the "
        "LOOMFLOW_SCHEMA of PostgreSQL",
    )
    otel.add_argument(
        "--follow",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep sending the spans of new events (default: --no-follow, exit at the end)",
    )
    otel.add_argument(
        "--retry-for",
        type=_seconds,
        metavar="SECONDS",
        help="how long a batch is sent again while the endpoint does not take it, with "
        "backoff (default: 30 with --no-follow, for ever with --follow); each send may "
        "itself take up to OTEL_EXPORTER_OTLP_TIMEOUT (10 s), as the exporter tries again",
    )
    otel.set_defaults(handler=_otel)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a number of seconds, 0 or more")
    return value


def _otel(args: argparse.Namespace) -> int:
    from loomflow.errors import LoomflowError
    from loomflow.otel import ExportError, endpoint

    try:
        for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
            import_module(module)
    except ModuleNotFoundError as exc:
        print(f"loomflow otel: {exc}; pip install 'loomflow-durable[otel]'", file=sys.stderr)
        return 2
    try:
        url = endpoint()
    except ValueError as exc:
        print(f"loomflow otel: {exc}", file=sys.stderr)
        return 2
    if args.state is not None and args.db is None:
        print(
            "loomflow otel: --state goes with --db (at scale the state is in PostgreSQL)",
            file=sys.stderr,
        )
        return 2
    source = Source.of(args.db)
    if source is None:
        return 2
    if not args.follow:
        quiet_kafka()
    retry_for = args.retry_for if args.retry_for is not None else None if args.follow else 30.0
    try:
        done = asyncio.run(_run(source, args.state, args.follow, retry_for, url))
    except ExportError as exc:
        print(f"loomflow otel: {exc}", file=sys.stderr)
        return EXIT_UNSENT
    except LoomflowError as exc:
        print(f"loomflow otel: {exc}", file=sys.stderr)
        return 1
    print(done)
    return 0


async def _run(
    source: Source, state_path: Path | None, follow: bool, retry_for: float | None, url: str
) -> str:
    from loomflow.log.reader import require_log
    from loomflow.otel import OtlpSink, TraceExporter

    if source.db is not None:
        await require_log(source.db)  # before a state file is created beside something else
    sink = OtlpSink(url)
    try:
        async with _state(source, state_path) as state:
            # an embedded exporter keeps its position with its state; at scale the group does
            if source.settings is None:
                reader = source.reader(start=await state.position() or "beginning")
            else:
                reader = source.reader(group=source.settings.otel_group, start="committed")
            async with reader:
                stop = asyncio.Event()
                exporter = TraceExporter(reader, state, sink, retry_for=retry_for, stop=stop)
                if follow:
                    loop = asyncio.get_running_loop()
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        loop.add_signal_handler(signum, stop.set)
                    print(
                        f"sending the runs of {reader.source} to {url}; Ctrl-C stops",
                        file=sys.stderr,
                        flush=True,
                    )
                    await exporter.follow()
                else:
                    await exporter.catch_up()
                done = exporter.done
                return (
                    f"sent {count(done.spans, 'span')} ({count(done.runs, 'run')}, "
                    f"{count(len(done.traces), 'trace')}) from "
                    f"{count(done.records, 'new record')} of {reader.source} to {url}, "
                    f"{done.refused} refused"
                    + (
                        f", {done.unverified} with a signature that does not hold"
                        if done.unverified
                        else ""
                    )
                )
    finally:
        sink.close()


def _state(source: Source, path: Path | None) -> TraceState:
    from loomflow.otel import PostgresState, SqliteState, default_state_path

    if source.db is not None:
        return SqliteState(path or default_state_path(source.db))
    from loomflow.runtime.postgres import PostgresStore

    settings = source.settings
    assert settings is not None
    store = PostgresStore.from_settings(settings, max_size=2)
    where = f"otel state in PostgreSQL schema {settings.db_schema}"
    return PostgresState(store._call, where, on_close=store.close)
