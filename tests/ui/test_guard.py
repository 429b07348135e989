"""Who may use the console and what it lets a page do, in process: the token (bearer or
the one-time login link's cookie), CSRF and Origin on every action, the Host check on
the loopback, per-user scoping, a read-only console, and the headers and markup that keep
a page from loading anything elsewhere or running a transcript's script."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from loomflow.runtime import ANY_USER, DatabaseStore, Scope, SqliteRuntime
from loomflow.ui import ConsoleConfig, create_app
from loomflow.ui.guard import COOKIE, CSP, Guard
from tests.support.console_app import (
    BINARY,
    LONG_LINE,
    SCRIPT,
    Journal,
    Stream,
    chatter,
    console,
    make_journal,
    served,
    until,
)

TEMPLATES = Path(__file__).resolve().parents[2] / "loomflow" / "ui" / "templates"
STATIC = TEMPLATES.parent / "static"
TOKEN = "a-token-of-the-console-0123456789"


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return make_journal(tmp_path_factory.mktemp("console") / "journal.db")


@pytest.fixture
def db(journal: Journal, tmp_path: Path) -> Path:
    """A copy of the journal's file, for a test that may change it."""
    assert journal.db is not None
    shutil.copy(journal.db, tmp_path / "journal.db")
    return tmp_path / "journal.db"


def log_of(db: Path) -> list[tuple[str | None, str, int]]:
    """Every event of the file: (user, session, seq), read as another process would."""

    async def read() -> list[tuple[str | None, str, int]]:
        async with SqliteRuntime(db) as runtime:
            assert isinstance(runtime.store, DatabaseStore)
            rows = await runtime.store.list_sessions(user_id=ANY_USER, limit=1000)
            found = []
            for row in rows:
                scope = Scope(row.session_id, row.user_id)
                found += [
                    (row.user_id, row.session_id, e.seq)
                    for e in await runtime.store.read_events(scope)
                ]
            return sorted(found, key=str)

    return asyncio.run(read())


def actions(session: str, user: str, checkpoint: str) -> list[tuple[str, dict[str, Any]]]:
    """Every action of the API and of the pages' forms on ``session``: (path, json or
    form)."""
    return [
        (f"/api/sessions/{session}/signal", {"json": {"name": "approve", "data": 1}}),
        (f"/api/sessions/{session}/cancel", {"json": {}}),
        (f"/api/sessions/{session}/fork", {"json": {"checkpoint_id": checkpoint}}),
        (f"/sessions/{session}/signal", {"data": {"name": "approve", "user": user}}),
        (f"/sessions/{session}/cancel", {"data": {"user": user}}),
        (f"/sessions/{session}/fork", {"data": {"checkpoint": checkpoint, "user": user}}),
        (f"/sessions/{session}/retry", {"data": {"user": user}}),
        (f"/sessions/{session}/erase", {"data": {"confirm": session, "user": user}}),
    ]


def _checkpoint(client: TestClient, session: str, user: str) -> str:
    """The session's newest checkpoint, or an id of none (a run that waits before it
    wrote one)."""
    detail = client.get(f"/api/sessions/{session}", params={"user": user}).json()
    return str(detail["checkpoints"][0]["checkpoint_id"]) if detail["checkpoints"] else "ckpt-0"


# -- CSRF and Origin -------------------------------------------------------------------


@pytest.mark.parametrize("csrf", [None, "wrong", "wröng"])
def test_an_action_without_the_csrf_token_is_refused_and_does_nothing(
    db: Path, journal: Journal, csrf: str | None
) -> None:
    before = log_of(db)
    with console(db) as client:
        session = journal.waiting[0]
        checkpoint = _checkpoint(client, session, "alice")
        for path, body in actions(session, "alice", checkpoint):
            query = {"user": "alice"} if path.startswith("/api/") else {}
            # a header of any bytes, as a client may send (UTF-8 here)
            headers = {b"X-CSRF-Token": csrf.encode()} if csrf is not None else {}
            if "data" in body and csrf is not None:
                body = {"data": {**body["data"], "csrf": csrf}}
            answer = client.post(path, params=query, headers=headers, **body)
            assert answer.status_code == 403, (path, answer.text)
            said = answer.json()["error"] if path.startswith("/api/") else answer.text
            assert "CSRF token is missing" in said or "missing or wrong" in said, said
    assert log_of(db) == before


def test_an_action_from_another_origin_is_refused_even_with_the_token(
    db: Path, journal: Journal
) -> None:
    before = log_of(db)
    with console(db) as client:
        csrf = client.get("/api/csrf").json()["csrf"]
        session = journal.waiting[0]
        checkpoint = _checkpoint(client, session, "alice")
        for origin in ("http://evil.example", "null", "http://127.0.0.1:9999"):
            for path, body in actions(session, "alice", checkpoint):
                if "data" in body:
                    body = {"data": {**body["data"], "csrf": csrf}}
                answer = client.post(
                    path,
                    params={"user": "alice"},
                    headers={"X-CSRF-Token": csrf, "Origin": origin},
                    **body,
                )
                assert answer.status_code == 403, (origin, path, answer.text)
                assert f"a request from {origin}" in answer.text
        assert log_of(db) == before
        # from the console's own origin, the same request goes through
        answer = client.post(
            f"/api/sessions/{session}/signal",
            params={"user": "alice"},
            headers={"X-CSRF-Token": csrf, "Origin": "http://127.0.0.1:8765"},
            json={"name": "approve", "data": {"ok": True}},
        )
        assert answer.status_code == 200, answer.text
    assert len(log_of(db)) == len(before) + 1


def test_a_read_only_console_refuses_every_action(db: Path, journal: Journal) -> None:
    before = log_of(db)
    with console(db, read_only=True, agent="tests.support.lifecycle:researcher") as client:
        csrf = client.get("/api/csrf").json()["csrf"]
        for session, user in (("a-1", "alice"), journal.zoo["stuck"], journal.zoo["finished"]):
            assert user is not None
            checkpoint = _checkpoint(client, session, user)
            for path, body in actions(session, user, checkpoint):
                if "data" in body:
                    body = {"data": {**body["data"], "csrf": csrf}}
                answer = client.post(
                    path, params={"user": user}, headers={"X-CSRF-Token": csrf}, **body
                )
                assert answer.status_code == 403, (path, answer.text)
                assert "read-only" in answer.text
            page = client.get(f"/sessions/{session}", params={"user": user}).text
            assert '<form method="post"' not in page
    assert log_of(db) == before


# -- the token -------------------------------------------------------------------------


@pytest.fixture
def guarded(journal: Journal) -> Iterator[tuple[TestClient, Guard]]:
    """A console with a token, as beyond the loopback, reached as another machine."""
    assert journal.db is not None
    from loomflow.control.source import Source

    guard = Guard(TOKEN, loopback=False)
    config = ConsoleConfig(source=Source(db=journal.db), token=TOKEN, host="0.0.0.0")
    app = create_app(config, guard)
    with TestClient(app, base_url="http://console.example:8765") as client:
        yield client, guard


@pytest.mark.parametrize(
    "path", ["/", "/api/sessions", "/api/openapi.json", "/tail", "/static/console.js"]
)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", "Bearer", f"Basic {TOKEN}", "Bearer tökén"]
)
def test_without_its_token_the_console_answers_401(
    guarded: tuple[TestClient, Guard], path: str, authorization: str | None
) -> None:
    client, _ = guarded
    headers = {} if authorization is None else {b"Authorization": authorization.encode()}
    answer = client.get(path, headers=headers)
    assert answer.status_code == 401
    assert "needs its token" in answer.text and answer.headers["WWW-Authenticate"] == "Bearer"
    assert answer.headers["Content-Security-Policy"] == CSP
    client.cookies.set(COOKIE, "wrong")
    assert client.get(path).status_code == 401


def test_the_bearer_token_opens_every_page_and_the_api(
    guarded: tuple[TestClient, Guard], journal: Journal
) -> None:
    client, _ = guarded
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/", headers=bearer).status_code == 200
    listing = client.get("/api/sessions", headers=bearer)
    assert listing.status_code == 200 and listing.json()["total_sessions"] == journal.count
    # any Host: beyond the loopback the token is the check
    other = client.get("/api/csrf", headers={**bearer, "Host": "10.0.0.7:8765"})
    assert other.status_code == 200


def test_the_login_link_sets_the_cookie_and_works_once(
    guarded: tuple[TestClient, Guard],
) -> None:
    client, guard = guarded
    code = guard.login_code()
    answer = client.get(f"/login?code={code}", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"]
    assert f"{COOKIE}={TOKEN}" in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.get("/").status_code == 200  # the cookie, from now on
    client.cookies.clear()
    again = client.get(f"/login?code={code}", follow_redirects=False)
    assert again.status_code == 401 and "used already" in again.text
    assert "set-cookie" not in again.headers
    assert client.get("/").status_code == 401
    assert client.get("/login?code=guessed", follow_redirects=False).status_code == 401
    assert client.get("/login", follow_redirects=False).status_code == 401


# -- the Host header on the loopback ---------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8765", "localhost:8765", "localhost", "[::1]:8765", "[::1]", "127.0.0.2"]
)
def test_on_the_loopback_its_own_host_names_are_answered(journal: Journal, host: str) -> None:
    assert journal.db is not None
    with console(journal.db) as client:
        assert client.get("/api/csrf", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8765", "127.0.0.1.evil.example", "[::2]:8765", ""]
)
def test_on_the_loopback_another_host_name_is_refused_as_dns_rebinding(
    db: Path, journal: Journal, host: str
) -> None:
    before = log_of(db)
    with console(db) as client:
        csrf = client.get("/api/csrf").json()["csrf"]
        for method, path in (("GET", "/"), ("GET", "/api/sessions"), ("POST", "signal")):
            if method == "GET":
                answer = client.get(path, headers={"Host": host})
            else:
                answer = client.post(
                    "/api/sessions/a-1/signal",
                    params={"user": "alice"},
                    headers={"Host": host, "X-CSRF-Token": csrf},
                    json={"name": "approve", "data": {"ok": True}},
                )
            assert answer.status_code == 421, (path, answer.text)
            assert "answers on the loopback only" in answer.text
    assert log_of(db) == before


# -- one user's console ----------------------------------------------------------------


def test_a_users_console_lists_only_that_users_sessions(journal: Journal) -> None:
    assert journal.db is not None
    alices = {*journal.alice, *journal.waiting, journal.hostile}
    others = {*journal.bob, "live", "gone", *(s for s, _ in journal.zoo.values())}
    with console(journal.db, user="alice") as client:
        for query in ({}, {"user": "bob"}, {"user": ""}, {"user": "alice"}, {"status": "running"}):
            listing = client.get("/api/sessions", params={**query, "limit": 500}).json()
            ids = {r["session_id"] for r in listing["sessions"]}
            assert ids <= alices and not ids & others, query
            assert listing["total_sessions"] == len(ids)
            page = client.get("/", params=query).text
            assert not [s for s in others if f"/sessions/{s}" in page], query
        assert {r["session_id"] for r in client.get("/api/sessions").json()["sessions"]} == alices


def test_a_users_console_reads_another_users_ids_as_unknown(db: Path, journal: Journal) -> None:
    before = log_of(db)
    bobs = [(s, "bob") for s in journal.bob] + [journal.zoo["finished"], ("inv-7", None)]
    with console(db, user="alice") as client:
        csrf = client.get("/api/csrf").json()["csrf"]
        for session, user in bobs:
            for query in ({}, {"user": user or ""}):
                for path in (
                    f"/api/sessions/{session}",
                    f"/api/sessions/{session}/events",
                    f"/sessions/{session}",
                ):
                    answer = client.get(path, params=query)
                    assert answer.status_code == 404, (path, query, answer.text)
                    assert session not in answer.text.replace(f"no session {session}", "")
                for path, body in actions(session, user or "", "ckpt-any"):
                    if "data" in body:
                        body = {"data": {**body["data"], "csrf": csrf}}
                    answer = client.post(path, params=query, headers={"X-CSRF-Token": csrf}, **body)
                    assert answer.status_code == 404, (path, query, answer.text)
        # alice's own session, for comparison
        assert client.get(f"/api/sessions/{journal.alice[0]}").status_code == 200
    assert log_of(db) == before


def test_a_users_console_streams_none_of_another_users_changes(db: Path, journal: Journal) -> None:
    """A session stream of another user's session is a 404 (served, not in process: an
    open stream would never end there); the live list and the tail of alice's console,
    while bob's and alice's sessions change: alice's changes arrive, bob's never do."""
    from loomflow.control.source import Source

    app = create_app(ConsoleConfig(source=Source(db=db), user="alice", poll_seconds=0.05))
    with served(app) as url:
        for session, user in [(journal.bob[0], "bob"), journal.zoo["finished"], ("inv-7", "")]:
            for query in ("", f"?user={user}"):
                stream = Stream(f"{url}/live/sessions/{session}{query}")
                stream.close()
                assert stream.status == 404, (session, query)
        listing = Stream(f"{url}/live/sessions")
        tail = Stream(f"{url}/live/tail")
        assert listing.status == tail.status == 200
        written: dict[str, list[str]] = {"alice": [], "bob": []}

        async def write() -> None:
            async with SqliteRuntime(db) as runtime:
                for user in ("bob", "alice"):  # bob's first: had it leaked, it came first
                    done = await chatter(runtime, f"For {user}.").run("Hi.", user_id=user)
                    written[user].append(done.session_id)

        def arrived() -> bool:
            # a stream looks first, then sends what changed since: write until it has
            asyncio.run(write())
            return all(
                any(s in stream.text() for s in written["alice"]) for stream in (listing, tail)
            )

        try:
            until(arrived, within=60, what="alice's new sessions in her live list and tail")
        finally:
            listing.close()
            tail.close()
        for stream in (listing, tail):
            assert stream.events
            assert not [s for s in written["bob"] if s in stream.text()]
            assert "bob" not in stream.text()


# -- what a page may load and run ------------------------------------------------------


class _Links(HTMLParser):
    """The URLs a page loads or sends to, and its script elements."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action", "formaction", "data-live", "poster"):
                self.urls.append(value or "")
            if name.startswith("on"):
                self.handlers.append(f"{tag} {name}")
        if tag == "script":
            self.scripts.append(dict(attrs))


def _same_origin(url: str) -> bool:
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc and not url.startswith("//")


def test_every_page_loads_only_from_the_console_and_runs_only_its_own_script(
    journal: Journal, db: Path
) -> None:
    assert journal.db is not None
    seen: set[str] = set()
    pages: list[tuple[str, str]] = []
    with console(db) as client:
        paths = [
            "/",
            "/?status=waiting&status=stuck",
            "/tail",
            "/analytics",
            *(f"/sessions/{s}?user={u or ''}" for s, u in journal.zoo.values()),
            f"/sessions/{journal.hostile}?user=alice",
            f"/sessions/{journal.waiting[0]}?user=alice",
            "/sessions/nobody",  # 404
            "/?since=tomorrowish",  # 400
        ]
        for path in paths:
            answer = client.get(path)
            assert answer.headers["content-type"].startswith("text/html"), path
            seen.add(answer.template.name)  # type: ignore[attr-defined]
            pages.append((path, answer.text))
        # an action refused (the session page with the error), and 409
        csrf = client.get("/api/csrf").json()["csrf"]
        answer = client.post(
            "/sessions/a-1/signal",
            data={"name": "approve", "payload": "{", "csrf": csrf, "user": "alice"},
        )
        assert answer.status_code == 400
        pages.append(("signal", answer.text))
        finished, ada = journal.zoo["finished"]
        answer = client.post(f"/sessions/{finished}/cancel", data={"csrf": csrf, "user": ada or ""})
        assert answer.status_code == 409
        pages.append(("cancel", answer.text))
        db.unlink()  # the store gone: the page that says so
        answer = client.get("/")
        assert answer.status_code == 503
        seen.add(answer.template.name)  # type: ignore[attr-defined]
        pages.append(("down", answer.text))
    whole = {p.name for p in TEMPLATES.glob("*.html") if not p.name.startswith("_")}
    assert whole - {"base.html"} <= seen, f"pages not drawn here: {whole - seen}"
    for path, html in pages:
        links = _Links()
        links.feed(html)
        assert links.urls, path
        assert all(_same_origin(url) for url in links.urls), (path, links.urls)
        ours = [{"src": "/static/console.js", "defer": None}]
        if path == "/analytics":  # its figures as data, plotly served from here, its drawing
            data, plotly = links.scripts[1:3]
            assert data == {"type": "application/json", "id": "figures"}, path
            assert str(plotly["src"]).startswith("/vendor/plotly-"), path
            ours += [data, plotly, {"src": "/static/charts.js", "defer": None}]
        assert links.scripts == ours, path
        assert links.handlers == [], path
        assert "<style" not in html and " style=" not in html, path  # the CSP has no inline
    # nor do the templates and static files name anything elsewhere
    for source in [*TEMPLATES.glob("*.html"), *STATIC.iterdir()]:
        # an SVG's xmlns names its XML namespace: an identifier, never fetched
        text = source.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}", text), source.name
        assert "@import" not in text and 'fetch("http' not in text, source.name


def test_every_answer_carries_the_content_security_policy_and_no_sniffing(
    journal: Journal,
) -> None:
    assert journal.db is not None
    with console(journal.db) as client:
        for path in ("/", "/api/sessions", "/static/console.css", "/sessions/nobody", "/x"):
            headers = client.get(path).headers
            assert headers["Content-Security-Policy"] == CSP, path
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["X-Frame-Options"] == "DENY"
            assert headers["Referrer-Policy"] == "same-origin"
        refused = client.get("/", headers={"Host": "evil.example"}).headers
        assert refused["Content-Security-Policy"] == CSP
    policy = dict(part.strip().split(" ", 1) for part in CSP.split(";"))
    assert policy["default-src"] == policy["script-src"] == policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"


def test_a_hostile_transcript_is_text_on_the_page_and_data_in_the_api(
    journal: Journal,
) -> None:
    assert journal.db is not None
    with console(journal.db) as client:
        detail = client.get(f"/api/sessions/{journal.hostile}", params={"user": "alice"}).json()
        contents = [m["content"] for m in detail["transcript"]]
        assert f"{SCRIPT}\n{BINARY}" in contents  # as the model said it, unchanged
        assert any(LONG_LINE in c for c in contents)
        calls = [c for m in detail["transcript"] for c in m["tool_calls"]]
        assert calls[0]["arguments"] == {"text": f"{SCRIPT} {BINARY}"}
        html = client.get(f"/sessions/{journal.hostile}", params={"user": "alice"}).text
    links = _Links()
    links.feed(html)
    assert links.scripts == [{"src": "/static/console.js", "defer": None}]
    assert links.handlers == [] and "x" not in links.urls  # no <img src=x onerror>
    assert "<script>document" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in html
    assert "bytes\\x00\\x1b[31mred\\x7fend" in html and "\x00" not in html and "\x1b" not in html
    assert LONG_LINE.strip() in html  # all of it, as text
