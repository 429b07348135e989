"""The resume worker: hosts agents and finishes their runs that nobody else will.

A run is taken over when its writer went silent past its lease (the process died), or
when it waits for a signal that has arrived (or whose timeout passed). The take-over is
a conditional claim of the session (``Agent.take_over``): of several workers that saw
the same run, exactly one writes the new epoch, and that epoch fences the dead owner
too. Delivery of a resume is at least once (a worker that dies mid-resume leaves the
run abandoned again); its effect is exactly once, because recorded model and tool calls
replay from the log instead of running again.
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

from loomflow.agent.loop import Agent
from loomflow.errors import InvalidEventError, LoomflowError, RunTakenError
from loomflow.projections.fold import SessionRow
from loomflow.runtime import Runtime, Scope
from loomflow.runtime.base import abandoned
from loomflow.schemas import RunFailed, new_id
from loomflow.schemas.clock import utcnow
from loomflow.schemas.events import RunFailedPayload

__all__ = ["Reason", "Worker", "due"]

logger = logging.getLogger("loomflow.worker")

Reason = Literal["abandoned", "signalled", "timed out"]


def due(row: SessionRow) -> Reason | None:
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


#: how the log says what became of a take-over
_SAID = {
    "finished": "finished",
    "waiting": "waits again",
    "failed": "failed",
    "parked": "is parked",
    "taken": "was taken by another process first",
}


@dataclass(frozen=True)
class TakeOver:
    """What a worker did with one run: resumed it to an end, parked it, or lost it."""

    session_id: str
    user_id: str | None
    reason: Reason
    outcome: Literal["finished", "waiting", "failed", "parked", "taken"]
    detail: str = ""


class Worker:
    """Hosts ``agents`` (by name) and resumes their abandoned or signalled runs.

    ``scan`` looks once; ``run`` looks every ``poll_seconds`` until stopped. A resumed
    run that fails is tried again after ``backoff_seconds`` (doubling), up to
    ``max_attempts`` takes by workers in a row; then the session is parked with its
    error (status ``stuck``, ``loomflow sessions ls --stuck``). Several workers may run
    against the same store: each run is taken by one of them.
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
        if not hosted:
            raise ValueError("a worker needs at least one Agent to host")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
        self.agents = hosted
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
            for row in await runtime.store.sessions_in_flight():
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
        if not task.cancelled() and (outcome := task.result()) is not None:
            self.done.append(outcome)
            logger.info(
                "worker %s: %s %s",
                self.name,
                Scope(outcome.session_id, outcome.user_id).describe(),
                _SAID[outcome.outcome],
            )

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Scan every ``poll_seconds`` until ``stop`` is set; then wait for the runs it
        took over to end."""
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
            await self.drain()

    async def drain(self) -> None:
        """Wait for the take-overs in progress to end."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _take(self, agent: Agent, seen: SessionRow) -> TakeOver | None:
        scope = Scope(seen.session_id, seen.user_id)
        retrying: Reason | None = None
        async with self._slots:
            while True:
                row = await agent.runtime.store.session(scope)  # as the log has it now
                if row is None:
                    return None
                # after our own attempt failed, the failed run is ours to try again
                reason = retrying if retrying and row.status == "failed" else due(row)
                if reason is None:
                    return None
                if row.attempts >= self.max_attempts:
                    return await self._park(agent, row, reason)
                last = row.attempts + 1 >= self.max_attempts
                logger.info(
                    "worker %s claims %s (%s, attempt %d of %d)",
                    self.name,
                    scope.describe(),
                    reason,
                    row.attempts + 1,
                    self.max_attempts,
                )
                try:
                    result = await agent.take_over(
                        scope.session_id,
                        user_id=scope.user_id,
                        after_seq=row.last_seq,
                        worker=self.name,
                        last_attempt=last,
                    )
                except (RunTakenError, InvalidEventError) as exc:
                    logger.info(
                        "worker %s: %s was taken first: %s", self.name, scope.describe(), exc
                    )
                    return TakeOver(scope.session_id, scope.user_id, reason, "taken", str(exc))
                except Exception as exc:
                    logger.warning(
                        "worker %s: resuming %s failed: %s: %s",
                        self.name,
                        scope.describe(),
                        type(exc).__name__,
                        exc,
                    )
                    if last:
                        logger.warning(
                            "worker %s parked %s after %d attempts: it waits for a person "
                            "(loomflow sessions ls --stuck)",
                            self.name,
                            scope.describe(),
                            row.attempts + 1,
                        )
                        return TakeOver(scope.session_id, scope.user_id, reason, "parked", str(exc))
                    # a backoff timer before the next attempt, not a wait for a result
                    await asyncio.sleep(self.backoff_seconds * 2**row.attempts)
                    retrying = reason
                    continue
                outcome: Literal["finished", "waiting"] = (
                    "waiting" if result.stop_reason == "waiting" else "finished"
                )
                return TakeOver(scope.session_id, scope.user_id, reason, outcome)

    async def _park(self, agent: Agent, row: SessionRow, reason: Reason) -> TakeOver:
        """Give up on a run that keeps failing (or keeps killing its process): record
        the failure as parked, so it waits for a person instead of another worker."""
        scope = Scope(row.session_id, row.user_id)
        error = (
            f"gave up after {row.attempts} attempts by workers; last error: "
            f"{row.last_error or 'none recorded (its process died)'}"
        )
        try:
            writer = await agent.runtime.open_session(
                scope,
                run_id=new_id("run"),
                mode="resume",
                agent=agent.name,
                model=agent.model.name,
                claim_after=row.last_seq,
                worker=self.name,
            )
            await writer.emit(
                RunFailed,
                RunFailedPayload(error_type="Parked", error=error, parked=True),
            )
            await writer.confirm()
        except (RunTakenError, InvalidEventError) as exc:
            return TakeOver(scope.session_id, scope.user_id, reason, "taken", str(exc))
        logger.warning("worker %s parked %s: %s", self.name, scope.describe(), error)
        return TakeOver(scope.session_id, scope.user_id, reason, "parked", error)
