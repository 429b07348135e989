"""bench/bigjournal.py at a tiny size: the journal it builds is one the runtime reads as
its own (statuses, forks, transcripts, checkpoints, the log), built by two processes
sharing the file, then found in its cache; its timings run end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import pytest

from bench import bigjournal
from loomflow.runtime import ANY_USER, DatabaseStore, Scope, SqliteRuntime
from loomflow.schemas import Role, Usage

pytestmark = pytest.mark.slow

SESSIONS, CHECKPOINTS = 80, 80 * 24 + 7  # 24 passes each, the first 7 sessions one more


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cache = tmp_path_factory.mktemp("cache")
    path = tmp_path_factory.mktemp("journal") / "journal.db"
    made = bigjournal.build(
        path, sessions=SESSIONS, checkpoints=CHECKPOINTS, cache=cache, workers=2
    )
    assert made == path
    return path, cache


async def test_the_journal_is_what_the_runtime_wrote(built: tuple[Path, Path]) -> None:
    path, _ = built
    assert bigjournal.counts(path)["checkpoints"] == CHECKPOINTS
    async with SqliteRuntime(path) as runtime:
        store = runtime.store
        assert isinstance(store, DatabaseStore)
        rows = await store.list_sessions(user_id=ANY_USER, limit=1000)
        assert len(rows) == SESSIONS
        by_id = {r.session_id: r for r in rows}
        for index in range(SESSIONS):
            row = by_id[bigjournal.session_id(index)]
            assert row.user_id == bigjournal.user_of(index)
            assert row.status == bigjournal.ending(index), index
            assert row.agent == bigjournal.AGENTS[index % len(bigjournal.AGENTS)]
        assert {r.status for r in rows} == {"finished", "failed", "waiting", "running"}
        assert {r.user_id for r in rows} == set(bigjournal.USERS)
        assert {r.agent for r in rows} == set(bigjournal.AGENTS)
        totals = await store.session_totals(user_id=ANY_USER)
        summed = Usage()
        for r in rows:
            summed = summed + r.usage
        assert totals.sessions == SESSIONS and totals.usage.input_tokens == summed.input_tokens

        # a session: its transcript, checkpoints and log as the runtime reads them
        first = by_id[bigjournal.session_id(0)]
        scope = Scope(first.session_id, first.user_id)
        state = await runtime.restore(scope)
        assert state is not None and len(state.messages) == first.message_count
        assert state.messages[0].role is Role.SYSTEM and state.turns == 25
        assert len(await store.list_checkpoints(scope, 1000)) == 25
        assert len(await store.read_events(scope)) == first.last_seq

        # a fork starts from its parent's transcript at the parent's 10th checkpoint
        forks = [r for r in rows if r.parent_session_id is not None]
        assert {r.session_id for r in forks} == {bigjournal.session_id(i) for i in (39, 79)}
        fork = forks[-1]
        parent = Scope(fork.parent_session_id or "", fork.user_id)
        checkpoint = await store.checkpoint(parent, fork.parent_checkpoint_id)
        assert checkpoint is not None and checkpoint.turn == bigjournal.FORK_AT
        at_fork = await runtime.restore(parent, checkpoint.checkpoint_id)
        forked = await runtime.restore(Scope(fork.session_id, fork.user_id))
        assert at_fork is not None and forked is not None
        assert forked.messages[: len(at_fork.messages)] == at_fork.messages
        assert len(forked.messages) == fork.message_count > len(at_fork.messages)
        own = await store.list_checkpoints(Scope(fork.session_id, fork.user_id), 1000)
        assert len(own) == 24


def test_a_second_build_is_copied_from_the_cache(
    built: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cache = built

    def no_build(*args: Any) -> NoReturn:
        raise AssertionError("built again: the cache was not used")

    monkeypatch.setattr(bigjournal, "_build", no_build)
    again = bigjournal.build(
        tmp_path / "again.db", sessions=SESSIONS, checkpoints=CHECKPOINTS, cache=cache
    )
    assert again.read_bytes() == path.read_bytes()
    assert bigjournal.built_seconds(cache, SESSIONS, CHECKPOINTS) is not None
    with pytest.raises(AssertionError, match="built again"):  # other parameters: a build
        bigjournal.build(tmp_path / "other.db", sessions=4, checkpoints=40, cache=cache)


def test_the_timings_run_end_to_end(
    built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, cache = built
    argv = ["--sessions", str(SESSIONS), "--checkpoints", str(CHECKPOINTS), "--samples", "3"]
    results = bigjournal.main([*argv, "--cache", str(cache)])
    assert len(results) == 9 and all(len(times) == 3 for times in results.values())
    out = capsys.readouterr().out
    assert f"{SESSIONS:,} sessions, {CHECKPOINTS:,} checkpoints" in out and "(cached;" in out
    assert "list_sessions, page after a cursor half-way" in out
