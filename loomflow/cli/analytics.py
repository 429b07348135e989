"""``loomflow stats``, ``loomflow report`` and ``loomflow analytics``.

``stats`` and ``report`` read the analytics tables: with ``--db`` the embedded ones beside
a SQLite journal (brought up to date first), otherwise the Kafka tables that ``loomflow
analytics`` keeps. A period with no runs is not an error: ``stats`` says "no runs since …"
and exits 0, ``report`` writes a page that says so and exits 0. Heavy modules (rich,
plotly, aiokafka, faust) load in the handlers.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.cli.options import add_loglevel, parse_when, run_faust_worker
from loomflow.control.refused import Refused
from loomflow.control.source import Source, quiet_kafka, read_settings

if TYPE_CHECKING:
    from loomflow.analytics.report import ReadModel
    from loomflow.analytics.tally import Stats
    from loomflow.cli.render import Cell

__all__ = ["NAMES", "add_parser"]

NAMES = ("stats", "report", "analytics")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    where = (
        "With --db, the tables beside that SQLite journal (JOURNAL.stats.db, or --stats-db), "
        "brought up to date with its log first; without, the Kafka tables that `loomflow "
        "analytics` keeps, found through the LOOMFLOW_* settings."
    )
    stats = commands.add_parser(
        "stats",
        help="runs, turns, tool calls, tokens, cost and model latency, per model, user or hour",
        description="Print the analytics tables: runs started, finished and failed, model "
        "turns, tool calls per tool, input / cached / cache-write / output tokens, cost and "
        f"model-call latency p50/p95. {where}",
    )
    _source_options(stats)
    stats.add_argument(
        "--by",
        choices=("model", "user", "hour"),
        default="model",
        help="one row per model, user or UTC hour (default: %(default)s)",
    )
    stats.add_argument(
        "--json", action="store_true", help="print the rows and totals as one JSON object instead"
    )
    stats.add_argument(
        "--wide",
        action="store_true",
        help="the table whole on one line a row, however wide the terminal (else, in a "
        "narrow one, it is folded into tables that fit, each repeating the first column)",
    )
    stats.set_defaults(handler=_stats)

    report = commands.add_parser(
        "report",
        help="write the analytics as one self-contained HTML page with charts",
        description="Write one HTML page (no network needed to open it): cost, tokens and "
        "model-call latency over time, cost and tokens per model and per user (one colour "
        "per model, user and token kind on the whole page), tool calls and the slowest "
        "sessions; the failed and stuck runs with their errors, and the transcript of each "
        "session it names, from the read model (the journal's with --db, else PostgreSQL's). "
        f"A period with no runs gets a page that says so. {where}",
    )
    report.add_argument(
        "--html",
        type=Path,
        required=True,
        metavar="PATH",
        help="page to write: a new file, or the page of an earlier report (no other file is "
        "replaced)",
    )
    _source_options(report)
    report.set_defaults(handler=_report)

    analytics = commands.add_parser(
        "analytics",
        help="keep the analytics tables of the Kafka log (a faust-streaming worker)",
        description="Consume loomflow.events in its own consumer group (<processor id>"
        "-analytics) and keep the tables `loomflow stats` and `loomflow report` read, in a "
        "compacted changelog topic. Configured by the LOOMFLOW_* environment, like "
        "`loomflow processor`.",
    )
    add_loglevel(analytics)
    analytics.set_defaults(handler=_analytics)


def _source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", type=Path, metavar="PATH", help="a SQLite journal (what SqliteRuntime writes)"
    )
    parser.add_argument(
        "--stats-db",
        type=Path,
        metavar="PATH",
        help="where the journal's tables are kept (default: JOURNAL.stats.db beside it)",
    )
    parser.add_argument(
        "--since",
        type=parse_when,
        metavar="WHEN",
        help="only the UTC hours from the one WHEN falls in (the tables are hourly): a "
        "date or time (2026-12-01, 2026-12-01T09:00, UTC unless an offset is given) or an "
        "age (90m, 24h, 7d, 2w)",
    )


def _load(args: argparse.Namespace, command: str) -> Stats | None:
    """The tables, cut at --since; None after printing why they cannot be read."""
    from loomflow.errors import LoomflowError

    if args.stats_db is not None and args.db is None:
        print(f"loomflow {command}: --stats-db needs --db (the journal)", file=sys.stderr)
        return None
    source = Source.of(args.db)
    if source is None:
        return None

    def warn(note: str) -> None:
        print(f"loomflow {command}: {note}", file=sys.stderr)

    try:
        stats = source.stats(args.stats_db, warn=warn)
    except LoomflowError as exc:
        print(f"loomflow {command}: {exc}", file=sys.stderr)
        return None
    return stats.since(args.since)


def _period(args: argparse.Namespace) -> str:
    from loomflow.analytics.tally import since_text

    since: datetime | None = args.since
    return since_text(since) if since else "yet"


def _stats(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    quiet_kafka()
    stats = _load(args, "stats")
    if stats is None:
        return 1
    if args.json:
        import orjson

        from loomflow.analytics.tally import stats_json

        data = stats_json(stats, args.by, since=args.since)
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return 0
    if stats.empty:
        print(f"no runs {_period(args)} in {stats.source}")
        return 0
    _print_tables(stats, args.by, "" if args.since is None else _period(args), wide=args.wide)
    return 0


def _print_tables(stats: Stats, by: str, period: str, *, wide: bool) -> None:
    from loomflow.analytics.tally import ms_text
    from loomflow.cli.render import USER_CELLS, Column, Fitted, console

    out = console(wide=wide)
    total = stats.totals()
    columns: list[tuple[str, Any]] = [
        ("runs", lambda c: f"{c.runs_started:,}"),
        ("finished", lambda c: f"{c.runs_finished:,}"),
        ("failed", lambda c: f"{c.runs_failed:,}"),
        ("turns", lambda c: f"{c.turns:,}"),
        ("tool calls", lambda c: f"{c.tool_calls:,}"),
        ("input", lambda c: f"{c.input_tokens:,}"),
        ("cached", lambda c: f"{c.cached_input_tokens:,}"),
        ("cache write", lambda c: f"{c.cache_write_tokens:,}"),
        ("output", lambda c: f"{c.output_tokens:,}"),
        ("cost $", lambda c: f"{c.cost_usd:,.6f}"),
        ("p50 ms", lambda c: ms_text(c.latency.quantile(0.5))),
        ("p95 ms", lambda c: ms_text(c.latency.quantile(0.95))),
    ]
    # a model's or an hour's name stays whole; a user's is cut in the middle if need be
    table = Fitted(
        [
            Column(by, cut=USER_CELLS if by == "user" else None),
            *(Column(name, numeric=True) for name, _ in columns),
        ],
        [
            [_label(label, by), *(cell(counters) for _, cell in columns)]
            for label, counters in stats.by(by)  # type: ignore[arg-type]
        ],
        footer=["total", *(cell(total) for _, cell in columns)],
    )
    # a heading of its own, not the table's title: a title wraps at the table's width,
    # and the period it names must stay whole on one line
    heading = " · ".join(filter(None, (f"per {by}", stats.source, period)))
    out.print(heading, style="italic", soft_wrap=True, highlight=False)
    out.print(table)
    if total.tools:
        tools = Fitted(
            [Column("tool"), Column("tool calls", numeric=True)],
            [
                [name, f"{calls:,}"]
                for name, calls in sorted(total.tools.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
        )
        out.print()
        out.print(tools)
    if stats.not_counted is not None:
        out.print(stats.not_counted, soft_wrap=True)


def _label(label: str, by: str) -> str | Cell:
    """A row's name: an hour (``2026-12-03T09:00Z``) is ``12-03 09:00`` where room is short."""
    if by != "hour":
        return label
    from loomflow.analytics.tally import parse_hour
    from loomflow.cli.render import Cell

    return Cell(label, f"{parse_hour(label):%m-%d %H:%M}")


def _report(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    from loomflow.analytics.report import refusal, write_report

    # checked before the journal's tables are brought up to date: refused, nothing changes
    why = refusal(args.html, _journal_files(args))
    if why is not None:
        print(
            f"loomflow report: will not write over {args.html}: {why}; give --html a new "
            "file, or the page of an earlier report",
            file=sys.stderr,
        )
        return 1
    quiet_kafka()
    stats = _load(args, "report")
    if stats is None:
        return 1
    model: ReadModel | None = None
    if not stats.empty:  # no runs in the period: nothing failed in it, no session to show
        model = _read_model(args, stats)
        if model is None:
            return 1
    try:
        write_report(args.html, stats, since=args.since, read_model=model)
    except OSError as exc:
        print(f"loomflow report: cannot write {args.html}: {exc}", file=sys.stderr)
        return 1
    if stats.empty:
        print(f"no runs {_period(args)} in {stats.source}; wrote {args.html}, which says so")
    else:
        total = stats.totals()
        hours = len({row.hour for row in stats.rows})
        print(
            f"wrote {args.html} (runs: {total.runs_started}, sessions: {len(stats.sessions)}, "
            f"hours: {hours}, cost: ${total.cost_usd:,.6f})"
        )
    return 0


def _read_model(args: argparse.Namespace, stats: Stats) -> ReadModel | None:
    """What the report shows of the read model (failed and stuck runs, transcripts), read
    through the runtime over the store of --db or the LOOMFLOW_* settings; None after
    printing why it cannot be read."""
    import asyncio

    from loomflow.analytics.report import read_model
    from loomflow.errors import LoomflowError

    source = Source.of(args.db)
    if source is None:
        return None
    if source.settings is None:
        where = f"the journal {args.db}"
    else:  # the schema, never the DSN: it may hold a password
        where = f"PostgreSQL schema {source.settings.db_schema}"

    async def read() -> ReadModel:
        async with source.runtime("read") as runtime:
            return await read_model(runtime, stats, source=where, since=args.since)

    try:
        return asyncio.run(read())
    except (LoomflowError, Refused) as exc:
        print(f"loomflow report: the read model of {where}: {exc}", file=sys.stderr)
        return None


def _journal_files(args: argparse.Namespace) -> dict[str, Path]:
    """The files of --db that a report must never replace, by what they are."""
    if args.db is None:
        return {}
    from loomflow.analytics.embedded import stats_path
    from loomflow.projections.audit import default_trail_path

    return {
        f"the journal {args.db}": args.db,
        f"the stats database of {args.db}": args.stats_db or stats_path(args.db),
        f"the audit trail of {args.db}": default_trail_path(args.db),
    }


def _analytics(args: argparse.Namespace) -> int:
    import asyncio

    from loomflow.errors import StoreError
    from loomflow.producers import Topics, ensure_topics

    settings = read_settings()
    if settings is None:
        return 2
    try:  # the events topic exists before faust subscribes (a faust app without it fails)
        asyncio.run(
            ensure_topics(
                settings.kafka_bootstrap,
                Topics.from_settings(settings),
                create=settings.auto_migrate,
            )
        )
    except StoreError as exc:
        print(f"loomflow analytics: {exc}", file=sys.stderr)
        return 1
    from loomflow.analytics.app import create_app

    return run_faust_worker("analytics", create_app(settings), args.loglevel)
