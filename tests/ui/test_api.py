"""The console's JSON API (``/api/``) over a SQLite journal, in process: the session list
with the filters of ``loomflow sessions ls`` and cursor paging, a session, its events,
and the actions, each recorded in the log as the command line records it."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loomflow.runtime import Scope, SqliteRuntime
from tests.support import lifecycle
from tests.support.console_app import Journal, console, make_journal


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return make_journal(tmp_path_factory.mktemp("console") / "journal.db")


@pytest.fixture
def fresh(journal: Journal, tmp_path: Path) -> Journal:
    """The journal, copied for a test that changes it."""
    assert journal.db is not None
    db = tmp_path / "journal.db"
    shutil.copy(journal.db, db)
    return Journal(journal.zoo, journal.alice, journal.bob, journal.waiting, journal.hostile, db)


@pytest.fixture
def client(journal: Journal) -> Iterator[TestClient]:
    assert journal.db is not None
    with console(journal.db) as opened:
        yield opened


@pytest.fixture
def writer(fresh: Journal) -> Iterator[TestClient]:
    """A console over a copy of the journal, with its CSRF token on every request."""
    assert fresh.db is not None
    with console(fresh.db) as opened:
        opened.headers["X-CSRF-Token"] = opened.get("/api/csrf").json()["csrf"]
        yield opened


def events_of(db: Path, session: str, user: str | None) -> list[str]:
    """The types of a session's events, read from the file as another process would."""

    async def read() -> list[str]:
        async with SqliteRuntime(db) as runtime:
            return [e.type for e in await runtime.store.read_events(Scope(session, user))]

    return asyncio.run(read())


def everything(client: TestClient, limit: int, **query: Any) -> list[dict[str, Any]]:
    """Every page of the list, following next_cursor."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        answer = client.get("/api/sessions", params={**query, "limit": limit, "cursor": cursor})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["sessions"]) <= limit
        rows += page["sessions"]
        cursor = page["next_cursor"]
        if cursor is None:
            return rows


# -- the list --------------------------------------------------------------------------


def test_paging_by_cursor_lists_every_session_once_newest_first(
    client: TestClient, journal: Journal
) -> None:
    rows = everything(client, limit=3)
    ids = [(r["user_id"], r["session_id"]) for r in rows]
    assert len(ids) == len(set(ids)) == journal.count
    moments = [r["updated_at"] for r in rows]
    assert moments == sorted(moments, reverse=True)
    # one page of all of them is the same list
    whole = client.get("/api/sessions", params={"limit": 100}).json()
    assert [(r["user_id"], r["session_id"]) for r in whole["sessions"]] == ids
    assert whole["next_cursor"] is None


def test_totals_count_and_sum_every_session_the_filters_keep_not_only_the_page(
    client: TestClient, journal: Journal
) -> None:
    page = client.get("/api/sessions", params={"limit": 2}).json()
    assert len(page["sessions"]) == 2 and page["total_sessions"] == journal.count
    rows = everything(client, limit=50)
    assert page["total_usage"]["output_tokens"] == sum(r["usage"]["output_tokens"] for r in rows)
    assert page["total_usage"]["cost_usd"] == pytest.approx(
        sum(r["usage"]["cost_usd"] for r in rows)
    )
    alice = client.get("/api/sessions", params={"user": "alice", "limit": 1}).json()
    assert alice["total_sessions"] == len(journal.alice) + len(journal.waiting) + 1


@pytest.mark.parametrize(
    "status",
    ["running", "abandoned", "waiting", "signalled", "stuck", "finished", "failed", "cancelled"],
)
def test_the_status_filter_keeps_the_sessions_a_person_reads_so(
    client: TestClient, journal: Journal, status: str
) -> None:
    rows = everything(client, limit=2, status=status)
    assert rows and {r["status"] for r in rows} == {status}
    assert journal.zoo[status][0] in {r["session_id"] for r in rows}


def test_filters_by_user_agent_and_since_combine_and_page(
    client: TestClient, journal: Journal
) -> None:
    bob = everything(client, limit=1, user="bob")
    assert {r["session_id"] for r in bob} == {*journal.bob, journal.zoo["abandoned"][0], "live"}
    nobody = everything(client, limit=2, user="-")
    assert {r["user_id"] for r in nobody} == {None}
    assert {"inv-7", "inv-8", "inv-9"} <= {r["session_id"] for r in nobody}
    billing = everything(client, limit=2, agent="billing")
    assert [r["session_id"] for r in billing] == [journal.zoo["billing"][0]]
    two = everything(client, limit=1, status=["waiting", "stuck"], user="alice")
    assert sorted(r["session_id"] for r in two) == sorted(journal.waiting)
    # since: an age, or an ISO time
    assert len(everything(client, limit=5, since="1h")) == journal.count
    assert everything(client, limit=5, since="2999-01-01") == []


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"cursor": "not-a-cursor"}, "cursor: not the cursor of a page of this list"),
        ({"cursor": "W10"}, "cursor: not the cursor of a page of this list"),  # base64 of []
        ({"status": "sleeping"}, "unknown status sleeping: one of running, abandoned"),
        ({"since": "yesterdayish"}, "since: 'yesterdayish' is neither an ISO date"),
        ({"user": "a b"}, "user id"),
        ({"limit": "many"}, "limit: "),
    ],
)
def test_a_bad_filter_or_cursor_is_a_400_saying_what_is_wrong(
    client: TestClient, query: dict[str, str], says: str
) -> None:
    answer = client.get("/api/sessions", params=query)
    assert answer.status_code == 400, answer.text
    assert says in answer.json()["error"]


# -- a session -------------------------------------------------------------------------


def test_a_session_has_its_transcript_runs_checkpoints_and_fork_tree(
    client: TestClient, journal: Journal
) -> None:
    session, user = journal.zoo["finished"]
    answer = client.get(f"/api/sessions/{session}", params={"user": user})
    assert answer.status_code == 200, answer.text
    detail = answer.json()
    assert detail["session"]["session_id"] == session and detail["session"]["status"] == "finished"
    roles = [m["role"] for m in detail["transcript"]]
    assert roles[:2] == ["system", "user"] and "tool" in roles
    assert detail["transcript"][-1]["content"] == "Bergen is smaller."
    assert [r["mode"] for r in detail["runs"]] == ["run", "resume"]
    assert all(r["ended"] == "finished" for r in detail["runs"])
    assert len(detail["checkpoints"]) == 2
    (fork,) = detail["tree"]["children"]
    assert detail["tree"]["current"] and detail["tree"]["session_id"] == session
    assert fork["session_id"] == journal.zoo["forked"][0]
    assert fork["from_checkpoint"] == detail["checkpoints"][-1]["checkpoint_id"]
    # the fork's page draws the same tree from its root, with itself marked
    forked = client.get(f"/api/sessions/{fork['session_id']}", params={"user": user}).json()
    assert forked["tree"]["session_id"] == session and not forked["tree"]["current"]
    assert forked["tree"]["children"][0]["current"]


def test_a_waiting_session_shows_what_it_waits_for(client: TestClient, journal: Journal) -> None:
    detail = client.get(f"/api/sessions/{journal.waiting[0]}", params={"user": "alice"}).json()
    assert detail["session"]["status"] == "waiting"
    assert detail["session"]["waiting_for"] == "approve"
    assert detail["waiting"]["signal"] == "approve"


def test_events_after_a_seq_are_the_rest_of_the_history_in_order(
    client: TestClient, journal: Journal
) -> None:
    session, user = journal.zoo["finished"]
    every = client.get(f"/api/sessions/{session}/events", params={"user": user}).json()
    assert [e["seq"] for e in every] == list(range(1, len(every) + 1))
    assert every[0]["type"] == "run.started" and every[-1]["type"] == "run.finished"
    rest = client.get(f"/api/sessions/{session}/events", params={"user": user, "after": 3})
    assert rest.json() == every[3:]


@pytest.mark.parametrize("path", ["", "/events"])
def test_an_unknown_session_is_a_404_pointing_at_what_exists(
    client: TestClient, journal: Journal, path: str
) -> None:
    answer = client.get(f"/api/sessions/no-such-session{path}")
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error.startswith("no session no-such-session (no user)")
    assert "GET /api/sessions" in error and "?user=U" in error
    # a session of a user, asked for without the user, is not that user's
    finished, _ = journal.zoo["finished"]
    assert client.get(f"/api/sessions/{finished}").status_code == 404
    assert client.get(f"/api/sessions/{finished}", params={"user": "bob"}).status_code == 404


def test_an_unknown_sessions_page_is_a_404_page_linking_to_the_list(client: TestClient) -> None:
    answer = client.get("/sessions/no-such-session", params={"user": "ada"})
    assert answer.status_code == 404 and "<h1>Not found</h1>" in answer.text
    assert "no session no-such-session (user ada)" in answer.text
    assert "listed at / and at GET /api/sessions" in answer.text
    assert '<a href="/">The sessions this console shows</a>' in answer.text


def test_the_openapi_description_names_every_route_of_the_api(client: TestClient) -> None:
    spec = client.get("/api/openapi.json").json()
    assert set(spec["paths"]) == {
        "/api/analytics",
        "/api/csrf",
        "/api/sessions",
        "/api/sessions/{session_id}",
        "/api/sessions/{session_id}/events",
        "/api/sessions/{session_id}/fork",
        "/api/sessions/{session_id}/signal",
        "/api/sessions/{session_id}/cancel",
    }
    listing = spec["paths"]["/api/sessions"]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {"user", "status", "since", "cursor"}
    assert "SessionsPage" in spec["components"]["schemas"]
    signal = spec["paths"]["/api/sessions/{session_id}/signal"]["post"]
    assert {p["name"] for p in signal["parameters"]} >= {"x-csrf-token"}


# -- actions ---------------------------------------------------------------------------


def test_a_signal_is_recorded_and_the_waiting_run_receives_it(
    writer: TestClient, fresh: Journal
) -> None:
    db = fresh.db
    assert db is not None
    session = fresh.waiting[0]
    answer = writer.post(
        f"/api/sessions/{session}/signal",
        params={"user": "alice"},
        json={"name": "approve", "data": {"ok": True, "by": "<b>ops</b>"}},
    )
    assert answer.status_code == 200, answer.text
    assert events_of(db, session, "alice")[-1] == "signal.sent"
    assert answer.json()["seq"] == len(events_of(db, session, "alice"))

    async def resume() -> str:
        lifecycle.APPROVALS.clear()
        async with SqliteRuntime(db) as runtime:
            done = await lifecycle.payer(runtime).resume(session_id=session, user_id="alice")
        return done.stop_reason

    assert asyncio.run(resume()) == "completed"
    assert lifecycle.APPROVALS == [{"ok": True, "by": "<b>ops</b>"}]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"name": "approve", "data": {"ok": tru', "the body is not JSON"),
        (b"approve", "the body is not JSON"),
        (b'{"data": 1}', "body.name: Field required"),
        (b'{"name": ""}', "body.name: String should have at least 1 character"),
    ],
)
def test_a_signal_that_is_not_json_is_a_400_and_nothing_is_appended(
    writer: TestClient, fresh: Journal, body: bytes, says: str
) -> None:
    assert fresh.db is not None
    session = fresh.waiting[0]
    before = events_of(fresh.db, session, "alice")
    answer = writer.post(
        f"/api/sessions/{session}/signal",
        params={"user": "alice"},
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400, answer.text
    assert says in answer.json()["error"]
    assert events_of(fresh.db, session, "alice") == before


def test_a_signal_form_whose_payload_is_not_json_keeps_what_was_typed_and_appends_nothing(
    writer: TestClient, fresh: Journal
) -> None:
    assert fresh.db is not None
    session = fresh.waiting[0]
    before = events_of(fresh.db, session, "alice")
    typed = '{"ok": yes, "note": "<b>x</b>"}'
    answer = writer.post(
        f"/sessions/{session}/signal",
        data={
            "name": "approve",
            "payload": typed,
            "user": "alice",
            "csrf": writer.headers["X-CSRF-Token"],
        },
    )
    assert answer.status_code == 400
    assert "the payload is not JSON" in answer.text
    assert "{&#34;ok&#34;: yes, &#34;note&#34;: &#34;&lt;b&gt;x&lt;/b&gt;&#34;}" in answer.text
    assert events_of(fresh.db, session, "alice") == before


def test_cancel_ends_the_waiting_run_as_the_command_line_does(
    writer: TestClient, fresh: Journal
) -> None:
    assert fresh.db is not None
    session = fresh.waiting[1]
    answer = writer.post(
        f"/api/sessions/{session}/cancel", params={"user": "alice"}, json={"reason": "paid"}
    )
    assert answer.status_code == 200, answer.text
    assert events_of(fresh.db, session, "alice")[-1] == "run.cancelled"
    detail = writer.get(f"/api/sessions/{session}", params={"user": "alice"}).json()
    assert detail["session"]["status"] == "cancelled"
    assert detail["runs"][-1]["ended"] == "cancelled" and detail["runs"][-1]["error"] == "paid"
    # a second cancel has nothing to cancel: refused, not appended
    again = writer.post(f"/api/sessions/{session}/cancel", params={"user": "alice"}, json={})
    assert again.status_code == 409 and "no run in flight" in again.json()["error"]
    assert events_of(fresh.db, session, "alice").count("run.cancelled") == 1


def test_fork_makes_a_child_session_listed_in_the_parents_tree(
    writer: TestClient, fresh: Journal
) -> None:
    session, user = fresh.zoo["finished"]
    detail = writer.get(f"/api/sessions/{session}", params={"user": user}).json()
    newest = detail["checkpoints"][0]["checkpoint_id"]
    answer = writer.post(
        f"/api/sessions/{session}/fork",
        params={"user": user},
        json={"checkpoint_id": newest, "new_id": "from-the-console"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"session_id": "from-the-console"}
    child = writer.get("/api/sessions/from-the-console", params={"user": user}).json()
    assert child["session"]["parent_session_id"] == session
    assert child["session"]["parent_checkpoint_id"] == newest
    assert [m["content"] for m in child["transcript"]] == [
        m["content"] for m in detail["transcript"]
    ]
    tree = writer.get(f"/api/sessions/{session}", params={"user": user}).json()["tree"]
    assert "from-the-console" in {c["session_id"] for c in tree["children"]}
    # the id is taken now
    taken = writer.post(
        f"/api/sessions/{session}/fork",
        params={"user": user},
        json={"checkpoint_id": newest, "new_id": "from-the-console"},
    )
    assert taken.status_code == 409 and "choose another id" in taken.json()["error"]
    # a new id that is no id, or a key the body does not have: a bad request, not a
    # refusal of a good one (a new user's trial: 409, and "as" ignored for an id of ours)
    before = writer.get("/api/sessions", params={"user": user}).json()
    bad = writer.post(
        f"/api/sessions/{session}/fork",
        params={"user": user},
        json={"checkpoint_id": newest, "new_id": "a b"},
    )
    assert bad.status_code == 400 and "invalid new session id 'a b'" in bad.json()["error"]
    unknown = writer.post(
        f"/api/sessions/{session}/fork",
        params={"user": user},
        json={"checkpoint_id": newest, "as": "mine"},
    )
    assert unknown.status_code == 400 and "as" in unknown.json()["error"], unknown.text
    assert writer.get("/api/sessions", params={"user": user}).json() == before


def test_an_unknown_checkpoint_is_a_404_naming_the_sessions_checkpoints(
    writer: TestClient, fresh: Journal
) -> None:
    assert fresh.db is not None
    session, user = fresh.zoo["finished"]
    before = events_of(fresh.db, session, user)
    checkpoints = writer.get(f"/api/sessions/{session}", params={"user": user}).json()
    known = [c["checkpoint_id"] for c in checkpoints["checkpoints"]]
    answer = writer.post(
        f"/api/sessions/{session}/fork", params={"user": user}, json={"checkpoint_id": "ckpt-x"}
    )
    assert answer.status_code == 404
    assert answer.json()["error"] == (
        f"no checkpoint ckpt-x of session {session} (user ada); its checkpoints (newest "
        f"first): {', '.join(known)}"
    )
    missing = writer.post(
        "/api/sessions/nobody/fork", params={"user": user}, json={"checkpoint_id": known[0]}
    )
    assert missing.status_code == 404
    assert missing.json()["error"].startswith("no session nobody (user ada)")
    assert events_of(fresh.db, session, user) == before


@pytest.mark.parametrize("action", ["signal", "cancel", "fork"])
def test_an_action_on_an_unknown_session_is_a_404(writer: TestClient, action: str) -> None:
    body = {"signal": {"name": "approve"}, "cancel": {}, "fork": {"checkpoint_id": "c"}}[action]
    answer = writer.post(f"/api/sessions/nobody/{action}", params={"user": "alice"}, json=body)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"].startswith("no session nobody (user alice)")
