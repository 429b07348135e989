"""The resume worker: hosts agents and finishes their runs that nobody else will.

A run is taken over when its writer went silent past its lease (the process died), or
when it waits for a signal that has arrived (or whose timeout passed). The take-over is
a conditional claim of the session (``Agent.take_over``): of several workers that saw
the same run, exactly one writes the new epoch, and that epoch fences the dead owner
too. Delivery of a resume is at least once (a worker that dies mid-resume leaves the
run abandoned again); its effect is exactly once, because recorded model and tool calls
replay from the log instead of running again.

A take-over continues the same run: the options its run.started recorded (metadata,
extra tools, output schema, effort) are restored, and a run whose tools or schema this
worker does not host is parked, never run without them. A run's budget (take-overs,
and optionally model calls, tokens and cost) is counted in the log, so no worker, nor
several in turn, spends past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from loomflow.agent.agent import Agent
from loomflow.agent.streaming import Emit
from loomflow.errors import (
    InvalidEventError,
    LoomflowError,
    RunBudgetExceededError,
    RunCancelledError,
    RunOptionsError,
    RunTakenError,
)
from loomflow.runtime import InProcRuntime, Runtime, Scope
from loomflow.runtime.base import abandoned
from loomflow.schemas import RunFailed, Usage, new_id
from loomflow.schemas.clock import utcnow
from loomflow.schemas.events import RunFailedPayload
from loomflow.schemas.sessions import SessionRecord

__all__ = ["Budget", "Reason", "Worker", "due"]

logger = logging.getLogger("loomflow.worker")

Reason = Literal["abandoned", "signalled", "timed out"]


def due(row: SessionRecord) -> Reason | None:
    """Why a worker should take the session's run over now, or None: its writer went
    silent past its lease, or it waits for a signal that is in its inbox (or whose
    timeout passed)."""
    if abandoned(row):
        return "abandoned"
    if row.status == "signalled":
        return "signalled"
    waiting = row.waiting
    if row.status == "waiting" and waiting and waiting.until and utcnow() >= waiting.until:
        return "timed out"
    return None


@dataclass(frozen=True)
class Budget:
    """What workers may spend on one run, counted in the log across every worker's
    take-overs: at most ``takes`` take-overs since a caller started the run or it last
    waited for a signal, and (each when not None) ``model_calls`` model calls,
    ``tokens`` tokens and ``cost_usd`` dollars since a caller started it. A run past any
    of them is parked as stuck with the reason, for a person."""

    takes: int = 10
    model_calls: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("takes", "model_calls", "tokens"):
            value = getattr(self, name)
            if value is None and name != "takes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Budget.{name} must be an int >= 1, not {value!r}")
        cost = self.cost_usd
        if cost is not None and (
            isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 < cost < 1e12
        ):
            raise ValueError(f"Budget.cost_usd must be a positive number, not {cost!r}")

    def spent(self, row: SessionRecord, calls: int = 0, usage: Usage | None = None) -> str | None:
        """Why the run of ``row`` may not spend more, having made ``calls`` model calls
        costing ``usage`` since the row was read; None while it may."""
        usage = row.spent if usage is None else row.spent + usage
        calls += row.spent_calls
        if self.model_calls is not None and calls >= self.model_calls:
            return f"the run made {calls} model calls, its budget (model_calls={self.model_calls})"
        if self.tokens is not None and usage.total_tokens >= self.tokens:
            return f"the run used {usage.total_tokens} tokens, its budget (tokens={self.tokens})"
        if self.cost_usd is not None and usage.cost_usd >= self.cost_usd:
            return f"the run cost ${usage.cost_usd:.6f}, its budget (cost_usd={self.cost_usd:g})"
        return None

    def exceeded(self, row: SessionRecord) -> str | None:
        """Why the run of ``row`` may not be taken over again; None while it may."""
        if row.takes >= self.takes:
            return f"workers took the run over {row.takes} times, its budget (takes={self.takes})"
        return self.spent(row)


#: how the log says what became of a take-over
_SAID = {
    "finished": "finished",
    "waiting": "waits again",
    "failed": "failed",
    "parked": "is parked",
    "taken": "was taken by another process first",
    "cancelled": "was cancelled while it ran; no worker resumes it",
    "released": "stops with this worker; left for the next one",
}


@dataclass(frozen=True)
class TakeOver:
    """What a worker did with one run: resumed it to an end, parked it, lost it (to
    another process, or to a cancel), or left it for the next worker when it stopped."""

    session_id: str
    user_id: str | None
    reason: Reason
    outcome: Literal["finished", "waiting", "failed", "parked", "taken", "cancelled", "released"]
    detail: str = ""


class Worker:
    """Hosts ``agents`` (by name) and resumes their abandoned or signalled runs.

    ``scan`` looks once; ``run`` looks every ``poll_seconds`` until stopped. A resumed
    run that fails is tried again after ``backoff_seconds`` (doubling), up to
    ``max_attempts`` takes by workers in a row that record no model turn; then the
    session is parked with its error (status ``stuck``, ``loomflow sessions ls
    --stuck``). ``budget`` bounds what workers spend on a run however it progresses
    (parked too, past it). Several workers may run against the same store: each run is
    taken by one of them. Once stopped, runs in progress stop at their next step and are
    left for the next worker; those still in a step after ``stop_grace_seconds`` are cut
    off there, as a crash would. ``emit`` hears of each take-over's events as the log
    acknowledges them (as ``run(emit=...)`` does).
    """

    def __init__(
        self,
        agents: Iterable[Agent],
        *,
        name: str | None = None,
        poll_seconds: float = 1.0,
        max_attempts: int = 3,
        backoff_seconds: float = 1.0,
        concurrency: int = 8,
        budget: Budget | None = None,
        stop_grace_seconds: float = 5.0,
        emit: Emit | None = None,
    ) -> None:
        hosted: dict[str, Agent] = {}
        for agent in agents:
            if not isinstance(agent, Agent):
                raise TypeError(f"a worker hosts Agents, not {type(agent).__name__}")
            if agent.name in hosted:
                raise ValueError(
                    f"two agents are named {agent.name!r}: give each Agent(name=...) its own"
                )
            hosted[agent.name] = agent
            if isinstance(agent.runtime, InProcRuntime):
                logger.warning(
                    "agent %r keeps its runs in this process's memory (InProcRuntime): no "
                    "other process's runs are there to take over; give it the runtime its "
                    "runs use (SqliteRuntime(path), KafkaRuntime(), ...)",
                    agent.name,
                )
        if not hosted:
            raise ValueError("a worker needs at least one Agent to host")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
        for option, value, least in (
            ("poll_seconds", poll_seconds, 0.01),
            ("backoff_seconds", backoff_seconds, 0.0),
        ):
            if isinstance(value, bool) or not (
                isinstance(value, int | float) and least <= value <= 3600
            ):
                raise ValueError(f"{option} must be a number from {least:g} to 3600, not {value!r}")
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, not {type(budget).__name__}")
        if isinstance(stop_grace_seconds, bool) or not (
            isinstance(stop_grace_seconds, int | float) and 0 <= stop_grace_seconds <= 3600
        ):
            raise ValueError(
                f"stop_grace_seconds must be a number from 0 to 3600, not {stop_grace_seconds!r}"
            )
        self.agents = hosted
        self.budget = budget or Budget()
        self.stop_grace_seconds = float(stop_grace_seconds)
        self.emit = emit
        #: set once the worker stops: runs in progress stop at their next step
        self.stopping = asyncio.Event()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.poll_seconds = poll_seconds
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self._slots = asyncio.Semaphore(concurrency)
        self._busy: set[tuple[str | None, str]] = set()
        self._tasks: set[asyncio.Task[TakeOver | None]] = set()
        self._unhosted: set[str] = set()
        #: what this worker did, in order (for logs, tests and the demo)
        self.done: list[TakeOver] = []

    @property
    def in_progress(self) -> int:
        """How many take-overs are running now."""
        return len(self._tasks)

    def _runtimes(self) -> list[Runtime]:
        seen: dict[int, Runtime] = {}
        for agent in self.agents.values():
            seen.setdefault(id(agent.runtime), agent.runtime)
        return list(seen.values())

    async def scan(self) -> list[asyncio.Task[TakeOver | None]]:
        """Look once for runs to take over; start a take-over of each (returned)."""
        started = []
        for runtime in self._runtimes():
            for row in await runtime.sessions_in_flight():
                key = (row.user_id, row.session_id)
                if key in self._busy or due(row) is None:
                    continue
                agent = self.agents.get(row.agent or "")
                if agent is None or agent.runtime is not runtime:
                    if (row.agent or "") not in self._unhosted:
                        self._unhosted.add(row.agent or "")
                        logger.warning(
                            "%s: its run belongs to agent %r, which this worker does not "
                            "host (it hosts %s); left for a worker that does",
                            Scope(row.session_id, row.user_id).describe(),
                            row.agent,
                            ", ".join(sorted(self.agents)),
                        )
                    continue
                self._busy.add(key)
                task = asyncio.create_task(self._take(agent, row))
                self._tasks.add(task)
                task.add_done_callback(functools.partial(self._finished, key=key))
                started.append(task)
        return started

    def _finished(
        self, task: asyncio.Task[TakeOver | None], *, key: tuple[str | None, str]
    ) -> None:
        self._tasks.discard(task)
        self._busy.discard(key)
        if task.cancelled():  # cut off by stop(): left as a crash leaves a run
            logger.info(
                "worker %s: %s is cut off mid-step; left for the next worker",
                self.name,
                Scope(key[1], key[0]).describe(),
            )
            return
        if (outcome := task.result()) is not None:
            self.done.append(outcome)
            logger.info(
                "worker %s: %s %s",
                self.name,
                Scope(outcome.session_id, outcome.user_id).describe(),
                _SAID[outcome.outcome],
            )

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Scan every ``poll_seconds`` until ``stop`` is set; then stop the runs in
        progress at their next step (see ``stop``)."""
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                try:
                    await self.scan()
                except LoomflowError as exc:
                    logger.warning("worker %s: looking for runs failed: %s", self.name, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_seconds)  # the poll timer
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop the take-overs in progress at their next step (a model or tool call, a
        stop hook), recording nothing: each is left for the next worker, which takes it
        once its lease has passed. One still inside a step after ``stop_grace_seconds``
        is cut off there, as a crash would (the call in flight runs again, once, in the
        next worker's take)."""
        self.stopping.set()
        if not self._tasks:
            return
        _, late = await asyncio.wait(list(self._tasks), timeout=self.stop_grace_seconds)
        for task in late:
            task.cancel()
        await self.drain()

    async def drain(self) -> None:
        """Wait for the take-overs in progress to end."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _take(self, agent: Agent, seen: SessionRecord) -> TakeOver | None:
        scope = Scope(seen.session_id, seen.user_id)
        retrying: Reason | None = None
        async with self._slots:
            while not self.stopping.is_set():
                row = await agent.runtime.session(scope)  # as the log has it now
                if row is None:
                    return None
                # after our own attempt failed, the failed run is ours to try again
                reason = retrying if retrying and row.status == "failed" else due(row)
                if reason is None:
                    return None
                if row.attempts >= self.max_attempts:
                    return await self._park(
                        agent,
                        row,
                        reason,
                        f"gave up after {row.attempts} attempts by workers; last error: "
                        f"{row.last_error or 'none recorded (its process died)'}",
                    )
                if (spent := self.budget.exceeded(row)) is not None:
                    return await self._park(agent, row, reason, f"over budget: {spent}")
                last = row.attempts + 1 >= self.max_attempts
                logger.info(
                    "worker %s claims %s (%s, attempt %d of %d, take %d of %d)",
                    self.name,
                    scope.describe(),
                    reason,
                    row.attempts + 1,
                    self.max_attempts,
                    row.takes + 1,
                    self.budget.takes,
                )
                try:
                    result = await agent.take_over(
                        scope.session_id,
                        user_id=scope.user_id,
                        after_seq=row.last_seq,
                        worker=self.name,
                        last_attempt=last,
                        emit=self.emit,
                        budget=functools.partial(self.budget.spent, row),
                        stop=self.stopping,
                    )
                except RunCancelledError as exc:
                    return TakeOver(scope.session_id, scope.user_id, reason, "cancelled", str(exc))
                except (RunTakenError, InvalidEventError) as exc:
                    logger.info(
                        "worker %s: %s was taken first: %s", self.name, scope.describe(), exc
                    )
                    return TakeOver(scope.session_id, scope.user_id, reason, "taken", str(exc))
                except RunOptionsError as exc:  # nothing was written: park it, as it is
                    return await self._park(agent, row, reason, str(exc))
                except asyncio.CancelledError:
                    if not self.stopping.is_set() or _cancelling():
                        raise
                    return TakeOver(scope.session_id, scope.user_id, reason, "released")
                except Exception as exc:
                    logger.warning(
                        "worker %s: resuming %s failed: %s: %s",
                        self.name,
                        scope.describe(),
                        type(exc).__name__,
                        exc,
                    )
                    if last or isinstance(exc, RunBudgetExceededError):
                        logger.warning(
                            "worker %s parked %s (%s): it waits for a person "
                            "(loomflow sessions ls --stuck)",
                            self.name,
                            scope.describe(),
                            "over budget"
                            if isinstance(exc, RunBudgetExceededError)
                            else f"after {row.attempts + 1} attempts",
                        )
                        return TakeOver(scope.session_id, scope.user_id, reason, "parked", str(exc))
                    # a backoff timer before the next attempt (cut short when stopping)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self.stopping.wait(), self.backoff_seconds * 2**row.attempts
                        )
                    retrying = reason
                    continue
                outcome: Literal["finished", "waiting"] = (
                    "waiting" if result.stop_reason == "waiting" else "finished"
                )
                return TakeOver(scope.session_id, scope.user_id, reason, outcome)
        return None

    async def _park(self, agent: Agent, row: SessionRecord, reason: Reason, error: str) -> TakeOver:
        """Give up on a run (it keeps failing or killing its process, it is over its
        budget, or it needs what this worker does not host): record the failure as
        parked, so it waits for a person instead of another worker. The claim carries
        the run's recorded options forward, so a later resume is given them still."""
        scope = Scope(row.session_id, row.user_id)
        try:
            writer = await agent.runtime.open_session(
                scope,
                run_id=new_id("run"),
                mode="resume",
                prepare=lambda now: (now.run_metadata, now.run_options) if now else (None, None),
                agent=agent.name,
                model=agent.model.name,
                claim_after=row.last_seq,
                worker=self.name,
            )
            await writer.emit(
                RunFailed,
                RunFailedPayload(error_type="Parked", error=error[:2000], parked=True),
            )
            await writer.confirm()
        except (RunTakenError, InvalidEventError) as exc:
            return TakeOver(scope.session_id, scope.user_id, reason, "taken", str(exc))
        logger.warning("worker %s parked %s: %s", self.name, scope.describe(), error)
        return TakeOver(scope.session_id, scope.user_id, reason, "parked", error)


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (not a run stopping inside it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
