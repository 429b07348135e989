"""What a new operator typed that the console got wrong, each now a clear refusal or the
list it asked for: an age past any date, the sessions of no user (``user=-``), an empty
signal payload, a bad limit or cursor, a path the console has not, tail filters no event
matches, a live page whose session moved on, and (the command) a --db that is not there,
a token too short (never echoed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.console_app import Journal, Stream, console, make_journal, served, until
from tests.ui.test_api import events_of

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return make_journal(tmp_path_factory.mktemp("console") / "journal.db")


@pytest.fixture
def client(journal: Journal) -> Iterator[TestClient]:
    assert journal.db is not None
    with console(journal.db) as opened:
        yield opened


def _ids(html: str) -> set[str]:
    return set(re.findall(r'href="/sessions/([^"?]+)', html))


def test_an_age_past_any_date_is_a_400_not_a_crash(client: TestClient) -> None:
    for path in ("/?since=99999999d", "/api/sessions?since=99999999d"):
        answer = client.get(path)
        assert answer.status_code == 400, (path, answer.text[:300])
        assert "further back than any date" in answer.text


def test_user_dash_lists_the_sessions_of_no_user_and_an_empty_user_everyone(
    client: TestClient, journal: Journal
) -> None:
    nobody = client.get("/api/sessions", params={"user": "-", "limit": 500}).json()
    assert nobody["sessions"] and {r["user_id"] for r in nobody["sessions"]} == {None}
    page = client.get("/", params={"user": "-", "limit": 500}).text
    assert _ids(page) == {r["session_id"] for r in nobody["sessions"]}
    everyone = client.get("/", params={"user": "", "limit": 500}).text
    assert set(journal.bob) <= _ids(everyone) and _ids(page) < _ids(everyone)


def test_an_empty_signal_payload_is_refused_and_sends_nothing(
    journal: Journal, tmp_path: Path
) -> None:
    assert journal.db is not None
    db = tmp_path / "journal.db"
    shutil.copy(journal.db, db)
    session = journal.waiting[0]
    before = events_of(db, session, "alice")
    with console(db) as client:
        csrf = client.get("/api/csrf").json()["csrf"]
        answer = client.post(
            f"/sessions/{session}/signal",
            data={"name": "approve", "payload": "  ", "csrf": csrf, "user": "alice"},
        )
    assert answer.status_code == 400 and "the payload is empty: type null" in answer.text
    assert events_of(db, session, "alice") == before


def test_a_bad_limit_or_cursor_is_a_400_saying_what_to_do(client: TestClient) -> None:
    for limit in ("0", "-1", "501"):
        answer = client.get("/api/sessions", params={"limit": limit})
        assert answer.status_code == 400 and "limit: a whole number from 1 to 500" in answer.text
    answer = client.get("/", params={"cursor": "garbage"})
    assert answer.status_code == 400 and "follow the list's next-page link" in unescape(answer.text)
    assert "SessionCursor" not in answer.text


def test_a_path_the_console_has_not_is_its_own_404_page(client: TestClient) -> None:
    answer = client.get("/nothing/here")
    assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html")
    assert "no page at /nothing/here" in answer.text and 'href="/static/console.css"' in answer.text
    api = client.get("/api/nothing")
    assert api.status_code == 404 and api.json() == {
        "error": "no page at /api/nothing; the console's pages are linked from /"
    }


def test_tail_filters_are_checked_and_kept_whole(client: TestClient) -> None:
    answer = client.get("/tail", params={"type": "bogus"})
    assert answer.status_code == 400 and "no event is of type 'bogus'" in unescape(answer.text)
    page = client.get("/tail", params=[("type", "run.*"), ("type", "signal.sent")]).text
    assert 'value="run.*, signal.sent"' in page
    assert client.get("/tail", params={"session": "not an id"}).status_code == 404


def test_a_live_page_says_when_its_session_moved_on(journal: Journal) -> None:
    assert journal.db is not None
    finished, user = journal.zoo["finished"]
    with console(journal.db) as client, served(client.app) as base:  # type: ignore[arg-type]
        for drawn, stale in (("running", True), ("finished", False)):
            query = f"user={user or ''}&after=0&drawn={drawn}"
            stream = Stream(f"{base}/live/sessions/{finished}?{query}")

            def statuses(of: Stream = stream) -> list[str]:
                return [data for kind, data in of.events if kind == "status"]

            try:
                status = until(statuses, what="the stream's status line")
            finally:
                stream.close()
            html = json.loads(status[0])["html"]
            assert ('id="stale"' in html) is stale, html
            if stale:
                assert "It was running when this page was drawn" in html


def test_loomflow_ui_refuses_a_db_that_is_not_there(tmp_path: Path) -> None:
    for db in (tmp_path / "missing.db", tmp_path):
        done = subprocess.run(
            [str(BIN / "loomflow"), "ui", "--db", str(db), "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # exit 1, a store that cannot be read, as `sessions ls`, `tail` or `stats` say it
        assert done.returncode == 1, done.stderr
        assert f"--db {db} " in done.stderr and "name the SQLite file" in done.stderr


def test_a_token_too_short_is_refused_without_echoing_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "loomflow"), "ui", "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"LOOMFLOW_UI_TOKEN": "s3cret-value", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "LOOMFLOW_UI_TOKEN" in done.stderr and "s3cret-value" not in done.stderr, done.stderr
