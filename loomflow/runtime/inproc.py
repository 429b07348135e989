"""InProcRuntime: the event log and read model in this process's memory."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from loomflow.projections.apply import apply_batch
from loomflow.projections.fold import CheckpointRow, PruneFilter, StepRow
from loomflow.projections.memory import MemoryLog
from loomflow.runtime.base import Runtime
from loomflow.runtime.store import EventStore, PruneResult
from loomflow.schemas import Event, Message, utcnow
from loomflow.schemas.codec import Serializer
from loomflow.schemas.scope import Scope
from loomflow.schemas.sessions import SessionRecord

if TYPE_CHECKING:
    from loomflow.settings import Settings

__all__ = ["InProcRuntime", "InProcStore"]


class InProcStore(EventStore):
    """Events and read model in dicts (projections/memory.py); gone when the process ends."""

    appends_bounded = True

    def __init__(self, *, settings: Settings | None = None) -> None:
        """``settings`` (by default the ``LOOMFLOW_*`` environment) give its signing key."""
        from loomflow.settings import Settings

        self.signer, self.signing_refused = Settings.resolve(settings).writer_key()
        self._memory = MemoryLog()
        self._lock = asyncio.Lock()

    async def _append(self, events: Sequence[Event]) -> None:
        async with self._lock:
            apply_batch(self._memory, events)  # raises before any change

    async def session(self, scope: Scope) -> SessionRecord | None:
        held = self._memory.sessions.get(scope)
        return held.row if held else None

    async def sessions_in_flight(self, limit: int = 500) -> list[SessionRecord]:
        return self._memory.in_flight(utcnow(), limit)

    async def checkpoint(self, scope: Scope, checkpoint_id: str | None) -> CheckpointRow | None:
        return self._memory.checkpoint(scope, checkpoint_id)

    async def list_checkpoints(self, scope: Scope, limit: int) -> list[CheckpointRow]:
        return self._memory.list_checkpoints(scope, limit)

    async def transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, message_count: int
    ) -> list[Message]:
        return self._memory.transcript(scope, base_seq, upto_seq, message_count)

    async def step(self, scope: Scope, step_key: str) -> StepRow | None:
        return self._memory.step(scope, step_key)

    async def read_events(self, scope: Scope, after_seq: int = 0) -> list[Event]:
        return self._memory.read_events(scope, after_seq)

    async def _prune(self, match: PruneFilter) -> PruneResult:
        async with self._lock:
            return PruneResult(*self._memory.prune(match))


class InProcRuntime(Runtime):
    """The same events and projection as the durable runtimes, kept in memory."""

    def __init__(
        self,
        *,
        max_checkpoints_per_session: int | None = None,
        serializer: Serializer | None = None,
        lease_seconds: float | None = None,
        retry_seconds: float | None = None,
        settings: Settings | None = None,
    ) -> None:
        from loomflow.settings import Settings

        resolved = Settings.resolve(settings)
        super().__init__(
            InProcStore(settings=resolved),
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
            settings=resolved,
        )
