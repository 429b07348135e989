"""One migration scheme for every SQLite file we own (the journal, its audit trail, its
stats database): numbered steps run once in order, the version in the file's meta table,
a newer file refused, several openers of a new file all getting it, and the files written
before the scheme (``formats/``, dumped from files loomflow made then) opening and going on.
PostgreSQL's runner of the same type is proven in tests/runtime/test_postgres.py."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from loomflow.analytics import embedded
from loomflow.cli import main
from loomflow.errors import StoreError
from loomflow.projections.audit import default_trail_path
from loomflow.projections.migrations import Migrations
from loomflow.projections.sqlite import JOURNAL, migrate, stored_version
from loomflow.projections.sqlite.audit import TRAIL
from loomflow.projections.sqlite.otel import OTEL
from loomflow.projections.sqlite.stats import STATS
from loomflow.runtime import ANY_USER, Scope, SqliteRuntime, SqliteStore
from loomflow.schemas import SessionCursor
from tests.support.file_opener import OPENERS
from tests.support.scenario import Research

FORMATS = Path(__file__).parent / "formats"


def _restore(fixture: str, path: Path) -> Path:
    """A file as loomflow wrote it before the scheme, from its dump."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript((FORMATS / fixture).read_text())
    return path


def _version(path: Path, migrations: Migrations) -> int | None:
    with closing(sqlite3.connect(path)) as conn:
        return stored_version(conn, migrations.meta)


async def _run(db: Path, session_id: str, user_id: str | None = None) -> None:
    runtime = SqliteRuntime(db)
    try:
        await (
            Research(passes=1)
            .agent(runtime)
            .run("research", session_id=session_id, user_id=user_id)
        )
    finally:
        await runtime.close()


def _audit(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What ``loomflow audit ARGS`` prints, which must succeed."""
    capsys.readouterr()
    assert main(["audit", *args]) == 0
    return " ".join(capsys.readouterr().out.split())


# -- the scheme ---------------------------------------------------------------------------


def test_the_steps_after_a_version_run_in_order_and_a_newer_version_is_refused() -> None:
    three = Migrations(meta="t_meta", steps=("one", "two", "three"))
    assert three.version == 3
    assert three.pending(0, "file f") == [(1, "one"), (2, "two"), (3, "three")]
    assert three.pending(2, "file f") == [(3, "three")]
    assert three.pending(3, "file f") == []
    with pytest.raises(StoreError) as refused:
        three.pending(4, "the audit trail f.db")
    assert str(refused.value) == (
        "the audit trail f.db is at schema version 4, newer than version 3 that this loomflow "
        "knows: upgrade loomflow to open it"
    )
    with pytest.raises(ValueError):
        Migrations(meta="t_meta", steps=())


def test_a_file_at_an_older_version_runs_only_the_steps_it_has_not(tmp_path: Path) -> None:
    steps = (
        "CREATE TABLE t_runs (id INTEGER); INSERT INTO t_runs VALUES (1)",
        # a ';' inside a literal is not the end of a statement
        "CREATE TABLE t_notes (body TEXT); INSERT INTO t_notes VALUES ('a; b')",
    )
    path = tmp_path / "t.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        migrate(conn, Migrations("t_meta", steps[:1]), "t.db")
        assert stored_version(conn, "t_meta") == 1
        migrate(conn, Migrations("t_meta", steps), "t.db")
        migrate(conn, Migrations("t_meta", steps), "t.db")  # at the version: nothing runs
        assert stored_version(conn, "t_meta") == 2
        assert conn.execute("SELECT count(*) FROM t_runs").fetchone() == (1,)
        assert conn.execute("SELECT body FROM t_notes").fetchall() == [("a; b",)]
        with pytest.raises(StoreError, match="upgrade loomflow"):
            migrate(conn, Migrations("t_meta", steps[:1]), "t.db")
        assert not conn.in_transaction


def test_a_failing_step_leaves_the_file_at_the_version_before(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    good = "CREATE TABLE t_a (x INTEGER)"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        migrate(conn, Migrations("t_meta", (good,)), "t.db")
        with pytest.raises(sqlite3.OperationalError):
            migrate(conn, Migrations("t_meta", (good, "CREATE TABLE t_b (y); NO SUCH SQL")), "t.db")
        assert stored_version(conn, "t_meta") == 1
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "t_b" not in tables


# -- each file: newer refused, new ones opened at once ------------------------------------


FILES = {"journal": JOURNAL, "trail": TRAIL, "stats": STATS, "otel": OTEL}


@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_file_at_a_newer_version_is_refused_saying_to_upgrade(tmp_path: Path, kind: str) -> None:
    migrations, opener = FILES[kind], OPENERS[kind]
    path = tmp_path / f"{kind}.db"
    opener(path)
    assert _version(path, migrations) == migrations.version
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(f"UPDATE {migrations.meta} SET value = '99' WHERE key = 'schema_version'")
    said = f"{re.escape(str(path))} is at schema version 99, .*: upgrade loomflow to open it"
    with pytest.raises(StoreError, match=said):
        opener(path)
    assert _version(path, migrations) == 99


def test_processes_opening_one_new_file_at_once_all_get_it(tmp_path: Path) -> None:
    # SQLite does not wait for a journal mode change, and two openers that both found no
    # version would both run step 1: before the one runner, a stats database opened by
    # several processes at once could fail with "database is locked"
    openers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.file_opener"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for kind, migrations in FILES.items():
            for trial in range(8):
                path = tmp_path / f"{kind}-{trial}.db"
                for proc in openers:  # each is waiting for its line: they open at once
                    assert proc.stdin is not None
                    proc.stdin.write(f"{kind} {path}\n")
                    proc.stdin.flush()
                said = [proc.stdout.readline().strip() for proc in openers if proc.stdout]
                assert said == ["ok"] * len(openers), (kind, said)
                assert _version(path, migrations) == migrations.version
    finally:
        for proc in openers:
            proc.communicate(timeout=60)  # stdin closed: it ends


@pytest.mark.parametrize("kind", sorted(FILES))
def test_threads_opening_one_new_file_at_once_all_get_it(tmp_path: Path, kind: str) -> None:
    migrations, opener = FILES[kind], OPENERS[kind]
    for trial in range(8):
        path = tmp_path / f"{kind}-{trial}.db"
        start = threading.Barrier(4)

        def open_at_once(_: int, path: Path = path, start: threading.Barrier = start) -> None:
            start.wait(timeout=30)
            opener(path)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(open_at_once, range(4)))
        assert _version(path, migrations) == migrations.version


# -- the files written before the scheme --------------------------------------------------


async def test_a_journal_written_before_the_scheme_opens_and_keeps_working(
    tmp_path: Path,
) -> None:
    db = _restore("journal-v3.sql", tmp_path / "journal.db")
    await _run(db, "s3")
    async with SqliteStore(db, create=False) as store:
        for scope in (Scope("s1"), Scope("s2", "alice"), Scope("s3")):
            row = await store.session(scope)
            assert row is not None and row.status == "finished", scope
    assert _version(db, JOURNAL) == JOURNAL.version == 7


def _indexes(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'loomflow_sessions'"
        )
        return {name for (name,) in rows if not name.startswith("sqlite_")}


async def test_a_journal_at_version_3_gets_the_listing_indexes_and_usage_columns(
    tmp_path: Path,
) -> None:
    db = _restore("journal-v3.sql", tmp_path / "journal.db")
    assert _version(db, JOURNAL) == 3
    assert {"loomflow_sessions_updated", "loomflow_sessions_user_updated"} <= _indexes(db)
    await _run(db, "s3", "alice")  # opened at the version of this code from here on
    assert _version(db, JOURNAL) == JOURNAL.version
    indexes = _indexes(db)
    assert {"loomflow_sessions_listing", "loomflow_sessions_user_listing"} <= indexes
    assert not {"loomflow_sessions_updated", "loomflow_sessions_user_updated"} & indexes
    async with SqliteStore(db) as store:
        everyone = await store.list_sessions(user_id=ANY_USER)
        assert [(r.user_id, r.session_id) for r in everyone] == [
            ("alice", "s3"),
            ("alice", "s2"),
            (None, "s1"),
        ]
        # the rows the old version wrote page on as the new ones do
        for k in range(len(everyone)):
            after = SessionCursor.of(everyone[k])
            assert await store.list_sessions(user_id=ANY_USER, after=after) == everyone[k + 1 :]
        alice = await store.list_sessions(user_id="alice", after=SessionCursor.of(everyone[0]))
        assert alice == everyone[1:2]
        totals = await store.session_totals(user_id=ANY_USER)
        # the usage columns of the rows written before them were filled from their JSON
        summed = everyone[0].usage + everyone[1].usage + everyone[2].usage
        assert totals.sessions == 3 and totals.usage == summed and summed.input_tokens > 0
        old = await store.session_totals(user_id=None)
        assert old.usage == everyone[2].usage and old.usage.cost_usd > 0


def test_a_trail_written_before_it_had_versions_verifies_then_migrates_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _restore("journal-v3.sql", tmp_path / "journal.db")
    trail = _restore("trail-unversioned.sql", default_trail_path(db))
    before = trail.read_bytes()
    said = _audit(capsys, "verify", "--db", str(db))
    assert "verified 2 sessions, 18 entries: the trail matches the log" in said, said
    # verification changes nothing, not even the version
    assert trail.read_bytes() == before and _version(trail, TRAIL) is None
    asyncio.run(_run(db, "s3"))
    said = _audit(capsys, "--db", str(db))
    assert "audited 9 new records" in said, said  # the new run's: the old ones are there
    assert _version(trail, TRAIL) == TRAIL.version
    said = _audit(capsys, "verify", "--db", str(db))
    assert "verified 3 sessions, 27 entries: the trail matches the log" in said, said


async def test_a_stats_database_at_version_1_opens_and_counts_on(tmp_path: Path) -> None:
    db = _restore("journal-v3.sql", tmp_path / "journal.db")
    stats = _restore("stats-v1.sql", embedded.stats_path(db))
    old = embedded.load(stats)
    assert old.totals().runs_finished == 2 and len(old.sessions) == 2
    await _run(db, "s3", "alice")
    progress = await embedded.update(db)
    assert (progress.records, progress.counted, progress.skipped) == (9, 9, 0)
    new = embedded.load(stats)
    assert new.totals().runs_finished == 3
    assert new.totals().input_tokens == old.totals().input_tokens * 3 // 2
    assert dict(new.by("user"))["alice"].runs_finished == 2
    assert _version(stats, STATS) == 1
