"""``loomflow report``: the page opens offline in headless Chromium and its charts are drawn,
each model, user and token kind in one colour throughout; the failed and stuck runs are
listed with their errors, and each session the page names links to its transcript in it.

Chromium is Debian's (``dev/chromium.sh`` installs it; CI runs that first), driven by
playwright through ``executable_path``: playwright cannot download a browser here.
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from PIL import Image
from playwright.sync_api import Browser, Page

from loomflow.cli import main
from loomflow.runtime import SqliteRuntime, SqliteStore
from loomflow.schemas import (
    Event,
    Message,
    RunFailed,
    RunFinished,
    RunStarted,
    ToolCall,
    TurnAppended,
    Usage,
)
from tests.support.analytics import record_runs
from tests.support.browser import launched

T = TypeVar("T")

CHARTS = (
    "cost-over-time",
    "tokens-over-time",
    "latency-over-time",
    "cost-per-model",
    "tokens-per-model",
    "cost-per-user",
    "tokens-per-user",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as chromium:
        yield chromium


def _earlier_hours(start: datetime, hours: int) -> list[Event]:
    """One finished session per hour before ``start``, so the time charts have a series."""
    events: list[Event] = []
    for h in range(hours):
        at = start - timedelta(hours=hours - h)
        env: dict[str, Any] = {
            "user_id": "ada" if h % 2 else "bob",
            "session_id": f"past{h}",
            "run_id": f"run{h}",
            "epoch": 1,
            "at": at,
        }
        model = "opus-ish" if h % 3 else "haiku-ish"
        call = ToolCall(id="c1", name="lookup", arguments={"city": "Oslo"})
        usage = Usage(
            input_tokens=800 + 100 * h,
            cached_input_tokens=400,
            cache_write_tokens=50 * h,
            output_tokens=120,
            cost_usd=0.01 * (h + 1),
        )
        events += [
            RunStarted(seq=1, payload={"model": model}, **env),
            TurnAppended(
                seq=2,
                payload={"messages": [Message.user("go")]},
                **env,
            ),
            TurnAppended(
                seq=3,
                payload={
                    "messages": [Message.assistant("", [call])],
                    "usage": usage,
                    "model_call": True,
                    "model": model,
                    "latency_ms": 300.0 + 250 * h,
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


#: a run a worker gave up on, of a session run without a user
STUCK_ERROR = "ModelTimeout: no answer in 30 s, 3 attempts; parked for a person"


def _stuck(start: datetime) -> list[Event]:
    env: dict[str, Any] = {
        "user_id": None,
        "session_id": "stuck1",
        "run_id": "run_stuck",
        "epoch": 1,
        "at": start - timedelta(hours=2, minutes=-10),
    }
    error_type, error = STUCK_ERROR.split(": ", 1)
    return [
        RunStarted(seq=1, payload={"model": "haiku-ish", "agent": "summariser"}, **env),
        TurnAppended(seq=2, payload={"messages": [Message.user("summarise the week")]}, **env),
        RunFailed(
            seq=3,
            payload={
                "error_type": error_type,
                "error": error,
                "parked": True,
                "model": "haiku-ish",
            },
            **env,
        ),
    ]


async def _journal(path: Path) -> None:
    store = SqliteStore(path)
    try:
        now = datetime.now(UTC)
        await store.append(_earlier_hours(now, 6))
        await store.append(_stuck(now))
    finally:
        await store.close()
    runtime = SqliteRuntime(path)
    try:
        await record_runs(runtime)
    finally:
        await runtime.close()


def _off_the_loop(fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn`` in a thread of its own: playwright's sync API keeps an event loop
    running in this one, and the CLI (like any program) starts its own with asyncio.run."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result(timeout=300)


def report(*args: str) -> int:
    return _off_the_loop(main, ["report", *args])


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "journal.db"
    _off_the_loop(asyncio.run, _journal(path))
    return path


class Opened:
    """A page opened from a file, with what it logged and requested."""

    def __init__(self, browser: Browser, page_file: Path) -> None:
        self.page: Page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(page_file.as_uri())

    def network(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file:", "data:", "blob:"))]


def _inked(png: bytes) -> int:
    """Pixels of a screenshot in a saturated colour: bars and lines, not the white
    background, grey grid or black text."""
    rgb = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    pixels = zip(rgb[0::3], rgb[1::3], rgb[2::3], strict=True)
    return sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 60)


def test_the_report_opens_offline_without_errors_and_draws_every_chart(
    browser: Browser, journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_file = tmp_path / "report.html"
    assert report("--html", str(page_file), "--db", str(journal)) == 0
    assert f"wrote {page_file}" in capsys.readouterr().out
    assert "<script src=" not in page_file.read_text()  # everything inline

    opened = Opened(browser, page_file)
    opened.page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * len(CHARTS)}",
        timeout=30_000,
    )
    opened.page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    for chart in CHARTS:
        drawn = _inked(opened.page.locator(f"#{chart}").screenshot())
        assert drawn > 1_000, f"chart {chart} has {drawn} coloured pixels: not drawn"
    _assert_hours_and_dollars(opened.page, hours=7)
    slowest = opened.page.locator("#slowest-sessions tbody tr")
    assert slowest.count() == 10
    # the earlier hours' sessions are slowest: 300 ms + 250 ms an hour, one call each
    assert slowest.first.locator("td").first.inner_text() == "past5"
    assert opened.page.locator("#tool-calls").inner_text().count("lookup") == 1
    # each section says where it comes from: the analytics tables or the read model
    sources = opened.page.locator(".source").all_inner_texts()
    tables, read_model = (
        f"analytics tables (journal {journal})",
        f"read model (the journal {journal})",
    )
    assert [(tables in s, read_model in s) for s in sources] == [
        (True, False),  # totals, charts, tool calls
        (False, True),  # failed and stuck runs
        (True, True),  # slowest sessions, linking to transcripts
        (False, True),  # transcripts
    ], sources
    assert opened.errors == [] and opened.network() == []
    opened.page.close()


def test_a_report_for_a_period_without_runs_says_so(
    browser: Browser, journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_file = tmp_path / "empty.html"
    assert report("--html", str(page_file), "--db", str(journal), "--since", "2099-01-01") == 0
    assert "no runs since 2099-01-01 00:00 UTC (whole hours)" in capsys.readouterr().out
    opened = Opened(browser, page_file)
    no_data = opened.page.locator("#no-data").inner_text()
    assert no_data == "No runs since 2099-01-01 00:00 UTC (whole hours)."
    assert opened.page.locator(".js-plotly-plot").count() == 0
    assert _inked(opened.page.screenshot()) == 0
    assert opened.errors == [] and opened.network() == []
    opened.page.close()


def _files(directory: Path) -> dict[str, bytes | None]:
    return {p.name: p.read_bytes() if p.is_file() else None for p in directory.iterdir()}


def test_the_page_is_never_written_over_the_journal_its_tables_or_a_file_that_is_not_html(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j2.db"
    shutil.copy(journal, db)
    other = tmp_path / "app.sqlite"
    other.write_bytes(b"SQLite format 3\x00" + bytes(100))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (tmp_path / "pages").mkdir()
    refused = {
        db: "it is the journal",
        tmp_path / "j2.stats.db": "it is the stats database of",
        tmp_path / "j2.audit.db": "it is the audit trail of",
        tmp_path / "j2.db-wal": "it is the journal",
        other: "it is a SQLite database, not an HTML page",
        notes: "it exists and is not an HTML page",
        tmp_path / "pages": "it is a directory",
    }
    capsys.readouterr()
    for page, why in refused.items():
        before = _files(tmp_path)
        assert report("--db", str(db), "--html", str(page)) == 1, page
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"loomflow report: will not write over {page}: ")
        assert why in err, err
        assert _files(tmp_path) == before  # not the page, not the journal's stats: nothing
    # an earlier report's page is what --html is for: it is replaced
    earlier = tmp_path / "report.html"
    earlier.write_text("<!DOCTYPE html><html><body>last week</body></html>")
    assert report("--db", str(db), "--html", str(earlier)) == 0
    assert "last week" not in earlier.read_text() and "loomflow report" in earlier.read_text()


def _assert_hours_and_dollars(page: Page, *, hours: int) -> None:
    """The time charts' ticks are whole hours and each hour's bar is about an hour wide;
    the cost axes count dollars."""
    for chart in ("cost-over-time", "tokens-over-time"):
        ticks = page.locator(f"#{chart} .xtick text").all_text_contents()
        assert ticks and all(re.fullmatch(r"(\w{3} \d\d )?\d\d:00", t) for t in ticks), ticks
        area = page.locator(f"#{chart} .nsewdrag").bounding_box()
        bars = [b.bounding_box() for b in page.locator(f"#{chart} .trace.bars path").all()]
        assert area is not None and bars
        widest = max(b["width"] for b in bars if b is not None)
        # the axis spans the hours plus one either side
        assert widest <= area["width"] / (hours + 2) + 1, (chart, widest, area)
        assert widest >= area["width"] / (hours + 2) * 0.5, (chart, widest, area)
    for chart in ("cost-over-time", "cost-per-model", "cost-per-user"):
        ticks = page.locator(f"#{chart} .ytick text").all_text_contents()
        assert ticks and all(re.fullmatch(r"\$\d[\d,]*(\.\d+)?", t) for t in ticks), ticks


async def _one_hour(path: Path) -> None:
    runtime = SqliteRuntime(path)
    try:
        await record_runs(runtime)
    finally:
        await runtime.close()


def test_one_hour_of_runs_reads_as_one_hour_in_dollars(
    browser: Browser, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "journal.db"
    _off_the_loop(asyncio.run, _one_hour(db))
    page_file = tmp_path / "report.html"
    assert report("--html", str(page_file), "--db", str(db)) == 0
    assert "hours: 1," in capsys.readouterr().out
    opened = Opened(browser, page_file)
    opened.page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * len(CHARTS)}",
        timeout=30_000,
    )
    opened.page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    _assert_hours_and_dollars(opened.page, hours=1)
    # sessions that made no model call (the run that failed at once) are not "slow"
    slowest = opened.page.locator("#slowest-sessions tbody tr")
    calls = [int(row.locator("td").nth(2).inner_text()) for row in slowest.all()]
    assert len(calls) == 4 and all(calls), calls
    assert opened.errors == [] and opened.network() == []
    opened.page.close()


# --- one colour per thing, the runs that went wrong, latency, transcripts ----------------


@pytest.fixture(scope="module")
def page_file(journal: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of the journal, written once for the tests that only read it."""
    path = tmp_path_factory.mktemp("page") / "report.html"
    assert report("--html", str(path), "--db", str(journal)) == 0
    return path


def _drawn(browser: Browser, page_file: Path) -> Opened:
    opened = Opened(browser, page_file)
    opened.page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * len(CHARTS)}",
        timeout=30_000,
    )
    return opened


def _traces(page: Page) -> dict[str, list[dict[str, Any]]]:
    """Each chart's traces as the page handed them to plotly: name, legend group, x and
    the colours of their markers and lines."""
    traces: dict[str, list[dict[str, Any]]] = page.evaluate(
        """charts => Object.fromEntries(charts.map(id => [id,
            document.getElementById(id).data.map(t => ({
                name: t.name, group: t.legendgroup ?? null, x: t.x,
                marker: t.marker ? t.marker.color : null,
                line: t.line ? t.line.color : null,
            }))]))""",
        list(CHARTS),
    )
    return traces


def _colours_of(traces: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, str], set[str]]:
    """(kind, name) -> every colour the charts give it: a model's, user's or token kind's."""
    seen: dict[tuple[str, str], set[str]] = {}

    def give(kind: str, name: str, *colours: str | None) -> None:
        seen.setdefault((kind, name), set()).update(c for c in colours if c is not None)

    for trace in traces["cost-over-time"]:
        give("model", trace["name"], trace["marker"])
    for trace in traces["latency-over-time"]:  # a p50 and a p95 line per model
        give("model", trace["group"], trace["marker"], trace["line"])
    for chart, kind in (("cost-per-model", "model"), ("cost-per-user", "user")):
        (bars,) = traces[chart]
        assert isinstance(bars["marker"], list), (chart, bars)  # a colour per bar
        for name, colour in zip(bars["x"], bars["marker"], strict=True):
            give(kind, name, colour)
    for chart in ("tokens-over-time", "tokens-per-model", "tokens-per-user"):
        for trace in traces[chart]:
            give("token", trace["name"], trace["marker"])
    return seen


def _pixels_of(png: bytes, colour: str) -> int:
    """Pixels of a screenshot in exactly ``colour`` (#rrggbb)."""
    want = bytes.fromhex(colour.removeprefix("#"))
    rgb = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    return sum(1 for i in range(0, len(rgb), 3) if rgb[i : i + 3] == want)


def test_each_model_user_and_token_kind_has_one_colour_in_every_chart(
    browser: Browser, page_file: Path
) -> None:
    opened = _drawn(browser, page_file)
    traces = _traces(opened.page)
    seen = _colours_of(traces)
    names = {kind: {n for k, n in seen if k == kind} for kind in ("model", "user", "token")}
    assert names == {
        "model": {"haiku-ish", "opus-ish"},
        "user": {"ada", "bob", "(none)"},
        "token": {"input", "cached", "cache write", "output"},
    }
    # every model is in each chart of models, every kind in each chart of tokens...
    assert {t["name"] for t in traces["cost-over-time"]} == names["model"]
    assert {t["group"] for t in traces["latency-over-time"]} == names["model"]
    for chart in ("tokens-over-time", "tokens-per-model", "tokens-per-user"):
        assert {t["name"] for t in traces[chart]} == names["token"], chart
    # ...in one colour wherever it is, and no colour stands for two things
    assert all(len(colours) == 1 for colours in seen.values()), seen
    colour = {key: next(iter(colours)) for key, colours in seen.items()}
    assert len(set(colour.values())) == len(colour), colour
    # and it is the colour drawn: each model's bars in both of its bar charts
    for chart in ("cost-over-time", "cost-per-model"):
        png = opened.page.locator(f"#{chart}").screenshot()
        for model in names["model"]:
            assert _pixels_of(png, colour[("model", model)]) > 200, (chart, model)
    png = opened.page.locator("#cost-per-user").screenshot()
    for user in ("ada", "bob"):  # the user-less session spent nothing: no bar to see
        assert _pixels_of(png, colour[("user", user)]) > 200, user
    assert opened.errors == [] and opened.network() == []
    opened.page.close()


def _failed_runs(journal: Path) -> dict[tuple[str, str], str]:
    """(user, session) -> the error of its last run.failed, straight from the log."""
    errors: dict[tuple[str, str], str] = {}
    with sqlite3.connect(journal) as conn:
        for user, session, payload in conn.execute(
            "SELECT user_id, session_id, payload FROM loomflow_events "
            "WHERE type = 'run.failed' ORDER BY position"
        ):
            data = orjson.loads(payload)
            errors[(user or "(none)", session)] = f"{data['error_type']}: {data['error']}"
    return errors


def test_the_failed_and_stuck_runs_are_listed_with_their_errors(
    browser: Browser, journal: Path, page_file: Path
) -> None:
    failed = _failed_runs(journal)
    assert len(failed) == 2 and STUCK_ERROR in failed.values()
    opened = Opened(browser, page_file)
    rows = opened.page.locator("#failed-runs tbody tr")
    listed = {}
    for row in rows.all():
        cells = row.locator("td").all_inner_texts()
        listed[(cells[1], cells[0])] = (cells[2], cells[-1])
    assert listed == {
        ("bob", next(s for u, s in failed if u == "bob")): ("failed", failed_error(failed, "bob")),
        ("(none)", "stuck1"): ("stuck", STUCK_ERROR),
    }
    source = opened.page.locator("#failed-runs").locator("xpath=preceding-sibling::p[1]")
    assert f"From the read model (the journal {journal})" in source.inner_text()
    assert opened.errors == [] and opened.network() == []
    opened.page.close()


def failed_error(failed: dict[tuple[str, str], str], user: str) -> str:
    return next(error for (u, _), error in failed.items() if u == user)


def test_latency_over_time_is_each_models_p50_and_p95_per_hour(
    browser: Browser, page_file: Path
) -> None:
    opened = _drawn(browser, page_file)
    assert _inked(opened.page.locator("#latency-over-time").screenshot()) > 1_000
    traces = {t["name"]: t for t in _traces(opened.page)["latency-over-time"]}
    assert set(traces) == {f"{m} p{q}" for m in ("haiku-ish", "opus-ish") for q in (50, 95)}
    # the earlier hours made one call each: 300 ms + 250 ms an hour, past0 and past3 on
    # haiku-ish, the others on opus-ish; the histogram is within 4.5 % of a sample
    values = opened.page.evaluate(
        "() => document.getElementById('latency-over-time').data.map(t => [t.name, t.y])"
    )
    y = dict(values)
    hours = len(y["opus-ish p95"])
    assert hours == 7
    for h in range(6):
        model = "opus-ish" if h % 3 else "haiku-ish"
        other = "haiku-ish" if h % 3 else "opus-ish"
        for q in (50, 95):
            got = y[f"{model} p{q}"][h]
            assert got == pytest.approx(300 + 250 * h, rel=0.045), (h, q, got)
            assert y[f"{other} p{q}"][h] is None, (h, q)  # a gap, not a zero
    assert all(y[f"{m} p95"][-1] is not None for m in ("haiku-ish", "opus-ish"))  # this hour
    assert opened.errors == [] and opened.network() == []
    opened.page.close()


def _follow(page: Page, link: Any) -> Any:
    """Click a link of the page; the element its fragment names, which must be in view."""
    href = link.get_attribute("href")
    assert href is not None and href.startswith("#"), href
    link.click()
    assert page.evaluate("() => decodeURIComponent(location.hash)") == href
    assert page.url.startswith("file:")  # still the page, not a request anywhere
    target = page.locator(f"[id='{href[1:]}']")
    assert target.count() == 1, href
    assert target.is_visible() and target.evaluate(
        "e => { const r = e.getBoundingClientRect(); return r.top > -2 && r.top < innerHeight }"
    ), href
    return target


def test_a_session_id_links_to_its_transcript_in_the_page(
    browser: Browser, page_file: Path
) -> None:
    opened = _drawn(browser, page_file)  # drawn first: a chart drawn later moves the rest
    page = opened.page
    slowest = page.locator("#slowest-sessions tbody tr").first.locator("td a")
    assert slowest.inner_text() == "past5"
    transcript = _follow(page, slowest).inner_text()
    assert "session past5" in transcript and "user ada" in transcript
    assert "go" in transcript and "→ lookup(city='Oslo')" in transcript
    page.go_back()
    for user, status in (("bob", "failed"), ("(none)", "stuck")):
        row = page.locator("#failed-runs tbody tr").filter(
            has=page.locator(f"td:nth-child(2):text-is('{user}')")
        )
        error = row.locator("td").last.inner_text()
        transcript = _follow(page, row.locator("td a")).inner_text()
        assert f"status {status}" in transcript and f"error: {error}" in transcript
        assert ("go" if user == "bob" else "summarise the week") in transcript
    # every link of the page is to a place in it, and each such place is there
    hrefs = page.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert hrefs and all(h.startswith("#") for h in hrefs), hrefs
    ids = set(page.locator("[id]").evaluate_all("es => es.map(e => e.id)"))
    assert {h[1:] for h in hrefs} <= ids
    assert opened.errors == [] and opened.network() == []
    page.close()
