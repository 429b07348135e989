"""The demo (examples/demo, `make demo`) end to end: a real worker process, a real SIGKILL,
resume and fork; then real `loomflow worker` processes, one of them SIGKILLed, and a real
`loomflow signal`.

A resume's RunResult says how many turns it restored, not whether it sent them to the
model again. So the demo's claims are checked against the calls the model really
answered, from the demo's CallLog (one line per answered call, written by whichever
process made it), beside the turns each run recorded in the SQLite log.

The demo runs once for the module (it takes seconds), as `make demo` runs it: the
`loomflow-demo` command of .venv; each test reads its output and log.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import (
    Event,
    Role,
    RunStarted,
    RunWaiting,
    SessionForked,
    SignalSent,
    TurnAppended,
)
from loomflow_demo import scenario
from loomflow_demo.assistant import editor_answer
from loomflow_demo.scenario import (
    HOSTED_AGENTS,
    CallLog,
    ModelCall,
    ProcessRun,
    Unattended,
    call_log_path,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
#: what `make demo` runs: the console script the demo's distribution installs
DEMO_COMMAND = Path(sys.executable).with_name("loomflow-demo")
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


async def _events(db: Path, session_id: str) -> list[Event]:
    async with SqliteRuntime(db) as runtime:
        return await runtime.store.read_events(Scope(session_id))


async def _status(db: Path, session_id: str) -> str | None:
    async with SqliteRuntime(db) as runtime:
        row = await runtime.store.session(Scope(session_id))
    return None if row is None else row.status


def runs_of(events: list[Event]) -> list[tuple[str | None, list[int]]]:
    """Each run of a session in log order: the worker that started it (None: a caller's
    run) and the model turns it recorded."""
    runs: dict[str, tuple[str | None, list[int]]] = {}
    for event in events:
        if isinstance(event, RunStarted):
            runs[event.run_id] = (event.payload.worker, [])
        if isinstance(event, TurnAppended) and event.payload.model_call:
            key = event.payload.step_key or ""
            runs[event.run_id][1].append(int(key.removeprefix("model:")))
    return list(runs.values())


def run_demo(db: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    # Output is parsed, so keep rich from colouring it or wrapping it to a narrow terminal.
    env.pop("FORCE_COLOR", None)
    env.update(NO_COLOR="1", COLUMNS="100")
    proc = subprocess.run(
        [str(DEMO_COMMAND), "--db", str(db)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = ANSI.sub("", proc.stdout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo's log and output, from one run of `loomflow-demo` for the module."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    return db, run_demo(db)


def _session(out: str, label: str) -> str:
    found = re.search(rf"^{label}\s+({SESSION_ID})\b", out, re.M)
    assert found is not None, (label, out)
    return found.group(1)


def _calls(db: Path, step: str) -> list[ModelCall]:
    return [call for call in asyncio.run(CallLog(call_log_path(db)).read()) if call.step == step]


@pytest.mark.slow
def test_demo_kills_resumes_and_forks(demo: tuple[Path, str]) -> None:
    db, out = demo
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

    first_part = [call for call in calls if call.step in ("worker", "resume", "fork")]
    assert len(first_part) == len(by_worker) + len(by_resume) + len(by_fork) + unrecorded
    pids = {step: {call.pid for call in calls if call.step == step} for step in ("worker", "fork")}
    assert pids["worker"] != pids["fork"] == {call.pid for call in calls if call.step == "resume"}

    # What the demo says agrees with the calls counted here.
    not_repeated = re.search(r"(\d+) model calls? (?:were|was) not repeated", out)
    assert not_repeated is not None, out
    assert int(not_repeated.group(1)) == killed_at


@pytest.mark.slow
def test_two_workers_finish_a_run_whose_process_and_then_whose_worker_were_killed(
    demo: tuple[Path, str],
) -> None:
    db, out = demo
    session = _session(out, "unattended")
    workers = re.search(r"started two workers, W1 pid (\d+) and W2 pid (\d+)", out)
    runner = re.search(r"started the run process pid (\d+)", out)
    killed = re.search(r"SIGKILL (W[12]) \(pid (\d+)\) after its turn", out)
    stopped = re.search(r"sent SIGTERM to (W[12]) \(pid (\d+)\): it exited with status 0", out)
    assert workers and runner and killed and stopped, out
    assert killed.group(1) != stopped.group(1)
    assert {int(killed.group(2)), int(stopped.group(2))} == {int(p) for p in workers.groups()}
    assert asyncio.run(_status(db, session)) == "finished"

    # The run process's run, then one run by each worker: the one later SIGKILLed, then
    # the other, which finished it. Each went on from the turn the log ended at.
    (none, by_runner), (first, by_first), (second, by_second) = runs_of(
        asyncio.run(_events(db, session))
    )
    assert none is None and first is not None and second is not None
    assert first.endswith(f":{killed.group(2)}") and second.endswith(f":{stopped.group(2)}")
    assert by_runner and by_first and by_second
    recorded = by_runner + by_first + by_second
    assert recorded == list(range(1, len(recorded) + 1))

    # No turn the log held was sent to the model again: each process's calls begin after
    # the turns its run restored, and every turn it recorded was one of its calls. A
    # killed process may have had one more call answered, in flight at its SIGKILL.
    calls = _calls(db, "unattended")
    pids = [int(runner.group(1)), int(killed.group(2)), int(stopped.group(2))]
    assert {call.pid for call in calls} == set(pids)
    unrecorded = 0
    for pid, turns, restored in zip(
        pids,
        (by_runner, by_first, by_second),
        (0, len(by_runner), len(by_runner) + len(by_first)),
        strict=True,
    ):
        sent = [call.turn for call in calls if call.pid == pid]
        assert min(sent) == restored + 1, (pid, sent, restored)
        assert sent[: len(turns)] == turns, (pid, sent, turns)
        unrecorded += len(sent) - len(turns)
        assert len(sent) - len(turns) in ((0, 1) if pid != pids[-1] else (0,)), (pid, sent)
    assert len(calls) == len(recorded) + unrecorded
    assert "no recorded turn was sent to the model again" in out, out
    assert re.search(rf"^unattended {session}\s+\({len(recorded)} turns, finished\)", out, re.M)


@pytest.mark.slow
def test_a_signal_sent_with_the_cli_lets_the_surviving_worker_finish_a_waiting_run(
    demo: tuple[Path, str],
) -> None:
    db, out = demo
    session = _session(out, "approved")
    command = f"$ loomflow signal {session} approve --json '{{\"ok\": true}}' --db {db}"
    assert command in out, out
    assert re.search(rf"^  sent approve to {session} \(seq \d+\)$", out, re.M), out
    stopped = re.search(r"sent SIGTERM to (W[12]) \(pid (\d+)\): it exited with status 0", out)
    assert stopped is not None, out
    assert asyncio.run(_status(db, session)) == "finished"

    events = asyncio.run(_events(db, session))
    (caller, by_caller), (worker, by_worker) = runs_of(events)
    assert caller is None and by_caller == [1]  # it asked the editor, and waited
    assert worker is not None and worker.endswith(f":{stopped.group(2)}") and by_worker == [2]
    # it waited, then the signal came, then the worker's run started
    waited = next(i for i, e in enumerate(events) if isinstance(e, RunWaiting))
    sent = next(i for i, e in enumerate(events) if isinstance(e, SignalSent))
    resumed = max(i for i, e in enumerate(events) if isinstance(e, RunStarted))
    assert waited < sent < resumed
    (signal,) = (event for event in events if isinstance(event, SignalSent))
    assert signal.payload.name == "approve" and signal.payload.data == {"ok": True}
    (result,) = (
        message.content
        for event in events
        if isinstance(event, TurnAppended)
        for message in event.payload.messages
        if message.role is Role.TOOL
    )
    assert result == editor_answer({"ok": True}) == 'the editor answered {"ok": true}'
    assert f"the tool returned where it had waited: {result}" in out

    # one call before the wait, in the demo's process, one after it, in the worker's
    calls = _calls(db, "approval")
    assert [call.turn for call in calls] == [1, 2]
    assert calls[1].pid == int(stopped.group(2)) != calls[0].pid
    assert calls[0].pid in {call.pid for call in _calls(db, "resume")}


@pytest.mark.slow
def test_the_logs_other_readers_count_every_session_of_the_demo(demo: tuple[Path, str]) -> None:
    db, out = demo
    resumed, forked = _session(out, "resumed"), _session(out, "forked")
    unattended = _session(out, "unattended")
    research = [resumed, forked, unattended]

    # The turns and their cost, counted from the log: the research sessions' six runs
    # (the killed worker's, the resume, the fork; the run process's and two workers'),
    # and the approver's two (before and after the wait).
    model_turns = sum(
        len(turns)
        for session in research
        for _, turns in runs_of(asyncio.run(_events(db, session)))
    )
    cost = asyncio.run(_billed(db, *research))
    counted = rf"scripted-demo\s+6\s+{model_turns}\s+\d+\s+[\d,]+ / [\d,]+\s+\${cost:.4f}"
    assert re.search(counted, out), (model_turns, cost, out)
    assert re.search(r"scripted-approver\s+2\s+2\s+1\s", out), out
    assert "stats: log record" not in out  # the stats refused no event

    # then every event chained and verified
    with sqlite3.connect(db) as conn:
        events = conn.execute("SELECT count(*) FROM loomflow_events").fetchone()[0]
    assert f"loomflow audit: {events} events chained by hash into demo.audit.db" in out, out
    *_, verdict, console = out.rstrip().splitlines()
    assert verdict == "loomflow audit verify: 4 sessions match the log", out
    # and it ends with where to see it all: the console over this log, at the default address
    assert console == (
        "see every session, run, checkpoint and fork in the web console: "
        f"loomflow ui --db {db}, then open http://127.0.0.1:8765/"
    ), out


@pytest.fixture(scope="module")
def failed_scene(tmp_path_factory: pytest.TempPathFactory) -> list[subprocess.Popen[bytes]]:
    """Every child process of a demo that fails while both of its workers run (the first
    part's worker, two `loomflow worker`s, the run process), each waited for."""
    children: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = popen(*args, **kwargs)
        children.append(child)
        return child

    async def fails(self: Any, survivor: Any) -> None:
        assert survivor.proc.poll() is None  # a worker is still running when it fails
        raise scenario.DemoError("the approval failed")

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("ANTHROPIC_API_KEY", raising=False)
        patch.setattr(subprocess, "Popen", recorded)
        patch.setattr(scenario._UnattendedScene, "_approval", fails)
        db = tmp_path_factory.mktemp("failed") / "demo.db"
        with pytest.raises(scenario.DemoError, match="the approval failed"):
            scenario.play(db, 3, "unused", lambda step: None)
    return children


@pytest.mark.slow
def test_a_failing_scene_leaves_no_worker_behind(
    failed_scene: list[subprocess.Popen[bytes]],
) -> None:
    # the story SIGKILLs the worker, the run process and one `loomflow worker`; the demo's
    # failure, the other
    assert len(failed_scene) == 4
    assert all(proc.returncode == -signal.SIGKILL for proc in failed_scene), failed_scene


@pytest.mark.slow
def test_the_demo_starts_its_worker_itself_and_only_library_commands_with_loomflow(
    failed_scene: list[subprocess.Popen[bytes]],
) -> None:
    # the process the demo kills is a module of the demo's package: the library's command
    # line knows nothing of it, and hosts the demo's agents only as `loomflow worker` does
    # any user's factory
    own = [sys.executable, "-P", "-m", "loomflow_demo.worker"]
    library = [sys.executable, "-P", "-m", "loomflow.cli", "worker", HOSTED_AGENTS]
    commands = [cast(list[str], proc.args) for proc in failed_scene]
    kinds = [
        "own" if command[:4] == own else "library" if command[:6] == library else command
        for command in commands
    ]
    assert kinds == ["own", "library", "library", "own"], commands


def test_a_take_over_that_resends_a_recorded_turn_is_counted_as_repeated() -> None:
    # the demo's check itself: a process whose calls begin at or before the turns its run
    # restored sent those turns again; a turn answered twice past them was in flight
    runs = (
        ProcessRun("run process", 1, 0, (1, 2), (1, 2, 3), "SIGKILL"),
        ProcessRun("W1", 2, 2, (3, 4), (3, 4), "SIGKILL"),
        ProcessRun("W2", 3, 4, (5,), (4, 5), "finished"),
    )
    done = Unattended("s", "finished", 5, "", runs)
    assert [run.repeated for run in runs] == [0, 0, 1]
    assert done.repeated == 1 and done.sent_again == 2


def test_the_workers_factory_says_what_it_needs_when_run_by_hand() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_DEMO_")}
    done = subprocess.run(
        [sys.executable, "-m", "loomflow.cli", "worker", HOSTED_AGENTS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"loomflow worker: {HOSTED_AGENTS} reads LOOMFLOW_DEMO_DB"), (
        done.stderr
    )


def test_the_library_loads_no_demo_and_the_demos_worker_no_rich() -> None:
    probe = (
        "import contextlib, io, sys, loomflow\n"
        "from loomflow.cli import main\n"
        # --help loads every command's module, and none of the demo's
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "assert not any(m.split('.')[0] in ('rich', 'loomflow_demo') for m in sys.modules)\n"
        "import loomflow_demo.worker\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_demos_module_entry_checks_its_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loomflow_demo", "--kill-after-turns", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "loomflow-demo: error: argument --kill-after-turns: must be at least 1" in done.stderr
