"""Publishing each session's latest checkpoint, materialised, to the compacted topic.

The value is a :class:`loomflow.schemas.Checkpoint` as JSON, keyed like the log, so a
reader of the snapshots topic has every session's transcript as of a recent checkpoint
without the read model. A snapshot carries the whole transcript: publishing one per
checkpoint would put O(n²) bytes through Kafka over a session's life. So a checkpoint is
published ``interval`` seconds after it falls due, with whatever newer checkpoint the
session wrote meanwhile, and a session is published at most once per ``interval``;
``flush`` publishes everything due at once (on shutdown, or for a benchmark's clock).
Projection never waits for it. An erased session's snapshot goes with it: a tombstone
(a null value) is published at once, so compaction keeps no transcript of it.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import orjson

from loomflow.producers import EventProducer, scope_key
from loomflow.projections import postgres as pg
from loomflow.projections.fold import CheckpointRow
from loomflow.schemas import CheckpointWritten, SessionErased

__all__ = ["SnapshotPublisher"]

logger = logging.getLogger("loomflow.processors.snapshots")

_Key = tuple[str | None, str]


class SnapshotPublisher:
    """Coalesces due checkpoints per session and publishes them off the hot path."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        producer: EventProducer,
        *,
        schema: str,
        topic: str,
        interval: float = 30.0,
    ) -> None:
        self._pool = pool
        self._producer = producer
        self._schema = schema
        self._topic = topic
        self.interval = interval
        #: the checkpoint to publish, or None: a tombstone for an erased session
        self._due: dict[_Key, CheckpointWritten | None] = {}
        #: when each due session may be published next
        self._at: dict[_Key, float] = {}
        #: sessions published within the last interval, and when
        self._last: dict[_Key, float] = {}
        self._wanted = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._force = False
        self._timer: asyncio.TimerHandle | None = None
        self.published = 0

    def checkpointed(self, event: CheckpointWritten) -> None:
        """A checkpoint was committed to the read model: its session's snapshot is due."""
        key = (event.user_id, event.session_id)
        if key not in self._due:
            now = asyncio.get_running_loop().time()
            self._at[key] = max(now, self._last.get(key, now)) + self.interval
        self._due[key] = event
        self._idle.clear()
        self._wanted.set()

    def erased(self, event: SessionErased) -> None:
        """A session was erased: publish a tombstone for it now, in place of any snapshot
        due. Snapshots go out in order, so it follows one already on its way."""
        key = (event.user_id, event.session_id)
        self._due[key] = None
        self._at[key] = asyncio.get_running_loop().time()
        self._idle.clear()
        self._wanted.set()

    async def flush(self) -> None:
        """Publish every due snapshot now, whatever the interval, and return when none is
        due (checkpoints that fall due meanwhile are published at once too)."""
        if self._due or not self._idle.is_set():
            self._force = True
            self._wanted.set()
        await self._idle.wait()

    async def run(self) -> None:
        """Publish until cancelled; a failed snapshot is logged and the next one goes on."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            now = loop.time()
            ready = [
                (key, event)
                for key, event in self._due.items()
                if self._force or self._at[key] <= now
            ]
            for key, _ in ready:
                del self._due[key], self._at[key]
            await self._publish_all(ready)
            published_at = loop.time()
            self._last.update((key, published_at) for key, _ in ready)
            self._last = {k: t for k, t in self._last.items() if t + self.interval > now}
            if self._due and self._force:
                self._wanted.set()  # a flush goes on until nothing is due
            elif self._due:
                wake = min(self._at.values())
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(wake, self._wanted.set)
            elif not self._wanted.is_set():
                self._force = False
                self._idle.set()

    async def _publish_all(self, due: list[tuple[_Key, CheckpointWritten | None]]) -> None:
        """Publish sessions' snapshots in chunks, ``_IN_FLIGHT`` at a time: one chunk's
        reads overlap another's wait for its acks (one after the other, a flush of a few
        thousand sessions was a quarter of a benchmark's clock). A session is in one chunk
        only, so its snapshots still go out in order."""
        room = asyncio.Semaphore(_IN_FLIGHT)

        async def publish(chunk: list[tuple[_Key, CheckpointWritten | None]]) -> None:
            async with room:
                await self._publish(chunk)

        await asyncio.gather(
            *(publish(due[first : first + _CHUNK]) for first in range(0, len(due), _CHUNK))
        )

    async def _publish(self, due: list[tuple[_Key, CheckpointWritten | None]]) -> None:
        """Publish a chunk of sessions' snapshots (and tombstones): two reads, one wait
        for the acks."""
        try:
            async with self._pool.acquire() as conn:
                found = await pg.latest_snapshots(
                    conn,
                    self._schema,
                    [
                        (user, session, e.payload.checkpoint_id)
                        for (user, session), e in due
                        if e is not None
                    ],
                )
            records: list[tuple[bytes, bytes | None]] = [
                (scope_key(user, session), None) for (user, session), e in due if e is None
            ]
            # a checkpoint dropped by retention since has a newer one due or published
            records += [
                (scope_key(user, session), _snapshot(session, row, arrays))
                for user, session, row, arrays in found
            ]
            await self._producer.send_many(self._topic, records)
            self.published += len(records)
        except Exception as exc:  # a snapshot is an optimisation: log, go on
            logger.warning("publishing %d snapshot(s) failed: %s", len(due), exc)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


#: sessions whose snapshots are read and sent together
_CHUNK = 256
#: chunks being read or sent at once (each holds a connection of the projector's pool)
_IN_FLIGHT = 3


def _snapshot(session_id: str, row: CheckpointRow, arrays: list[str]) -> bytes:
    """The checkpoint as Checkpoint JSON, assembled from the stored message arrays.

    The payloads were validated when they were projected, and the projector stored them
    as orjson writes them, so their arrays are joined as JSON text: the bytes orjson
    would write for the messages parsed, without parsing them.
    """
    messages = ",".join(inner for array in arrays if (inner := array[1:-1].strip()))
    return orjson.dumps(
        {
            "session_id": session_id,
            "checkpoint_id": row.checkpoint_id,
            "turn": row.turn,
            "messages": orjson.Fragment(f"[{messages}]"),
            "cumulative_usage": row.cumulative_usage.model_dump(),
            "cursor": row.cursor,
            "created_at": row.created_at,
        }
    )
