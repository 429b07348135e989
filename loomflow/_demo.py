"""`loomflow demo`: a research agent is SIGKILLed mid-run, resumed from its log, then forked.

The worker is a real child process writing to a SQLite log; the parent watches that log,
kills the worker, and continues the same session in its own process. Offline the model is
a ScriptedModel whose replies depend only on the transcript, so a different process asked
about the same session gives the same next reply; with ANTHROPIC_API_KEY set it is Claude.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from loomflow.agent import CONTINUATION_PROMPT, Agent, SessionState, Tuning
from loomflow.cli import WORKER_COMMAND
from loomflow.models.base import Model, ModelResponse, ToolSpec
from loomflow.models.scripted import Reply, ScriptedModel
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import (
    CheckpointMeta,
    CheckpointWritten,
    Event,
    Message,
    Role,
    RunResult,
    ToolCall,
    TurnAppended,
    new_id,
)

__all__ = ["DemoError", "run_demo", "run_worker"]

#: The hidden CLI subcommand the demo starts its worker process with.

SCRIPTED_LATENCY_S = 0.15
POLL_INTERVAL_S = 0.05


class DemoError(Exception):
    """The demo cannot go on; the message says why and what to try."""


# -- the research assistant's tools -------------------------------------------------------

FACTS: dict[str, str] = {
    "mars": (
        "Mars: mean radius 3,389.5 km; surface gravity 3.72 m/s^2; a solar day (sol) lasts "
        "24 h 39 min; two small moons, Phobos and Deimos."
    ),
    "earth": "Earth: mean radius 6,371 km; surface gravity 9.81 m/s^2; a solar day lasts 24 h.",
    "moon": (
        "The Moon: mean radius 1,737.4 km; surface gravity 1.62 m/s^2; a solar day lasts "
        "about 29.5 Earth days."
    ),
    "olympus mons": (
        "Olympus Mons, on Mars: about 21.9 km high, some 2.5 times the height of Mount "
        "Everest (8.85 km)."
    ),
}


def lookup_fact(topic: str) -> str:
    """Look up reference facts about a planet, moon or landmark.

    Args:
        topic: What to look up, e.g. "mars", "earth", "moon" or "olympus mons".
    """
    key = topic.strip().lower()
    if key not in FACTS:
        raise LookupError(f"no entry for {topic!r}; known topics: {', '.join(sorted(FACTS))}")
    return FACTS[key]


def word_count(text: str) -> int:
    """Count the words of a draft, to check it against a length limit.

    Args:
        text: The draft to count.
    """
    return len(text.split())


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponents above 64 are not supported")  # keeps the tool instant
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}")


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression (numbers, + - * / ** and parentheses).

    Args:
        expression: The expression, e.g. "3389.5 / 6371".
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _evaluate(tree)
    if not math.isfinite(value):
        raise ValueError(f"{expression!r} has no finite value")
    return round(value, 4)


TOOLS: tuple[Callable[..., Any], ...] = (lookup_fact, calculate, word_count)

# -- the task, the reviewer stop hook and the scripted replies ----------------------------

INSTRUCTIONS = (
    "You are a careful research assistant writing for a school science newsletter. Use "
    "lookup_fact for every fact, calculate for every number you derive and word_count to "
    "check length; never guess figures. End every pass with the full current draft."
)
TASK = (
    "Write a short briefing on Mars for the newsletter: how big it is next to Earth, how "
    "strong its gravity is and how long its day is."
)
FORK_PROMPT = "try a different approach from here"
REFINEMENTS: tuple[str, ...] = (
    "Reviewer: the draft estimates where it could be exact. Work the ratios out with the "
    "calculator and use the exact figures.",
    "Reviewer: the newsletter column holds at most 50 words. Count the words and tighten "
    "the draft to fit.",
    "Reviewer: give readers one number they can feel: what would a 40 kg student weigh on "
    "Mars, in Earth kilograms? Check the length again.",
)
#: A task prompt or the fork prompt starts an approach, which the reviewer reviews anew.
APPROACH_PROMPTS = (TASK, FORK_PROMPT)


def _stage(messages: Sequence[Message]) -> tuple[bool, int, int]:
    """(forked?, reviews asked since the approach began, model replies since the last ask).

    Continuation nudges are skipped on purpose: a reply resumed after a crash must be the
    one the interrupted process would have received.
    """
    forked, reviews, replies = False, 0, 0
    for message in messages:
        if message.role is Role.USER and message.content in APPROACH_PROMPTS:
            forked, reviews, replies = message.content == FORK_PROMPT, 0, 0
        elif message.role is Role.USER and message.content in REFINEMENTS:
            reviews, replies = reviews + 1, 0
        elif message.role is Role.ASSISTANT:
            replies += 1
    return forked, reviews, replies


def reviewer(state: SessionState) -> str | None:
    """Stop hook: send each draft back for the next review point until all are addressed."""
    _, reviews, _ = _stage(state.messages)
    return REFINEMENTS[reviews] if reviews < len(REFINEMENTS) else None


def _calls(*calls: tuple[str, dict[str, Any]], text: str = "") -> Message:
    # Ids are left empty: ScriptedModel numbers them per turn, as an API would assign them.
    return Message.assistant(
        text, tool_calls=[ToolCall(id="", name=name, arguments=args) for name, args in calls]
    )


def _pct(expression: str) -> str:
    return f"{calculate(expression) * 100:.0f}%"


DRAFT_1 = (
    "Mars is roughly half the size of Earth, its gravity is about a third of ours, and a day "
    "there lasts a little longer than 24 hours. Two small moons, Phobos and Deimos, circle it."
)
DRAFT_2 = (
    f"Mars has a radius of 3,389.5 km, {_pct('3389.5 / 6371')} of Earth's, and its surface "
    f"gravity of 3.72 m/s^2 is {_pct('3.72 / 9.81')} of what we feel at home. A Martian day, "
    "called a sol, lasts 24 hours 39 minutes, so the clock barely changes, but everything "
    "weighs far less. Two small moons, Phobos and Deimos, circle the planet."
)
DRAFT_3 = (
    f"Mars is {_pct('3389.5 / 6371')} as wide as Earth and its gravity is "
    f"{_pct('3.72 / 9.81')} of ours. A Martian day, a sol, lasts 24 hours 39 minutes. Two "
    "small moons, Phobos and Deimos, circle it."
)
STUDENT_ON_MARS = f"{calculate('40 * 3.72 / 9.81'):.1f}"
FINAL = (
    f"Mars is {_pct('3389.5 / 6371')} as wide as Earth and its gravity is "
    f"{_pct('3.72 / 9.81')} of ours: a 40 kg student would weigh just {STUDENT_ON_MARS} kg "
    "there. A Martian day, a sol, lasts 24 hours 39 minutes. Phobos and Deimos are its moons."
)
FORK_DRAFT = (
    f"Picture the Moon you see at night: Mars is {calculate('3389.5 / 1737.4'):.1f} times as "
    f"wide, and its gravity is {calculate('3.72 / 1.62'):.1f} times the Moon's, yet still only "
    f"{_pct('3.72 / 9.81')} of Earth's. A day on Mars lasts 24 hours 39 minutes, while a lunar "
    "day drags on for about 29.5 Earth days."
)
FORK_FINAL = (
    f"Mars is {calculate('3389.5 / 1737.4'):.1f} times as wide as our Moon, with "
    f"{calculate('3.72 / 1.62'):.1f} times its gravity, yet a 40 kg student would weigh only "
    f"{STUDENT_ON_MARS} kg there. A Martian day lasts 24 hours 39 minutes; a lunar day, 29.5 "
    "Earth days."
)

#: Replies per approach (main, fork) and per review round, in the order they are asked for.
MAIN_SCRIPT: tuple[tuple[Reply, ...], ...] = (
    (
        _calls(
            ("lookup_fact", {"topic": "mars"}),
            ("lookup_fact", {"topic": "earth"}),
            text="I'll start from the reference facts for both planets.",
        ),
        DRAFT_1,
    ),
    (
        _calls(("calculate", {"expression": "3389.5 / 6371"})),
        _calls(("calculate", {"expression": "3.72 / 9.81"})),
        f"With exact ratios:\n\n{DRAFT_2}",
    ),
    (
        _calls(("word_count", {"text": DRAFT_2})),
        f"The draft had {word_count(DRAFT_2)} words; tightened:\n\n{DRAFT_3}",
    ),
    (
        _calls(("calculate", {"expression": "40 * 3.72 / 9.81"})),
        _calls(("word_count", {"text": FINAL})),
        f"Final briefing ({word_count(FINAL)} words):\n\n{FINAL}",
    ),
)
FORK_SCRIPT: tuple[tuple[Reply, ...], ...] = (
    (
        _calls(
            ("lookup_fact", {"topic": "moon"}),
            text="Different angle: anchor Mars on the Moon, which every reader has seen.",
        ),
        _calls(
            ("calculate", {"expression": "3389.5 / 1737.4"}),
            ("calculate", {"expression": "3.72 / 1.62"}),
        ),
        FORK_DRAFT,
    ),
    (f"Every ratio above already comes from the calculator:\n\n{FORK_DRAFT}",),
    (
        _calls(("word_count", {"text": FORK_DRAFT})),
        f"The draft had {word_count(FORK_DRAFT)} words; tightened:\n\n{FORK_FINAL}",
    ),
    (f"The 40 kg student is already in, and it fits the column:\n\n{FORK_FINAL}",),
)
AFTER_INTERRUPTION = (
    "Picking up after the interruption: the draft above is complete for this review point."
)
#: Model calls of the worker's run when nothing interrupts it.
MAIN_TURNS = sum(len(replies) for replies in MAIN_SCRIPT)


def scripted_reply(messages: Sequence[Message]) -> Reply:
    """The next reply, chosen from the transcript alone so any process picks the same one."""
    forked, reviews, replies = _stage(messages)
    script = FORK_SCRIPT if forked else MAIN_SCRIPT
    round_ = script[min(reviews, len(script) - 1)]
    return round_[replies] if replies < len(round_) else AFTER_INTERRUPTION


# -- models and agents -----------------------------------------------------------------------


class _CountingModel:
    """Counts the requests really sent to a model that keeps no record of its own."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.name = inner.name
        self.sent = 0

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        self.sent += 1
        return await self.inner.complete(messages, tools)


@dataclass
class Backend:
    """The model one process uses, and how many calls that process has sent to it."""

    model: Model
    label: str
    calls_sent: Callable[[], int]

    async def aclose(self) -> None:
        inner = getattr(self.model, "inner", self.model)
        close = getattr(inner, "aclose", None)
        if close is not None:
            await close()


def make_backend(kind: str, model_name: str) -> Backend:
    if kind == "anthropic":
        from loomflow.models.anthropic import AnthropicModel

        counted = _CountingModel(AnthropicModel(model_name))
        return Backend(
            counted, f"Claude ({model_name}) via ANTHROPIC_API_KEY", lambda: counted.sent
        )
    scripted = ScriptedModel(scripted_reply, name="scripted-demo", latency=SCRIPTED_LATENCY_S)
    return Backend(
        scripted,
        f"offline ScriptedModel ({SCRIPTED_LATENCY_S:.2f} s per call; set ANTHROPIC_API_KEY "
        f"to use {model_name})",
        lambda: len(scripted.calls),
    )


def build_agent(runtime: SqliteRuntime, model: Model) -> Agent:
    return Agent(
        INSTRUCTIONS,
        model=model,
        runtime=runtime,
        tuning=Tuning(checkpoint=True, stop_hooks=[reviewer]),
        tools=TOOLS,
    )


# -- the worker process --------------------------------------------------------------------


def run_worker(db: Path, session_id: str, backend: str, model_name: str) -> int:
    """Run the task on ``session_id`` until it finishes (or, in the demo, is killed)."""
    asyncio.run(_work(db, session_id, backend, model_name))
    return 0


async def _work(db: Path, session_id: str, backend_kind: str, model_name: str) -> None:
    backend = make_backend(backend_kind, model_name)
    runtime = SqliteRuntime(db)
    try:
        await build_agent(runtime, backend.model).run(TASK, session_id=session_id)
    finally:
        await backend.aclose()
        await runtime.close()


# -- the demo ----------------------------------------------------------------------------------


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]

    def stderr_tail(self, lines: int = 15) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip()
        return "\n".join(text.splitlines()[-lines:]) or "(no output on stderr)"


def run_demo(
    db: Path, kill_after_turns: int, model_name: str, console: Console | None = None
) -> int:
    """Run the whole demo; return the process exit code."""
    console = console or Console(highlight=False)
    backend_kind = "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "scripted"
    try:
        if kill_after_turns < 1:
            raise DemoError("--kill-after-turns must be at least 1")
        if backend_kind == "scripted" and kill_after_turns >= MAIN_TURNS:
            raise DemoError(
                f"the offline run makes {MAIN_TURNS} model calls in all, so it would finish "
                f"before turn {kill_after_turns}; use --kill-after-turns 1 to {MAIN_TURNS - 1}"
            )
        _reset_db(db)
        asyncio.run(_Demo(console, db.resolve(), kill_after_turns, model_name, backend_kind).run())
    except DemoError as exc:
        console.print(Panel(escape(str(exc)), title="demo failed", border_style="red"))
        return 1
    return 0


def _reset_db(db: Path) -> None:
    if not db.parent.is_dir():
        raise DemoError(f"directory {db.parent} does not exist for --db {db}")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _usd(value: float) -> str:
    return f"${value:.4f}"


def _short(text: str, width: int = 68) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _calls_were(count: int) -> str:
    return f"{count} model call was" if count == 1 else f"{count} model calls were"


def _call_text(call: ToolCall) -> str:
    args = ", ".join(f"{k}={_short(repr(v), 24)}" for k, v in call.arguments.items())
    return f"{call.name}({args})"


def _when(meta: CheckpointMeta) -> str:
    return meta.created_at.strftime("%H:%M:%S.%f")[:-3]


class _Demo:
    def __init__(
        self, console: Console, db: Path, kill_after_turns: int, model_name: str, backend_kind: str
    ) -> None:
        self.console = console
        self.db = db
        self.kill_after = kill_after_turns
        self.model_name = model_name
        self.backend_kind = backend_kind
        self.session_id = new_id("sess")
        self.scope = Scope(self.session_id)
        # A real model can take a minute on a slow pass; the scripted one never should.
        offline = backend_kind == "scripted"
        self.timeout_s = 60.0 if offline else 600.0
        self.stall_s = 20.0 if offline else 180.0

    async def run(self) -> None:
        backend = make_backend(self.backend_kind, self.model_name)
        runtime = SqliteRuntime(self.db)
        try:
            await self._steps(runtime, backend)
        finally:
            await backend.aclose()
            await runtime.close()

    async def _steps(self, runtime: SqliteRuntime, backend: Backend) -> None:
        c = self.console
        agent = build_agent(runtime, backend.model)
        self._intro(backend)

        c.rule("[bold]1 · The agent runs in a worker process")
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
        recorded_turns, crash_cost, crash_ckpts = await self._show_log(runtime)

        c.rule("[bold]3 · Resume in this process")
        sent_before = backend.calls_sent()
        resumed = await agent.resume(session_id=self.session_id)
        resume_calls = backend.calls_sent() - sent_before
        self._show_resume(resumed, resume_calls, crash_cost, crash_ckpts)

        c.rule("[bold]4 · Checkpoints of the session")
        metas = await agent.list_checkpoints(self.session_id)
        self._show_checkpoints(metas, {m.checkpoint_id for m in crash_ckpts})

        c.rule("[bold]5 · Fork from an older checkpoint")
        if len(metas) < 2:
            raise DemoError("the session has a single checkpoint, so there is nothing to fork")
        older = metas[-1]
        events_before = len(await runtime.store.read_events(self.scope))
        sent_before = backend.calls_sent()
        forked = await agent.resume(
            FORK_PROMPT, session_id=self.session_id, from_checkpoint=older.checkpoint_id
        )
        fork_calls = backend.calls_sent() - sent_before
        metas_after = await agent.list_checkpoints(self.session_id)
        events_after = len(await runtime.store.read_events(self.scope))
        self._show_fork(forked, fork_calls, older, metas, metas_after, events_before, events_after)

        c.rule("[bold]6 · Summary")
        self._summary(killed, recorded_turns, resumed, resume_calls, forked, fork_calls, older)

    # -- step 1 and 2: the worker ----------------------------------------------------------

    def _intro(self, backend: Backend) -> None:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("model", escape(backend.label))
        grid.add_row("log", escape(str(self.db)))
        grid.add_row("session", self.session_id)
        grid.add_row("tools", ", ".join(tool.__name__ for tool in TOOLS))
        grid.add_row("task", escape(TASK))
        grid.add_row("reviewer", f"a stop hook that sends the draft back {len(REFINEMENTS)} times")
        grid.add_row("plan", f"SIGKILL the worker after {self.kill_after} turns, resume, fork")
        self.console.print(
            Panel(grid, title="loomflow demo · crash, resume, fork", border_style="cyan")
        )

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
            self.backend_kind,
            "--model",
            self.model_name,
        ]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        self.console.print(
            f"started worker [bold]pid {proc.pid}[/]: python -m loomflow.cli {WORKER_COMMAND} …\n"
            f"  agent.run(task, session_id={self.session_id})"
        )
        return _Worker(proc, stderr)

    async def _watch_and_kill(
        self, runtime: SqliteRuntime, worker: _Worker
    ) -> subprocess.Popen[bytes]:
        proc = worker.proc
        start = last_progress = time.monotonic()
        seen = turns = 0
        while True:
            events = await runtime.store.read_events(self.scope, after_seq=seen)
            for event in events:
                self._print_event(event)
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
            self._print_event(event)

        self.console.rule(f"[bold]2 · SIGKILL the worker after {self.kill_after} turns")
        self.console.print(f"sent SIGKILL to pid {proc.pid} once the log held {turns} turns")
        if code != -signal.SIGKILL:
            raise DemoError(
                f"the worker (pid {proc.pid}) ended with status {code}, not by SIGKILL: it "
                f"probably finished first; try a smaller --kill-after-turns.\n"
                f"{worker.stderr_tail()}"
            )
        self.console.print(
            f"[bold red]worker pid {proc.pid} was killed by SIGKILL[/] (exit status {code}); "
            "it ran no cleanup"
        )
        return proc

    def _print_event(self, event: Event) -> None:
        if isinstance(event, CheckpointWritten):
            self.console.print(
                f"  [green]checkpoint[/] {event.payload.checkpoint_id} at turn {event.payload.turn}"
            )
            return
        if not isinstance(event, TurnAppended):
            return
        for message in event.payload.messages:
            if message.role is Role.ASSISTANT:
                turn = event.payload.step_key or "model"
                label = f"  [bold]{escape(turn.replace('model:', 'turn '))}[/]"
                if message.tool_calls:
                    calls = ", ".join(_call_text(call) for call in message.tool_calls)
                    self.console.print(f"{label}  calls {escape(_short(calls, 60))}")
                else:
                    self.console.print(f"{label}  “{escape(_short(message.content, 58))}”")
            elif message.role is Role.TOOL:
                self.console.print(f"          [dim]↳ {escape(_short(message.content, 62))}[/]")
            elif message.role is Role.USER:
                who = "task" if message.content in APPROACH_PROMPTS else "hook"
                self.console.print(f"  [cyan]{who}[/]    {escape(_short(message.content, 62))}")

    async def _show_log(self, runtime: SqliteRuntime) -> tuple[int, float, list[CheckpointMeta]]:
        row = await runtime.store.session(self.scope)
        if row is None:
            raise DemoError(f"the log holds no session {self.session_id} after the kill")
        events = await runtime.store.read_events(self.scope)
        ckpts = await runtime.list_checkpoints(self.scope)
        table = Table(
            title="What the log holds after the kill", title_justify="left", show_header=False
        )
        table.add_column()
        table.add_column(justify="right")
        table.add_row("events", str(len(events)))
        table.add_row("turns (model calls the worker recorded)", str(row.turns))
        table.add_row("cost so far", _usd(row.usage.cost_usd))
        table.add_row(
            "checkpoints",
            ", ".join(f"turn {m.turn}" for m in reversed(ckpts)) or "none yet",
        )
        status = "running: no run.finished event" if row.status == "running" else row.status
        table.add_row("session status", status)
        self.console.print(table)
        return row.turns, row.usage.cost_usd, ckpts

    # -- step 3 to 6: resume, list, fork, summary -----------------------------------------------

    def _show_resume(
        self,
        result: RunResult,
        calls_now: int,
        crash_cost: float,
        crash_ckpts: list[CheckpointMeta],
    ) -> None:
        c = self.console
        start = (
            f"latest checkpoint (turn {crash_ckpts[0].turn}) plus the log after it"
            if crash_ckpts
            else "log alone (no checkpoint had been written yet)"
        )
        c.print(
            f"agent.resume(session_id={result.session_id})\n"
            f"  restored from the {start},\n  then nudged with “{CONTINUATION_PROMPT}”"
        )
        table = Table(show_header=False)
        table.add_column()
        table.add_column(justify="right")
        table.add_row("turns restored from the log", str(result.restored_turns))
        table.add_row("model calls sent by this process", str(calls_now))
        table.add_row("turns in the session now", str(result.turns))
        table.add_row("cost restored from the log", _usd(crash_cost))
        table.add_row("cost of the new calls", _usd(result.cost_usd - crash_cost))
        table.add_row("cost rolled up in the RunResult", _usd(result.cost_usd))
        table.add_row("stop reason", result.stop_reason)
        c.print(table)
        c.print(
            f"[bold green]{_calls_were(result.restored_turns)} not repeated[/]: their replies "
            "came from the log."
        )
        if calls_now != result.turns - result.restored_turns or calls_now != result.model_calls:
            c.print(
                f"[yellow]note:[/] {calls_now} calls were sent but the session grew by "
                f"{result.turns - result.restored_turns} turns (RunResult.model_calls="
                f"{result.model_calls})"
            )
        c.print(
            "[dim]A call still in flight when the worker died leaves no record, so it is the "
            "one call that can be sent twice.[/]"
        )
        c.print(Panel(escape(result.output), title="resumed run's answer", border_style="green"))

    def _show_checkpoints(self, metas: list[CheckpointMeta], before_kill: set[str]) -> None:
        table = Table(title=f"agent.list_checkpoints({self.session_id})", title_justify="left")
        table.add_column("checkpoint id", no_wrap=True)
        table.add_column("turn", justify="right")
        table.add_column("created_at (UTC)")
        table.add_column("written by")
        for meta in metas:
            by = "worker (pre-kill)" if meta.checkpoint_id in before_kill else "resume"
            table.add_row(meta.checkpoint_id, str(meta.turn), _when(meta), by)
        self.console.print(table)
        self.console.print("[dim]newest first; each pass of the loop writes one checkpoint[/]")

    def _show_fork(
        self,
        result: RunResult,
        calls_now: int,
        older: CheckpointMeta,
        before: list[CheckpointMeta],
        after: list[CheckpointMeta],
        events_before: int,
        events_after: int,
    ) -> None:
        c = self.console
        c.print(
            f"agent.resume(“{FORK_PROMPT}”,\n"
            f"             session_id={self.session_id},\n"
            f"             from_checkpoint={older.checkpoint_id})  [dim]# oldest[/]"
        )
        table = Table(show_header=False)
        table.add_column()
        table.add_column()
        table.add_row("new session", result.session_id)
        table.add_row("parent session", str(result.parent_session_id))
        table.add_row("parent checkpoint", f"{result.parent_checkpoint_id} (turn {older.turn})")
        table.add_row("turns copied from the checkpoint", str(result.restored_turns))
        table.add_row("model calls sent by this process", str(calls_now))
        table.add_row("cost, copied turns included", _usd(result.cost_usd))
        c.print(table)
        same = [m.checkpoint_id for m in before] == [m.checkpoint_id for m in after]
        untouched = same and events_before == events_after
        verdict = "[bold green]untouched[/]" if untouched else "[bold red]CHANGED[/]"
        c.print(
            f"original session {self.session_id}: {verdict}\n"
            f"  checkpoints {len(before)} before the fork, {len(after)} after (same ids); "
            f"events {events_before} → {events_after}"
        )
        if not untouched:
            raise DemoError("forking changed the original session's checkpoints or events")
        c.print(Panel(escape(result.output), title="forked run's answer", border_style="magenta"))

    def _summary(
        self,
        killed: subprocess.Popen[bytes],
        recorded_turns: int,
        resumed: RunResult,
        resume_calls: int,
        forked: RunResult,
        fork_calls: int,
        older: CheckpointMeta,
    ) -> None:
        table = Table(box=None, padding=(0, 2))
        table.add_column("process")
        table.add_column("what happened")
        table.add_column("calls sent", justify="right")
        table.add_column("turns restored", justify="right")
        table.add_row(
            f"worker {killed.pid}",
            f"SIGKILLed at turn {recorded_turns}",
            f"{recorded_turns} recorded",
            "-",
        )
        table.add_row(
            "parent",
            f"resumed to turn {resumed.turns}",
            str(resume_calls),
            str(resumed.restored_turns),
        )
        table.add_row(
            "parent",
            f"forked at turn {older.turn}",
            str(fork_calls),
            str(forked.restored_turns),
        )
        lines = Text(
            f"Starting over after the crash would have re-sent {resumed.restored_turns} model "
            f"call(s); the resume sent {resume_calls}, and the session's cost "
            f"({_usd(resumed.cost_usd)}) counts every turn once."
        )
        self.console.print(Panel(Group(table, Text(), lines), title="summary", border_style="cyan"))
        self.console.print(
            f"resumed {resumed.session_id}  ({resumed.turns} turns, {resumed.restored_turns} "
            "restored)"
        )
        self.console.print(f"forked  {forked.session_id}  (parent {forked.parent_session_id})")
