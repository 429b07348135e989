"""How the demo (`loomflow-demo`) looks in a terminal: rich draws each step the scenario reports.

Needs rich, which the demo's distribution installs (loomflow's ``[cli]`` extra). What
happens and what counts as success is the scenario's; this module only words and lays out
the records it is handed, so the same scenario could be shown another way, or checked by a
test without a terminal.
"""

from __future__ import annotations

from pathlib import Path
from typing import assert_never

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from loomflow.schemas import (
    CheckpointMeta,
    CheckpointWritten,
    EventBase,
    Role,
    ToolCall,
    TurnAppended,
)
from loomflow_demo.assistant import APPROACH_PROMPTS
from loomflow_demo.scenario import (
    WORKER_MODULE,
    Approved,
    Audited,
    CheckpointList,
    Counted,
    DemoError,
    Forked,
    Intro,
    ProcessKilled,
    Resumed,
    Resuming,
    RunProcessStarted,
    Signalled,
    Step,
    Summary,
    TakenOver,
    Unattended,
    Waiting,
    WebConsole,
    WorkerKilled,
    WorkersStarted,
    WorkersStopped,
    WorkerStarted,
    play,
)

__all__ = ["DemoView", "run_demo"]


def run_demo(
    db: Path, kill_after_turns: int, model_name: str, console: Console | None = None
) -> int:
    """Run the whole demo in this terminal; return the process exit code."""
    console = console or Console(highlight=False)
    try:
        play(db, kill_after_turns, model_name, DemoView(console).show)
    except DemoError as exc:
        console.print(Panel(escape(str(exc)), title="demo failed", border_style="red"))
        return 1
    return 0


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


class DemoView:
    """Draws each step as it is reported; a numbered heading marks where each part begins."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def show(self, step: Step) -> None:
        match step:
            case Intro():
                self._intro(step)
                self.console.rule("[bold]1 · The agent runs in a worker process")
            case WorkerStarted():
                self.console.print(
                    f"started worker [bold]pid {step.pid}[/]: python -m {WORKER_MODULE} "
                    f"…\n  agent.run(task, session_id={step.session_id})"
                )
            case EventBase():
                self._event(step)
            case WorkerKilled():
                self._killed(step)
                self._log(step)
            case Resuming():
                self._resuming(step)
            case Resumed():
                self._resumed(step)
            case CheckpointList():
                self.console.rule("[bold]4 · Checkpoints of the session")
                self._checkpoints(step)
            case Forked():
                self._forked(step)
            case Summary():
                self.console.rule("[bold]6 · Summary")
                self._summary(step)
            case WorkersStarted():
                self.console.rule("[bold]7 · Unattended: loomflow worker finishes a run it finds")
                self._workers_started(step)
            case RunProcessStarted():
                self._run_process_started(step)
            case ProcessKilled():
                self.console.print(
                    f"  [bold red]SIGKILL[/] {step.who} (pid {step.pid}) after its turn "
                    f"{step.turn}; the log holds {step.turns} turns"
                )
            case TakenOver():
                self._taken_over(step)
            case Unattended():
                self._unattended(step)
            case Waiting():
                self.console.rule("[bold]8 · A run that waits for a person's approval")
                self._waiting(step)
            case Signalled():
                self._signalled(step)
            case Approved():
                self._approved(step)
            case WorkersStopped():
                self._stopped(step)
            case Counted():
                self.console.rule("[bold]9 · The log's other readers: stats and audit")
                self._counted(step)
            case Audited():
                self._audited(step)
            case WebConsole():
                self._web_console(step)
            case _:
                assert_never(step)

    # -- step 1 and 2: the worker ----------------------------------------------------------

    def _intro(self, intro: Intro) -> None:
        if intro.backend == "anthropic":
            model = f"Claude ({intro.model_name}) via ANTHROPIC_API_KEY"
        else:
            model = (
                f"offline ScriptedModel ({intro.scripted_latency_s:.2f} s per call; set "
                f"ANTHROPIC_API_KEY to use {intro.model_name})"
            )
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("model", escape(model))
        grid.add_row("log", escape(str(intro.db)))
        grid.add_row("session", intro.session_id)
        grid.add_row("tools", ", ".join(intro.tools))
        grid.add_row("task", escape(intro.task))
        grid.add_row("reviewer", f"a stop hook that sends the draft back {intro.reviews} times")
        grid.add_row(
            "plan",
            f"SIGKILL the worker after {intro.kill_after_turns} turns, resume, fork; then "
            "`loomflow worker` processes finish runs nobody resumes",
        )
        self.console.print(
            Panel(
                grid, title="loomflow-demo · crash, resume, fork, unattended", border_style="cyan"
            )
        )

    def _event(self, event: EventBase) -> None:
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

    def _killed(self, killed: WorkerKilled) -> None:
        self.console.rule(f"[bold]2 · SIGKILL the worker after {killed.kill_after_turns} turns")
        self.console.print(
            f"sent SIGKILL to pid {killed.pid} once the log held {killed.turns_at_kill} turns"
        )
        self.console.print(
            f"[bold red]worker pid {killed.pid} was killed by SIGKILL[/] (exit status "
            f"{killed.exit_status}); it ran no cleanup"
        )

    def _log(self, log: WorkerKilled) -> None:
        table = Table(
            title="What the log holds after the kill", title_justify="left", show_header=False
        )
        table.add_column()
        table.add_column(justify="right")
        table.add_row("events", str(log.events))
        table.add_row("turns (model calls the worker recorded)", str(log.turns))
        table.add_row("cost so far", _usd(log.cost_usd))
        table.add_row(
            "checkpoints",
            ", ".join(f"turn {m.turn}" for m in reversed(log.checkpoints)) or "none yet",
        )
        status = "running: no run.finished event" if log.status == "running" else log.status
        table.add_row("session status", status)
        self.console.print(table)

    # -- step 3 to 6: resume, list, fork, summary -----------------------------------------------

    def _resuming(self, resuming: Resuming) -> None:
        if resuming.fork:
            self._forking(resuming)
            return
        self.console.rule("[bold]3 · Resume in this process")
        start = (
            f"latest checkpoint (turn {resuming.checkpoint.turn}) plus the log after it"
            if resuming.checkpoint is not None
            else "log alone (no checkpoint had been written yet)"
        )
        self.console.print(
            f"agent.resume(session_id={resuming.session_id})\n"
            f"  restored from the {start},\n  then nudged with “{resuming.prompt}”"
        )

    def _forking(self, forking: Resuming) -> None:
        self.console.rule("[bold]5 · Fork from an older checkpoint")
        checkpoint_id = forking.checkpoint.checkpoint_id if forking.checkpoint else "latest"
        self.console.print(
            f"agent.resume(“{forking.prompt}”,\n"
            f"             session_id={forking.session_id},\n"
            f"             from_checkpoint={checkpoint_id})  [dim]# oldest[/]"
        )

    def _resumed(self, resumed: Resumed) -> None:
        c = self.console
        result, sent = resumed.result, len(resumed.calls)
        table = Table(show_header=False)
        table.add_column()
        table.add_column(justify="right")
        table.add_row("turns restored from the log", str(result.restored_turns))
        table.add_row("model calls sent by this process", str(sent))
        table.add_row("turns in the session now", str(result.turns))
        table.add_row("cost restored from the log", _usd(resumed.cost_before))
        table.add_row("cost of the new calls", _usd(result.cost_usd - resumed.cost_before))
        table.add_row("cost rolled up in the RunResult", _usd(result.cost_usd))
        table.add_row("stop reason", result.stop_reason)
        c.print(table)
        if resumed.repeated:
            c.print(
                f"[bold red]{_calls_were(resumed.repeated)} sent again[/]: the log already "
                "held their turns."
            )
        else:
            c.print(
                f"[bold green]{_calls_were(result.restored_turns)} not repeated[/]: their "
                "replies came from the log."
            )
        if sent != result.turns - result.restored_turns or sent != result.model_calls:
            c.print(
                f"[yellow]note:[/] {sent} calls were sent but the session grew by "
                f"{result.turns - result.restored_turns} turns (RunResult.model_calls="
                f"{result.model_calls})"
            )
        c.print(
            "[dim]A call still in flight when the worker died leaves no record, so it is the "
            "one call that can be sent twice.[/]"
        )
        c.print(Panel(escape(result.output), title="resumed run's answer", border_style="green"))

    def _checkpoints(self, listed: CheckpointList) -> None:
        table = Table(title=f"agent.list_checkpoints({listed.session_id})", title_justify="left")
        table.add_column("checkpoint id", no_wrap=True)
        table.add_column("turn", justify="right")
        table.add_column("created_at (UTC)")
        table.add_column("written by")
        for meta in listed.checkpoints:
            by = "worker (pre-kill)" if meta.checkpoint_id in listed.written_by_worker else "resume"
            table.add_row(meta.checkpoint_id, str(meta.turn), _when(meta), by)
        self.console.print(table)
        self.console.print("[dim]newest first; each pass of the loop writes one checkpoint[/]")

    def _forked(self, forked: Forked) -> None:
        c = self.console
        result = forked.result
        table = Table(show_header=False)
        table.add_column()
        table.add_column()
        table.add_row("new session", result.session_id)
        table.add_row("parent session", str(result.parent_session_id))
        table.add_row(
            "parent checkpoint", f"{result.parent_checkpoint_id} (turn {result.restored_turns})"
        )
        table.add_row("turns copied from the checkpoint", str(result.restored_turns))
        table.add_row("model calls sent by this process", str(len(forked.calls)))
        table.add_row("cost, copied turns included", _usd(result.cost_usd))
        c.print(table)
        untouched = forked.original_untouched
        verdict = "[bold green]untouched[/]" if untouched else "[bold red]CHANGED[/]"
        c.print(
            f"original session {result.parent_session_id}: {verdict}\n"
            f"  checkpoints {len(forked.checkpoints_before)} before the fork, "
            f"{len(forked.checkpoints_after)} after (same ids); "
            f"events {forked.events_before} → {forked.events_after}"
        )
        if untouched:
            c.print(
                Panel(escape(result.output), title="forked run's answer", border_style="magenta")
            )

    def _counted(self, counted: Counted) -> None:
        stats = counted.stats
        # padding 1: the approver's model name fits in an 80-column terminal
        table = Table(box=None, padding=(0, 1), title=f"loomflow stats ({counted.stats_db.name})")
        for column in ("model", "runs", "turns", "tool calls", "tokens in / out", "cost"):
            table.add_column(column, justify="left" if column == "model" else "right")
        for label, c in stats.by("model"):
            table.add_row(
                label,
                str(c.runs_started),
                str(c.turns),
                str(c.tool_calls),
                f"{c.input_tokens:,} / {c.output_tokens:,}",
                _usd(c.cost_usd),
            )
        self.console.print(table)

    def _audited(self, audited: Audited) -> None:
        check = audited.verification
        sessions = len(check.sessions)
        self.console.print(
            f"loomflow audit: {audited.entries} events chained by hash into {audited.trail.name}"
        )
        table = Table(box=None, padding=(0, 2))
        for column in ("session", "entries", "verified"):
            table.add_column(column)
        for session in check.sessions:
            table.add_row(
                session.session_id,
                str(session.entries),
                "[green]ok[/]" if not session.findings else f"[red]{len(session.findings)}[/]",
            )
        self.console.print(table)
        verdict = (
            f"loomflow audit verify: {sessions} sessions match the log"
            if not check.problems
            else f"[red]loomflow audit verify: {check.problems} problems[/]"
        )
        self.console.print(verdict)

    def _web_console(self, console: WebConsole) -> None:
        self.console.print(
            f"see every session, run, checkpoint and fork in the web console: "
            f"[bold]{escape(console.command)}[/], then open {console.url}",
            soft_wrap=True,
        )

    def _summary(self, summary: Summary) -> None:
        resumed, forked = summary.resumed.result, summary.forked.result
        resume_calls = len(summary.resumed.calls)
        table = Table(box=None, padding=(0, 2))
        table.add_column("process")
        table.add_column("what happened")
        table.add_column("calls answered", justify="right")
        table.add_column("turns restored", justify="right")
        table.add_row(
            f"worker {summary.killed.pid}",
            f"SIGKILLed at turn {summary.killed.turns}",
            f"{summary.worker_calls}",
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
            f"forked at turn {forked.restored_turns}",
            str(len(summary.forked.calls)),
            str(forked.restored_turns),
        )
        # answered before the SIGKILL, killed before its turn was recorded
        unrecorded = summary.worker_calls - summary.killed.turns
        in_flight = (
            f" {_calls_were(unrecorded)} answered to the worker but not yet recorded when "
            "it died, so the resume asked again."
            if unrecorded > 0
            else ""
        )
        lines = Text(
            f"Starting over after the crash would have re-sent {resumed.restored_turns} model "
            f"call(s); the resume sent {resume_calls}, and the session's cost "
            f"({_usd(resumed.cost_usd)}) counts every turn once.{in_flight}"
        )
        self.console.print(Panel(Group(table, Text(), lines), title="summary", border_style="cyan"))
        self.console.print(
            f"resumed {resumed.session_id}  ({resumed.turns} turns, {resumed.restored_turns} "
            "restored)"
        )
        self.console.print(f"forked  {forked.session_id}  (parent {forked.parent_session_id})")

    # -- steps 7 and 8: the unattended scene ------------------------------------------------------

    def _workers_started(self, started: WorkersStarted) -> None:
        c = self.console
        pids = " and ".join(f"[bold]W{n} pid {pid}[/]" for n, pid in enumerate(started.pids, 1))
        c.print(f"started two workers, {pids}, each as")
        c.print(f"  [bold]$ {escape(started.command)}[/]", soft_wrap=True)
        c.print(
            f"  [dim]in an environment with {escape(' '.join(started.settings))}[/]", soft_wrap=True
        )
        c.print(
            f"  each hosts {' and '.join(started.agents)}, and looks for runs every "
            f"{started.poll_seconds:g} s;\n  a run is abandoned once its log has been silent "
            f"for its lease, {started.lease_seconds:g} s here"
        )

    def _run_process_started(self, started: RunProcessStarted) -> None:
        self.console.print(
            f"started the run process [bold]pid {started.pid}[/] ({WORKER_MODULE}, lease "
            f"{started.lease_seconds:g} s)\n  agent.run(task, session_id={started.session_id})"
        )

    def _taken_over(self, taken: TakenOver) -> None:
        why = (
            f"signalled: {taken.silent_s:.1f} s after the signal"
            if taken.reason == "signalled"
            else f"abandoned: no event for {taken.silent_s:.1f} s"
        )
        self.console.print(
            f"  [bold green]{taken.who} took the run over[/] at turn {taken.turns} ({why})\n"
            f"    [dim]run.started payload.worker={escape(taken.worker)}[/]"
        )

    def _unattended(self, done: Unattended) -> None:
        table = Table(box=None, padding=(0, 2))
        table.add_column("process")
        table.add_column("pid", justify="right")
        table.add_column("restored", justify="right")
        table.add_column("recorded", justify="right")
        table.add_column("calls", justify="right")
        table.add_column("ended")
        for run in done.runs:
            table.add_row(
                run.who,
                str(run.pid),
                str(run.restored_turns),
                _span(run.turns),
                str(len(run.calls)),
                run.ended,
            )
        if done.repeated:
            verdict = (
                f"[bold red]{_calls_were(done.repeated)} sent again[/] for turns the log "
                "already held."
            )
        else:
            restored = " + ".join(str(run.restored_turns) for run in done.runs[1:])
            verdict = (
                "[bold green]no recorded turn was sent to the model again[/]: the take-overs "
                f"restored {restored} turns from the log."
            )
        if done.sent_again:
            verdict += (
                f" {_calls_were(done.sent_again)} in flight at a kill, answered but not "
                "recorded, so the next run asked again."
            )
        lines = Text.from_markup(
            "[dim]turns the log held when the run began, turns it recorded, and model calls "
            "its process had answered[/]\n\n"
            f"{done.session_id}: {done.status}, {done.turns} turns; no command was typed.\n"
            + verdict
        )
        self.console.print(
            Panel(Group(table, Text(), lines), title="who ran the session", border_style="cyan")
        )
        self.console.print(f"unattended {done.session_id}  ({done.turns} turns, {done.status})")

    def _waiting(self, waiting: Waiting) -> None:
        result = waiting.result
        self.console.print(
            f"{waiting.agent}.run(“{escape(_short(waiting.task, 60))}”,\n"
            f"             session_id={waiting.session_id})  [dim]# in this process[/]\n"
            f"  its tool awaits wait_for_signal(“{result.waiting_for}”), so the run ends:\n"
            f"  RunResult.stop_reason={result.stop_reason!r}, waiting_for="
            f"{result.waiting_for!r}; no process holds it"
        )

    def _signalled(self, signalled: Signalled) -> None:
        self.console.print("the editor approves, from a shell:")
        # soft_wrap: a command is copied whole, so rich must not break it into lines
        self.console.print(f"  [bold]$ {escape(signalled.command)}[/]", soft_wrap=True)
        for line in signalled.output.splitlines():
            self.console.print(f"  {escape(line)}", soft_wrap=True)

    def _approved(self, approved: Approved) -> None:
        ok = approved.tool_result == approved.expected
        got = "[green]" if ok else "[red]"
        self.console.print(
            f"  the tool returned where it had waited: {got}{escape(approved.tool_result)}[/]"
        )
        self.console.print(
            Panel(
                escape(approved.output),
                title=f"approver's answer ({approved.status})",
                border_style="green" if approved.status == "finished" else "red",
            )
        )
        self.console.print(f"approved   {approved.session_id}  ({approved.status})")

    def _stopped(self, stopped: WorkersStopped) -> None:
        self.console.print(
            f"sent SIGTERM to {stopped.who} (pid {stopped.pid}): it exited with status "
            f"{stopped.exit_status} once its runs had ended"
        )
        if stopped.log:
            self.console.print("[dim]what the workers logged:[/]")
            for line in stopped.log:
                self.console.print(f"  [dim]{escape(line)}[/]", soft_wrap=True)


def _span(turns: tuple[int, ...]) -> str:
    if not turns:
        return "-"
    return str(turns[0]) if len(turns) == 1 else f"{turns[0]}-{turns[-1]}"
