"""What only a file-backed store has to prove: crashes, files, concurrency, bad rows."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from loomflow import Agent, Message, Tuning
from loomflow.errors import (
    CorruptRecordError,
    StaleWriterError,
    StoreError,
    StoreFileReplacedError,
)
from loomflow.models import ScriptedModel
from loomflow.projections import sqlite as sql
from loomflow.runtime import Scope, SqliteRuntime, SqliteStore
from loomflow.schemas import TurnAppended, new_id
from loomflow.schemas.events import TurnAppendedPayload
from tests.support.scenario import Research
from tests.support.waiting import kill_once_hanging

ROOT = Path(__file__).resolve().parents[2]


def _worker(db: Path, session: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.crash_worker", str(db), session, str(log), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_resume_after_sigkill_repeats_no_recorded_model_or_tool_call(tmp_path: Path) -> None:
    db, log = tmp_path / "journal.db", tmp_path / "calls.log"
    # the 8th model call is the note call of pass 3: pass 3's lookup has finished
    victim = _worker(db, "s1", log, "--hang-at", "8")
    await kill_once_hanging(victim)

    runtime = SqliteRuntime(db)
    state = await runtime.restore(Scope("s1"))
    assert state is not None and state.turns == 7

    research = Research(passes=3)
    agent = research.agent(runtime)
    result = await agent.resume(session_id="s1")
    await runtime.close()

    killed_run = Counter(log.read_text().splitlines())
    resumed_turns = [
        sum(1 for m in request if m.role.value == "assistant")
        for request in research.models[-1].inner.calls
    ]
    assert resumed_turns == [7, 8]  # only the call that was in flight, and the answer
    assert all(killed_run[f"model {turn}"] == 1 for turn in range(8))
    # every tool ran exactly once across both processes
    for name, count in research.tool_runs.items():
        assert killed_run[f"tool {name}"] + count == 1, name
    assert set(research.tool_runs) == {"note:faust noted"}
    assert result.turns == 9 and result.restored_turns == 7 and result.output.startswith("Pass 3")


async def test_several_processes_and_runtimes_share_one_file(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    workers = [_worker(db, f"proc-{n}", tmp_path / f"{n}.log", "--passes", "4") for n in range(3)]
    here = [Research(passes=4).agent(SqliteRuntime(db)) for _ in range(2)]
    results = await asyncio.gather(
        *(agent.run("Research.", session_id=f"local-{n}") for n, agent in enumerate(here))
    )
    for worker in workers:
        _, err = await asyncio.to_thread(worker.communicate, timeout=120)
        assert worker.returncode == 0, err
    assert all(r.turns == 12 for r in results)
    reader = SqliteRuntime(db)
    for session in ["proc-0", "proc-1", "proc-2", "local-0", "local-1"]:
        state = await reader.restore(Scope(session))
        assert state is not None and state.turns == 12, session
        assert len(await reader.list_checkpoints(Scope(session))) == 4
    await reader.close()
    for agent in here:
        await agent.runtime.close()


async def test_wal_mode_and_reads_off_the_event_loop(tmp_path: Path) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db")
    await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    store = runtime.store
    thread = await store._call(lambda conn: threading.get_ident())  # type: ignore[attr-defined]
    assert thread != threading.get_ident()
    await runtime.close()
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_runtime_not_yet_used_loads_neither_the_fold_nor_its_sql(tmp_path: Path) -> None:
    # ``import loomflow`` and ``SqliteRuntime(path)`` is what every embedded process pays
    # at its start (bench.scaled's import target, <= 150 ms): the event models, the fold,
    # the SQLite dialect's reads and writes and the in-process runtime load with the first
    # run, which works
    code = (
        "import asyncio, sys\n"
        "import loomflow\n"
        "from loomflow import SqliteRuntime\n"
        f"runtime = SqliteRuntime({str(tmp_path / 'journal.db')!r})\n"
        "print(' '.join(sorted(sys.modules)))\n"
        "from tests.support.scenario import Research\n"
        "result = asyncio.run(Research(passes=1).agent(runtime).run('Go.', session_id='s1'))\n"
        "print(result.turns)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    modules, turns = done.stdout.splitlines()
    deferred = {
        "loomflow.schemas.checkpoints",
        "loomflow.schemas.codec",
        "loomflow.schemas.events",
        "loomflow.schemas.messages",
        "loomflow.schemas.sessions",
        "loomflow.schemas.signing",
        "loomflow.projections.fold",
        "loomflow.projections.sqlite.reads",
        "loomflow.projections.sqlite.schema",
        "loomflow.projections.sqlite.writes",
        "loomflow.runtime.inproc",
        "loomflow.runtime.journal",
    }
    assert sorted(deferred & set(modules.split())) == []
    assert int(turns) >= 1


async def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 100)
    runtime = SqliteRuntime(path)
    with pytest.raises(StoreError, match=r"notes\.txt"):
        await runtime.list_checkpoints(Scope("s1"))
    await runtime.close()
    assert path.read_text().startswith("these are my notes")  # untouched


async def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    runtime = SqliteRuntime(tmp_path / "nope" / "journal.db")
    with pytest.raises(StoreError, match="does not exist"):
        await runtime.list_checkpoints(Scope("s1"))
    await runtime.close()


async def test_a_store_opened_only_to_inspect_never_creates_or_alters_a_file(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "journal.db"
    with pytest.raises(StoreError, match="does not exist"):
        async with SqliteStore(missing, create=False):
            pass
    assert not missing.exists()

    other = tmp_path / "app.db"  # another application's database
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    before = other.read_bytes()
    with pytest.raises(StoreError, match="not a loomflow store"):
        async with SqliteStore(other, create=False):
            pass
    assert other.read_bytes() == before  # no loomflow tables, still not in WAL mode

    runtime = SqliteRuntime(missing)
    await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    await runtime.close()
    async with SqliteStore(missing, create=False) as store:  # an existing store opens
        row = await store.session(Scope("s1"))
        assert row is not None and row.status == "finished"


async def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)
    await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    await runtime.close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE loomflow_meta SET value = '99' WHERE key = 'schema_version'")
    again = SqliteRuntime(db)
    with pytest.raises(StoreError, match="newer"):
        await again.list_checkpoints(Scope("s1"))
    await again.close()


async def test_a_corrupted_row_is_reported_and_nothing_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)
    await Research(passes=2).agent(runtime).run("Research.", session_id="broken")
    await Research(passes=2).agent(runtime).run("Research.", session_id="fine")
    await runtime.close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE loomflow_events SET payload = '{not json' WHERE session_id = 'broken' "
            "AND seq = 4"
        )
        conn.execute(
            "UPDATE loomflow_events SET payload = '{\"messages\": 7}' WHERE session_id = 'broken' "
            "AND seq = 5"
        )
        rows_before = set(conn.execute("SELECT session_id, seq, payload FROM loomflow_events"))
    runtime = SqliteRuntime(db)
    with pytest.raises(CorruptRecordError, match=r"session 'broken', seq 4"):
        await runtime.restore(Scope("broken"))
    with pytest.raises(CorruptRecordError):
        await Research(passes=2).agent(runtime).resume(session_id="broken")
    fine = await runtime.restore(Scope("fine"))
    assert fine is not None and fine.turns == 6
    assert len(await runtime.list_checkpoints(Scope("broken"))) == 2  # listing still works
    with caplog.at_level(logging.WARNING, logger="loomflow"):
        events = await runtime.store.read_events(Scope("broken"))
    assert 4 not in {e.seq for e in events} and 5 not in {e.seq for e in events}
    broken_rows = sum(1 for row in rows_before if row[0] == "broken")
    assert len(events) == broken_rows + 1 - 2  # the failed resume's run.started; not the bad two
    assert sum("skipping a log row" in r.getMessage() for r in caplog.records) == 2
    await runtime.close()
    with sqlite3.connect(db) as conn:
        rows_after = set(conn.execute("SELECT session_id, seq, payload FROM loomflow_events"))
    assert rows_before <= rows_after  # the failed resume only added its own run.started


async def test_a_closed_store_refuses_appends(tmp_path: Path) -> None:
    runtime = SqliteRuntime(tmp_path / "journal.db")
    writer = await runtime.open_session(Scope("s1"), run_id=new_id("run"))
    turn = writer.make(TurnAppended, TurnAppendedPayload(messages=[Message.user("x")]))
    await runtime.close()
    with pytest.raises(StoreError, match="closed"):
        await runtime.store.append([turn])


def _unlink_store(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)


def _tidying(runtime: SqliteRuntime, tidy: Callable[[], None]) -> Agent:
    """A checkpointing agent whose one tool call runs ``tidy`` (what a cleanup job or a
    person does to the store's file while the run writes)."""

    def clean_up() -> str:
        """Clean up the disk."""
        tidy()
        return "cleaned"

    model = ScriptedModel([ScriptedModel.tool_call("clean_up"), "Done."])
    return Agent(
        "You tidy.", model=model, runtime=runtime, tools=[clean_up], tuning=Tuning(checkpoint=True)
    )


async def test_a_store_file_removed_mid_run_fails_the_run_and_every_write_after(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    runtime = SqliteRuntime(db)
    agent = _tidying(runtime, lambda: _unlink_store(db))
    with pytest.raises(StoreFileReplacedError, match=f"{re.escape(str(db))} was removed"):
        await agent.run("Tidy up.", session_id="s1")
    with pytest.raises(StoreFileReplacedError, match="was removed"):
        await agent.run("Go on.", session_id="s2")  # the next claim
    await runtime.close()
    assert not db.exists()  # nothing made a new file there either


async def test_a_store_file_replaced_mid_run_fails_the_run_and_leaves_the_new_file_alone(
    tmp_path: Path,
) -> None:
    db, backup = tmp_path / "journal.db", tmp_path / "backup.db"
    runtime = SqliteRuntime(db)
    await Research(passes=1).agent(runtime).run("Research.", session_id="s0")
    with (
        contextlib.closing(sqlite3.connect(db)) as source,
        contextlib.closing(sqlite3.connect(backup)) as copy,
    ):
        source.backup(copy)  # the store as it is now, put back mid-run below

    def restore() -> None:
        _unlink_store(db)
        backup.rename(db)

    with pytest.raises(StoreFileReplacedError, match=f"{re.escape(str(db))} was replaced"):
        await _tidying(runtime, restore).run("Tidy up.", session_id="s1")
    with pytest.raises(StoreFileReplacedError, match="was replaced"):
        await runtime.store.erase("s0")  # the next write
    await runtime.close()
    reopened = SqliteRuntime(db)
    assert await reopened.store.session(Scope("s1")) is None  # not written into the backup
    row = await reopened.store.session(Scope("s0"))
    await reopened.close()
    assert row is not None and row.status == "finished"


async def test_processes_opening_one_new_file_at_once_all_get_it(tmp_path: Path) -> None:
    # SQLite does not wait for a journal mode change: before the store tried again, two
    # runtimes opening a new file together could fail with "database is locked"
    for trial in range(30):
        path = tmp_path / f"new-{trial}.db"
        stores = [SqliteStore(path) for _ in range(6)]
        await asyncio.gather(*(store.open() for store in stores))
        for store in stores:
            await store.close()


def _turn(scope: Scope, seq: int, epoch: int = 0, text: str = "hi") -> TurnAppended:
    return TurnAppended(
        user_id=scope.user_id,
        session_id=scope.session_id,
        run_id="run-1",
        seq=seq,
        epoch=epoch,
        payload=TurnAppendedPayload(messages=[Message.user(text)]),
    )


async def test_an_append_while_another_connection_writes_waits_for_it(tmp_path: Path) -> None:
    # commits run on the event loop's connection, which never waits for a lock: while
    # another process holds the file's write lock, the append waits on the store's
    # thread instead of failing with "database is locked" or blocking the event loop
    db = tmp_path / "journal.db"
    store = SqliteStore(db)
    scope = Scope("s1")
    await store.append([_turn(scope, 1)])
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    append = asyncio.create_task(store.append([_turn(scope, 2)]))
    done, _ = await asyncio.wait({append}, timeout=0.3)
    assert not done  # it waits for the lock (the loop runs meanwhile: this line ran)
    other.execute("COMMIT")
    await append
    other.close()
    assert [e.seq for e in await store.read_events(scope)] == [1, 2]
    await store.close()


async def test_an_append_waiting_for_the_lock_of_a_file_removed_meanwhile_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the round that waits on the store's thread checks the file once it holds the lock
    db = tmp_path / "journal.db"
    store = SqliteStore(db)
    scope = Scope("s1")
    await store.append([_turn(scope, 1)])
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    on_thread = asyncio.Event()
    call = store._call

    async def seen(fn: Callable[..., object], *args: object) -> object:
        if fn is sql.commit_round:
            on_thread.set()
        return await call(fn, *args)

    monkeypatch.setattr(store, "_call", seen)
    append = asyncio.create_task(store.append([_turn(scope, 2)]))
    await asyncio.wait_for(on_thread.wait(), 30)  # the file is busy: it waits there
    _unlink_store(db)
    other.execute("ROLLBACK")
    other.close()
    with pytest.raises(StoreFileReplacedError, match="was removed"):
        await append
    await store.close()


async def test_an_append_folds_from_what_another_connection_wrote(tmp_path: Path) -> None:
    # the store folds from the session rows of its own last commit only while no other
    # connection wrote: a take-over by another runtime on the same file fences this one
    db = tmp_path / "journal.db"
    first, second = SqliteRuntime(db), SqliteRuntime(db)
    scope = Scope("s1")
    writer = await first.open_session(scope, run_id="run-a")
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("one")]))
    taker = await second.open_session(scope, run_id="run-b")
    await taker.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("two")]))
    # the first store's own rows are stale now: its reads see the take-over too
    row = await first.store.session(scope)
    assert row is not None and row.last_run_id == "run-b" and row.epoch == 2
    with pytest.raises(StaleWriterError):
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))
    events = await first.store.read_events(scope)
    assert [e.run_id for e in events][-1] == "run-b"
    await first.close()
    await second.close()


async def test_the_wal_is_checkpointed_while_appends_go_on(tmp_path: Path) -> None:
    # the event loop's connection never checkpoints; the store's thread does, so the
    # WAL stays bounded in a long run instead of growing with every event
    db = tmp_path / "journal.db"
    store = SqliteStore(db)
    scope = Scope("s1")
    text = "x" * 3000  # a log row of 3 KB, besides the pages of indexes and rows
    sizes = []
    for phase in range(3):
        for seq in range(phase * 2000 + 1, (phase + 1) * 2000 + 1):
            await store.append([_turn(scope, seq, text=text)])
        sizes.append(await asyncio.to_thread(os.path.getsize, f"{db}-wal"))
    await store.close()
    # A WAL file never shrinks, so its size is the longest stretch between two
    # checkpoints: unchecked, it grows with every event (6,000 events: three times the
    # size at 2,000). Checked, it stays near the size at 2,000, however late the store's
    # thread gets to a checkpoint on a loaded machine (up to 1.6 times that, seen here).
    assert sizes[2] < 2 * sizes[0], sizes


def test_the_rows_a_store_keeps_from_its_commits_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a worker writing many sessions keeps the rows of the latest ones, not of every one
    from loomflow.projections import sqlite as sql
    from loomflow.projections.sqlite import writes
    from loomflow.schemas import utcnow
    from loomflow.schemas.sessions import SessionRecord

    monkeypatch.setattr(writes, "KNOWN_ROWS", 3)
    now = utcnow()

    def rows(*names: str) -> dict[Scope, SessionRecord]:
        return {Scope(n): SessionRecord(None, n, created_at=now, updated_at=now) for n in names}

    known = sql.KnownRows()
    known.remember(rows("a", "b", "c", "d"))
    assert [k.session_id for k in known.rows] == ["b", "c", "d"]
    known.remember(rows("b"))  # written again: the latest
    known.remember(rows("e"))
    assert [k.session_id for k in known.rows] == ["d", "b", "e"]


@pytest.mark.parametrize("user", ["ada", None, "every user"])
@pytest.mark.parametrize("paged", [False, True])
def test_a_page_of_sessions_reads_an_index_in_the_listing_order(
    tmp_path: Path, user: str | None, paged: bool
) -> None:
    # at 10k sessions a sort of every row costs milliseconds a page; a page read in index
    # order stops after its rows, however deep it is (EXPLAIN QUERY PLAN says which)
    from datetime import UTC, datetime

    from loomflow.schemas import SessionCursor

    conn = sql.connect(tmp_path / "journal.db", 1000)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    after = SessionCursor(datetime.now(UTC), "bob", "s1") if paged else None
    any_user = user == "every user"
    sql.list_sessions(conn, None if any_user else user, any_user, None, None, 50, None, None, after)
    conn.set_trace_callback(None)
    (statement,) = statements
    plan = " / ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}"))
    conn.close()
    index = "loomflow_sessions_listing" if any_user else "loomflow_sessions_user_listing"
    assert f"USING INDEX {index}" in plan and "TEMP B-TREE" not in plan, plan
    if paged:  # it starts at the cursor's moment, not at the newest session
        assert "updated_at<?" in plan, plan
