"""``loomflow report``: the page opens offline in headless Chromium and its charts are drawn.

Chromium is Debian's (``dev/chromium.sh`` installs it; CI runs that first), driven by
playwright through ``executable_path``: playwright cannot download a browser here.
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from PIL import Image
from playwright.sync_api import Browser, Page, sync_playwright

from loomflow.cli import main
from loomflow.runtime import SqliteRuntime, SqliteStore
from loomflow.schemas import Event, Message, RunFinished, RunStarted, ToolCall, TurnAppended, Usage
from tests.support.analytics import record_runs

T = TypeVar("T")

CHARTS = (
    "cost-over-time",
    "tokens-over-time",
    "cost-per-model",
    "tokens-per-model",
    "cost-per-user",
    "tokens-per-user",
)
CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # no calls home: the machine has no network, and the page must need none
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Chromium is not installed: run dev/chromium.sh (Debian's chromium package)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


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


async def _journal(path: Path) -> None:
    store = SqliteStore(path)
    try:
        await store.append(_earlier_hours(datetime.now(UTC), 6))
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
