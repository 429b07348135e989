"""The console's analytics page (``/analytics``) and its numbers as JSON
(``/api/analytics``): the report's charts, read from the analytics tables when asked.

The tables are the ones ``loomflow stats`` reads (:meth:`Source.read_stats`): an
embedded log's, brought up to date with the log first, or the Kafka tables ``loomflow
analytics`` keeps. The charts are the report's own figures (``analytics.report.figures``)
in its colours (one per model, user and token kind), handed to plotly in the browser as
data: the page embeds them in a ``<script type="application/json">`` block that the
console's ``charts.js`` draws, since the console's policy runs no inline script. Each bar
or point of a chart by hour or by user leads to the sessions behind it in the session
list (``/?since=HOUR``, ``/?user=U``); the totals lead to the failed and finished ones.

A user-scoped console shows only its user's numbers: the tables file every row and
session under a user, so the others are left out before anything is drawn or counted,
and what the whole log skipped or has yet to count is not said.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from loomflow.analytics.colours import Colours
from loomflow.analytics.tally import (
    NO_USER,
    Stats,
    hour_start,
    ms_text,
    since_text,
    summary_json,
)
from loomflow.control.refused import Refused
from loomflow.control.when import parse_when
from loomflow.errors import LoomflowError
from loomflow.runtime import ANY_USER
from loomflow.ui.backend import ConsoleConfig, StoreDown
from loomflow.ui.render import page
from loomflow.ui.views import NO_USER as NO_USER_FILTER

if TYPE_CHECKING:
    from loomflow.analytics.report import Chart

__all__ = ["Analytics", "router"]

router = APIRouter()

#: one update of an embedded log's tables at a time: two would count the same records
_updating: weakref.WeakKeyDictionary[FastAPI, asyncio.Lock] = weakref.WeakKeyDictionary()

#: the statuses of a session whose last run failed: given up on (failed), or parked for
#: a person after its retries (stuck); both count as failed runs in the tables
_FAILED = "failed,stuck"


class Analytics(BaseModel):
    """The numbers of the analytics page: rows per model, user and UTC hour, as ``loomflow
    stats --json --by model|user|hour`` gives them, their totals and tool calls, the
    slowest sessions, and each model's, user's and token kind's colour in the charts.
    ``user``: the one user a user-scoped console counts (None: every user)."""

    model_config = ConfigDict(frozen=True)
    source: str
    #: the start of the first hour counted (the tables are hourly), or None for all
    since: datetime | None
    user: str | None
    empty: bool
    totals: dict[str, Any]
    by_model: list[dict[str, Any]]
    by_user: list[dict[str, Any]]
    by_hour: list[dict[str, Any]]
    slowest: list[dict[str, Any]]
    #: records of the log not counted, by kind (never said in a user-scoped console)
    skipped: dict[str, int]
    colours: dict[str, dict[str, str]]
    #: what the tables still have to count, or could not count (not in a scoped console)
    notes: list[str]


@dataclass(frozen=True)
class _Read:
    """The tables as one request reads them: cut at ``since`` and to the console's user."""

    stats: Stats
    since: datetime | None
    user: str | None
    notes: Sequence[str] = field(default_factory=tuple)


def _config(request: Request) -> ConsoleConfig:
    config: ConsoleConfig = request.app.state.config
    return config


def _since(text: str | None) -> datetime | None:
    if not text or not text.strip():
        return None
    try:
        return parse_when(text)
    except ValueError as exc:
        raise Refused(f"since: {exc}", 2) from None


async def _read(request: Request, since: datetime | None) -> _Read:
    """The tables now; StoreDown when their store does not answer (the console's page
    for it tries again), LoomflowError when there are none to read (no journal, or the
    analytics app never ran on this log)."""
    config = _config(request)
    notes: list[str] = []
    # an embedded log's tables are updated by the read; Kafka's are only read
    embedded = config.source.db is not None
    lock = _updating.setdefault(request.app, asyncio.Lock()) if embedded else nullcontext()
    try:
        async with lock:
            stats = await config.source.read_stats(None, warn=notes.append)
    except LoomflowError as exc:
        if exc.retriable:
            raise StoreDown(str(exc)) from None
        raise
    stats = stats.since(since)
    if config.user is ANY_USER:
        return _Read(stats, since, None, notes)
    user = str(config.user)
    return _Read(stats.of_user(user), since, user)


# -- where a bar leads -----------------------------------------------------------------


def _list_url(**query: str | None) -> str:
    """The session list with these filters (a None one is left out)."""
    values = {k: v for k, v in query.items() if v is not None}
    return f"/?{urlencode(values)}" if values else "/"


def _period(since: datetime | None) -> str | None:
    return None if since is None else hour_start(since).isoformat()


def _hour_url(at: Any) -> str:
    """The sessions active since the UTC hour ``at`` (a datetime) falls in."""
    return _list_url(since=hour_start(at).isoformat())


def _user_url(label: str, since: datetime | None) -> str:
    """The sessions of the user the tables file as ``label`` ("(none)": of no user)."""
    return _list_url(user=NO_USER_FILTER if label == NO_USER else label, since=_period(since))


def _session_url(user: str, session_id: str) -> str:
    tail = "" if user == NO_USER else f"?{urlencode({'user': user})}"
    return f"/sessions/{quote(session_id)}{tail}"


def _point_url(chart: Chart, x: Any, since: datetime | None) -> str | None:
    if chart.by == "hour" and isinstance(x, datetime):
        return _hour_url(x)
    if chart.by == "user" and isinstance(x, str):
        return _user_url(x, since)
    return None  # the session list has no model filter


def _links(chart: Chart, since: datetime | None) -> list[list[str | None]]:
    """For each trace of the chart, for each of its points, where a click on it leads."""
    return [[_point_url(chart, x, since) for x in (trace.x or ())] for trace in chart.figure.data]


def _drills(chart: Chart, since: datetime | None) -> list[tuple[str, str]]:
    """The links under a chart: each hour's or user's sessions, once each."""
    seen: dict[str, str] = {}
    for trace in chart.figure.data:
        for x in trace.x or ():
            url = _point_url(chart, x, since)
            if url is None:
                continue
            label = f"{hour_start(x):%b %d %H:00}" if isinstance(x, datetime) else str(x)
            seen.setdefault(url, label)
    return [(label, url) for url, label in seen.items()]


# -- the page ---------------------------------------------------------------------------


def _tiles(stats: Stats, since: datetime | None) -> list[tuple[str, str, str | None]]:
    total = stats.totals()
    period = _period(since)
    return [
        ("runs started", f"{total.runs_started:,}", _list_url(since=period)),
        ("finished", f"{total.runs_finished:,}", _list_url(status="finished", since=period)),
        ("failed", f"{total.runs_failed:,}", _list_url(status=_FAILED, since=period)),
        ("model turns", f"{total.turns:,}", None),
        ("tool calls", f"{total.tool_calls:,}", None),
        ("tokens", f"{total.tokens:,}", None),
        ("cost", f"${total.cost_usd:,.4f}", None),
        ("latency p50", f"{ms_text(total.latency.quantile(0.5))} ms", None),
        ("latency p95", f"{ms_text(total.latency.quantile(0.95))} ms", None),
    ]


def _charts(stats: Stats, since: datetime | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The charts for the template, and the data ``charts.js`` draws them from."""
    import orjson
    import plotly.io as pio

    from loomflow.analytics.report import PLOTLY_CONFIG, figures

    charts = figures(stats, Colours.of(stats))
    data = {
        "config": dict(PLOTLY_CONFIG),
        "charts": [
            {
                "name": chart.name,
                "figure": orjson.loads(pio.to_json(chart.figure, validate=False)),
                "links": _links(chart, since),
            }
            for chart in charts
        ],
    }
    shown = [
        {
            "name": chart.name,
            "by": chart.by,
            "title": chart.figure.layout.title.text,
            "drills": _drills(chart, since),
        }
        for chart in charts
    ]
    return shown, data


def _unavailable(request: Request, message: str, since: datetime | None) -> Response:
    return page(
        request,
        "analytics.html",
        {
            "message": message,
            "unavailable": True,
            "raw_since": _raw(request),
            "period": since_text(since) if since else "all recorded hours",
        },
    )


def _raw(request: Request) -> str:
    return request.query_params.get("since", "")


@router.get("/analytics", response_class=HTMLResponse, include_in_schema=False)
async def analytics_page(request: Request, since: str | None = None) -> Response:
    moment = _since(since)
    try:
        read = await _read(request, moment)
    except LoomflowError as exc:
        return _unavailable(request, f"The analytics tables cannot be read: {exc}", moment)
    stats = read.stats
    period = since_text(moment) if moment else "all recorded hours"
    context: dict[str, Any] = {
        "stats": stats,
        "period": period,
        "raw_since": _raw(request),
        "notes": read.notes,
        "user": read.user,
    }
    if stats.empty:
        whose = f" of user {read.user}" if read.user is not None else ""
        when = since_text(moment) if moment else "yet"
        context["message"] = (
            f"No runs{whose} {when} in {stats.source}: the charts appear once runs are recorded."
        )
        return page(request, "analytics.html", context)
    try:
        from loomflow.ui.vendor import plotly_files

        plotly = plotly_files()
        charts, data = _charts(stats, moment)
    except ModuleNotFoundError:
        return _unavailable(
            request,
            "The charts need plotly: install loomflow-durable[ui] (the numbers are at "
            "/api/analytics without it).",
            moment,
        )
    total = stats.totals()
    context.update(
        tiles=_tiles(stats, moment),
        charts=charts,
        figures=data,
        plotly=plotly,
        tools=sorted(total.tools.items(), key=lambda kv: (-kv[1], kv[0])),
        slowest=[
            (s, _session_url(s.user, s.session_id), ms_text(s.counters.latency.quantile(0.95)))
            for s in stats.slowest(10)
        ],
        failed_url=_list_url(status=_FAILED, since=_period(moment)),
    )
    return page(request, "analytics.html", context)


@router.get(
    "/api/analytics",
    tags=["api"],
    response_model=Analytics,
    responses={503: {"description": "no analytics tables to read yet, or their store is down"}},
)
async def analytics_json(request: Request, since: str | None = None) -> Analytics | Response:
    """The analytics page's numbers: rows per model, user and hour as ``loomflow stats
    --json --by …`` gives them, totals, the slowest sessions and the charts' colours.
    ``since``: an ISO time or an age (``24h``); the tables count whole UTC hours. 503
    when there are no tables to read yet (the error says why)."""
    moment = _since(since)
    try:
        read = await _read(request, moment)
    except LoomflowError as exc:
        return JSONResponse({"error": f"the analytics tables cannot be read: {exc}"}, 503)
    stats = read.stats

    def rows(by: Any) -> list[dict[str, Any]]:
        return [{by: label, **summary_json(c)} for label, c in stats.by(by)]

    return Analytics(
        source=stats.source,
        since=None if moment is None else hour_start(moment),
        user=read.user,
        empty=stats.empty,
        totals=summary_json(stats.totals()),
        by_model=rows("model"),
        by_user=rows("user"),
        by_hour=rows("hour"),
        slowest=[
            {
                "user": s.user,
                "session_id": s.session_id,
                "model_calls": s.counters.model_calls,
                "model_time_ms": s.counters.latency_ms_total,
                "latency_p95_ms": s.counters.latency.quantile(0.95),
                "span_s": s.span_s,
                "cost_usd": s.counters.cost_usd,
            }
            for s in stats.slowest(10)
        ],
        skipped=dict(stats.skipped),
        colours=Colours.of(stats).to_json(),
        notes=list(read.notes),
    )


# -- plotly's files ---------------------------------------------------------------------

#: the files' URLs name the script's hash: a browser may keep them as long as it likes
_CACHED = {"Cache-Control": "public, max-age=31536000, immutable"}


@router.get("/vendor/plotly-{tag}.min.js", include_in_schema=False)
async def plotly_script(tag: str) -> Response:
    files = _vendored(tag)
    return Response(files.script, media_type="text/javascript", headers=_CACHED)


@router.get("/vendor/plotly-{tag}.css", include_in_schema=False)
async def plotly_css(tag: str) -> Response:
    files = _vendored(tag)
    return Response(files.css, media_type="text/css", headers=_CACHED)


def _vendored(tag: str) -> Any:
    from loomflow.control.refused import Missing

    try:
        from loomflow.ui.vendor import plotly_files

        files = plotly_files()
    except ModuleNotFoundError:
        raise Missing("plotly is not installed: install loomflow-durable[ui]") from None
    if tag != files.tag:
        raise Missing(f"no plotly {tag} here; this console serves plotly {files.version}")
    return files
