"""What a run reports as it happens: its events as they are appended, and text deltas."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar

from loomflow.schemas import Event, RunResult

__all__ = ["Emit", "RunItem", "TextDelta", "stream_of"]

logger = logging.getLogger("loomflow.agent")


@dataclass(frozen=True)
class TextDelta:
    """A piece of the model's answer as it streams; ``turn`` is the turn it becomes.

    The one item an observer gets before the log has it (``recorded`` is False): the
    answer is recorded by the ``TurnAppended`` that follows its deltas, and a crash
    before that loses it (the model is asked again on resume).
    """

    #: never recorded itself: every event an observer hears of is in the log already
    recorded: ClassVar[bool] = False

    text: str
    turn: int


#: what ``emit`` receives: each event of the run once the log acknowledged it, and text
#: deltas as the model streams them
RunItem = Event | TextDelta
Emit = Callable[[RunItem], Awaitable[None]]


class Emitter:
    """Calls a run's ``emit`` in order and waits for it (back-pressure: a slow consumer
    slows the run). An ``emit`` that raises is logged and the run goes on: what the run
    recorded never depends on its observers."""

    def __init__(self, emit: Emit | None) -> None:
        if emit is not None and not callable(emit):
            raise TypeError(f"emit must be an async callable, not {type(emit).__name__}")
        self._emit = emit
        self._warned = False

    def __bool__(self) -> bool:
        return self._emit is not None

    async def __call__(self, item: RunItem) -> None:
        if self._emit is None:
            return
        try:
            outcome = self._emit(item)
            if not asyncio.iscoroutine(outcome) and not isinstance(outcome, Awaitable):
                raise TypeError(f"emit returned {type(outcome).__name__}, not an awaitable")
            await outcome
        except Exception as exc:
            if not self._warned:  # once per run: a broken consumer must not flood the log
                self._warned = True
                logger.warning(
                    "emit raised %s: %s; the run goes on (further errors of this run's emit "
                    "are logged at debug level)",
                    type(exc).__name__,
                    exc,
                )
            else:
                logger.debug("emit raised %s: %s", type(exc).__name__, exc)


async def stream_of(
    start: Callable[[Emit], Coroutine[Any, Any, RunResult]], buffer: int = 256
) -> AsyncIterator[RunItem | RunResult]:
    """Run ``start(emit)`` in a task and yield what it emits, then its RunResult.

    The queue holds ``buffer`` items; a consumer slower than that slows the run. If the
    run fails, its exception is raised after the items that came before it. Leaving the
    iteration early cancels the run, which then stays resumable like any interrupted run.
    """
    queue: asyncio.Queue[RunItem] = asyncio.Queue(maxsize=buffer)
    task = asyncio.ensure_future(start(queue.put))
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
                continue
            getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            yield task.result()  # raises the run's exception, if any
            return
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):  # cancelled because the consumer left
                await task
