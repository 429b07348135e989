"""GroupCommit: a lone writer commits in its own step; sessions taking turns share rounds."""

from __future__ import annotations

import asyncio

import pytest

from loomflow import Message
from loomflow.errors import StoreError
from loomflow.runtime.cache import TranscriptCache
from loomflow.runtime.group_commit import GroupCommit, Outcomes
from loomflow.schemas import Event, Scope, TurnAppended
from loomflow.schemas.events import TurnAppendedPayload


def _event(session: str, seq: int) -> Event:
    return TurnAppended(
        session_id=session,
        run_id="run-1",
        seq=seq,
        epoch=1,
        payload=TurnAppendedPayload(messages=[Message.user("hi")]),
    )


class _Store:
    """Records each round the group commit hands over, and how."""

    def __init__(self, *, busy: bool = False, broken: bool = False) -> None:
        self.rounds: list[tuple[str, list[str]]] = []
        self.busy, self.broken = busy, broken

    async def commit(self, batches: list[list[Event]]) -> Outcomes:
        await asyncio.sleep(0)  # a store's commit yields (a thread, a server)
        self.rounds.append(("round", [b[0].session_id for b in batches]))
        return [None] * len(batches)

    def now(self, batches: list[list[Event]]) -> Outcomes | None:
        if self.broken:
            raise StoreError("disk I/O error")
        if self.busy:
            return None
        self.rounds.append(("now", [b[0].session_id for b in batches]))
        return [None] * len(batches)


async def test_a_lone_writer_commits_in_its_own_step() -> None:
    store = _Store()
    group = GroupCommit(store.commit, TranscriptCache(), store.now)
    for seq in range(1, 5):
        await group.append([_event("a", seq)])
    # the first append has no session before it; then each follows its own session
    assert store.rounds == [("round", ["a"]), ("now", ["a"]), ("now", ["a"]), ("now", ["a"])]


async def test_sessions_taking_turns_share_rounds() -> None:
    store = _Store()
    group = GroupCommit(store.commit, TranscriptCache(), store.now)

    async def writer(session: str) -> None:
        for seq in range(1, 4):
            await group.append([_event(session, seq)])

    await asyncio.gather(*(writer(s) for s in "abcd"))
    assert all(kind == "round" for kind, _ in store.rounds)
    assert max(len(sessions) for _, sessions in store.rounds) == 4
    assert sorted(s for _, sessions in store.rounds for s in sessions) == sorted("abcd" * 3)


async def test_a_busy_file_sends_the_append_to_a_round() -> None:
    store = _Store(busy=True)
    group = GroupCommit(store.commit, TranscriptCache(), store.now)
    for seq in range(1, 3):
        await group.append([_event("a", seq)])
    assert store.rounds == [("round", ["a"]), ("round", ["a"])]


async def test_a_failed_commit_in_its_own_step_raises_and_forgets_the_session() -> None:
    cache = TranscriptCache()
    store = _Store()
    group = GroupCommit(store.commit, cache, store.now)
    await group.append([_event("a", 1)])
    assert cache.lookup(Scope("a"), 0) is not None
    store.broken = True
    with pytest.raises(StoreError, match="disk I/O"):
        await group.append([_event("a", 2)])
    assert cache.lookup(Scope("a"), 0) is None  # its outcome is unknown: read it again
