"""``loomflow audit``, ``audit verify`` and ``tail`` on an embedded log, as a user runs them."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loomflow.cli import main
from loomflow.log.describe import describe
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import RunCancelled, RunStarted
from loomflow.schemas.events import RunCancelledPayload, RunStartedPayload
from tests.support.scenario import Research
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


async def _run(db: Path, session_id: str, user_id: str | None = None) -> None:
    runtime = SqliteRuntime(db)
    try:
        await Research(passes=1).agent(runtime).run("go", session_id=session_id, user_id=user_id)
    finally:
        await runtime.close()


def _cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_audit_then_verify_passes_and_a_tampered_log_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "journal.db"
    asyncio.run(_run(db, "s1"))
    asyncio.run(_run(db, "s2", "alice"))
    code, out = _cli("audit", "--db", str(db), capsys=capsys)
    assert code == 0 and "in 2 sessions, 0 rejected" in out, out
    assert (tmp_path / "journal.audit.db").exists()
    code, out = _cli("audit", "verify", "--db", str(db), capsys=capsys)
    assert code == 0 and "verified 2 sessions" in out, out
    code, out = _cli("audit", "verify", "--db", str(db), "--user", "alice", capsys=capsys)
    assert code == 0 and "verified 1 session," in out and "s1" not in out, out

    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE loomflow_events SET payload = replace(payload, '\"go\"', '\"stop\"') "
            "WHERE session_id = 's1' AND seq = 2"
        )
    code, out = _cli("audit", "verify", "--db", str(db), capsys=capsys)
    assert code == 1, out
    assert "altered in session s1 (user -) at entry 2, log 2" in out, out
    assert "verification failed: 1 problem in 1 of 2 sessions" in out, out


def test_a_log_record_whose_user_was_changed_is_blamed_on_the_log_not_the_trail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One log row's user_id changed after the audit: its session's entry no longer has
    its record, though the log holds a record at that position. That is the log's
    record changed (or an entry added to the trail), not "inserted into the trail" (a
    new user's trial was told so, which sends an auditor to the wrong place)."""
    db = tmp_path / "journal.db"
    asyncio.run(_run(db, "s1", "alice"))
    assert _cli("audit", "--db", str(db), capsys=capsys)[0] == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE loomflow_events SET user_id = 'mallory' WHERE seq = 2")
    code = main(["audit", "verify", "--db", str(db), "--json"])
    out = capsys.readouterr().out
    assert code == 1, out
    found = {(s["user_id"], s["session_id"]): s["findings"] for s in orjson.loads(out)["sessions"]}
    (alice,) = found[("alice", "s1")]
    assert alice["kind"] == "altered" and alice["entry"] == 2, alice
    assert "is not the one it chained: its event, user or session id was changed" in str(alice)
    # and where the log now puts the record: audited as alice's, not deleted from a trail
    (mallory,) = found[("mallory", "s1")]
    assert mallory["kind"] == "altered", mallory
    assert (
        "was audited as session s1 (user alice)'s: its user or session id was changed"
        in (mallory["detail"])
    )
    assert "inserted into the trail" not in out and "deleted from the trail" not in out


def test_verify_before_any_audit_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "journal.db"
    asyncio.run(_run(db, "s1"))
    code, out = _cli("audit", "verify", "--db", str(db), capsys=capsys)
    assert code == 1 and f"run `loomflow audit --db {db}` first" in out, out
    code, out = _cli("audit", "--db", str(tmp_path / "missing.db"), capsys=capsys)
    assert code == 1 and "no loomflow log at" in out, out
    assert not (tmp_path / "missing.db").exists()


def _tail(db: Path, *options: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    return subprocess.Popen(
        [sys.executable, "-m", "loomflow.cli", "tail", "--db", str(db), *options],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _line(stream: object) -> str:
    line = await asyncio.wait_for(asyncio.to_thread(stream.readline), 30)  # type: ignore[attr-defined]
    assert line, "tail ended"
    return str(line)


async def test_tail_prints_events_appended_while_it_runs(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _run(db, "before")
    tail = _tail(db, "--session", "live")
    try:
        assert "following SQLite log" in await _line(tail.stderr)
        await _run(db, "before-too")  # filtered away
        await _run(db, "live")
        first = await _line(tail.stdout)
        lines = [first]
        while "run.finished" not in lines[-1]:
            lines.append(await _line(tail.stdout))
    finally:
        tail.send_signal(signal.SIGINT)
        tail.wait(timeout=30)
    assert tail.returncode == 0
    assert "  live  -  #1  run.started  run" in lines[0]
    assert all("  live  " in line for line in lines)
    assert any("lookup(topic=" in line for line in lines), lines
    assert "run.finished" in lines[-1] and "tokens" in lines[-1]


async def test_tail_json_from_the_beginning(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _run(db, "s1")
    tail = _tail(db, "--from-beginning", "--json", "--type", "run.*")
    try:
        started = orjson.loads(await _line(tail.stdout))
        finished = orjson.loads(await _line(tail.stdout))
    finally:
        tail.send_signal(signal.SIGTERM)
        tail.wait(timeout=30)
    assert (started["type"], finished["type"]) == ("run.started", "run.finished")
    assert started["session_id"] == "s1" and started["position"] == "1"


async def _loomflow(*argv: str) -> tuple[int, str, str]:
    """``loomflow ARGV`` as a process of its own: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loomflow.cli",
        *argv,
        env=dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1", COLUMNS="300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_an_audit_beside_one_that_writes_the_trail_is_refused_saying_so(
    tmp_path: Path,
) -> None:
    """Two audits writing one trail at once read the same records: the second said it
    audited "0 entries" (the first had chained them all), or failed on the trail's unique
    keys ("UNIQUE constraint failed: audit_entries.key"). One audit writes a trail at a
    time: the second is refused (exit 1) naming the trail, and verify reads beside it."""
    db = tmp_path / "journal.db"
    await _run(db, "s1")
    follower = _following_audit(db)
    try:
        assert "Ctrl-C stops" in await _line(follower.stdout)
        busy = "another `loomflow audit` is writing the audit trail"
        code, out, err = await _loomflow("audit", "--db", str(db))
        assert (code, out) == (1, ""), err
        assert err == (
            f"loomflow audit: {busy} {tmp_path / 'journal.audit.db'} now (one at a time), "
            "and audits what this one would: run this again once it has ended\n"
        )
        code, out, err = await _loomflow("audit", "digest", "--db", str(db), "--digests", "-")
        assert code == 1 and err.startswith(f"loomflow audit digest: {busy}"), err
        assert "stop an `audit --follow` first" in err and out == ""

        async def verified() -> bool:  # what the running audit chained, read beside it
            code, out, _ = await _loomflow("audit", "verify", "--db", str(db))
            return code == 0 and "verified 1 session" in out

        await eventually(verified, within=60, what="the running audit to chain the log")
    finally:
        follower.send_signal(signal.SIGINT)
        said, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0
    records = _position(db, "SELECT count(*) FROM loomflow_events")
    assert f"audited {records} new records" in said, said
    assert f"{records} entries in 1 session, 0 rejected" in said, said
    # it is let go with its process: the next audit writes the trail, and finds it done
    code, out, err = await _loomflow("audit", "--db", str(db))
    assert code == 0 and "audited 0 new records" in out, err
    assert _files(tmp_path, "journal.audit.db*") == ["journal.audit.db"]  # no lock left


def _following_audit(db: Path) -> subprocess.Popen[str]:
    """``loomflow audit --follow`` of the log ``db``, as a service of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "loomflow.cli", "audit", "--db", str(db), "--follow"],
        env=dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1", COLUMNS="300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _files(directory: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in directory.glob(pattern))


def test_verify_of_a_session_it_does_not_know_or_of_a_dropped_trail_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "journal.db"
    asyncio.run(_run(db, "s1"))
    assert _cli("audit", "--db", str(db), capsys=capsys)[0] == 0
    code, out = _cli("audit", "verify", "--db", str(db), "--session", "nope", capsys=capsys)
    assert code == 1 and "no audited sessions matching session_id='nope'" in out, out
    with sqlite3.connect(tmp_path / "journal.audit.db") as conn:
        conn.execute("DROP TABLE audit_entries")
    code, out = _cli("audit", "verify", "--db", str(db), capsys=capsys)
    assert code == 1 and "has no audit_entries table: it was dropped" in out, out
    with sqlite3.connect(tmp_path / "journal.audit.db") as conn:  # verify recreated nothing
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "audit_entries" not in tables


def test_audit_refuses_a_file_that_is_not_a_loomflow_log_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    for command in (["audit"], ["audit", "verify"], ["tail"]):
        code, out = _cli(*command, "--db", str(other), capsys=capsys)
        assert code == 1 and "is not a loomflow store" in out, out
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def _position(path: Path, sql: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(sql).fetchone()[0])


def test_audit_and_stats_keep_their_own_positions_in_the_embedded_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "journal.db"
    asyncio.run(_run(db, "s1"))
    assert _cli("audit", "--db", str(db), capsys=capsys)[0] == 0
    audited = _position(tmp_path / "journal.audit.db", "SELECT next_position FROM audit_position")
    asyncio.run(_run(db, "s2"))
    assert _cli("stats", "--db", str(db), capsys=capsys)[0] == 0
    counted = _position(
        tmp_path / "journal.stats.db", "SELECT max(next_offset) FROM stats_positions"
    )
    end = _position(db, "SELECT max(position) FROM loomflow_events") + 1
    # stats read to the end; the audit, not run since, stays where it was
    assert counted == end > audited
    assert _position(tmp_path / "journal.audit.db", "SELECT next_position FROM audit_position") == (
        audited
    )
    code, out = _cli("audit", "--db", str(db), capsys=capsys)
    assert code == 0 and f"audited {end - audited} new records" in out, out


def test_tail_names_the_run_a_new_claim_interrupted() -> None:
    event = RunStarted(
        session_id="s1",
        run_id="run2",
        seq=9,
        epoch=2,
        payload=RunStartedPayload(mode="resume", interrupted="run1"),
    )
    assert describe(event) == "resume, interrupting run run1"


def test_tail_says_why_a_run_was_cancelled() -> None:
    common = {"session_id": "s1", "run_id": "run1", "seq": 9, "epoch": 2}
    said = RunCancelled(payload=RunCancelledPayload(reason="paid by hand"), **common)
    assert describe(said) == "paid by hand"
    assert describe(RunCancelled(**common)) == "no reason given"


async def test_tail_says_a_runs_end_carries_the_sessions_totals(tmp_path: Path) -> None:
    from loomflow import Agent
    from loomflow.models import ScriptedModel

    runtime = SqliteRuntime(tmp_path / "journal.db")
    try:
        agent = Agent("x", model=ScriptedModel(lambda messages: "ok"), runtime=runtime)
        for _ in range(2):  # the second run's end counts the first run's turn too
            await agent.run("go", session_id="s1")
        events = await runtime.store.read_events(Scope("s1"))
    finally:
        await runtime.close()
    first, second = (e for e in events if e.type == "run.finished")
    assert describe(first).startswith("completed; session totals 1 turn, ")
    assert describe(second).startswith("completed; session totals 2 turns, ")


def test_tail_shows_several_partitions_by_time_each_in_its_own_order() -> None:
    from datetime import UTC, datetime, timedelta

    from loomflow.cli.tail import _in_order
    from loomflow.log.reader import LogRecord

    start = datetime(2026, 12, 1, tzinfo=UTC)

    def event(partition: int, offset: int, second: int) -> LogRecord:
        started = RunStarted(
            session_id=f"s{partition}",
            run_id="r",
            seq=offset + 1,
            epoch=1,
            at=start + timedelta(seconds=second),
        )
        return LogRecord(partition=partition, offset=offset, event=started)

    def broken(partition: int, offset: int) -> LogRecord:
        return LogRecord(partition=partition, offset=offset, event=None, error="no JSON")

    # partition 0's second record has no time, and partition 1's clock ran behind at 1:1
    batch = [
        event(0, 0, 10),
        broken(0, 1),
        event(0, 2, 30),
        event(1, 0, 5),
        event(1, 1, 4),
        event(1, 2, 20),
    ]
    shown = [(r.partition, r.offset) for r in _in_order(batch)]
    assert shown == [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (0, 2)]
