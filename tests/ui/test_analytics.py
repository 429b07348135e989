"""The console's analytics page (``/analytics``, ``/api/analytics``): the report's charts
drawn from the analytics tables when the page is asked, in the report's colours, each
bar of a user or an hour leading to the sessions behind it in the session list; the
JSON is ``loomflow stats --json``'s numbers; a user-scoped console shows its user's only.

The journal holds real runs of scripted models (two users, two models, tool calls, a
compaction, a failed run) and, hours before them, two sessions written as events: carol's
(under a model whose name is markup) and ada's, so the charts by hour have three hours.
"""

from __future__ import annotations

import asyncio
import html
import io
import json
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import plotly.io as pio
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from loomflow.analytics.app import read_stats
from loomflow.analytics.colours import Colours
from loomflow.analytics.report import figures
from loomflow.analytics.tally import NO_USER, Stats, summary_json
from loomflow.cli import main
from loomflow.control.source import Source
from loomflow.runtime import ANY_USER, SqliteRuntime, SqliteStore
from loomflow.schemas import Event, Message, RunFinished, RunStarted, TurnAppended, Usage
from loomflow.schemas.sessions import SessionRecord
from loomflow.ui import ConsoleConfig, create_app
from tests.support.analytics import record_runs
from tests.support.browser import launched
from tests.support.console_app import console, served
from tests.support.kafka_env import KafkaEnv, ProcessorProcess
from tests.support.waiting import eventually

T = TypeVar("T")

#: a model's name as an event may give it: markup, which must end no script block
HOSTILE_MODEL = "evil</script><script>alert(1)</script>"
CHARTS = [
    "cost-over-time",
    "tokens-over-time",
    "latency-over-time",
    "cost-per-model",
    "tokens-per-model",
    "cost-per-user",
    "tokens-per-user",
]


def _off_the_loop(fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn`` in a thread of its own: a test's playwright keeps an event loop in this
    one, and the CLI, like the journal's writers, starts its own with asyncio.run."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result(timeout=300)


def _past(now: datetime) -> list[Event]:
    """carol's session three hours ago and ada's two hours ago, each one model call."""
    events: list[Event] = []
    for hours, user, session, model in ((3, "carol", "past-carol", HOSTILE_MODEL),
                                        (2, "ada", "past-ada", "haiku-ish")):  # fmt: skip
        env: dict[str, Any] = {
            "user_id": user,
            "session_id": session,
            "run_id": f"run-{session}",
            "epoch": 1,
            "at": now - timedelta(hours=hours),
        }
        usage = Usage(input_tokens=500, output_tokens=80, cost_usd=0.02 * hours)
        events += [
            RunStarted(seq=1, payload={"model": model}, **env),
            TurnAppended(seq=2, payload={"messages": [Message.user("go")]}, **env),
            TurnAppended(
                seq=3,
                payload={
                    "messages": [Message.assistant("done")],
                    "usage": usage,
                    "model_call": True,
                    "model": model,
                    "latency_ms": 250.0 * hours,
                },
                **env,
            ),
            RunFinished(
                seq=4,
                payload={"output": "done", "turns": 1, "usage": usage, "model": model},
                **env,
            ),
        ]
    return events


async def _write(path: Path) -> None:
    store = SqliteStore(path)
    try:
        await store.append(_past(datetime.now(UTC)))
    finally:
        await store.close()
    runtime = SqliteRuntime(path)
    try:
        await record_runs(runtime)
    finally:
        await runtime.close()


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("analytics") / "journal.db"
    _off_the_loop(asyncio.run, _write(path))
    return path


@pytest.fixture
def client(journal: Path) -> Iterator[TestClient]:
    with console(journal) as opened:
        yield opened


def _stats(db: Path) -> Stats:
    return _off_the_loop(lambda: Source(db=db).stats(None, warn=lambda _: None))


def _stats_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert _off_the_loop(main, ["stats", "--json", *args]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _sessions(db: Path) -> list[SessionRecord]:
    """Every session of the journal's read model, straight from its store."""

    async def read() -> list[SessionRecord]:
        store = SqliteStore(db, create=False)
        try:
            return list(await store.list_sessions(user_id=ANY_USER, limit=1000))
        finally:
            await store.close()

    return _off_the_loop(asyncio.run, read())


def _figures(page: str) -> dict[str, Any]:
    """The charts' data the page embeds for charts.js."""
    found = re.search(r'<script type="application/json" id="figures">(.*?)</script>', page, re.S)
    assert found is not None, "the page embeds no figures"
    data: dict[str, Any] = orjson.loads(found.group(1))
    return data


def _listed(client: TestClient, link: str) -> set[tuple[str | None, str]]:
    """The sessions the list at ``link`` shows: the page answers, and the API with the
    same filters names them (user, session)."""
    assert link.startswith("/?") or link == "/", link
    page = client.get(link)
    assert page.status_code == 200, (link, page.text[:500])
    query = urlsplit(link).query
    data = client.get(f"/api/sessions?{query}&limit=500").json()
    assert data["next_cursor"] is None
    listed = {(s["user_id"], s["session_id"]) for s in data["sessions"]}
    for _, session in listed:
        assert session in page.text, (link, session)
    return listed


# --- the page --------------------------------------------------------------------------


def test_the_page_draws_the_reports_figures_from_scripts_of_its_own_origin(
    client: TestClient, journal: Path
) -> None:
    answer = client.get("/analytics")
    assert answer.status_code == 200
    page = answer.text
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    data = _figures(page)
    # the report's own figures of the same tables, in the same colours
    stats = _stats(journal)
    report = figures(stats, Colours.of(stats))
    assert [c["name"] for c in data["charts"]] == [c.name for c in report] == CHARTS
    for embedded, chart in zip(data["charts"], report, strict=True):
        assert embedded["figure"] == orjson.loads(pio.to_json(chart.figure, validate=False))
        assert f'id="{chart.name}"' in page
    colours = Colours.of(stats)
    (per_user,) = data["charts"][CHARTS.index("cost-per-user")]["figure"]["data"]
    assert per_user["marker"]["color"] == [colours.user[u] for u in per_user["x"]]
    assert set(colours.user) == {"ada", "bob", "carol"}
    # no inline script, nothing from elsewhere: every script and stylesheet is the console's
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    for attributes, body in scripts:
        if 'type="application/json"' in attributes:
            continue
        (src,) = re.findall(r'src="([^"]*)"', attributes)
        assert src.startswith("/") and not src.startswith("//") and not body.strip(), src
        fetched = client.get(src)
        assert fetched.status_code == 200 and "javascript" in fetched.headers["content-type"]
    sources = [re.search(r'src="([^"]*)"', a) for a, _ in scripts]
    named = [s.group(1) for s in sources if s is not None]
    assert "/static/charts.js" in named and any(
        re.fullmatch(r"/vendor/plotly-\w+\.min\.js", s) for s in named
    )
    for href in re.findall(r'<link\b[^>]*href="([^"]*)"', page):
        assert href.startswith("/") and not href.startswith("//"), href
        assert client.get(href).status_code == 200, href
    css = next(h for h in re.findall(r'<link\b[^>]*href="([^"]*)"', page) if "/vendor/" in h)
    assert ".js-plotly-plot .plotly .modebar" in client.get(css).text  # plotly's own rules
    # a model's name that is markup stays data inside the figures' block
    assert HOSTILE_MODEL not in page and "alert(1)" in json.dumps(data)


def test_the_json_is_the_numbers_of_stats_json(
    client: TestClient, journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = client.get("/api/analytics").json()
    assert data["user"] is None and not data["empty"]
    for by in ("model", "user", "hour"):
        printed = _stats_json(capsys, "--db", str(journal), "--by", by)
        assert data[f"by_{by}"] == printed["rows"], by
        assert data["totals"] == printed["totals"]
        assert data["skipped"] == printed["skipped"]
    assert data["totals"]["runs_started"] == 9 and data["totals"]["runs_failed"] == 1
    assert data["colours"] == Colours.of(_stats(journal)).to_json()
    # cut at an hour, as stats --since cuts the tables: from ada's earlier session on
    second = data["by_hour"][1]["hour"]
    since = client.get("/api/analytics", params={"since": second}).json()
    printed = _stats_json(capsys, "--db", str(journal), "--by", "hour", "--since", second)
    assert since["by_hour"] == printed["rows"] and since["totals"] == printed["totals"]
    assert since["totals"]["runs_started"] == 8  # carol's, three hours ago, left out
    assert client.get("/api/analytics", params={"since": "last week"}).status_code == 400


def test_each_bar_of_a_user_or_an_hour_lists_the_sessions_behind_it(
    client: TestClient, journal: Path
) -> None:
    page = client.get("/analytics").text
    data = {c["name"]: c for c in _figures(page)["charts"]}
    stats = _stats(journal)
    behind: dict[str, set[tuple[str | None, str]]] = {}
    for s in stats.sessions:
        behind.setdefault(s.user, set()).add((None if s.user == NO_USER else s.user, s.session_id))
    # a user's bar (each trace's, each point's): that user's sessions, every one of them
    for name in ("cost-per-user", "tokens-per-user"):
        chart = data[name]
        for trace, links in zip(chart["figure"]["data"], chart["links"], strict=True):
            for user, link in zip(trace["x"], links, strict=True):
                assert link == f"/?user={user}"
                assert _listed(client, link) == behind[user], user
                assert f'href="{link}"' in page  # the link row under the chart, too
    # an hour's bar or point: the sessions active since that hour began
    rows = _sessions(journal)
    hours = data["cost-over-time"]["links"][0]
    assert len(hours) == len(set(hours)) >= 3  # the runs of now may span two hours
    for name in ("cost-over-time", "tokens-over-time", "latency-over-time"):
        for links in data[name]["links"]:
            assert set(links) <= set(hours), name
    for link in hours:
        since = datetime.fromisoformat(dict(_query(link))["since"])
        assert since.minute == 0 and since.tzinfo is not None
        expected = {(r.user_id, r.session_id) for r in rows if r.updated_at >= since}
        assert _listed(client, link) == expected, link
        assert f'href="{link}"' in page
    assert ("carol", "past-carol") not in _listed(client, hours[1])
    # a model's bar leads nowhere: the list has no model filter
    assert data["cost-per-model"]["links"] == [[None, None, None]]
    # the failed runs' total: the sessions whose last run failed (or is parked, stuck)
    failed = re.search(r'<a href="([^"]*)"><b>1</b>failed</a>', page)
    assert failed is not None, "the failed total links to its sessions"
    link = failed.group(1).replace("&amp;", "&")
    listed = _listed(client, link)
    assert listed == {(r.user_id, r.session_id) for r in rows if r.status == "failed"}
    assert len(listed) == 1 and next(iter(listed))[0] == "bob"
    # the slowest sessions open their session page
    for href in re.findall(r'<td class="id"><a href="(/sessions/[^"]+)">', page):
        assert client.get(href.replace("&amp;", "&")).status_code == 200, href


def _query(link: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(urlsplit(link).query, keep_blank_values=True)


def test_a_user_scoped_console_shows_only_its_users_numbers(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_user = _stats_json(capsys, "--db", str(journal), "--by", "user")
    (ada,) = [row for row in by_user["rows"] if row["user"] == "ada"]
    others = {s.session_id for s in _stats(journal).sessions if s.user != "ada"}
    with console(journal, user="ada") as client:
        data = client.get("/api/analytics").json()
        assert data["user"] == "ada"
        assert data["by_user"] == [ada]
        assert data["totals"] == {k: v for k, v in ada.items() if k != "user"}
        assert sum(row["runs_started"] for row in data["by_hour"]) == ada["runs_started"]
        assert data["skipped"] == {} and data["notes"] == []
        assert set(data["colours"]["user"]) == {"ada"}
        assert {s["user"] for s in data["slowest"]} == {"ada"}
        page = client.get("/analytics").text
        charts = _figures(page)["charts"]
        for chart in charts:
            for trace in chart["figure"]["data"]:
                if chart["name"].endswith("-per-user"):
                    assert trace["x"] == ["ada"]
        text = page + json.dumps(data)
        for other in ("bob", "carol", *others):
            assert other not in text, other
        # and the lists its bars lead to are ada's
        for links in charts[CHARTS.index("cost-over-time")]["links"]:
            for link in links:
                assert {u for u, _ in _listed(client, link)} <= {"ada"}


def test_a_store_without_analytics_yet_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"

    async def create() -> None:  # a journal no run has written to yet
        store = SqliteStore(empty)
        try:
            assert await store.list_sessions(user_id=ANY_USER) == []
        finally:
            await store.close()

    _off_the_loop(asyncio.run, create())
    with console(empty) as client:
        page = client.get("/analytics")
        assert page.status_code == 200
        assert re.search(r'id="no-data">No runs yet in journal [^<]*empty\.db', page.text)
        assert 'id="figures"' not in page.text
        data = client.get("/api/analytics").json()
        assert data["empty"] and data["by_model"] == [] and data["totals"]["runs_started"] == 0
    with console(tmp_path / "missing.db") as client:
        page = client.get("/analytics")
        assert page.status_code == 200
        assert "The analytics tables cannot be read: no journal at" in page.text
        answer = client.get("/api/analytics")
        assert answer.status_code == 503 and "no journal at" in answer.json()["error"]
    assert not (tmp_path / "missing.db").exists()
    assert not (tmp_path / "missing.stats.db").exists()


def test_a_period_without_runs_says_so(client: TestClient) -> None:
    page = client.get("/analytics", params={"since": "2099-01-01"}).text
    assert "No runs since 2099-01-01 00:00 UTC (whole hours)" in page


def test_only_the_installed_plotly_is_served(client: TestClient) -> None:
    page = client.get("/analytics").text
    (script,) = re.findall(r'src="(/vendor/[^"]+)"', page)
    served = client.get(script)
    assert served.status_code == 200 and served.content.startswith(b"/**\n* plotly.js v")
    assert "immutable" in served.headers["cache-control"]
    assert client.get("/vendor/plotly-0123456789ab.min.js").status_code == 404


# --- at scale: the Kafka tables `loomflow analytics` keeps ----------------------------


@pytest.fixture
async def kafka_env() -> AsyncIterator[KafkaEnv]:
    env = await KafkaEnv.create(partitions=2)
    yield env
    await env.close()


@pytest.mark.kafka
async def test_on_kafka_the_page_reads_the_analytics_apps_tables(kafka_env: KafkaEnv) -> None:
    env = kafka_env
    await env.start_projector()  # KafkaRuntime's runs wait for their claim to be applied
    runtime = env.runtime()
    try:
        await record_runs(runtime)
    finally:
        await runtime.close()
    source = Source(settings=env.settings)
    with console(source) as client:

        def get(url: str) -> Any:
            return asyncio.to_thread(client.get, url)

        # before `loomflow analytics` ever ran on this log: what to do, not a crash
        page = await get("/analytics")
        assert page.status_code == 200
        assert "The analytics tables cannot be read: no analytics tables on" in page.text
        assert "Start `loomflow analytics`" in html.unescape(page.text)
        assert (await get("/api/analytics")).status_code == 503
        analytics = ProcessorProcess(
            env.variables(), argv=[sys.executable, "-m", "loomflow.cli", "analytics"]
        )
        try:

            async def counted() -> dict[str, Any] | None:
                assert analytics.poll() is None, analytics.output()[-3000:]
                answer = await get("/api/analytics")
                data: dict[str, Any] = answer.json()
                return data if answer.status_code == 200 and not data["notes"] else None

            async def all_counted() -> dict[str, Any] | None:
                data = await counted()
                return data if data and data["totals"]["runs_started"] == 7 else None

            data = await eventually(all_counted, within=120, what="the app to count the runs")
        finally:
            output = analytics.stop()
        assert "Traceback" not in output, output[-3000:]
        stats = await read_stats(env.settings)
        assert data["totals"] == summary_json(stats.totals())
        assert data["by_user"] == [{"user": u, **summary_json(c)} for u, c in stats.by("user")]
        assert data["source"] == stats.source
        # a user's bar lists their sessions from the PostgreSQL read model
        page = await get("/analytics")
        chart = next(c for c in _figures(page.text)["charts"] if c["name"] == "cost-per-user")
        behind: dict[str, set[str]] = {}
        for s in stats.sessions:
            behind.setdefault(s.user, set()).add(s.session_id)
        for user, link in zip(chart["figure"]["data"][0]["x"], chart["links"][0], strict=True):

            async def listed(link: str = link, user: str = user) -> bool:
                shown = await asyncio.to_thread(_listed, client, link)
                return {s for _, s in shown} == behind[user]

            await eventually(listed, what=f"the list behind {user}'s bar")


# --- in a browser ----------------------------------------------------------------------


def _inked(png: bytes) -> int:
    """Pixels in a saturated colour: bars and lines, not background, grid or text."""
    rgb = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    pixels = zip(rgb[0::3], rgb[1::3], rgb[2::3], strict=True)
    return sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 60)


def test_in_chromium_the_charts_draw_and_a_bar_opens_its_sessions(
    journal: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "journal.db"
    shutil.copy(journal, copy)
    app = create_app(ConsoleConfig(source=Source(db=copy)))
    with served(app) as base, launched() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        requests: list[str] = []

        def logged(message: Any) -> None:
            # the console has no icon yet: the browser's own look for one is not the page's
            if message.type == "error" and not message.location.get("url", "").endswith(
                "/favicon.ico"
            ):
                errors.append(message.text)

        page.on("console", logged)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(f"{base}/analytics")
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * len(CHARTS)}",
            timeout=30_000,
        )
        for chart in CHARTS:
            drawn = _inked(page.locator(f"#{chart}").screenshot())
            assert drawn > 1_000, f"chart {chart} has {drawn} coloured pixels: not drawn"
        assert errors == [], errors
        assert requests and all(u.startswith(f"{base}/") for u in requests), requests
        # a click on a user's bar opens that user's sessions
        links = page.evaluate(
            "JSON.parse(document.getElementById('figures').textContent).charts"
            ".find(c => c.name === 'cost-per-user').links[0]"
        )
        bar = page.locator("#cost-per-user .trace.bars path").first
        bar.scroll_into_view_if_needed()
        box = bar.bounding_box()
        assert box is not None
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_url(f"{base}{links[0]}", timeout=10_000)
        assert page.locator("h1").inner_text() == "Sessions"
        assert errors == [], errors
        assert all(u.startswith(f"{base}/") for u in requests), requests
