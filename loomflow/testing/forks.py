"""Forks in the runtime conformance suite: resuming from an older checkpoint starts a
new session with its lineage and leaves the original untouched, a fork stays with its
user, ``runtime.fork`` makes one without a run, and the latest checkpoint continues in
place."""

from __future__ import annotations

import pytest

from loomflow import CheckpointNotFoundError, InvalidIdError, new_id
from loomflow.runtime import Runtime, Scope
from loomflow.testing._support import Opened, follower
from loomflow.testing.scenario import Research

__all__ = ["Forks"]


class Forks:
    """Tests of forks and their lineage; mixed into RuntimeConformance."""

    async def test_older_checkpoint_forks_and_leaves_the_original_untouched(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=3)
        agent = await research.ran(new_runtime())
        runtime = new_runtime()
        metas = await agent.list_checkpoints("s1")
        original_events = await runtime.store.read_events(Scope("s1"))
        older = metas[-1]  # the first pass

        calls_before = research.model_calls
        fork = await research.agent(runtime).resume(
            "Try another angle.", session_id="s1", from_checkpoint=older.checkpoint_id
        )
        assert fork.session_id != "s1" and fork.session_id.startswith("sess")
        assert fork.parent_session_id == "s1" and fork.parent_checkpoint_id == older.checkpoint_id
        assert fork.restored_turns == older.turn == 3
        assert research.model_calls - calls_before == 6  # passes two and three, in the fork
        assert await agent.list_checkpoints("s1") == metas
        assert await runtime.store.read_events(Scope("s1")) == original_events
        fork_row = await runtime.store.session(Scope(fork.session_id))
        assert fork_row is not None
        assert (fork_row.parent_session_id, fork_row.parent_checkpoint_id) == (
            "s1",
            older.checkpoint_id,
        )
        fork_metas = await agent.list_checkpoints(fork.session_id)
        fork_first = await runtime.get_checkpoint(
            Scope(fork.session_id), fork_metas[-1].checkpoint_id
        )
        older_full = await runtime.get_checkpoint(Scope("s1"), older.checkpoint_id)
        assert fork_first is not None and older_full is not None
        assert fork_first.messages[: len(older_full.messages)] == older_full.messages

    async def test_a_fork_stays_with_its_user(self, new_runtime: Opened[Runtime]) -> None:
        research = Research(passes=3)
        agent = await research.ran(new_runtime(), user_id="alice")
        metas = await agent.list_checkpoints("s1", user_id="alice")
        older = metas[-1]
        with pytest.raises(CheckpointNotFoundError):  # not without alice's user id
            await agent.resume(session_id="s1", from_checkpoint=older.checkpoint_id)
        fork = await research.agent(new_runtime()).resume(
            "Try another angle.",
            session_id="s1",
            user_id="alice",
            from_checkpoint=older.checkpoint_id,
        )
        assert fork.session_id != "s1" and fork.parent_checkpoint_id == older.checkpoint_id
        assert fork.restored_turns == 3 and fork.turns == 9
        runtime = new_runtime()
        row = await runtime.store.session(Scope(fork.session_id, "alice"))
        assert row is not None and row.user_id == "alice"
        assert (row.parent_session_id, row.parent_checkpoint_id) == ("s1", older.checkpoint_id)
        forked = await agent.list_checkpoints(fork.session_id, user_id="alice")
        assert [m.turn for m in forked] == [9, 6]  # the fork's own passes two and three
        for stranger in (None, "bob"):
            assert await agent.list_checkpoints(fork.session_id, user_id=stranger) == []
            assert await runtime.restore(Scope(fork.session_id, stranger)) is None
        assert await agent.list_checkpoints("s1", user_id="alice") == metas
        # the fork continues in place for alice, from its own latest checkpoint
        follow = await follower(new_runtime()).resume(
            "And?", session_id=fork.session_id, user_id="alice"
        )
        assert follow.session_id == fork.session_id and follow.restored_turns == 9

    async def test_a_fork_onto_an_erased_session_s_id_says_it_was_erased(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        """An erased session's id is not used again; a fork given it says so, rather
        than that the session "already exists" (a new user's trial was told that)."""
        research = Research(passes=1)
        agent = await research.ran(new_runtime(), user_id="alice")
        (meta,) = await agent.list_checkpoints("s1", user_id="alice")
        runtime = new_runtime()
        await runtime.fork(Scope("s1", "alice"), meta.checkpoint_id, session_id="gone")
        assert await runtime.store.erase("gone", user_id="alice") is True
        with pytest.raises(InvalidIdError, match=r"fork target session gone .* was erased"):
            await runtime.fork(Scope("s1", "alice"), meta.checkpoint_id, session_id="gone")

    async def test_a_fork_made_without_a_run_resumes_from_its_checkpoint(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=3)
        agent = await research.ran(new_runtime(), user_id="alice")
        metas = await agent.list_checkpoints("s1", user_id="alice")
        older = metas[-1]  # the first pass
        runtime = new_runtime()
        calls = research.model_calls
        child = await runtime.fork(Scope("s1", "alice"), older.checkpoint_id, session_id="alt")
        assert child == Scope("alt", "alice") and research.model_calls == calls
        assert [e.type for e in await runtime.store.read_events(child)] == ["session.forked"]
        row = await runtime.store.session(child)
        assert row is not None and row.last_run_id is None and row.turns == older.turn
        assert (row.parent_session_id, row.parent_checkpoint_id) == ("s1", older.checkpoint_id)
        assert (await runtime.fork(Scope("s1", "alice"), older.checkpoint_id)).session_id != "alt"
        with pytest.raises(InvalidIdError, match="already exists"):
            await runtime.fork(Scope("s1", "alice"), metas[0].checkpoint_id, session_id="alt")
        with pytest.raises(CheckpointNotFoundError):  # alice's checkpoint, not bob's
            await runtime.fork(Scope("s1", "bob"), older.checkpoint_id)

        # resumed like any session: no checkpoint of its own yet, so its log is replayed
        fork = await research.agent(new_runtime()).resume(
            "Try another angle.", session_id="alt", user_id="alice"
        )
        assert fork.session_id == "alt" and fork.parent_session_id == "s1"
        assert fork.restored_turns == older.turn == 3 and fork.turns == 9
        assert research.model_calls - calls == 6  # passes two and three, in the fork
        first = await runtime.get_checkpoint(
            child, (await agent.list_checkpoints("alt", user_id="alice"))[-1].checkpoint_id
        )
        older_full = await runtime.get_checkpoint(Scope("s1", "alice"), older.checkpoint_id)
        assert first is not None and older_full is not None
        assert first.messages[: len(older_full.messages)] == older_full.messages
        assert await agent.list_checkpoints("s1", user_id="alice") == metas

    async def test_latest_checkpoint_id_continues_in_place(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        research = Research(passes=1)
        agent = await research.ran(new_runtime())
        latest = (await agent.list_checkpoints("s1"))[0]
        follow = follower(new_runtime())
        result = await follow.resume("more", session_id="s1", from_checkpoint=latest.checkpoint_id)
        assert result.session_id == "s1" and result.parent_session_id is None

    async def test_unknown_checkpoint_is_a_clear_error(self, runtime: Runtime) -> None:
        research = Research(passes=1)
        agent = await research.ran(runtime)
        missing = new_id("ckpt")
        with pytest.raises(CheckpointNotFoundError, match=missing):
            await agent.resume(session_id="s1", from_checkpoint=missing)
        # another user's id is just as unknown
        other = (await agent.list_checkpoints("s1"))[0].checkpoint_id
        with pytest.raises(CheckpointNotFoundError):
            await agent.resume(session_id="s1", from_checkpoint=other, user_id="mallory")
        with pytest.raises(InvalidIdError):
            await agent.resume(session_id="s1", from_checkpoint="../../etc/passwd")
