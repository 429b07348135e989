"""Group commit: concurrent appends share one transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from loomflow.errors import (
    LoomflowError,
)
from loomflow.runtime.cache import TranscriptCache
from loomflow.schemas.scope import Scope, scope_of

if TYPE_CHECKING:
    from loomflow.schemas import Event

__all__ = ["GroupCommit", "Outcomes"]

Outcomes = list["LoomflowError | None"]


class GroupCommit:
    """Appends that arrive while a commit runs go into the next round, committed together.

    ``commit(batches)`` applies one round (one transaction) and returns each batch's
    outcome: None, or the error that refused that batch alone. Many concurrent sessions
    then cost one commit per round instead of one each.

    ``now(batches)``, where a store has it, commits a round at once without yielding, or
    returns None when it cannot (the file is busy). A lone writer's append is committed
    with it in the caller's own step: no task to start and no future to wake, which is
    most of what a round costs besides its SQL. A writer counts as alone while the
    appends follow each other from one session with nothing queued; once sessions take
    turns, their appends queue for rounds again, which they share.
    """

    def __init__(
        self,
        commit: Callable[[list[list[Event]]], Awaitable[Outcomes]],
        cache: TranscriptCache,
        now: Callable[[list[list[Event]]], Outcomes | None] | None = None,
    ) -> None:
        self._commit = commit
        self._now = now
        self._cache = cache
        self._pending: list[tuple[list[Event], asyncio.Future[None]]] = []
        self._drainer: asyncio.Task[None] | None = None
        #: the session of the last append
        self._last: Scope | None = None

    async def append(self, events: list[Event]) -> None:
        key, self._last = self._last, scope_of(events[0])
        idle = not self._pending and (self._drainer is None or self._drainer.done())
        if self._now is not None and key == self._last and idle:
            try:
                outcomes = self._now([events])
            except BaseException:
                self._forget(events)  # the outcome may be unknown: read them again
                raise
            if outcomes is not None:
                [outcome] = outcomes
                if outcome is not None:
                    self._forget(events)
                    raise outcome
                self._cache.follow(events)
                return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((events, done))
        if self._drainer is None or self._drainer.done() or self._drainer.get_loop() is not loop:
            self._drainer = loop.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                outcomes = await self._commit([events for events, _ in batch])
            except BaseException as exc:
                for events, done in batch:  # the outcome may be unknown: read them again
                    self._forget(events)
                    if done.done():
                        continue
                    if isinstance(exc, asyncio.CancelledError):
                        done.cancel()
                    else:
                        done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (events, done), outcome in zip(batch, outcomes, strict=True):
                if outcome is None:
                    self._cache.follow(events)
                    if not done.done():
                        done.set_result(None)
                else:
                    self._forget(events)
                    if not done.done():
                        done.set_exception(outcome)

    def _forget(self, events: list[Event]) -> None:
        for event in events:
            self._cache.forget(scope_of(event))
