"""What `loomflow demo` does: a worker process is SIGKILLed mid-run, resumed here, then forked.

The worker is a real child process writing to a SQLite log; this process watches that log,
kills the worker, and continues the same session itself. Each step is handed to a callback
as a plain record (the dataclasses below), so this module decides what happens and checks
that it went right while the view decides only how it looks: nothing here imports rich,
and the worker process loads none of it.

Every model call a process of the demo gets answered is added to a CallLog beside the
SQLite file. The event log says which turns were recorded; only the call log says which
calls were really sent, so only it can show that a resume repeated none.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

from loomflow.agent import CONTINUATION_PROMPT
from loomflow.cli import WORKER_COMMAND
from loomflow.demo.assistant import (
    FORK_PROMPT,
    MAIN_TURNS,
    REFINEMENTS,
    TASK,
    TOOLS,
    build_agent,
    scripted_reply,
)
from loomflow.models.base import Model, ModelResponse, ToolSpec
from loomflow.models.scripted import ScriptedModel
from loomflow.processors.analytics import Stats
from loomflow.processors.audit import Auditor, Verification, verify_trail
from loomflow.processors.reader import sqlite_reader
from loomflow.processors.stats_db import load as load_stats
from loomflow.processors.stats_db import stats_path
from loomflow.processors.stats_db import update as update_stats
from loomflow.projections.audit import SqliteTrail, default_trail_path
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import CheckpointMeta, Event, Message, Role, RunResult, new_id

__all__ = [
    "CallLog",
    "CheckpointList",
    "DemoError",
    "Forked",
    "Intro",
    "LoggedModel",
    "ModelCall",
    "Resumed",
    "Resuming",
    "Step",
    "Summary",
    "WorkerKilled",
    "WorkerStarted",
    "call_log_path",
    "make_model",
    "play",
    "run_worker",
]

SCRIPTED_LATENCY_S = 0.15
POLL_INTERVAL_S = 0.05

Backend = Literal["scripted", "anthropic"]
#: The part of the demo a model call belongs to: the worker's run, the resume or the fork.
CallStep = Literal["worker", "resume", "fork"]


class DemoError(Exception):
    """The demo cannot go on; the message says why and what to try."""


# -- the record of model calls -----------------------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    """One call a model answered: the process and demo step it served, and its turn.

    ``turn`` is the session turn the reply becomes (the request's assistant messages + 1),
    so a call repeated for a turn the log already held shows as a turn number seen twice.
    """

    pid: int
    step: CallStep
    turn: int


def call_log_path(db: Path) -> Path:
    """The CallLog of the demo on ``db``: a sibling file, reset with it like SQLite's -wal."""
    return Path(f"{db}-calls.jsonl")


class CallLog:
    """The model calls every process of one demo had answered, one JSON line each.

    Lines are written with a single ``os.write`` to a file opened with O_APPEND, so the
    worker's lines and this process's never interleave, and a SIGKILL leaves whole lines.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    async def add(self, call: ModelCall) -> None:
        line = (json.dumps(asdict(call)) + "\n").encode()
        await asyncio.to_thread(self._append, line)

    async def read(self) -> list[ModelCall]:
        return await asyncio.to_thread(self._read)

    def _append(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _read(self) -> list[ModelCall]:
        if not self.path.exists():
            return []
        return [ModelCall(**json.loads(line)) for line in self.path.read_text().splitlines()]


class LoggedModel:
    """A model that adds each call it answers to the CallLog, under the step now running.

    The call is logged after the answer and before the loop records the turn, so every
    recorded turn has its call in the log; a call answered just before a SIGKILL may be
    logged without a turn, and that one call is the resume's to send again.
    """

    def __init__(self, inner: Model, log: CallLog, step: CallStep) -> None:
        self.inner = inner
        self.name = inner.name
        self.log = log
        self.step: CallStep = step

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        response = await self.inner.complete(messages, tools)
        turn = 1 + sum(1 for message in messages if message.role is Role.ASSISTANT)
        await self.log.add(ModelCall(os.getpid(), self.step, turn))
        return response

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


def make_model(backend: Backend, model_name: str, log: CallLog, step: CallStep) -> LoggedModel:
    """The model of one process: Claude, or the offline script paced like a slow network."""
    if backend == "anthropic":
        from loomflow.models.anthropic import AnthropicModel

        return LoggedModel(AnthropicModel(model_name), log, step)
    scripted = ScriptedModel(scripted_reply, name="scripted-demo", latency=SCRIPTED_LATENCY_S)
    return LoggedModel(scripted, log, step)


# -- the worker process --------------------------------------------------------------------


def run_worker(db: Path, session_id: str, backend: Backend, model_name: str) -> int:
    """Run the task on ``session_id`` until it finishes (or, in the demo, is killed)."""
    asyncio.run(_work(db, session_id, backend, model_name))
    return 0


async def _work(db: Path, session_id: str, backend: Backend, model_name: str) -> None:
    model = make_model(backend, model_name, CallLog(call_log_path(db)), "worker")
    runtime = SqliteRuntime(db)
    try:
        await build_agent(runtime, model).run(TASK, session_id=session_id)
    finally:
        await model.aclose()
        await runtime.close()


# -- what the demo reports, step by step -----------------------------------------------------


@dataclass(frozen=True)
class Intro:
    """The plan, before anything runs."""

    backend: Backend
    model_name: str
    scripted_latency_s: float
    db: Path
    session_id: str
    tools: tuple[str, ...]
    task: str
    reviews: int
    kill_after_turns: int


@dataclass(frozen=True)
class WorkerStarted:
    """The worker process runs ``agent.run(task, session_id=...)``."""

    pid: int
    session_id: str


@dataclass(frozen=True)
class WorkerKilled:
    """The worker died of the SIGKILL sent once the log held ``turns_at_kill`` turns; the
    rest is what the log holds now that it is dead (checkpoints newest first)."""

    pid: int
    exit_status: int
    kill_after_turns: int
    turns_at_kill: int
    events: int
    turns: int
    cost_usd: float
    checkpoints: tuple[CheckpointMeta, ...]
    status: str


@dataclass(frozen=True)
class Resuming:
    """This process calls ``agent.resume`` next: in place from ``checkpoint`` (the latest,
    or None for the log alone), or with ``fork`` from an older one into a new session."""

    session_id: str
    prompt: str
    checkpoint: CheckpointMeta | None
    fork: bool


@dataclass(frozen=True)
class Resumed:
    """The resume's result and the model calls it had answered."""

    result: RunResult
    calls: tuple[ModelCall, ...]
    cost_before: float

    @property
    def repeated(self) -> int:
        """Calls sent for a turn the log already held: a correct resume sends none."""
        return sum(1 for call in self.calls if call.turn <= self.result.restored_turns)


@dataclass(frozen=True)
class CheckpointList:
    """``agent.list_checkpoints`` after the resume, newest first."""

    session_id: str
    checkpoints: tuple[CheckpointMeta, ...]
    written_by_worker: frozenset[str]


@dataclass(frozen=True)
class Forked:
    """The fork's result (its restored turns are its checkpoint's turn), its model calls,
    and the original session before and after."""

    result: RunResult
    calls: tuple[ModelCall, ...]
    checkpoints_before: tuple[CheckpointMeta, ...]
    checkpoints_after: tuple[CheckpointMeta, ...]
    events_before: int
    events_after: int

    @property
    def original_untouched(self) -> bool:
        same = [m.checkpoint_id for m in self.checkpoints_before] == [
            m.checkpoint_id for m in self.checkpoints_after
        ]
        return same and self.events_before == self.events_after


@dataclass(frozen=True)
class Summary:
    """The whole demo: the calls the worker had answered beside what its log kept."""

    worker_calls: int
    killed: WorkerKilled
    resumed: Resumed
    forked: Forked


@dataclass(frozen=True)
class Counted:
    """What another reader of the log counted: `loomflow stats` of the demo's log."""

    stats_db: Path
    stats: Stats


@dataclass(frozen=True)
class Audited:
    """What another reader of the log found: the audit trail, chained and verified."""

    trail: Path
    entries: int
    verification: Verification


#: What the demo reports, in order: while the worker runs, each event it appends as read
#: from the log; otherwise one of the records above.
Step = (
    Intro
    | WorkerStarted
    | Event
    | WorkerKilled
    | Resuming
    | Resumed
    | CheckpointList
    | Forked
    | Summary
    | Counted
    | Audited
)


# -- the demo ----------------------------------------------------------------------------------


def play(db: Path, kill_after_turns: int, model_name: str, report: Callable[[Step], None]) -> None:
    """Run the whole demo on a new log at ``db``, handing each step to ``report``.

    Offline unless ANTHROPIC_API_KEY is set. Raises DemoError when the demo cannot go on
    or a step did not do what the demo shows.
    """
    backend: Backend = "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "scripted"
    if kill_after_turns < 1:
        raise DemoError("--kill-after-turns must be at least 1")
    if backend == "scripted" and kill_after_turns >= MAIN_TURNS:
        raise DemoError(
            f"the offline run makes {MAIN_TURNS} model calls in all, so it would finish "
            f"before turn {kill_after_turns}; use --kill-after-turns 1 to {MAIN_TURNS - 1}"
        )
    _reset(db)
    asyncio.run(_Scenario(db.resolve(), kill_after_turns, model_name, backend, report).run())


def _reset(db: Path) -> None:
    if not db.parent.is_dir():
        raise DemoError(f"directory {db.parent} does not exist for --db {db}")
    for path in (db, call_log_path(db), default_trail_path(db), stats_path(db)):
        for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            file.unlink(missing_ok=True)


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]

    def stderr_tail(self, lines: int = 15) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return "\n".join(text.splitlines()[-lines:]) or "(no output on stderr)"


class _Scenario:
    """One run of the demo: its session, its deadlines, and where each step is reported."""

    def __init__(
        self,
        db: Path,
        kill_after_turns: int,
        model_name: str,
        backend: Backend,
        report: Callable[[Step], None],
    ) -> None:
        self.db = db
        self.kill_after = kill_after_turns
        self.model_name = model_name
        self.backend: Backend = backend
        self.report = report
        self.calls = CallLog(call_log_path(db))
        self.session_id = new_id("sess")
        self.scope = Scope(self.session_id)
        # A real model can take a minute on a slow pass; the scripted one never should.
        offline = backend == "scripted"
        self.timeout_s = 60.0 if offline else 600.0
        self.stall_s = 20.0 if offline else 180.0

    async def run(self) -> None:
        model = make_model(self.backend, self.model_name, self.calls, "resume")
        runtime = SqliteRuntime(self.db)
        try:
            await self._steps(runtime, model)
        finally:
            await model.aclose()
            await runtime.close()

    async def _steps(self, runtime: SqliteRuntime, model: LoggedModel) -> None:
        agent = build_agent(runtime, model)
        self.report(
            Intro(
                backend=self.backend,
                model_name=self.model_name,
                scripted_latency_s=SCRIPTED_LATENCY_S,
                db=self.db,
                session_id=self.session_id,
                tools=tuple(tool.__name__ for tool in TOOLS),
                task=TASK,
                reviews=len(REFINEMENTS),
                kill_after_turns=self.kill_after,
            )
        )
        # A file, not a pipe: nobody reads stderr until the end, and a full pipe would
        # block the worker and look like a stall.
        with tempfile.TemporaryFile() as stderr:
            worker = self._start_worker(stderr)
            try:
                killed = await self._watch_and_kill(runtime, worker)
            finally:
                if worker.proc.poll() is None:
                    worker.proc.kill()  # never leave a worker behind when the demo fails
                    worker.proc.wait()
        self.report(killed)

        latest = killed.checkpoints[0] if killed.checkpoints else None
        self.report(Resuming(self.session_id, CONTINUATION_PROMPT, latest, fork=False))
        model.step = "resume"
        result = await agent.resume(session_id=self.session_id)
        resumed = Resumed(result, await self._calls_of("resume"), killed.cost_usd)
        self.report(resumed)
        if resumed.repeated:
            raise DemoError(
                f"the resume sent {resumed.repeated} model call(s) for turns the log already "
                "held: their replies should have come from the log"
            )

        metas = tuple(await agent.list_checkpoints(self.session_id))
        by_worker = frozenset(m.checkpoint_id for m in killed.checkpoints)
        self.report(CheckpointList(self.session_id, metas, by_worker))
        if len(metas) < 2:
            raise DemoError("the session has a single checkpoint, so there is nothing to fork")

        older = metas[-1]
        self.report(Resuming(self.session_id, FORK_PROMPT, older, fork=True))
        events_before = len(await runtime.store.read_events(self.scope))
        model.step = "fork"
        result = await agent.resume(
            FORK_PROMPT, session_id=self.session_id, from_checkpoint=older.checkpoint_id
        )
        forked = Forked(
            result=result,
            calls=await self._calls_of("fork"),
            checkpoints_before=metas,
            checkpoints_after=tuple(await agent.list_checkpoints(self.session_id)),
            events_before=events_before,
            events_after=len(await runtime.store.read_events(self.scope)),
        )
        self.report(forked)
        if not forked.original_untouched:
            raise DemoError("forking changed the original session's checkpoints or events")

        worker_calls = len(await self._calls_of("worker"))
        self.report(Summary(worker_calls, killed, resumed, forked))

        stats_db = stats_path(self.db)
        await update_stats(self.db, stats_db)
        self.report(Counted(stats_db, await asyncio.to_thread(load_stats, stats_db)))
        audited = await self._audit()
        self.report(audited)
        if audited.verification.problems:
            raise DemoError(f"the audit trail does not match the log in {audited.trail}")

    async def _audit(self) -> Audited:
        """What `loomflow audit` then `loomflow audit verify` do, on this demo's log."""
        trail_path = default_trail_path(self.db)
        async with SqliteTrail(trail_path) as trail:
            async with sqlite_reader(self.db) as reader:
                done = await Auditor(reader, trail).catch_up()
            async with sqlite_reader(self.db) as fresh:
                verification = await verify_trail(trail, fresh, reader.next_positions())
        return Audited(trail_path, done.entries, verification)

    async def _calls_of(self, step: CallStep) -> tuple[ModelCall, ...]:
        return tuple(call for call in await self.calls.read() if call.step == step)

    # -- the worker, watched through the log -------------------------------------------------

    def _start_worker(self, stderr: IO[bytes]) -> _Worker:
        command = [
            sys.executable,
            "-m",
            "loomflow.cli",
            WORKER_COMMAND,
            "--db",
            str(self.db),
            "--session-id",
            self.session_id,
            "--backend",
            self.backend,
            "--model",
            self.model_name,
        ]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        self.report(WorkerStarted(proc.pid, self.session_id))
        return _Worker(proc, stderr)

    async def _watch_and_kill(self, runtime: SqliteRuntime, worker: _Worker) -> WorkerKilled:
        proc = worker.proc
        start = last_progress = time.monotonic()
        seen = turns = 0
        while True:
            events = await runtime.store.read_events(self.scope, after_seq=seen)
            for event in events:
                self.report(event)
            if events:
                seen, last_progress = events[-1].seq, time.monotonic()
            row = await runtime.store.session(self.scope)
            turns = row.turns if row is not None else 0
            if turns >= self.kill_after:
                break
            code = proc.poll()
            if code is not None:
                raise DemoError(
                    f"the worker (pid {proc.pid}) exited with status {code} after {turns} "
                    f"turns, before reaching turn {self.kill_after}.\n{worker.stderr_tail()}"
                )
            now = time.monotonic()
            if now - last_progress > self.stall_s or now - start > self.timeout_s:
                raise DemoError(
                    f"the worker (pid {proc.pid}) wrote nothing for {now - last_progress:.0f} s "
                    f"({now - start:.0f} s in all) before turn {self.kill_after}; it looks "
                    f"stalled.\n{worker.stderr_tail()}"
                )
            await asyncio.sleep(POLL_INTERVAL_S)

        os.kill(proc.pid, signal.SIGKILL)
        try:
            # Reaping a SIGKILLed child is near-instant; the bound only guards the demo.
            code = await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired as exc:
            raise DemoError(f"pid {proc.pid} did not die within 10 s of SIGKILL") from exc
        # Events committed between the last poll and the kill belong to the worker's story.
        for event in await runtime.store.read_events(self.scope, after_seq=seen):
            self.report(event)
        if code != -signal.SIGKILL:
            raise DemoError(
                f"the worker (pid {proc.pid}) ended with status {code}, not by SIGKILL: it "
                f"probably finished first; try a smaller --kill-after-turns.\n"
                f"{worker.stderr_tail()}"
            )
        row = await runtime.store.session(self.scope)
        if row is None:
            raise DemoError(f"the log holds no session {self.session_id} after the kill")
        events = await runtime.store.read_events(self.scope)
        checkpoints = await runtime.list_checkpoints(self.scope)
        return WorkerKilled(
            pid=proc.pid,
            exit_status=code,
            kill_after_turns=self.kill_after,
            turns_at_kill=turns,
            events=len(events),
            turns=row.turns,
            cost_usd=row.usage.cost_usd,
            checkpoints=tuple(checkpoints),
            status=row.status,
        )
