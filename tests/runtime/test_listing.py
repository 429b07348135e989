"""Listing sessions (``DatabaseStore.list_sessions``), on both SQL dialects: per user unless
every user is asked for, the most recently active first, forks findable by their parent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from loomflow import Agent, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import ANY_USER, DatabaseStore, Runtime, Scope
from loomflow.schemas.sessions import SessionRecord
from tests.support.backends import SQL_BACKENDS, backend_runtime


@pytest.fixture(params=SQL_BACKENDS)
async def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Runtime]:
    async with backend_runtime(request.param, tmp_path) as opened:
        yield opened


def _agent(runtime: Runtime) -> Agent:
    return Agent(
        "x", model=ScriptedModel(lambda m: "ok"), runtime=runtime, tuning=Tuning(checkpoint=True)
    )


def _ids(rows: Sequence[SessionRecord]) -> list[tuple[str | None, str]]:
    return [(r.user_id, r.session_id) for r in rows]


async def test_sessions_are_listed_per_user_newest_activity_first(runtime: Runtime) -> None:
    store = runtime.store
    assert isinstance(store, DatabaseStore)
    agent = _agent(runtime)
    await agent.run("a", session_id="a1", user_id="ada")
    await agent.run("b", session_id="b1", user_id="bob")
    await agent.run("c", session_id="a2", user_id="ada")
    await agent.run("n", session_id="n1")
    await agent.run("gone", session_id="a3", user_id="ada")
    assert await store.erase("a3", user_id="ada")
    await agent.resume("again", session_id="a1", user_id="ada")  # a1 is now the newest

    assert _ids(await store.list_sessions(user_id="ada")) == [("ada", "a1"), ("ada", "a2")]
    assert _ids(await store.list_sessions(user_id=None)) == [(None, "n1")]
    assert _ids(await store.list_sessions(user_id="carol")) == []
    everyone = await store.list_sessions(user_id=ANY_USER)
    assert _ids(everyone) == [("ada", "a1"), (None, "n1"), ("ada", "a2"), ("bob", "b1")]
    assert [r.turns for r in everyone] == [2, 1, 1, 1]
    assert everyone[0].usage.total_tokens > everyone[2].usage.total_tokens > 0
    assert _ids(await store.list_sessions(user_id=ANY_USER, limit=2)) == _ids(everyone[:2])
    with pytest.raises(TypeError):  # no default: the caller says whose sessions
        await store.list_sessions()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="limit"):
        await store.list_sessions(user_id="ada", limit=0)


async def test_the_forks_of_a_session_are_found_by_their_parent_for_its_user_only(
    runtime: Runtime,
) -> None:
    store = runtime.store
    assert isinstance(store, DatabaseStore)
    agent = _agent(runtime)
    for user in ("ada", "bob"):
        await agent.run("a", session_id="s1", user_id=user)
        await agent.resume("more", session_id="s1", user_id=user)
    ada = await agent.list_checkpoints("s1", user_id="ada")
    bob = await agent.list_checkpoints("s1", user_id="bob")
    first = await runtime.fork(Scope("s1", "ada"), ada[-1].checkpoint_id, session_id="f1")
    await runtime.fork(Scope("s1", "bob"), bob[-1].checkpoint_id, session_id="f2")
    second = await agent.resume(
        "again", session_id="s1", user_id="ada", from_checkpoint=ada[-1].checkpoint_id
    )

    forks = await store.list_sessions(user_id="ada", parent_session_id="s1")
    assert _ids(forks) == [("ada", second.session_id), ("ada", first.session_id)]
    assert {r.parent_checkpoint_id for r in forks} == {ada[-1].checkpoint_id}
    assert await store.list_sessions(user_id="ada", parent_session_id="f1") == []
    assert _ids(await store.list_sessions(user_id="bob", parent_session_id="s1")) == [("bob", "f2")]
