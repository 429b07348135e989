"""The listing conformance suite: what a :class:`loomflow.runtime.DatabaseStore` lists of
its sessions (``list_sessions``, page after page through a :class:`SessionCursor`) and
what it counts of them (``session_totals``), whatever database holds its read model.

The sessions are made by hand (:class:`SessionLog`), each last active at a chosen moment,
several at the same one, so the listing's order is known before the store is asked:
``updated_at`` newest first, then user id (no user first), then session id.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from loomflow import Usage
from loomflow.runtime import ANY_USER, DatabaseStore, EventStore, Scope
from loomflow.schemas import Event, Message
from loomflow.schemas.sessions import SessionCursor, SessionRecord, SessionTotals
from loomflow.testing._support import Suite, commit, opened_fixture, required_fixture
from loomflow.testing.store import SessionLog

__all__ = ["ListingConformance"]

_USERS = (None, "ada", "bob")
_BASE = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


@dataclass(frozen=True)
class _Made:
    """A session as the suite made it: what its row must say."""

    user_id: str | None
    session_id: str
    updated_at: datetime
    status: str
    agent: str | None
    parent_session_id: str | None
    usage: Usage

    def key(self) -> tuple[float, str, str]:
        # the listing's order; ids here are lower-case letters and digits, so their order
        # is the same under any collation of the database
        return (-self.updated_at.timestamp(), self.user_id or "", self.session_id)


def _usage(i: int) -> Usage:
    return Usage(
        input_tokens=100 + i,
        cached_input_tokens=3 * i,
        cache_write_tokens=i % 4,
        output_tokens=10 + 2 * i,
        cost_usd=0.0013 * (i + 1),
    )


async def _make(store: EventStore) -> list[_Made]:
    """24 live sessions of three users (one erased besides): groups of five last active at
    one moment (a microsecond apart from the next group), so pages end inside ties; a
    session id held by two users; failed, finished and running sessions of two agents; a
    fork."""
    made: list[_Made] = []
    events: list[Event] = []
    specs = [(_USERS[i % 3], f"s{i:02d}") for i in range(20)]
    specs += [("ada", "twin"), ("bob", "twin")]
    for i, (user, session_id) in enumerate(specs):
        moment = _BASE - timedelta(seconds=i // 5 * 60, microseconds=i // 5)
        log = SessionLog(session_id, user, at=moment)
        agent = "alpha" if i % 2 else "beta"
        usage = _usage(i)
        events += [log.claim(agent=agent), log.turn("q"), log.turn("a", usage=usage)]
        status = ("running", "failed", "finished", "running")[i % 4]
        if status == "failed":
            events.append(log.fail())
        elif status == "finished":
            events.append(log.finish())
        made.append(_Made(user, session_id, moment, status, agent, None, usage))
    # a fork of ada's s01, last active in the newest group's moment
    parent = SessionLog("s01", "ada", at=_BASE)
    fork = SessionLog("fork1", "ada", at=_BASE)
    fork.usage = _usage(1)
    events.append(fork.fork(parent.scope, "ckpt-parent", [Message.user("q")]))
    made.append(_Made("ada", "fork1", _BASE, "running", None, "s01", _usage(1)))
    gone = SessionLog("gone", "bob", at=_BASE + timedelta(hours=1))
    events += [gone.claim(agent="alpha"), gone.turn("a", usage=_usage(7))]
    await commit(store, events)
    assert await store.erase("gone", user_id="bob")  # newest of all, and never listed
    for m in made:  # the rows say what the suite made, or the rest proves nothing
        row = await store.session(Scope(m.session_id, m.user_id))
        assert row is not None, m
        assert (row.updated_at, row.status, row.agent) == (m.updated_at, m.status, m.agent)
    return sorted(made, key=_Made.key)


def _ids(rows: list[SessionRecord]) -> list[tuple[str | None, str]]:
    return [(r.user_id, r.session_id) for r in rows]


def _expected(made: list[_Made], select: Callable[[_Made], bool]) -> list[tuple[str | None, str]]:
    return [(m.user_id, m.session_id) for m in made if select(m)]


async def _paged(store: DatabaseStore, limit: int, **filters: Any) -> list[SessionRecord]:
    """Every session ``list_sessions`` lists with ``filters``, page by page, each page
    after the token of the one before it."""
    listed: list[SessionRecord] = []
    after: SessionCursor | None = None
    for _ in range(100):
        page = await store.list_sessions(limit=limit, after=after, **filters)
        assert len(page) <= limit
        listed += page
        if len(page) < limit:
            return listed
        token = SessionCursor.of(page[-1]).encode()
        after = SessionCursor.decode(token)
    raise AssertionError(f"list_sessions({filters}) pages on past 100 pages")


def _summed(made: list[_Made], select: Callable[[_Made], bool]) -> Usage:
    total = Usage()
    for m in made:
        if select(m):
            total = total + m.usage
    return total


def _assert_totals(totals: SessionTotals, count: int, usage: Usage) -> None:
    assert totals.sessions == count
    got, want = totals.usage, usage
    assert (
        got.input_tokens,
        got.cached_input_tokens,
        got.cache_write_tokens,
        got.output_tokens,
    ) == (want.input_tokens, want.cached_input_tokens, want.cache_write_tokens, want.output_tokens)
    assert got.cost_usd == pytest.approx(want.cost_usd, abs=1e-9)


#: filters of list_sessions and session_totals, and which made sessions each selects
_SINCE = _BASE - timedelta(seconds=120, microseconds=2)  # the third group's moment
_FILTERS: list[tuple[dict[str, Any], Callable[[_Made], bool]]] = [
    ({"user_id": ANY_USER}, lambda m: True),
    ({"user_id": None}, lambda m: m.user_id is None),
    ({"user_id": "ada"}, lambda m: m.user_id == "ada"),
    ({"user_id": ANY_USER, "status": "failed"}, lambda m: m.status == "failed"),
    (
        {"user_id": ANY_USER, "status": ("running", "finished")},
        lambda m: m.status in ("running", "finished"),
    ),
    (
        {"user_id": "bob", "status": ["running"]},
        lambda m: m.user_id == "bob" and m.status == "running",
    ),
    ({"user_id": ANY_USER, "since": _SINCE}, lambda m: m.updated_at >= _SINCE),
    (
        {"user_id": "ada", "since": _SINCE, "status": "running"},
        lambda m: m.user_id == "ada" and m.updated_at >= _SINCE and m.status == "running",
    ),
    ({"user_id": ANY_USER, "agent": "alpha"}, lambda m: m.agent == "alpha"),
    (
        {"user_id": None, "agent": "beta", "status": "running"},
        lambda m: m.user_id is None and m.agent == "beta" and m.status == "running",
    ),
    ({"user_id": ANY_USER, "status": ()}, lambda m: False),
]


class ListingConformance(Suite):
    """Subclass in a test module and define the fixture ``open_store``: a callable that
    returns a new :class:`~loomflow.runtime.DatabaseStore` on the test's storage."""

    factory = "open_store"
    open_store = required_fixture("open_store", "DatabaseStore")
    store = opened_fixture("store", one=True)

    @pytest.fixture
    def listing(self, store: EventStore) -> DatabaseStore:
        if not isinstance(store, DatabaseStore):
            raise TypeError(f"the listing suite lists a DatabaseStore, not {type(store).__name__}")
        return store

    async def test_pages_after_each_cursor_list_every_session_once_in_order(
        self, listing: DatabaseStore
    ) -> None:
        made = await _make(listing)
        everyone = _expected(made, lambda m: True)
        assert _ids(await listing.list_sessions(user_id=ANY_USER, limit=1000)) == everyone
        for limit in (1, 3, 5, 7, len(everyone), 1000):
            assert _ids(await _paged(listing, limit, user_id=ANY_USER)) == everyone, limit
        # the cursor of the last session lists nothing after it
        last = (await listing.list_sessions(user_id=ANY_USER, limit=1000))[-1]
        assert await listing.list_sessions(user_id=ANY_USER, after=SessionCursor.of(last)) == []
        # a cursor is a place in the order, not a row: one of no session still pages on
        ties = [m for m in made if m.updated_at == made[0].updated_at]
        between = SessionCursor(ties[1].updated_at, ties[1].user_id, ties[1].session_id + "0")
        rows = await listing.list_sessions(user_id=ANY_USER, after=between, limit=1000)
        assert _ids(rows) == everyone[2:]

    async def test_filters_page_with_a_cursor_as_they_list(self, listing: DatabaseStore) -> None:
        made = await _make(listing)
        for filters, select in _FILTERS:
            expected = _expected(made, select)
            listed = await listing.list_sessions(limit=1000, **filters)
            assert _ids(listed) == expected, filters
            assert _ids(await _paged(listing, 2, **filters)) == expected, filters
        forks = await _paged(listing, 1, user_id="ada", parent_session_id="s01")
        assert _ids(forks) == [("ada", "fork1")]
        assert await listing.list_sessions(user_id="bob", parent_session_id="s01") == []

    async def test_totals_are_the_count_and_usage_of_the_sessions_listed(
        self, listing: DatabaseStore
    ) -> None:
        made = await _make(listing)
        for filters, select in _FILTERS:
            totals = await listing.session_totals(**filters)
            count = len(_expected(made, select))
            _assert_totals(totals, count, _summed(made, select))
            listed = await listing.list_sessions(limit=1000, **filters)
            assert len(listed) == count, filters
            _assert_totals(totals, count, sum((r.usage for r in listed), Usage()))
        nobody = await listing.session_totals(user_id="carol")
        assert nobody == SessionTotals(0, Usage())
        with pytest.raises(TypeError):  # no default: the caller says whose sessions
            await listing.session_totals()  # type: ignore[call-arg]

    async def test_a_cursor_token_reads_back_and_one_that_is_not_is_a_value_error(
        self, listing: DatabaseStore
    ) -> None:
        made = await _make(listing)
        rows = await listing.list_sessions(user_id=ANY_USER, limit=1000)
        for row in rows:
            token = SessionCursor.of(row).encode()
            assert token.isascii() and all(c.isalnum() or c in "-_" for c in token), token
            assert SessionCursor.decode(token) == SessionCursor.of(row)
        assert len(rows) == len(made)
        good = SessionCursor.of(rows[0]).encode()
        wrong_shape = base64.urlsafe_b64encode(orjson.dumps({"at": "now"})).decode()
        naive = [1, "2026-03-04T05:06:07", None, "s1"]
        bad_id = [1, "2026-03-04T05:06:07+00:00", None, "no spaces"]
        bad = [
            "",
            "not a token",
            "!!!!",
            good[:-3],
            good + "A",
            "x" * 5000,
            wrong_shape,
            *(base64.urlsafe_b64encode(orjson.dumps(parts)).decode() for parts in (naive, bad_id)),
        ]
        for token in bad:
            with pytest.raises(ValueError, match="not a session cursor token"):
                SessionCursor.decode(token)
        with pytest.raises(TypeError, match=r"SessionCursor\.decode"):
            await listing.list_sessions(user_id=ANY_USER, after=good)  # type: ignore[arg-type]
