"""What ``loomflow report`` reads of the read model (``report.read_model``), on both SQL
dialects: the embedded journal's and the scaled path's PostgreSQL serve the same reads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from loomflow.analytics.report import read_model
from loomflow.analytics.tally import Stats, Tally
from loomflow.runtime import ANY_USER, DatabaseStore, Runtime, Scope
from loomflow.schemas import RunFailed
from loomflow.schemas.clock import utcnow
from loomflow.schemas.events import RunFailedPayload
from tests.support.analytics import record_runs
from tests.support.backends import SQL_BACKENDS, backend_runtime


@pytest.fixture(params=SQL_BACKENDS)
async def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Runtime]:
    async with backend_runtime(request.param, tmp_path) as opened:
        yield opened


async def _stats(store: DatabaseStore) -> Stats:
    """The analytics of every session in the store, counted as the tables count them."""
    tally = Tally()
    for row in await store.list_sessions(user_id=ANY_USER, limit=1000):
        for event in await store.read_events(Scope(row.session_id, row.user_id)):
            tally.add(event)
    return Stats.of_tallies([tally], "test")


async def test_the_failed_and_stuck_sessions_come_with_their_errors_and_transcripts(
    runtime: Runtime,
) -> None:
    await record_runs(runtime)
    store = runtime.store
    assert isinstance(store, DatabaseStore)
    (failed,) = await store.list_sessions(user_id=ANY_USER, status="failed")
    # a worker gives up on one of ada's sessions: it waits for a person
    ada = (await store.list_sessions(user_id="ada", limit=1))[0]
    parked = RunFailedPayload(error_type="ModelTimeout", error="3 attempts", parked=True)
    await store.append_admin(Scope(ada.session_id, "ada"), RunFailed, parked)
    stats = await _stats(store)

    model = await read_model(runtime, stats, source="here")
    assert model.source == "here" and not model.more
    assert [(r.user_id, r.session_id, r.status, r.last_error) for r in model.troubled] == [
        ("ada", ada.session_id, "stuck", "ModelTimeout: 3 attempts"),
        ("bob", failed.session_id, "failed", failed.last_error),
    ]
    assert failed.last_error is not None and failed.last_error.startswith("ModelError: ")
    # the transcript of each of them and of each slowest session, as a resume sees it
    named = [(r.user_id, r.session_id) for r in model.troubled]
    named += [(s.user, s.session_id) for s in stats.slowest(10)]
    assert list(model.sessions) == list(dict.fromkeys(named))
    for (user_id, session_id), view in model.sessions.items():
        restored = await runtime.restore(Scope(session_id, user_id))
        assert restored is not None and view.messages == restored.messages
        assert view.row.session_id == session_id and view.messages
    assert model.sessions[("bob", failed.session_id)].messages[-1].content == "go"

    # only what was active since the hour asked for; at most `limit`, newest first
    later = await read_model(runtime, stats, source="here", since=utcnow() + timedelta(hours=2))
    assert later.troubled == [] and set(later.sessions) == {
        (s.user, s.session_id) for s in stats.slowest(10)
    }
    one = await read_model(runtime, stats, source="here", limit=1)
    assert [r.status for r in one.troubled] == ["stuck"] and one.more
