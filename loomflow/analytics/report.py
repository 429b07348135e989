"""``loomflow report``: one self-contained HTML page of the analytics tables and the runs
that went wrong.

Two readers feed it, and the page says which section comes from which: the hourly
analytics tables (:class:`Stats`: totals, the charts, tool calls, the slowest sessions)
and the read model (:class:`ReadModel`, read by :func:`read_model` through a runtime's
store: the failed and stuck sessions with their errors, and the transcript of every
session the page names, each at an anchor of the page). Both the embedded path (the
journal's own read model) and the scaled one (PostgreSQL) serve the same reads.

Every model, user and token kind has one colour on the whole page (:class:`Colours`).
The charts are plotly figures (:func:`figures`, which the web console's analytics page
draws too); the page inlines plotly.js once (``include_plotlyjs=True``
on the first figure) and loads nothing else, so it opens offline, from a file or a mail
attachment. Needs the ``[report]`` extra.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import plotly.graph_objects as go
import plotly.io as pio

from loomflow.analytics.colours import TOKEN_KINDS, Colours
from loomflow.analytics.tally import (
    NO_USER,
    Counters,
    Stats,
    hour_start,
    ms_text,
    parse_hour,
    since_text,
)
from loomflow.schemas import Message
from loomflow.schemas.clock import utcnow
from loomflow.schemas.scope import ANY_USER, Scope
from loomflow.schemas.sessions import SessionRecord

if TYPE_CHECKING:
    from loomflow.runtime import Runtime

__all__ = [
    "CHART_HEIGHT",
    "PLOTLY_CONFIG",
    "Chart",
    "Colours",
    "ReadModel",
    "SessionView",
    "figures",
    "read_model",
    "refusal",
    "render_report",
    "write_report",
]

#: how many sessions the slowest-sessions table lists, and failed or stuck ones the
#: table of them lists (the most recently active)
SLOWEST = 10
TROUBLED = 50
#: a transcript shows its last messages, each cut at a length
_MESSAGES = 200
_MESSAGE_CHARS = 4000

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
#failed-runs th, #failed-runs td { text-align: left; vertical-align: top; }
#failed-runs td.error { white-space: pre-wrap; font-family: ui-monospace, monospace;
                        font-size: .85rem; color: #9b1c1c; }
.source { font-size: .85rem; }
.empty { font-size: 1.2rem; padding: 2rem; background: #fff8e1; border-radius: 6px; }
.transcript { border-top: 2px solid #d9e2ec; padding: .5rem 0 1rem; }
.transcript:target { background: #f0f4f8; }
.transcript h3 { font-size: 1.05rem; margin: .6rem 0 .2rem; }
.transcript ol { list-style: none; padding: 0; margin: .5rem 0; }
.transcript li { display: grid; grid-template-columns: 6.5rem 1fr; gap: .6rem;
                 padding: .2rem 0; border-bottom: 1px dotted #e4e7eb; }
.transcript li b { color: #52606d; }
.transcript li span { white-space: pre-wrap; overflow-wrap: anywhere; }
.transcript li.call span, .transcript li.result span { font-family: ui-monospace, monospace;
                                                       font-size: .85rem; }
.transcript li.failed span { color: #9b1c1c; }
"""


# --- what the read model says -----------------------------------------------------------


@dataclass(frozen=True)
class SessionView:
    """A session as the read model has it now: its row and its transcript (folded from
    its last compaction, as a resumed run would see it)."""

    row: SessionRecord
    messages: Sequence[Message]


@dataclass(frozen=True)
class ReadModel:
    """What the page shows of the read model: the failed and stuck sessions of the
    period, most recently active first (``more``: older ones were left off), and the
    session of every (user id, session id) the page names. ``source`` says where it was
    read (never a password)."""

    source: str
    troubled: Sequence[SessionRecord] = ()
    more: bool = False
    sessions: Mapping[tuple[str | None, str], SessionView] = field(default_factory=dict)


def _user_id(user: str) -> str | None:
    """The user id the analytics tables file as ``user`` (no real id reads "(none)")."""
    return None if user == NO_USER else user


async def read_model(
    runtime: Runtime,
    stats: Stats,
    *,
    source: str,
    since: datetime | None = None,
    limit: int = TROUBLED,
) -> ReadModel:
    """The failed and stuck sessions active since the hour ``since`` falls in (every one
    without it; up to ``limit``, the most recently active), and the transcripts of those
    and of the slowest sessions of ``stats``, through ``runtime``'s store: reads every
    database store serves, the embedded journal's and PostgreSQL's."""
    from loomflow.runtime import DatabaseStore

    store = runtime.store
    if not isinstance(store, DatabaseStore):
        raise TypeError(f"the report reads a database read model, not {type(store).__name__}")
    rows: list[SessionRecord] = []
    for status in ("failed", "stuck"):
        rows += await store.list_sessions(user_id=ANY_USER, status=status, limit=limit + 1)
    if since is not None:
        start = hour_start(since)
        rows = [r for r in rows if r.updated_at >= start]
    rows.sort(key=lambda r: (r.updated_at, r.session_id), reverse=True)
    troubled = rows[:limit]
    named = [(r.user_id, r.session_id) for r in troubled]
    named += [(_user_id(s.user), s.session_id) for s in stats.slowest(SLOWEST)]
    sessions: dict[tuple[str | None, str], SessionView] = {}
    for user_id, session_id in dict.fromkeys(named):
        restored = await runtime.restore(Scope(session_id, user_id))
        if restored is not None:
            sessions[(user_id, session_id)] = SessionView(restored.session, restored.messages)
    return ReadModel(source, troubled, len(rows) > limit, sessions)


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


def _hour_bar(name: str, hours: list[datetime], y: list[float] | list[int], colour: str) -> go.Bar:
    """Bars that each cover their UTC hour, from its start to its end (a little narrower,
    so neighbouring hours stay apart)."""
    return go.Bar(
        name=name,
        x=hours,
        y=y,
        width=0.9 * _HOUR_MS,
        offset=0.05 * _HOUR_MS,
        marker={"color": colour},
    )


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


def _latency_over_time(
    per_hour_model: Mapping[str, Mapping[str, Counters]], colours: Colours
) -> go.Figure:
    """Each model's p50 (solid) and p95 (dashed) per hour, from the hour's histogram,
    at the middle of the hour; an hour without calls of the model leaves a gap."""
    middles = [parse_hour(h) + _HOUR / 2 for h in per_hour_model]
    traces = []
    for model, colour in colours.model.items():
        latencies = [cell.get(model, Counters()).latency for cell in per_hour_model.values()]
        if not any(h.count for h in latencies):
            continue  # no model call of its own: a run's start or failure only
        for q, dash in ((0.5, "solid"), (0.95, "dash")):
            values = [h.quantile(q) for h in latencies]
            traces.append(
                go.Scatter(
                    name=f"{model} p{round(q * 100)}",
                    legendgroup=model,
                    x=middles,
                    y=values,
                    customdata=[ms_text(v) for v in values],
                    mode="lines+markers",
                    line={"color": colour, "dash": dash, "width": 2},
                    marker={"color": colour, "size": 7},
                    connectgaps=False,
                    hovertemplate="%{customdata} ms<extra>%{fullData.name}</extra>",
                )
            )
    figure = _layout(go.Figure(traces), "Model-call latency per hour, p50 and p95", "ms")
    # a log axis: a 2 ms call and a 2 s one both read; labels at powers of ten only
    figure.update_yaxes(
        type="log",
        dtick=1,
        exponentformat="none",
        separatethousands=True,
        minor={"dtick": "D1", "showgrid": True, "gridcolor": "#f0f2f5"},
    )
    return figure


@dataclass(frozen=True)
class Chart:
    """A chart of the page: its element id, its figure, and what its x axis counts by
    (an hour, a model or a user), which says which sessions a bar or point stands for."""

    name: str
    figure: go.Figure
    by: Literal["hour", "model", "user"]


#: how every chart is drawn: plotly's own config, the same in the report and the console
PLOTLY_CONFIG: Mapping[str, Any] = {"displaylogo": False, "responsive": True}
CHART_HEIGHT = "380px"


def figures(stats: Stats, colours: Colours) -> list[Chart]:
    """The charts of ``stats`` (which must not be empty), in the page's order, each model,
    user and token kind in its colour of ``colours``: cost, tokens and model-call latency
    per hour, then cost and tokens per model and per user."""
    per_hour_model = stats.by_hour_and("model")
    hours = [parse_hour(h) for h in per_hour_model]
    cost_time = go.Figure(
        [
            _hour_bar(
                model,
                hours,
                [
                    cell[model].cost_usd if model in cell else 0.0
                    for cell in per_hour_model.values()
                ],
                colour,
            )
            for model, colour in colours.model.items()
        ]
    )
    by_hour = stats.by("hour")
    tokens_time = go.Figure(
        [
            _hour_bar(
                label,
                [parse_hour(h) for h, _ in by_hour],
                [getattr(c, attr) for _, c in by_hour],
                colours.token[label],
            )
            for attr, label in TOKEN_KINDS
        ]
    )
    charts = [
        Chart(
            "cost-over-time",
            _hour_axis(_dollars(_layout(cost_time, "Cost per hour, by model", "USD")), hours),
            "hour",
        ),
        Chart(
            "tokens-over-time",
            _hour_axis(_layout(tokens_time, "Tokens per hour, by kind", "tokens"), hours),
            "hour",
        ),
        Chart(
            "latency-over-time",
            _hour_axis(_latency_over_time(per_hour_model, colours), hours),
            "hour",
        ),
    ]
    dimension: Literal["model", "user"]
    for dimension in ("model", "user"):
        groups = stats.by(dimension)
        labels = [label for label, _ in groups]
        palette = colours.model if dimension == "model" else colours.user
        cost = go.Figure(
            [
                go.Bar(
                    name="cost",
                    x=labels,
                    y=[c.cost_usd for _, c in groups],
                    marker={"color": [palette[label] for label in labels]},
                    showlegend=False,  # each bar is named under it, in its colour
                )
            ]
        )
        tokens = go.Figure(
            [
                go.Bar(
                    name=label,
                    x=labels,
                    y=[getattr(c, attr) for _, c in groups],
                    marker={"color": colours.token[label]},
                )
                for attr, label in TOKEN_KINDS
            ]
        )
        charts.append(
            Chart(
                f"cost-per-{dimension}",
                _dollars(_layout(cost, f"Cost per {dimension}", "USD")),
                dimension,
            )
        )
        charts.append(
            Chart(
                f"tokens-per-{dimension}",
                _layout(tokens, f"Tokens per {dimension}", "tokens"),
                dimension,
            )
        )
    return charts


def _anchor(user_id: str | None, session_id: str) -> str:
    """The id of a session's transcript on the page: ids never hold "/" and never
    start with "-", so ``session/U/S`` and ``session/S`` (no user) name one session."""
    return f"session/{user_id}/{session_id}" if user_id is not None else f"session/{session_id}"


def _session_cell(model: ReadModel | None, user_id: str | None, session_id: str) -> str:
    """A session's id, linking to its transcript when the read model has the session."""
    text = html.escape(session_id)
    if model is None or (user_id, session_id) not in model.sessions:
        return text
    return f'<a href="#{html.escape(_anchor(user_id, session_id))}">{text}</a>'


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def _source(text: str) -> str:
    return f"<p class='meta source'>{html.escape(text)}</p>"


def _slowest(stats: Stats, model: ReadModel | None) -> str:
    rows = "".join(
        "<tr>"
        f"<td>{_session_cell(model, _user_id(s.user), s.session_id)}</td>"
        f"<td>{html.escape(s.user)}</td>"
        f"<td>{s.counters.model_calls:,}</td>"
        f"<td>{s.counters.latency_ms_total / 1000:,.2f}</td>"
        f"<td>{ms_text(s.counters.latency.quantile(0.95))}</td>"
        f"<td>{s.span_s:,.1f}</td>"
        f"<td>${s.counters.cost_usd:,.4f}</td>"
        "</tr>"
        for s in stats.slowest(SLOWEST)
    )
    return (
        "<h2>Slowest sessions</h2><p class='meta'>by the summed wall time of their model "
        "calls; span is from a session's first event to its last</p>"
        + _source(
            f"From the analytics tables ({stats.source})"
            + (
                ""
                if model is None
                else f"; a session's id links to its transcript, from the read model "
                f"({model.source})"
            )
            + "."
        )
        + '<table id="slowest-sessions"><thead><tr><th>session</th><th>user</th>'
        "<th>model calls</th><th>model time (s)</th><th>p95 (ms)</th><th>span (s)</th>"
        f"<th>cost</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _troubled(model: ReadModel, since: datetime | None) -> str:
    """The failed and stuck sessions, each with its error."""
    head = (
        "<h2>Failed and stuck runs</h2>"
        "<p class='meta'>sessions whose latest run failed, or that a worker gave up on "
        "after its retries (stuck, waiting for a person: <code>loomflow sessions ls "
        "--stuck</code>); a session that failed and then ran again is in the failed count "
        "above, not here</p>"
        + _source(
            f"From the read model ({model.source}): the sessions last active "
            + (since_text(since) if since else "in any hour")
            + ", the most recently active first."
        )
    )
    if not model.troubled:
        return head + "<p id='no-failed-runs'>No failed or stuck runs.</p>"
    rows = "".join(
        "<tr>"
        f"<td>{_session_cell(model, row.user_id, row.session_id)}</td>"
        f"<td>{html.escape(row.user_id or NO_USER)}</td>"
        f"<td>{html.escape(row.status)}</td>"
        f"<td>{html.escape(row.agent or '-')}</td>"
        f"<td>{row.attempts:,}</td>"
        f"<td>{_when(row.updated_at)}</td>"
        f"<td class='error'>{html.escape(row.last_error or '(no error recorded)')}</td>"
        "</tr>"
        for row in model.troubled
    )
    more = (
        f"<p class='meta'>the {len(model.troubled)} most recently active shown; "
        "<code>loomflow sessions ls</code> lists them all</p>"
        if model.more
        else ""
    )
    return (
        head + '<table id="failed-runs"><thead><tr><th>session</th><th>user</th>'
        "<th>status</th><th>agent</th><th>attempts</th><th>last activity</th>"
        f"<th>error</th></tr></thead><tbody>{rows}</tbody></table>{more}"
    )


def _cut(text: str) -> str:
    if len(text) <= _MESSAGE_CHARS:
        return text
    return f"{text[:_MESSAGE_CHARS]}… ({len(text) - _MESSAGE_CHARS:,} more characters)"


def _messages(messages: Sequence[Message]) -> str:
    """Each message's role (once) and text; a tool call or result on a line of its own."""
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    items: list[str] = []
    for message in messages[-_MESSAGES:]:
        lines: list[tuple[str, str]] = []  # (kind, text)
        if message.thinking:
            lines.append(("thinking", f"(reasoning: {len(message.thinking)} blocks)"))
        if message.tool_call_id is not None:
            name = names.get(message.tool_call_id, message.tool_call_id)
            outcome = "failed" if message.is_error else "returned"
            kind = "result failed" if message.is_error else "result"
            lines.append((kind, f"← {name} {outcome}: {message.content}"))
        else:
            if message.content or not message.tool_calls:
                lines.append((message.role.value, message.content))
            for call in message.tool_calls:
                arguments = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
                lines.append(("call", f"→ {call.name}({arguments})"))
        for n, (kind, text) in enumerate(lines):
            role = message.role.value if n == 0 else ""
            items.append(
                f"<li class='{kind}'><b>{html.escape(role)}</b>"
                f"<span>{html.escape(_cut(text))}</span></li>"
            )
    return "<ol>" + "".join(items) + "</ol>"


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _transcripts(model: ReadModel) -> str:
    if not model.sessions:
        return ""
    sections = []
    for (user_id, session_id), view in model.sessions.items():
        row = view.row
        facts = [
            f"user {user_id or NO_USER}",
            f"status {row.status}",
            _plural(row.turns, "turn"),
            _plural(len(view.messages), "message"),
            f"${row.usage.cost_usd:,.4f}",
            f"last activity {_when(row.updated_at)}",
        ]
        if row.agent:
            facts.insert(1, f"agent {row.agent}")
        left_off = len(view.messages) - _MESSAGES
        note = (
            f"<p class='meta'>the first {left_off:,} messages are not shown: "
            f"<code>loomflow sessions show {html.escape(session_id)}</code> prints them all</p>"
            if left_off > 0
            else ""
        )
        error = (
            f"<p class='meta'>error: {html.escape(row.last_error)}</p>" if row.last_error else ""
        )
        sections.append(
            f'<section class="transcript" id="{html.escape(_anchor(user_id, session_id))}">'
            f"<h3>session {html.escape(session_id)}</h3>"
            f"<p class='meta'>{html.escape(' · '.join(facts))}</p>{error}{note}"
            f"{_messages(view.messages)}"
            "<p><a href='#top'>back to the top</a></p></section>"
        )
    return (
        "<h2 id='transcripts'>Transcripts</h2>"
        + _source(
            f"From the read model ({model.source}): each session the tables above name, "
            "as it is now (from its last compaction on; the messages a resumed run sees)."
        )
        + "".join(sections)
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


def render_report(
    stats: Stats, *, since: datetime | None = None, read_model: ReadModel | None = None
) -> str:
    """The page for ``stats`` (already cut at ``since``, which the heading names) and,
    when given, what ``read_model`` read of the failed and stuck runs and transcripts."""
    period = since_text(since) if since else "all recorded hours"
    sources = [f"analytics tables: {stats.source}"]
    if read_model is not None:
        sources.append(f"read model: {read_model.source}")
    head = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<title>loomflow report</title>"
        f"<style>{_STYLE}</style></head><body id='top'>"
        "<h1>loomflow report</h1>"
        f"<p class='meta'>{html.escape(' · '.join(sources))} · {html.escape(period)} · "
        f"generated {utcnow().isoformat(timespec='seconds')}</p>"
    )
    if stats.empty:
        body = f"<p class='empty' id='no-data'>No runs {html.escape(period)}.</p>"
        return head + body + "</body></html>"
    total = stats.totals()
    colours = Colours.of(stats)
    parts = [
        head,
        _totals(total),
        _source(
            f"Totals, charts and tool calls: the hourly analytics tables ({stats.source}). "
            "Each model, user and token kind has one colour in every chart."
        ),
    ]
    if read_model is not None:  # what went wrong, beside the totals that count it
        parts.append(_troubled(read_model, since))
    for index, chart in enumerate(figures(stats, colours)):
        parts.append(
            pio.to_html(
                chart.figure,
                full_html=False,
                include_plotlyjs=index == 0,  # inline once; no CDN, no network
                div_id=chart.name,
                default_height=CHART_HEIGHT,
                config=dict(PLOTLY_CONFIG),
            ).replace("<div>", '<div class="chart">', 1)
        )
    parts += [_tools(total), _slowest(stats, read_model)]
    if stats.not_counted is not None:
        parts.append(f"<p class='meta'>{html.escape(stats.not_counted)}</p>")
    if read_model is not None:
        parts.append(_transcripts(read_model))
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


def write_report(
    path: Path,
    stats: Stats,
    *,
    since: datetime | None = None,
    read_model: ReadModel | None = None,
) -> None:
    path.write_text(render_report(stats, since=since, read_model=read_model), encoding="utf-8")
