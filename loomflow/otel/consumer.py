"""The otel consumer: it reads the log, folds each batch into spans and sends them.

Written once against :class:`~loomflow.log.reader.LogReader`: on an embedded log the
position is kept with the sessions' states (``SqliteState``), on Kafka it is the otel
group's committed offsets. A batch goes in this order, so that the position never passes
what the receiver did not acknowledge:

1. load the states of the batch's sessions and fold its records into spans (no I/O);
2. send the spans, again with backoff (1 s doubling to 30 s) until the receiver
   acknowledges them, or until ``retry_for`` seconds have passed (ExportError: nothing
   is written, and the next run reads the same records and sends the same spans);
3. save the states (and, embedded, the position) in one transaction;
4. commit the group's offsets (Kafka).

A crash between 2 and 3 sends that batch's spans again on restart, with the same ids; one
between 3 and 4 rereads records whose seqs the states have passed, which add nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loomflow.log.reader import LogReader, LogRecord, drain
from loomflow.otel.export import ExportError, Sink
from loomflow.otel.fold import SessionTrace, fold
from loomflow.otel.spans import Span
from loomflow.otel.state import ScopeKey, TraceState

__all__ = ["Exported", "TraceExporter"]

logger = logging.getLogger("loomflow.otel.consumer")

#: the first wait before sending a batch again, and the longest
_BACKOFF_SECONDS = (1.0, 30.0)


@dataclass
class Exported:
    """What a consumer has done since it started."""

    records: int = 0
    spans: int = 0
    refused: int = 0
    #: events folded although their signature does not hold (signatures in ``check``)
    unverified: int = 0
    traces: set[str] = field(default_factory=set)
    #: runs whose span was sent (a run ends once)
    runs: int = 0


class _Stopped(Exception):
    """``stop`` was set while a batch waited to be sent again: nothing was written."""


class TraceExporter:
    """Reads the log and sends the spans of its runs; idempotent, so a record read again
    (after a crash, or a replay) sends nothing."""

    def __init__(
        self,
        reader: LogReader,
        state: TraceState,
        sink: Sink,
        *,
        retry_for: float | None = 30.0,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.reader = reader
        self.state = state
        self.sink = sink
        #: seconds a batch is sent again before ExportError; None: until ``stop`` is set
        self.retry_for = retry_for
        self.stop = stop or asyncio.Event()
        self.done = Exported()

    async def handle(self, records: Sequence[LogRecord]) -> None:
        """Fold one batch, send its spans, then move the position past it."""
        scopes = {(r.event.user_id, r.event.session_id) for r in records if r.event is not None}
        states = await self.state.load(scopes)
        changed: dict[ScopeKey, SessionTrace] = {}
        spans: list[Span] = []
        refused = unverified = 0
        for record in records:
            event = record.event
            if event is None:
                if record.note is None:  # a prune's note is no event, and no error
                    logger.warning("otel: record at %s refused: %s", record.position, record.error)
                    refused += 1
                continue
            if record.signature_problem is not None:
                logger.warning(
                    "otel: record at %s folded, but %s", record.position, record.signature_problem
                )
                unverified += 1
            scope = (event.user_id, event.session_id)
            state = states.setdefault(scope, SessionTrace())
            folded = fold(state, event, contiguous=record.partitioned)
            if folded.refused is not None:
                if folded.duplicate:
                    logger.debug("otel: record at %s skipped: %s", record.position, folded.refused)
                else:
                    logger.warning(
                        "otel: record at %s refused: %s", record.position, folded.refused
                    )
                    refused += 1
                continue
            changed[scope] = state
            spans.extend(folded.spans)
        if spans:
            await self._send(spans)
        keep = self.reader.consumer_keeps_position
        await self.state.save(changed, self.reader.next_positions() if keep else None)
        await self.reader.commit()
        self.done.records += len(records)
        self.done.spans += len(spans)
        self.done.refused += refused
        self.done.unverified += unverified
        self.done.traces.update(s.trace_id for s in spans)
        self.done.runs += sum(1 for s in spans if s.parent_id is None)

    async def _send(self, spans: list[Span]) -> None:
        """Send until the receiver acknowledges, waiting longer each time."""
        loop = asyncio.get_running_loop()
        give_up = None if self.retry_for is None else loop.time() + self.retry_for
        wait = _BACKOFF_SECONDS[0]
        while True:
            try:
                await self.sink.send(spans)
                return
            except ExportError as exc:
                left = None if give_up is None else give_up - loop.time()
                if left is not None and left <= 0:
                    raise ExportError(
                        f"{exc}; nothing is lost: the position stays before these spans, "
                        "and the next run sends them"
                    ) from None
                pause = wait if left is None else min(wait, left)
                # a run that gives up says so once; one that never does tells each retry
                level = logging.WARNING if self.retry_for is None else logging.INFO
                logger.log(level, "otel: %s; sending again in %.1f s", exc, pause)
                try:
                    await asyncio.wait_for(self.stop.wait(), pause)
                except TimeoutError:
                    pass
                else:
                    raise _Stopped() from None
                wait = min(wait * 2, _BACKOFF_SECONDS[1])

    async def catch_up(self) -> Exported:
        """Send the spans of every record the log holds now."""
        try:
            async for batch in drain(self.reader):
                await self.handle(batch)
        except _Stopped:
            pass
        return self.done

    async def follow(self, on_batch: Callable[[], object] | None = None) -> None:
        """Send spans as records arrive, until ``stop`` is set (a batch that waits to be
        sent again then stays unsent, its position unmoved)."""
        while not self.stop.is_set():
            batch = await self.reader.read(wait=0.5)
            if batch:
                try:
                    await self.handle(batch)
                except _Stopped:
                    return
                if on_batch is not None:
                    on_batch()
