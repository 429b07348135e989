"""`loomflow demo` end to end: a real worker process, a real SIGKILL, resume and fork.

A resume's RunResult says how many turns it restored, not whether it sent them to the
model again. So the demo's claims are checked against the calls the model really
answered, from the demo's CallLog (one line per answered call, written by whichever
process made it), beside the turns each run recorded in the SQLite log.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from loomflow.demo.scenario import CallLog, call_log_path
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import SessionForked, TurnAppended

REPO_ROOT = Path(__file__).resolve().parents[1]
SESSION_ID = r"sess[0-9a-z]{26}"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


async def recorded_turns(db: Path, session_id: str) -> tuple[list[list[int]], int]:
    """The model turns each run of the session recorded (runs in log order), and the
    turn a fork started from (0 for a session that is no fork)."""
    async with SqliteRuntime(db) as runtime:
        events = await runtime.store.read_events(Scope(session_id))
    runs: dict[str, list[int]] = {}
    forked_at = 0
    for event in events:
        if isinstance(event, SessionForked):
            forked_at = event.payload.turn
        if isinstance(event, TurnAppended) and event.payload.model_call:
            key = event.payload.step_key or ""
            runs.setdefault(event.run_id, []).append(int(key.removeprefix("model:")))
    return list(runs.values()), forked_at


async def _billed(db: Path, *session_ids: str) -> float:
    """What the model calls recorded in these sessions cost, summed from their events."""
    total = 0.0
    async with SqliteRuntime(db) as runtime:
        for session_id in session_ids:
            for event in await runtime.store.read_events(Scope(session_id)):
                if isinstance(event, TurnAppended) and event.payload.model_call:
                    total += event.payload.usage.cost_usd
    return total


def run_demo(db: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    # Output is parsed, so keep rich from colouring it or wrapping it to a narrow terminal.
    env.pop("FORCE_COLOR", None)
    env.update(NO_COLOR="1", COLUMNS="100")
    proc = subprocess.run(
        [sys.executable, "-m", "loomflow.cli", "demo", "--db", str(db)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = ANSI.sub("", proc.stdout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
    return out


@pytest.mark.slow
def test_demo_kills_resumes_and_forks(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    out = run_demo(db)
    assert "offline ScriptedModel" in out
    assert re.search(r"worker pid \d+ was killed by SIGKILL", out), out

    resumed = re.search(rf"^resumed\s+({SESSION_ID})\b", out, re.M)
    forked = re.search(rf"^forked\s+({SESSION_ID})\s+\(parent ({SESSION_ID})\)", out, re.M)
    assert resumed is not None and forked is not None, out
    assert forked.group(1) != resumed.group(1)
    assert forked.group(2) == resumed.group(1)

    calls = asyncio.run(CallLog(call_log_path(db)).read())
    (by_worker, by_resume), _ = asyncio.run(recorded_turns(db, resumed.group(1)))
    (by_fork,), forked_at = asyncio.run(recorded_turns(db, forked.group(1)))

    def turns(step: str) -> list[int]:
        return [call.turn for call in calls if call.step == step]

    # The worker: every turn it recorded was a call the model answered. At most one more
    # call was answered, the one in flight at the SIGKILL, whose turn never reached the log.
    killed_at = len(by_worker)
    assert killed_at > 0 and by_worker == list(range(1, killed_at + 1))
    assert turns("worker")[:killed_at] == by_worker
    unrecorded = len(turns("worker")) - killed_at
    assert unrecorded in (0, 1), turns("worker")

    # The resume and the fork sent a call only for a turn their session's log did not hold,
    # each once, and recorded every call they sent.
    assert turns("resume") == by_resume, (turns("resume"), by_resume)
    assert by_resume and min(by_resume) == killed_at + 1
    assert turns("fork") == by_fork, (turns("fork"), by_fork)
    assert by_fork and min(by_fork) == forked_at + 1 and forked_at > 0

    assert len(calls) == len(by_worker) + len(by_resume) + len(by_fork) + unrecorded
    pids = {step: {call.pid for call in calls if call.step == step} for step in ("worker", "fork")}
    assert pids["worker"] != pids["fork"] == {call.pid for call in calls if call.step == "resume"}

    # What the demo says agrees with the calls counted here.
    not_repeated = re.search(r"(\d+) model calls? (?:were|was) not repeated", out)
    assert not_repeated is not None, out
    assert int(not_repeated.group(1)) == killed_at

    # It ends with what other readers of the log see: the turns and their cost, counted
    # from the log, then every event chained and verified.
    model_turns = len(by_worker) + len(by_resume) + len(by_fork)
    cost = asyncio.run(_billed(db, resumed.group(1), forked.group(1)))
    counted = rf"scripted-demo\s+3\s+{model_turns}\s+\d+\s+[\d,]+ / [\d,]+\s+\${cost:.4f}"
    assert re.search(counted, out), (model_turns, cost, out)
    with sqlite3.connect(db) as conn:
        events = conn.execute("SELECT count(*) FROM loomflow_events").fetchone()[0]
    assert f"loomflow audit: {events} events chained by hash into demo.audit.db" in out, out
    assert out.rstrip().endswith("loomflow audit verify: 2 sessions match the log"), out


def test_the_scenario_and_the_core_load_no_rich() -> None:
    probe = (
        "import sys, loomflow, loomflow.cli\n"
        "assert not any(m.startswith(('rich', 'loomflow.demo')) for m in sys.modules)\n"
        "import loomflow.demo.scenario\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
