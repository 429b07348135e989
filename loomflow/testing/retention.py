"""Retention, prune and erase in the runtime conformance suite: the newest checkpoints
kept per session and user (20 by default), prune by session or time, and an erasure
whose tombstone a late write cannot undo."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loomflow import Message, new_id
from loomflow.errors import SessionErasedError
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import CheckpointWritten, TurnAppended
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.testing._support import Opened
from loomflow.testing.scenario import Research

__all__ = ["Retention"]


class Retention:
    """Tests of retention, prune and erase; mixed into RuntimeConformance."""

    async def test_default_retention_keeps_the_newest_20(self, runtime: Runtime) -> None:
        assert runtime.max_checkpoints_per_session == 20
        research = Research(passes=22)
        agent = research.agent(runtime)
        result = await agent.run("Research.", session_id="s1")
        assert result.turns == 66
        metas = await agent.list_checkpoints("s1", limit=50)
        assert [m.turn for m in metas] == list(range(66, 6, -3))  # passes 3 to 22
        events = await runtime.store.read_events(Scope("s1"))
        assert sum(isinstance(e, CheckpointWritten) for e in events) == 22  # the log keeps all

    async def test_retention_keeps_the_newest_n_per_session_and_user(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=5)
        agent = await research.ran(new_runtime(max_checkpoints_per_session=2), user_id="alice")
        bob = Research(passes=3).agent(new_runtime(max_checkpoints_per_session=2))
        await bob.run("Research.", session_id="s1", user_id="bob")
        alice = await agent.list_checkpoints("s1", user_id="alice")
        assert [m.turn for m in alice] == [15, 12]
        assert [m.turn for m in await agent.list_checkpoints("s1", user_id="bob")] == [9, 6]
        # the session itself is intact: resuming still restores everything
        state = await new_runtime().restore(Scope("s1", "alice"))
        assert state is not None and state.turns == 15

    @pytest.mark.parametrize("keep", [0, -1])
    async def test_retention_below_one_is_unbounded(
        self, new_runtime: Opened[Runtime], keep: int
    ) -> None:
        research = Research(passes=4)
        agent = await research.ran(new_runtime(max_checkpoints_per_session=keep))
        assert len(await agent.list_checkpoints("s1")) == 4

    async def test_prune_by_session_deletes_its_journal_and_checkpoints(
        self, runtime: Runtime
    ) -> None:
        await Research(passes=2).agent(runtime).run("Research.", session_id="done")
        await Research(passes=2).agent(runtime).run("Research.", session_id="live")
        with pytest.raises(ValueError):
            await runtime.store.prune()
        result = await runtime.store.prune(session_id="done")
        assert result.sessions == 1 and result.checkpoints == 2 and result.events > 0
        assert await runtime.list_checkpoints(Scope("done")) == []
        assert await runtime.restore(Scope("done")) is None
        assert len(await runtime.list_checkpoints(Scope("live"))) == 2

    async def test_prune_before_a_time(self, runtime: Runtime) -> None:
        await Research(passes=2).agent(runtime).run("Research.", session_id="old")
        cutoff = datetime.now(UTC) + timedelta(microseconds=1)
        assert (await runtime.store.prune(before=cutoff - timedelta(days=1))).sessions == 0
        assert len(await runtime.list_checkpoints(Scope("old"))) == 2
        result = await runtime.store.prune(before=cutoff)
        assert result.sessions == 1
        assert await runtime.list_checkpoints(Scope("old")) == []
        with pytest.raises(ValueError):
            await runtime.store.prune(before=datetime(2026, 1, 1))  # naive: ambiguous

    async def test_erase_leaves_a_tombstone_that_late_writes_cannot_undo(
        self, runtime: Runtime
    ) -> None:
        scope = Scope("s1", "alice")
        writer = await runtime.open_session(scope, run_id=new_id("run"))
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("secret")]))
        assert await runtime.store.erase("s1", user_id="alice") is True
        assert await runtime.restore(scope) is None
        assert await runtime.store.read_events(scope) != []  # only the tombstone remains
        assert all(e.type == "session.erased" for e in await runtime.store.read_events(scope))
        with pytest.raises(SessionErasedError):
            await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
        assert await runtime.store.erase("s1", user_id="alice") is False
