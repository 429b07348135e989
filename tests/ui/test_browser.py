"""The web console in a real Chromium, started as a user starts it (``loomflow ui --db
journal.db``, a process of its own) over a journal of real agent runs
(tests/support/console.py).

A user opens the list and filters it, opens a session, watches a run in another process
append its events without reloading, forks from a checkpoint and lands on the fork,
sends a signal a worker then continues the run with, cancels a running run, and types a
payload that is not JSON. Every page is watched throughout: no console message, no page
error, no dialog, and no request leaves the console's origin. A transcript holding a
script tag shows it as text. The screenshots of docs/ are taken here, from the real pages.

Chromium is Debian's, as for the report test (tests/support/browser.py).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from PIL import Image
from playwright.sync_api import Browser, Dialog, Locator, Page, Response, expect

from tests.support.browser import launched
from tests.support.console import CONTROL, HOSTILE, Journal, make_journal

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS = ROOT / "docs"
#: how long a page or a process is given to show what the test waits for
WITHIN = 30.0
SAID = re.compile(r"loomflow console on (http://\S+/) ")


# -- processes -------------------------------------------------------------------------


class Process:
    """A process the test started, whose output lines are read as they come."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None):
        self.argv = argv
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.said: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        for pipe in (self.popen.stdout, self.popen.stderr):
            threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: object) -> None:
        for line in pipe:  # type: ignore[attr-defined]
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, pattern: str | re.Pattern[str], within: float = WITHIN) -> re.Match[str]:
        """The first line from now on (stdout or stderr) that ``pattern`` matches."""
        deadline = time.monotonic() + within
        ended = 0
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{self.argv[:3]} did not print {pattern!r} in {within:.0f} s; it said:\n"
                    + "\n".join(self.said)
                ) from None
            if line is None:
                ended += 1
                if ended == 2:
                    raise AssertionError(
                        f"{self.argv[:3]} ended ({self.popen.wait()}) without printing "
                        f"{pattern!r}; it said:\n" + "\n".join(self.said)
                    )
                continue
            self.said.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def tell(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()

    def stop(self, how: int = signal.SIGINT) -> int:
        """Stop it as Ctrl-C (or ``how``) does; its exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(how)
        try:
            return self.popen.wait(timeout=WITHIN)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            raise AssertionError(f"{self.argv[:3]} did not stop: " + "\n".join(self.said)) from None


def _user_env(**extra: str) -> dict[str, str]:
    """A user's environment: none of the console's own settings, so their defaults hold."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_UI_")}
    return {**env, **extra}


def start_console(cwd: Path, *args: str) -> tuple[Process, str]:
    """``loomflow ui ARGS`` run in ``cwd``, and the address it says it serves on."""
    console = Process([str(BIN / "loomflow"), "ui", *args], cwd=cwd, env=_user_env())
    return console, console.line(SAID).group(1)


@dataclass(frozen=True)
class Console:
    journal: Journal
    url: str
    process: Process

    def session(self, which: tuple[str, str]) -> str:
        session_id, user = which
        return f"{self.url}sessions/{session_id}?user={user}"


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """``loomflow ui --db journal.db --port 0`` over the journal of real runs."""
    where = tmp_path_factory.mktemp("console")
    journal = make_journal(where / "journal.db")
    process, url = start_console(where, "--db", "journal.db", "--port", "0")
    try:
        yield Console(journal, url, process)
    finally:
        assert process.stop() == 0, process.said


def clerk(console: Console, session_id: str) -> Process:
    """A run of the clerk in a process of its own, held in its tool until told to go."""
    run = Process(
        [sys.executable, "-m", "tests.support.console", str(console.journal.db), session_id, "ada"],
        cwd=ROOT,
    )
    run.line("^HOLDING$")
    return run


# -- pages -----------------------------------------------------------------------------


@dataclass
class Watch:
    """What a page did that a user of the console must never see it do."""

    origin: str
    said: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    #: answers of 400 and above, which a page's console reports without their address
    refused: list[str] = field(default_factory=list)

    def attach(self, page: Page) -> None:
        page.on("console", lambda message: self.said.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("request", lambda request: self.requests.append(request.url))

        def answered(response: Response) -> None:
            if response.status >= 400:
                method = response.request.method
                self.refused.append(f"{response.status} {method} {response.url}")

        def dialog(opened: Dialog) -> None:
            self.dialogs.append(opened.message)
            opened.dismiss()

        page.on("response", answered)
        page.on("dialog", dialog)

    def check(self) -> None:
        elsewhere = [url for url in self.requests if _origin(url) != self.origin]
        assert not elsewhere, f"requests left {self.origin}: {elsewhere}"
        assert not self.said, f"the console of the page said: {self.said} ({self.refused})"
        assert not self.errors, f"page errors: {self.errors}"
        assert not self.dialogs, f"dialogs opened: {self.dialogs}"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@pytest.fixture(scope="module", autouse=True)
def patient() -> Iterator[None]:
    """Each expectation waits up to WITHIN for what it looks for (a worker starting, a
    live stream's next look), not playwright's 5 s."""
    expect.set_options(timeout=WITHIN * 1000)
    yield
    expect.set_options(timeout=None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as chromium:
        yield chromium


@pytest.fixture
def watch(console: Console) -> Watch:
    return Watch(_origin(console.url))


@pytest.fixture
def page(browser: Browser, watch: Watch) -> Iterator[Page]:
    """A page of a new browser context (no cookies), watched; checked after the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WITHIN * 1000)
    opened = context.new_page()
    watch.attach(opened)
    try:
        yield opened
    finally:
        context.close()
    watch.check()


def rows(page: Page) -> list[str]:
    """The session ids the list shows."""
    return page.locator("#rows tr[id] td.id a").all_inner_texts()


def badge(page: Page) -> Locator:
    return page.locator("#session-status .badge")


def mark(page: Page) -> None:
    """Mark the document: a reload would lose the mark (see :func:`not_reloaded`)."""
    page.evaluate("window.loomflowTestMark = 'still here'")


def not_reloaded(page: Page) -> None:
    assert page.evaluate("window.loomflowTestMark") == "still here", "the page was reloaded"


# -- the list --------------------------------------------------------------------------


def test_the_list_filters_by_status_and_user_and_opens_a_session(
    console: Console, page: Page
) -> None:
    journal = console.journal
    page.goto(console.url)
    expect(page).to_have_title(re.compile("^Sessions"))
    shown = rows(page)
    for session_id, _ in (journal.finished, journal.failed, journal.waiting, journal.hostile):
        assert session_id in shown
    expect(page.locator("#totals")).to_contain_text("sessions")
    fork_row = page.locator(f"#row-ada-{journal.forked[0]}")
    expect(fork_row).to_contain_text(f"fork of {journal.finished[0]}")

    page.get_by_role("checkbox", name="failed").check()
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#rows tr[id]")).to_have_count(1)
    assert rows(page) == [journal.failed[0]]
    expect(page.get_by_role("checkbox", name="failed")).to_be_checked()

    page.get_by_role("checkbox", name="failed").uncheck()
    page.get_by_role("checkbox", name="waiting").check()
    page.get_by_role("checkbox", name="finished").check()
    page.get_by_label("user").fill("bob")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"user=bob"))
    shown = rows(page)
    assert set(shown) >= {journal.waiting[0], journal.tool_error[0], journal.hostile[0]}
    assert journal.finished[0] not in shown and journal.failed[0] not in shown
    users = page.locator("#rows tr[id] td:nth-child(2)").all_inner_texts()
    assert set(users) == {"bob"}

    page.get_by_label("user").fill("nobody-here")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#rows")).to_contain_text("No sessions match these filters")

    page.get_by_role("link", name="clear them").click()
    page.get_by_role("link", name=journal.tool_error[0], exact=True).click()
    expect(page.locator("h1")).to_have_text(journal.tool_error[0])
    transcript = page.locator("#transcript")
    expect(transcript).to_contain_text("Will it rain in Oslo?")
    expect(transcript.locator(".msg.assistant").first).to_contain_text("calls forecast")
    failed_call = transcript.locator(".msg.tool.is-error")
    expect(failed_call).to_contain_text("error")
    expect(failed_call).to_contain_text("RuntimeError: the weather service is down for Oslo")
    expect(badge(page)).to_have_text("finished")


def test_a_session_of_a_failed_run_says_why(console: Console, page: Page) -> None:
    page.goto(console.session(console.journal.failed))
    expect(badge(page)).to_have_text("failed")
    expect(page.locator("#session-status .error")).to_contain_text("ModelError")
    expect(page.locator("table.runs")).to_contain_text("failed")
    # nothing in flight: neither cancel nor signal is offered
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#send-signal")).to_be_hidden()


# -- live ------------------------------------------------------------------------------


def test_a_live_runs_events_arrive_without_a_reload(
    console: Console, page: Page, browser: Browser, watch: Watch
) -> None:
    run = clerk(console, "clerk-live")
    try:
        page.goto(console.session(("clerk-live", "ada")))
        expect(badge(page)).to_have_text("running")
        expect(page.locator("#transcript")).to_contain_text("calls hold")
        expect(page.locator("#cancel")).to_be_visible()
        before = page.locator("#events tr").count()
        mark(page)

        listing = page.context.new_page()
        watch.attach(listing)
        listing.goto(console.url)
        row = listing.locator("#row-ada-clerk-live")
        expect(row.locator(".badge")).to_have_text("running")
        mark(listing)

        run.tell("go")
        assert run.line("^(FINISHED|CANCELLED)$").group(1) == "FINISHED"

        expect(badge(page)).to_have_text("finished")
        expect(page.locator("#events")).to_contain_text("run.finished")
        assert page.locator("#events tr").count() > before
        expect(page.locator("#transcript")).to_contain_text("released: go")
        expect(page.locator("#transcript .msg.assistant").last).to_contain_text("Filed.")
        # the run ended: nothing to cancel any more
        expect(page.locator("#cancel")).to_be_hidden()
        not_reloaded(page)

        expect(row.locator(".badge")).to_have_text("finished")
        not_reloaded(listing)
    finally:
        run.stop(signal.SIGKILL)


def test_cancel_a_running_run(console: Console, page: Page) -> None:
    run = clerk(console, "clerk-cancel")
    try:
        page.goto(console.session(("clerk-cancel", "ada")))
        expect(badge(page)).to_have_text("running")
        page.get_by_placeholder("reason").fill("filed by hand")
        page.get_by_role("button", name="Cancel run").click()
        expect(page.locator("#done")).to_have_text("the run was cancelled; no worker resumes it.")
        expect(badge(page)).to_have_text("cancelled")
        expect(page.locator("#events")).to_contain_text("run.cancelled")
        expect(page.locator("table.runs")).to_contain_text("filed by hand")

        run.tell("go")  # its next step is refused: the run stops there
        assert run.line("^(FINISHED|CANCELLED)$").group(1) == "CANCELLED"
        page.reload()
        expect(badge(page)).to_have_text("cancelled")
        expect(page.locator("#transcript")).not_to_contain_text("Filed.")
    finally:
        run.stop(signal.SIGKILL)


def test_the_tail_shows_the_records_appended_while_it_is_open(console: Console, page: Page) -> None:
    page.goto(f"{console.url}tail")
    page.get_by_label("session").fill("clerk-tail")
    page.get_by_role("button", name="Filter").click()
    tail = page.locator("#tail")
    expect(page.locator("#tail[data-following]")).to_have_count(1)
    expect(tail.locator("tr")).to_have_count(0)
    run = clerk(console, "clerk-tail")
    try:
        expect(tail).to_contain_text("run.started")
        run.tell("go")
        expect(tail).to_contain_text("run.finished")
        sessions = set(tail.locator("td.id").all_inner_texts())
        assert sessions == {"clerk-tail"}
        types = tail.locator("td:last-child").all_inner_texts()
        assert types[0] == "run.started" and types[-1] == "run.finished", types
    finally:
        run.stop(signal.SIGKILL)


# -- actions ---------------------------------------------------------------------------


def test_fork_here_lands_on_the_fork_whose_tree_shows_its_parent(
    console: Console, page: Page
) -> None:
    parent, user = console.journal.finished
    page.goto(console.session(console.journal.finished))
    checkpoint = page.locator("button.fork").last.get_attribute("data-checkpoint")
    assert checkpoint
    page.locator("button.fork").last.click()

    expect(page.locator("#done")).to_have_text("this session was forked from the checkpoint.")
    child = page.locator("h1").inner_text()
    assert child != parent
    expect(page).to_have_url(re.compile(rf"/sessions/{child}\?user={user}"))
    expect(badge(page)).to_have_text("forked")
    expect(page.locator("main > p.muted")).to_contain_text(f"forked from {parent} at {checkpoint}")
    tree = page.locator("#tree")
    expect(tree.get_by_role("link", name=parent, exact=True)).to_be_visible()
    expect(tree.locator("li.current > b")).to_have_text(child)
    expect(tree.locator("li.current")).to_contain_text(f"from {checkpoint}")
    # the fork's transcript is its parent's up to the checkpoint
    expect(page.locator("#transcript")).to_contain_text("How many people live in Oslo?")

    tree.get_by_role("link", name=parent, exact=True).click()
    expect(page.locator("h1")).to_have_text(parent)
    expect(page.locator("#tree").get_by_role("link", name=child, exact=True)).to_be_visible()


def test_erase_a_session_once_its_id_is_typed(console: Console, page: Page, watch: Watch) -> None:
    parent, _ = console.journal.finished
    page.goto(console.session(console.journal.finished))
    page.locator("button.fork").first.click()
    expect(page.locator("#done")).to_be_visible()
    child = page.locator("h1").inner_text()

    page.get_by_text("Erase…").click()
    page.get_by_label("the session's id, to confirm").fill(parent)
    page.get_by_role("button", name="Erase session").click()
    expect(page.get_by_role("alert")).to_contain_text(f"type the session's id, {child}")
    assert not [url for url in watch.requests if url.endswith("/erase")]
    expect(page.locator("h1")).to_have_text(child)

    page.get_by_label("the session's id, to confirm").fill(child)
    page.get_by_role("button", name="Erase session").click()
    expect(page.get_by_role("status")).to_have_text("The session was erased.")
    expect(page.locator("#rows")).to_contain_text(parent)
    assert child not in rows(page)
    page.goto(console.session(console.journal.finished))
    expect(page.locator("#tree")).not_to_contain_text(child)


def test_a_signal_sent_from_the_page_is_received_by_the_waiting_run(
    console: Console, page: Page
) -> None:
    journal = console.journal
    page.goto(console.session(journal.waiting))
    expect(badge(page)).to_have_text("waiting")
    expect(page.locator("#session-status")).to_contain_text("waits for signal approve")
    expect(page.get_by_label("signal", exact=True)).to_have_value("approve")
    page.get_by_label("payload (JSON)").fill('{"ok": true}')
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#done")).to_have_text("the signal was sent.")
    expect(badge(page)).to_have_text("signalled")
    expect(page.locator("#events")).to_contain_text("signal.sent")
    mark(page)

    worker = Process(
        [str(BIN / "loomflow"), "worker", "tests.support.console:payers", "--poll", "0.1"],
        cwd=ROOT,
        env=_user_env(CONSOLE_DB=str(journal.db)),
    )
    try:
        expect(badge(page)).to_have_text("finished")
        expect(page.locator("#events")).to_contain_text("run.finished")
        expect(page.locator("#transcript")).to_contain_text("approved=True for 5")
        expect(page.locator("#transcript .msg.assistant").last).to_contain_text("Paid.")
        not_reloaded(page)
    finally:
        worker.stop(signal.SIGTERM)
    page.reload()
    expect(page.locator("table.runs")).to_contain_text("worker")


def test_a_payload_that_is_not_json_is_refused_and_kept(
    console: Console, page: Page, watch: Watch
) -> None:
    journal = console.journal
    page.goto(console.session(journal.waiting_too))
    events = page.locator("#events tr").count()
    typed = '{"ok": tru'
    page.get_by_label("payload (JSON)").fill(typed)
    page.get_by_role("button", name="Send signal").click()

    expect(page.get_by_role("alert")).to_contain_text("the payload is not JSON")
    expect(page.get_by_role("alert")).to_contain_text("nothing was sent")
    expect(page.get_by_label("payload (JSON)")).to_have_value(typed)
    expect(page.get_by_label("payload (JSON)")).to_be_focused()
    assert not [url for url in watch.requests if url.endswith("/signal")]

    # corrected, it goes
    page.get_by_label("payload (JSON)").fill('{"ok": false}')
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#done")).to_have_text("the signal was sent.")
    expect(page.locator("#events tr")).to_have_count(events + 1)
    expect(page.locator("#events")).to_contain_text("signal.sent")


def test_without_javascript_the_console_refuses_a_payload_that_is_not_json(
    console: Console, browser: Browser
) -> None:
    """The console checks the payload itself: a browser without JavaScript (or a form
    posted by anything else) gets the page back with what went wrong and what was typed."""
    context = browser.new_context(java_script_enabled=False)
    context.set_default_timeout(WITHIN * 1000)
    watch = Watch(_origin(console.url))
    page = context.new_page()
    watch.attach(page)
    session, _ = console.journal.waiting_too
    page.goto(console.session(("invoice-3", "bob")))
    expect(page.locator("h1")).to_have_text("Not found")
    expect(page.locator(".error")).to_contain_text("no session invoice-3")
    assert watch.refused == [f"404 GET {console.session(('invoice-3', 'bob'))}"]

    page.goto(console.session(console.journal.waiting_too))
    events = page.locator("#events tr").count()
    typed = "approve it"
    page.get_by_label("payload (JSON)").fill(typed)
    page.get_by_role("button", name="Send signal").click()
    expect(page.get_by_role("alert")).to_contain_text("the payload is not JSON")
    expect(page.get_by_label("payload (JSON)")).to_have_value(typed)
    expect(page.get_by_label("signal", exact=True)).to_have_value("approve")
    expect(page.locator("#events tr")).to_have_count(events)
    context.close()
    # the two pages answered 404 and 400 on purpose, which the browser's console notes
    assert watch.refused[1:] == [f"400 POST {console.url}sessions/{session}/signal"]
    assert [line.rsplit("status of ", 1)[-1] for line in watch.said] == [
        "404 (Not Found)",
        "400 (Bad Request)",
    ]
    watch.said.clear()
    watch.refused.clear()
    watch.check()


# -- hostile transcripts ---------------------------------------------------------------


def test_a_transcript_holding_a_script_tag_shows_it_as_text(
    console: Console, page: Page, watch: Watch
) -> None:
    page.goto(console.session(console.journal.hostile))
    transcript = page.locator("#transcript")
    expect(transcript.locator(".msg.user")).to_contain_text(f"Print {HOSTILE} back.")
    expect(transcript.locator(".msg.assistant")).to_contain_text(f"You wrote {HOSTILE}.")
    scripts = page.evaluate("[...document.scripts].map(s => s.src || s.textContent)")
    assert scripts == [f"{console.url}static/console.js"], scripts
    assert watch.dialogs == []
    # control characters show as escapes, and a long line wraps inside the page
    escaped = CONTROL.replace("\x07", "\\x07").replace("\x1b", "\\x1b")
    escaped = escaped.replace("\x01", "\\x01").replace("\x02", "\\x02")
    expect(transcript).to_contain_text(escaped)
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"the page scrolls {wide} px sideways"


# -- as the README starts it -----------------------------------------------------------


def test_the_readmes_command_serves_on_port_8765(
    console: Console, browser: Browser, tmp_path: Path
) -> None:
    (tmp_path / "journal.db").write_bytes(console.journal.db.read_bytes())
    process, url = start_console(tmp_path, "--db", "journal.db")
    try:
        assert process.said == [
            "loomflow console on http://127.0.0.1:8765/ (SQLite journal.db); Ctrl-C stops"
        ]
        assert url == "http://127.0.0.1:8765/"
        context = browser.new_context()
        watch = Watch("http://127.0.0.1:8765")
        page = context.new_page()
        watch.attach(page)
        page.goto("http://127.0.0.1:8765/")
        expect(page.locator("h1")).to_have_text("Sessions")
        expect(page.locator("#rows")).to_contain_text(console.journal.finished[0])
        expect(page.locator(".where")).to_contain_text("SQLite journal.db")
        context.close()
        watch.check()
    finally:
        assert process.stop() == 0, process.said


# -- the screenshots of docs/ ----------------------------------------------------------


def test_the_docs_screenshots_are_the_real_pages(browser: Browser, tmp_path: Path) -> None:
    """docs/console-sessions.png (the list) and docs/console-session.png (a session with
    its fork tree), from a console over a journal of their own: written into docs/ under
    ``make screenshots`` (LOOMFLOW_SCREENSHOTS=docs), else beside the test's journal, so
    that a test run leaves the checkout as it was (ids and times differ each run)."""
    docs = DOCS if os.environ.get("LOOMFLOW_SCREENSHOTS") == "docs" else tmp_path / "docs"
    # in a thread: playwright's sync API holds an event loop in this one
    with ThreadPoolExecutor(1) as thread:
        journal = thread.submit(make_journal, tmp_path / "journal.db").result()
    process, url = start_console(tmp_path, "--db", "journal.db", "--port", "0")
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 400})
        watch = Watch(_origin(url))
        page = context.new_page()
        watch.attach(page)
        page.goto(url)
        expect(page.locator("#rows tr[id]")).to_have_count(7)
        docs.mkdir(exist_ok=True)
        page.screenshot(path=docs / "console-sessions.png", full_page=True)

        session, user = journal.finished
        page.goto(f"{url}sessions/{session}?user={user}")
        expect(page.locator("#tree li li")).to_have_count(1)
        # down to the end of the runs, with the transcript, fork tree and checkpoints
        runs = page.locator("section", has=page.get_by_role("heading", name=re.compile("^Runs")))
        box = runs.bounding_box()
        assert box is not None
        height = box["y"] + box["height"] + 12
        page.screenshot(
            path=docs / "console-session.png",
            full_page=True,
            clip={"x": 0, "y": 0, "width": 1280, "height": height},
        )
        context.close()
        watch.check()
    finally:
        assert process.stop() == 0, process.said
    for name in ("console-sessions.png", "console-session.png"):
        with Image.open(docs / name) as shot:
            assert shot.format == "PNG" and shot.width == 1280 and shot.height > 300, name
