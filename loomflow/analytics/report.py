"""``loomflow report``: one self-contained HTML page of the analytics tables.

The charts are plotly figures; the page inlines plotly.js once (``include_plotlyjs=True``
on the first figure) and loads nothing else, so it opens offline, from a file or a mail
attachment. Needs the ``[report]`` extra.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from loomflow.analytics.tally import Counters, Stats, ms_text, parse_hour, since_text
from loomflow.schemas.clock import utcnow

__all__ = ["refusal", "render_report", "write_report"]

_TOKEN_KINDS = (
    ("input_tokens", "input"),
    ("cached_input_tokens", "cached"),
    ("cache_write_tokens", "cache write"),
    ("output_tokens", "output"),
)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #1f2933; background: #ffffff; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
.meta { color: #52606d; margin-top: 0; }
.totals { display: flex; flex-wrap: wrap; gap: .8rem; margin: 1.2rem 0; }
.totals div { background: #f0f4f8; border-radius: 6px; padding: .5rem .9rem; }
.totals b { display: block; font-size: 1.2rem; }
.chart { height: 380px; margin: 1.5rem 0; }
table { border-collapse: collapse; width: 100%; margin: 1rem 0 2rem; }
th, td { border-bottom: 1px solid #d9e2ec; padding: .35rem .6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
#slowest-sessions td:nth-child(2), #slowest-sessions th:nth-child(2) { text-align: left; }
.empty { font-size: 1.2rem; padding: 2rem; background: #fff8e1; border-radius: 6px; }
"""


def _totals(total: Counters) -> str:
    cells = [
        ("runs started", f"{total.runs_started:,}"),
        ("finished", f"{total.runs_finished:,}"),
        ("failed", f"{total.runs_failed:,}"),
        ("model turns", f"{total.turns:,}"),
        ("tool calls", f"{total.tool_calls:,}"),
        ("tokens", f"{total.tokens:,}"),
        ("cost", f"${total.cost_usd:,.4f}"),
        ("latency p50", f"{ms_text(total.latency.quantile(0.5))} ms"),
        ("latency p95", f"{ms_text(total.latency.quantile(0.95))} ms"),
    ]
    return (
        '<div class="totals">'
        + "".join(f"<div><b>{html.escape(v)}</b>{html.escape(k)}</div>" for k, v in cells)
        + "</div>"
    )


def _layout(figure: go.Figure, title: str, y: str) -> go.Figure:
    figure.update_layout(
        title=title,
        barmode="stack",
        yaxis_title=y,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        plot_bgcolor="#ffffff",
        paper_bgcolor="#ffffff",
        legend={"orientation": "h", "y": -0.2},
    )
    figure.update_yaxes(gridcolor="#e4e7eb")
    return figure


def _dollars(figure: go.Figure) -> go.Figure:
    """A y axis of dollars: $0.0005, not 500µ (plotly's SI prefixes read as micro-units)."""
    figure.update_yaxes(
        tickprefix="$", exponentformat="none", separatethousands=True, hoverformat=",.6f"
    )
    return figure


_HOUR = timedelta(hours=1)
_HOUR_MS = 3_600_000


def _hour_bar(name: str, hours: list[datetime], y: list[float] | list[int]) -> go.Bar:
    """Bars that each cover their UTC hour, from its start to its end (a little narrower,
    so neighbouring hours stay apart)."""
    return go.Bar(name=name, x=hours, y=y, width=0.9 * _HOUR_MS, offset=0.05 * _HOUR_MS)


def _hour_axis(figure: go.Figure, hours: list[datetime]) -> go.Figure:
    """An x axis of whole hours, with an hour either side of the bars: with one hour of
    data plotly would otherwise stretch its bar over the chart and tick milliseconds."""
    start, end = min(hours) - _HOUR, max(hours) + 2 * _HOUR
    span = (end - start) / _HOUR
    step = next((n for n in (1, 2, 3, 6, 12, 24, 48, 168) if span / n <= 12), None)
    one_day = start.date() == (end - _HOUR).date()
    figure.update_xaxes(
        type="date",
        range=[start, end],
        tick0=start.replace(hour=0),  # ticks on hours a clock divides evenly
        dtick=(step or 168 * math.ceil(span / 168 / 12)) * _HOUR_MS,
        tickformat="%H:%M" if one_day else "%b %d %H:%M",
        hoverformat="%b %d %H:%M UTC",
        title_text=f"UTC, {start:%b %d %Y}" if one_day else "UTC",
    )
    figure.update_layout(showlegend=True)  # which model or kind, even when there is one
    return figure


def _figures(stats: Stats) -> list[tuple[str, go.Figure]]:
    per_hour_model = stats.by_hour_and("model")
    hours = [parse_hour(h) for h in per_hour_model]
    models = sorted({m for cell in per_hour_model.values() for m in cell})
    cost_time = go.Figure(
        [
            _hour_bar(
                model,
                hours,
                [
                    cell[model].cost_usd if model in cell else 0.0
                    for cell in per_hour_model.values()
                ],
            )
            for model in models
        ]
    )
    by_hour = stats.by("hour")
    tokens_time = go.Figure(
        [
            _hour_bar(
                label, [parse_hour(h) for h, _ in by_hour], [getattr(c, attr) for _, c in by_hour]
            )
            for attr, label in _TOKEN_KINDS
        ]
    )
    figures = [
        (
            "cost-over-time",
            _hour_axis(_dollars(_layout(cost_time, "Cost per hour, by model", "USD")), hours),
        ),
        (
            "tokens-over-time",
            _hour_axis(_layout(tokens_time, "Tokens per hour, by kind", "tokens"), hours),
        ),
    ]
    for dimension in ("model", "user"):
        groups = stats.by(dimension)
        labels = [label for label, _ in groups]
        cost = go.Figure([go.Bar(name="cost", x=labels, y=[c.cost_usd for _, c in groups])])
        tokens = go.Figure(
            [
                go.Bar(name=label, x=labels, y=[getattr(c, attr) for _, c in groups])
                for attr, label in _TOKEN_KINDS
            ]
        )
        figures.append(
            (f"cost-per-{dimension}", _dollars(_layout(cost, f"Cost per {dimension}", "USD")))
        )
        figures.append(
            (f"tokens-per-{dimension}", _layout(tokens, f"Tokens per {dimension}", "tokens"))
        )
    return figures


def _slowest(stats: Stats) -> str:
    rows = "".join(
        "<tr>"
        f"<td>{html.escape(s.session_id)}</td><td>{html.escape(s.user)}</td>"
        f"<td>{s.counters.model_calls:,}</td>"
        f"<td>{s.counters.latency_ms_total / 1000:,.2f}</td>"
        f"<td>{ms_text(s.counters.latency.quantile(0.95))}</td>"
        f"<td>{s.span_s:,.1f}</td>"
        f"<td>${s.counters.cost_usd:,.4f}</td>"
        "</tr>"
        for s in stats.slowest(10)
    )
    return (
        "<h2>Slowest sessions</h2><p class='meta'>by the summed wall time of their model "
        "calls; span is from a session's first event to its last</p>"
        '<table id="slowest-sessions"><thead><tr><th>session</th><th>user</th>'
        "<th>model calls</th><th>model time (s)</th><th>p95 (ms)</th><th>span (s)</th>"
        f"<th>cost</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _tools(total: Counters) -> str:
    if not total.tools:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{calls:,}</td></tr>"
        for name, calls in sorted(total.tools.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return (
        '<h2>Tool calls</h2><table id="tool-calls"><thead><tr><th>tool</th>'
        f"<th>calls</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def render_report(stats: Stats, *, since: datetime | None = None) -> str:
    """The page for ``stats`` (already cut at ``since``, which the heading names)."""
    period = since_text(since) if since else "all recorded hours"
    head = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<title>loomflow report</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>loomflow report</h1>"
        f"<p class='meta'>{html.escape(stats.source)} · {html.escape(period)} · generated "
        f"{utcnow().isoformat(timespec='seconds')}</p>"
    )
    if stats.empty:
        body = f"<p class='empty' id='no-data'>No runs {html.escape(period)}.</p>"
        return head + body + "</body></html>"
    total = stats.totals()
    parts = [head, _totals(total)]
    for index, (name, figure) in enumerate(_figures(stats)):
        parts.append(
            pio.to_html(
                figure,
                full_html=False,
                include_plotlyjs=index == 0,  # inline once; no CDN, no network
                div_id=name,
                default_height="380px",
                config={"displaylogo": False, "responsive": True},
            ).replace("<div>", '<div class="chart">', 1)
        )
    parts += [_tools(total), _slowest(stats)]
    if stats.skipped:
        skipped = ", ".join(f"{n} {kind}" for kind, n in sorted(stats.skipped.items()))
        parts.append(f"<p class='meta'>records not counted: {html.escape(skipped)}</p>")
    parts.append("</body></html>")
    return "".join(parts)


#: how every SQLite database file starts (sqlite.org/fileformat.html)
_SQLITE_HEADER = b"SQLite format 3\x00"


def refusal(path: Path, keep: Mapping[str, Path] | None = None) -> str | None:
    """Why the page must not be written to ``path``, or None when it may be.

    ``keep`` names files never to replace (what they are -> path: the journal, its stats
    database and audit trail; their -wal and -shm files too). Any other file that exists
    is replaced only when it is empty or an HTML page, as an earlier report is: never a
    database, a log or someone's notes.
    """
    for what, kept in (keep or {}).items():
        for suffix in ("", "-wal", "-shm"):
            if _same(path, kept.with_name(kept.name + suffix)):
                return f"it is {what}" + (f" (its {suffix[1:]} file)" if suffix else "")
    if path.is_dir():
        return "it is a directory"
    if not path.is_file():
        return None  # a new file, or a device such as /dev/stdout
    try:
        with path.open("rb") as file:
            head = file.read(512)
    except OSError as exc:
        return f"it cannot be read to see what it is ({exc.strerror})"
    if head.startswith(_SQLITE_HEADER):
        return "it is a SQLite database, not an HTML page"
    start = head.removeprefix(b"\xef\xbb\xbf").lstrip().lower()
    if start and not start.startswith((b"<!doctype html", b"<html")):
        return "it exists and is not an HTML page"
    return None


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)  # a hard link
    except OSError:
        return False  # one of them does not exist


def write_report(path: Path, stats: Stats, *, since: datetime | None = None) -> None:
    path.write_text(render_report(stats, since=since), encoding="utf-8")
