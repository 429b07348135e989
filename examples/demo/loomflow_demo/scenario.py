"""What the demo (`make demo`, `loomflow-demo`) does: a worker process is SIGKILLed mid-run,
resumed here, then forked; then runs finish unattended, taken over by `loomflow worker`
processes.

The worker is a real child process (``python -m loomflow_demo.worker``, a module of the
demo's own package) writing to a SQLite log; this process watches that log, kills the
worker, and continues the same session itself. In the unattended scene, two `loomflow
worker` processes host the demo's agents: a new run's process and then the worker that took
its run over are SIGKILLed, and the other worker finishes the run; a run that waits for an
editor's approval is finished by a worker once `loomflow signal` sends it. Each step is
handed to a callback as a plain record (the dataclasses below), so this module decides what
happens and checks that it went right while the view decides only how it looks: nothing here
imports rich, and the child processes load none of it.

Every model call a process of the demo gets answered is added to a CallLog beside the
SQLite file. The event log says which turns were recorded; only the call log says which
calls were really sent, so only it can show that a resume repeated none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal, TypeVar, cast

from loomflow.agent import CONTINUATION_PROMPT, Agent
from loomflow.analytics.embedded import load as load_stats
from loomflow.analytics.embedded import stats_path
from loomflow.analytics.embedded import update as update_stats
from loomflow.analytics.tally import Stats
from loomflow.audit.auditor import Auditor, Verification, verify_trail
from loomflow.log.reader import sqlite_reader
from loomflow.models.base import Model, ModelResponse, ToolSpec
from loomflow.models.scripted import ScriptedModel
from loomflow.projections.audit import SqliteTrail, default_trail_path
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import (
    CheckpointMeta,
    Event,
    Message,
    Role,
    RunFinished,
    RunResult,
    RunStarted,
    SignalSent,
    TranscriptCompacted,
    TurnAppended,
    new_id,
)
from loomflow.settings import Settings
from loomflow_demo.assistant import (
    APPROVAL_SIGNAL,
    APPROVAL_TASK,
    APPROVER,
    FORK_PROMPT,
    MAIN_TURNS,
    REFINEMENTS,
    RESEARCHER,
    TASK,
    TOOLS,
    approver_reply,
    build_agent,
    build_approver,
    editor_answer,
    scripted_reply,
)

__all__ = [
    "Approved",
    "CallLog",
    "CheckpointList",
    "DemoError",
    "Forked",
    "Intro",
    "LoggedModel",
    "ModelCall",
    "ProcessKilled",
    "ProcessRun",
    "Resumed",
    "Resuming",
    "RunProcessStarted",
    "Signalled",
    "Step",
    "Summary",
    "TakenOver",
    "Unattended",
    "Waiting",
    "WorkerKilled",
    "WorkerStarted",
    "WorkersStarted",
    "WorkersStopped",
    "call_log_path",
    "hosted_agents",
    "make_approver_model",
    "make_model",
    "play",
]

SCRIPTED_LATENCY_S = 0.15
#: How the demo starts ``loomflow`` in a child, for the library's own commands (worker,
#: signal): this interpreter, and -P so that the current directory is not put first on the
#: path, where a ``loomflow`` folder (an older checkout) would stand in for the loomflow
#: this process runs.
LOOMFLOW_CLI = (sys.executable, "-P", "-m", "loomflow.cli")
#: The demo's worker process, which the library knows nothing of: a module of this package,
#: started the same way.
WORKER_MODULE = "loomflow_demo.worker"
DEMO_WORKER = (sys.executable, "-P", "-m", WORKER_MODULE)
POLL_INTERVAL_S = 0.05

Backend = Literal["scripted", "anthropic"]
#: The part of the demo a model call belongs to: the worker's run, the resume, the fork, the
#: unattended scene's research session (its run process and the `loomflow worker`s that
#: took it over) or the approver's session.
CallStep = Literal["worker", "resume", "fork", "unattended", "approval"]


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


def make_approver_model(log: CallLog) -> LoggedModel:
    """The approver's model: always the script, since its story is the wait, not the model."""
    scripted = ScriptedModel(approver_reply, name="scripted-approver", latency=SCRIPTED_LATENCY_S)
    return LoggedModel(scripted, log, "approval")


# -- what the scene's `loomflow worker` processes host ---------------------------------------

#: The factory the scene's workers load: `loomflow worker loomflow_demo.scenario:hosted_agents`.
HOSTED_AGENTS = "loomflow_demo.scenario:hosted_agents"
#: What the factory needs, passed by the demo in the workers' environment.
ENV_DB = "LOOMFLOW_DEMO_DB"
ENV_BACKEND = "LOOMFLOW_DEMO_BACKEND"
ENV_MODEL = "LOOMFLOW_DEMO_MODEL"
ENV_LEASE = "LOOMFLOW_DEMO_LEASE"


def hosted_agents() -> list[Agent]:
    """What the scene's `loomflow worker` processes host: the researcher and the approver
    on the demo's log, as the LOOMFLOW_DEMO_* variables the demo sets describe it."""
    names = (ENV_DB, ENV_BACKEND, ENV_MODEL, ENV_LEASE)
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        raise ValueError(
            f"{HOSTED_AGENTS} reads {', '.join(missing)} from the environment; "
            "`loomflow-demo` sets them for the workers it starts"
        )
    backend = os.environ[ENV_BACKEND]
    if backend not in ("scripted", "anthropic"):
        raise ValueError(f"{ENV_BACKEND} must be scripted or anthropic, not {backend!r}")
    try:
        lease = float(os.environ[ENV_LEASE])
    except ValueError:
        raise ValueError(f"{ENV_LEASE} is not a number of seconds") from None
    db = Path(os.environ[ENV_DB])
    calls = CallLog(call_log_path(db))
    # One runtime for both: one connection pool, and one place a worker looks for runs.
    runtime = SqliteRuntime(db, lease_seconds=lease)
    model = make_model(cast(Backend, backend), os.environ[ENV_MODEL], calls, "unattended")
    return [build_agent(runtime, model), build_approver(runtime, make_approver_model(calls))]


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
class WebConsole:
    """Where to look at all of it in a browser: the command that serves the web console
    over the demo's log, and the address it listens on (the settings' defaults)."""

    command: str
    url: str


@dataclass(frozen=True)
class Audited:
    """What another reader of the log found: the audit trail, chained and verified."""

    trail: Path
    entries: int
    verification: Verification


# -- the unattended scene's records ------------------------------------------------------------


@dataclass(frozen=True)
class WorkersStarted:
    """`loomflow worker` processes (W1, W2, in ``pids`` order) host the demo's agents on
    its log, set up by the ``settings`` of their environment; runs of the scene have a
    ``lease_seconds`` lease."""

    command: str
    settings: tuple[str, ...]
    pids: tuple[int, ...]
    agents: tuple[str, ...]
    lease_seconds: float
    poll_seconds: float


@dataclass(frozen=True)
class RunProcessStarted:
    """A process runs ``agent.run(task, session_id=...)`` on a new session."""

    pid: int
    session_id: str
    lease_seconds: float


@dataclass(frozen=True)
class ProcessKilled:
    """``who`` died of the SIGKILL sent once its run had recorded turn ``turn``; the log
    held ``turns`` turns once it was dead."""

    who: str
    pid: int
    exit_status: int
    turn: int
    turns: int


@dataclass(frozen=True)
class TakenOver:
    """A worker's run.started on the session (``payload.worker`` names it): who took the
    run over, why, and how long after the session's previous event."""

    who: str
    worker: str
    session_id: str
    reason: Literal["abandoned", "signalled"]
    turns: int
    silent_s: float


@dataclass(frozen=True)
class ProcessRun:
    """One run of the unattended session: the process that made it, the turns the log
    held when it began, the turns it recorded, the turns of the model calls its process
    had answered (from the CallLog), and how it ended."""

    who: str
    pid: int
    restored_turns: int
    turns: tuple[int, ...]
    calls: tuple[int, ...]
    ended: str

    @property
    def repeated(self) -> int:
        """Calls sent for a turn the log held when the run began: a correct take-over
        sends none."""
        return sum(1 for turn in self.calls if turn <= self.restored_turns)


@dataclass(frozen=True)
class Unattended:
    """The unattended session once a worker finished it: its runs in log order."""

    session_id: str
    status: str
    turns: int
    output: str
    runs: tuple[ProcessRun, ...]

    @property
    def repeated(self) -> int:
        return sum(run.repeated for run in self.runs)

    @property
    def sent_again(self) -> int:
        """Turns answered to more than one process: each a call in flight at a kill,
        answered but not recorded, so the next run asked again."""
        answered = [turn for run in self.runs for turn in set(run.calls)]
        return sum(1 for turn in set(answered) if answered.count(turn) > 1)


@dataclass(frozen=True)
class Waiting:
    """The approver's run in this process stopped in its tool to wait for a signal."""

    agent: str
    session_id: str
    task: str
    result: RunResult


@dataclass(frozen=True)
class Signalled:
    """`loomflow signal` as a user types it, and what it printed."""

    command: str
    exit_status: int
    output: str


@dataclass(frozen=True)
class Approved:
    """The approver's session once a worker resumed and finished it: what its tool
    returned where it had waited, and the run's answer."""

    session_id: str
    status: str
    tool_result: str
    expected: str
    output: str


@dataclass(frozen=True)
class WorkersStopped:
    """The surviving worker stopped by SIGTERM, and what the workers logged."""

    who: str
    pid: int
    exit_status: int
    log: tuple[str, ...]


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
    | WorkersStarted
    | RunProcessStarted
    | ProcessKilled
    | TakenOver
    | Unattended
    | Waiting
    | Signalled
    | Approved
    | WorkersStopped
    | Counted
    | Audited
    | WebConsole
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
class _Child:
    """A child process of the demo, its stderr (a file, read only when something failed)
    and what the demo calls it."""

    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    label: str = "the worker"

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace").strip()

    def stderr_tail(self, lines: int = 15) -> str:
        text = self.stderr_text()
        return "\n".join(text.splitlines()[-lines:]) or "(no output on stderr)"

    def kill(self) -> None:
        """SIGKILL it if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


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
                worker.kill()  # never leave a worker behind when the demo fails
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

        await _UnattendedScene(self, runtime).play()

        stats_db = stats_path(self.db)
        await update_stats(self.db, stats_db)
        self.report(Counted(stats_db, await asyncio.to_thread(load_stats, stats_db)))
        audited = await self._audit()
        self.report(audited)
        if audited.verification.problems:
            raise DemoError(f"the audit trail does not match the log in {audited.trail}")
        settings = Settings()
        host = f"[{settings.ui_host}]" if ":" in settings.ui_host else settings.ui_host
        self.report(
            WebConsole(f"loomflow ui --db {_typed(self.db)}", f"http://{host}:{settings.ui_port}/")
        )

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

    def worker_command(self, session_id: str, *options: str) -> list[str]:
        """The command of a worker process that runs the task on ``session_id``."""
        return [
            *DEMO_WORKER,
            "--db",
            str(self.db),
            "--session-id",
            session_id,
            "--backend",
            self.backend,
            "--model",
            self.model_name,
            *options,
        ]

    def _start_worker(self, stderr: IO[bytes]) -> _Child:
        command = self.worker_command(self.session_id)
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        self.report(WorkerStarted(proc.pid, self.session_id))
        return _Child(proc, stderr)

    async def _watch_and_kill(self, runtime: SqliteRuntime, worker: _Child) -> WorkerKilled:
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


# -- the unattended scene: `loomflow worker` and `loomflow signal` ----------------------------

#: The scene's lease: a dead process's run is taken over seconds, not half a minute, after
#: its last event; a live writer's heartbeats (every third of it) keep it from looking dead.
UNATTENDED_LEASE_S = 2.0
#: How often the scene's workers look for runs to take over.
WORKER_POLL_S = 0.2
#: Turns the scene's run process records before its SIGKILL.
UNATTENDED_KILL_AFTER = 2
#: What the editor answers, as `loomflow signal ... --json` sends it.
APPROVAL_PAYLOAD: dict[str, object] = {"ok": True}

_T = TypeVar("_T")


def _turn(event: TurnAppended) -> int:
    return int((event.payload.step_key or "model:0").removeprefix("model:"))


def _typed(path: Path) -> str:
    """``path`` as a user would type it: relative when below the current directory, since
    the demo shows commands to be typed again."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _pid_of(worker: str) -> int | None:
    """The pid in a worker's default name, host:pid."""
    _, _, pid = worker.rpartition(":")
    return int(pid) if pid.isdigit() else None


class _Tail:
    """One session's events, read from the log as they are appended."""

    def __init__(self, runtime: SqliteRuntime, session_id: str) -> None:
        self.runtime = runtime
        self.scope = Scope(session_id)
        self.events: list[Event] = []

    async def read(self) -> list[Event]:
        after = self.events[-1].seq if self.events else 0
        self.events.extend(await self.runtime.store.read_events(self.scope, after_seq=after))
        return self.events

    def answer(self, finish: RunFinished) -> str:
        """The answer of the run ``finish`` ends (the event keeps it only where the
        transcript does not: RunFinishedPayload.answer)."""
        said = [
            message
            for event in self.events
            if event.seq < finish.seq and isinstance(event, TurnAppended | TranscriptCompacted)
            for message in event.payload.messages
        ]
        return finish.payload.answer(said)

    def turns(self, run_id: str | None = None, before: int | None = None) -> list[int]:
        """The model turns recorded, by the run ``run_id`` or by any, before the seq
        ``before`` or at any seq."""
        return [
            _turn(event)
            for event in self.events
            if isinstance(event, TurnAppended)
            and event.payload.model_call
            and run_id in (None, event.run_id)
            and (before is None or event.seq < before)
        ]

    def taken_over(self, known: Sequence[str]) -> RunStarted | None:
        """The first run a worker started that is not in ``known``."""
        for event in self.events:
            if (
                isinstance(event, RunStarted)
                and event.payload.worker is not None
                and event.run_id not in known
            ):
                return event
        return None

    def before(self, event: Event) -> Event:
        """The event the session held before ``event``: what the lease is counted from."""
        index = next(i for i, e in enumerate(self.events) if e.seq == event.seq)
        return self.events[max(index - 1, 0)]

    async def status(self) -> str:
        row = await self.runtime.store.session(self.scope)
        return "none" if row is None else row.status


class _UnattendedScene:
    """Runs nobody resumes by hand: `loomflow worker` processes take over a run whose
    process died (and then one whose worker died), and resume a run that waited for a
    signal once `loomflow signal` sends it."""

    def __init__(self, scenario: _Scenario, runtime: SqliteRuntime) -> None:
        self.s = scenario
        self.runtime = runtime
        #: the children's stderr files, closed when the scene ends
        self.files = contextlib.ExitStack()
        self.children: list[_Child] = []
        self.workers: dict[int, _Child] = {}

    async def play(self) -> None:
        with self.files:
            try:
                await self._steps()
            finally:
                for child in self.children:
                    child.kill()  # never leave a process behind when the demo fails

    async def _steps(self) -> None:
        w1, w2 = self._start_workers()
        research, survivor = await self._research(w1, w2)
        self.s.report(research)
        if research.repeated:
            raise DemoError(
                f"the workers sent {research.repeated} model call(s) for turns the log "
                f"already held in {research.session_id}: their replies should have come "
                "from the log"
            )
        await self._approval(survivor)
        await self._stop(survivor)

    # -- the children ----------------------------------------------------------------------

    def _spawn(self, command: list[str], label: str, env: dict[str, str] | None = None) -> _Child:
        # A file, not a pipe: nobody reads stderr until the end, and a full pipe would
        # block the child and look like a stall. The scene's ExitStack closes it.
        stderr = self.files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        child = _Child(proc, stderr, label)
        self.children.append(child)
        return child

    def _start_workers(self) -> tuple[_Child, _Child]:
        settings = {
            ENV_DB: _typed(self.s.db),  # the workers share this process's directory
            ENV_BACKEND: self.s.backend,
            ENV_MODEL: self.s.model_name,
            ENV_LEASE: f"{UNATTENDED_LEASE_S:g}",
        }
        args = ["worker", HOSTED_AGENTS, "--poll", f"{WORKER_POLL_S:g}"]
        env = {**os.environ, **settings}
        w1, w2 = (self._spawn([*LOOMFLOW_CLI, *args], label, env) for label in ("W1", "W2"))
        self.workers = {w1.proc.pid: w1, w2.proc.pid: w2}
        self.s.report(
            WorkersStarted(
                command=shlex.join(["loomflow", *args]),
                settings=tuple(f"{name}={value}" for name, value in settings.items()),
                pids=(w1.proc.pid, w2.proc.pid),
                agents=(RESEARCHER, APPROVER),
                lease_seconds=UNATTENDED_LEASE_S,
                poll_seconds=WORKER_POLL_S,
            )
        )
        return w1, w2

    async def _wait(
        self, what: str, probe: Callable[[], Awaitable[_T | None]], alive: Sequence[_Child]
    ) -> _T:
        """Poll ``probe`` until it gives a value; DemoError when a child in ``alive``
        exits first, or after the scenario's timeout."""
        start = time.monotonic()
        while True:
            found = await probe()
            if found is not None:
                return found
            for child in alive:
                code = child.proc.poll()
                if code is not None:
                    raise DemoError(
                        f"{child.label} (pid {child.proc.pid}) exited with status {code} while "
                        f"the demo waited for {what}.\n{child.stderr_tail()}"
                    )
            if time.monotonic() - start > self.s.timeout_s:
                tails = "\n".join(f"{c.label}:\n{c.stderr_tail(5)}" for c in alive)
                raise DemoError(
                    f"waited {self.s.timeout_s:.0f} s for {what}; it never came.\n{tails}"
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _kill(self, child: _Child, tail: _Tail, turn: int) -> None:
        """SIGKILL ``child`` and report it, with the turns the log held once it died."""
        os.kill(child.proc.pid, signal.SIGKILL)
        try:
            # Reaping a SIGKILLed child is near-instant; the bound only guards the demo.
            code = await asyncio.to_thread(child.proc.wait, 10)
        except subprocess.TimeoutExpired as exc:
            raise DemoError(f"pid {child.proc.pid} did not die within 10 s of SIGKILL") from exc
        if code != -signal.SIGKILL:
            raise DemoError(
                f"{child.label} (pid {child.proc.pid}) ended with status {code}, not by "
                f"SIGKILL.\n{child.stderr_tail()}"
            )
        await tail.read()
        self.s.report(ProcessKilled(child.label, child.proc.pid, code, turn, len(tail.turns())))

    async def _taker(
        self, tail: _Tail, known: Sequence[str], alive: Sequence[_Child], what: str
    ) -> tuple[RunStarted, _Child]:
        """Wait for a worker's run.started on the session beyond ``known``; return it and
        the worker process it names."""

        async def probe() -> RunStarted | None:
            await tail.read()
            return tail.taken_over(known)

        started = await self._wait(what, probe, alive)
        name = started.payload.worker or ""
        child = self.workers.get(_pid_of(name) or -1)
        if child is None:
            raise DemoError(f"{name!r}, not W1 or W2, took {tail.scope.describe()} over")
        return started, child

    def _taken(
        self,
        tail: _Tail,
        started: RunStarted,
        child: _Child,
        reason: Literal["abandoned", "signalled"],
    ) -> TakenOver:
        silent = (started.at - tail.before(started).at).total_seconds()
        return TakenOver(
            who=child.label,
            worker=started.payload.worker or "",
            session_id=tail.scope.session_id,
            reason=reason,
            turns=len(tail.turns(before=started.seq)),
            silent_s=silent,
        )

    # -- a run whose process dies, then whose worker dies --------------------------------------

    async def _research(self, w1: _Child, w2: _Child) -> tuple[Unattended, _Child]:
        """The run of a process SIGKILLed mid-run, taken over by one worker, which is
        SIGKILLed in turn, and finished by the other; returns it and that other."""
        session_id = new_id("sess")
        tail = _Tail(self.runtime, session_id)
        runner = self._start_run_process(session_id)

        async def turns_reached() -> int | None:
            await tail.read()
            turns = tail.turns()
            return turns[-1] if len(turns) >= UNATTENDED_KILL_AFTER else None

        what = f"turn {UNATTENDED_KILL_AFTER} of {session_id}"
        turn = await self._wait(what, turns_reached, (runner, w1, w2))
        await self._kill(runner, tail, turn)

        started, first = await self._taker(
            tail, (), (w1, w2), "a worker to take over the run of the killed process"
        )
        self.s.report(self._taken(tail, started, first, "abandoned"))

        async def progressed() -> int | None:
            await tail.read()
            if any(isinstance(e, RunFinished) for e in tail.events):
                raise DemoError(
                    f"{first.label} finished {session_id} before the demo could kill it"
                )
            turns = tail.turns(started.run_id)
            return turns[-1] if turns else None

        turn = await self._wait(f"{first.label} to record a turn", progressed, (w1, w2))
        await self._kill(first, tail, turn)

        other = w2 if first is w1 else w1
        again, second = await self._taker(
            tail,
            (started.run_id,),
            (other,),
            f"{other.label} to take over the run of {first.label}",
        )
        self.s.report(self._taken(tail, again, second, "abandoned"))

        async def finished() -> str | None:
            status = await tail.status()
            if status in ("failed", "stuck"):
                raise DemoError(
                    f"{session_id} ended {status}, not finished.\n{second.stderr_tail()}"
                )
            return status if status == "finished" else None

        await self._wait(f"{second.label} to finish {session_id}", finished, (second,))
        await tail.read()
        return await self._unattended(tail, runner), second

    def _start_run_process(self, session_id: str) -> _Child:
        lease = ("--lease", f"{UNATTENDED_LEASE_S:g}")
        command = self.s.worker_command(session_id, *lease, "--step", "unattended")
        child = self._spawn(command, "run process")
        self.s.report(RunProcessStarted(child.proc.pid, session_id, UNATTENDED_LEASE_S))
        return child

    async def _unattended(self, tail: _Tail, runner: _Child) -> Unattended:
        """The session's runs beside the calls each process had answered."""
        calls = await self.s.calls.read()
        runs: list[ProcessRun] = []
        recorded = 0
        for event in tail.events:
            if not isinstance(event, RunStarted):
                continue
            worker = event.payload.worker
            child = runner if worker is None else self.workers.get(_pid_of(worker) or -1)
            if child is None:
                raise DemoError(f"{worker!r}, not W1 or W2, took {tail.scope.describe()} over")
            pid = child.proc.pid
            finished = any(
                isinstance(e, RunFinished) and e.run_id == event.run_id for e in tail.events
            )
            turns = tuple(tail.turns(event.run_id))
            answered = tuple(c.turn for c in calls if c.step == "unattended" and c.pid == pid)
            ended = (
                "finished"
                if finished
                else "SIGKILL"
                if child.proc.returncode == -signal.SIGKILL
                else "stopped"
            )
            runs.append(ProcessRun(child.label, pid, recorded, turns, answered, ended))
            recorded += len(turns)
        finish = next(e for e in reversed(tail.events) if isinstance(e, RunFinished))
        return Unattended(
            session_id=tail.scope.session_id,
            status=await tail.status(),
            turns=recorded,
            output=tail.answer(finish),
            runs=tuple(runs),
        )

    # -- a run that waits for the editor's approval --------------------------------------------

    async def _approval(self, survivor: _Child) -> None:
        session_id = new_id("sess")
        model = make_approver_model(self.s.calls)
        # The scene's lease, as its workers' runs have: had this process died mid-run, a
        # worker would take the run over seconds later.
        async with SqliteRuntime(self.s.db, lease_seconds=UNATTENDED_LEASE_S) as runtime:
            try:
                result = await build_approver(runtime, model).run(
                    APPROVAL_TASK, session_id=session_id
                )
            finally:
                await model.aclose()
        self.s.report(Waiting(APPROVER, session_id, APPROVAL_TASK, result))
        if result.stop_reason != "waiting" or result.waiting_for != APPROVAL_SIGNAL:
            raise DemoError(
                f"the approver's run ended {result.stop_reason!r} (waiting for "
                f"{result.waiting_for!r}), not waiting for {APPROVAL_SIGNAL!r}"
            )

        args = ["signal", session_id, APPROVAL_SIGNAL, "--json", json.dumps(APPROVAL_PAYLOAD)]
        args += ["--db", _typed(self.s.db)]
        done = await asyncio.to_thread(
            subprocess.run,
            [*LOOMFLOW_CLI, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = (done.stdout + done.stderr).strip()
        self.s.report(Signalled(shlex.join(["loomflow", *args]), done.returncode, output))
        if done.returncode != 0:
            raise DemoError(f"`loomflow signal` exited with status {done.returncode}: {output}")

        tail = _Tail(self.runtime, session_id)
        started, taker = await self._taker(
            tail, (), (survivor,), f"{survivor.label} to resume the approver's run"
        )
        if not any(isinstance(e, SignalSent) for e in tail.events):
            raise DemoError(f"{taker.label} resumed {session_id} before any signal was sent")
        self.s.report(self._taken(tail, started, taker, "signalled"))

        async def finished() -> str | None:
            status = await tail.status()
            return status if status in ("finished", "failed", "stuck") else None

        status = await self._wait(f"{taker.label} to finish {session_id}", finished, (survivor,))
        await tail.read()
        approved = self._approved(tail, status)
        self.s.report(approved)
        if status != "finished" or approved.tool_result != approved.expected:
            raise DemoError(
                f"the approver's run ended {status}, and its tool returned "
                f"{approved.tool_result!r}, not {approved.expected!r}"
            )

    def _approved(self, tail: _Tail, status: str) -> Approved:
        results = [
            message.content
            for event in tail.events
            if isinstance(event, TurnAppended)
            for message in event.payload.messages
            if message.role is Role.TOOL
        ]
        finish = [tail.answer(e) for e in tail.events if isinstance(e, RunFinished)]
        return Approved(
            session_id=tail.scope.session_id,
            status=status,
            tool_result=results[-1] if results else "",
            expected=editor_answer(APPROVAL_PAYLOAD),
            output=finish[-1] if finish else "",
        )

    async def _stop(self, survivor: _Child) -> None:
        """SIGTERM the surviving worker, as Ctrl-C would: it ends once its runs have."""
        survivor.proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(survivor.proc.wait, 30)
        except subprocess.TimeoutExpired as exc:
            raise DemoError(
                f"{survivor.label} (pid {survivor.proc.pid}) did not stop within 30 s of "
                f"SIGTERM.\n{survivor.stderr_tail()}"
            ) from exc
        # Each line starts with its time, so sorting interleaves the two workers' logs.
        lines = sorted(
            line
            for child in self.workers.values()
            for line in child.stderr_text().splitlines()
            if " loomflow.worker " in line
        )
        log = tuple(line.partition(" loomflow.worker ")[2] for line in lines)
        self.s.report(WorkersStopped(survivor.label, survivor.proc.pid, code, log))
        if code != 0:
            raise DemoError(
                f"{survivor.label} (pid {survivor.proc.pid}) exited with status {code} after "
                f"SIGTERM, not 0.\n{survivor.stderr_tail()}"
            )
