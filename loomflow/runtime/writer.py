"""The single writer of a session for one run: seqs, epochs, staged and in-doubt events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from loomflow.errors import (
    InvalidEventError,
    LoomflowError,
    StoreUnavailableError,
)
from loomflow.schemas.scope import Scope

if TYPE_CHECKING:
    from loomflow.runtime.store import EventStore
    from loomflow.schemas import Event, EventBase, Message
    from loomflow.schemas.options import Serializer
    from loomflow.schemas.sessions import SessionRecord

__all__ = ["SessionWriter", "WritePolicy"]


@dataclass(frozen=True)
class WritePolicy:
    """How a run's writer treats its store: how long its writes keep trying while the
    store is briefly away, and how its journal encodes step values (its runtime's
    ``retry_seconds`` and ``serializer``)."""

    retry_seconds: float
    serializer: Serializer


logger = logging.getLogger("loomflow.runtime")

E = TypeVar("E", bound="EventBase")
T = TypeVar("T")

#: the least time a write is given before it counts as failed, whatever is left of the
#: window: an append that has not returned by then means the store is away
MIN_ATTEMPT_SECONDS = 5.0


async def _within(give_up: float, work: Awaitable[T]) -> T:
    """Await ``work`` until ``give_up`` (a loop time), or MIN_ATTEMPT_SECONDS if that is
    later; past it, StoreUnavailableError (retriable): a client that waits on a server
    that is gone (Kafka's producer does, for its request timeout) does not hold the run
    past its policy's retry_seconds."""
    bound = max(give_up - asyncio.get_running_loop().time(), MIN_ATTEMPT_SECONDS)
    deadline = asyncio.timeout(bound)
    try:
        async with deadline:
            return await work
    except TimeoutError as exc:
        if not deadline.expired():
            raise  # the store's own timeout: its error, as it raised it
        raise StoreUnavailableError(
            f"the store did not answer a write within {bound:.0f} s: it is away or overloaded"
        ) from exc


class SessionWriter:
    """The single writer of one session for one run: assigns seq and stamps its epoch.

    ``stage`` holds an event (a checkpoint) to go out with the next ``emit``: events made
    together cost one write, not one each. The loop stages only where no model or tool
    call runs before that next emit. ``hold`` does the same for an event that must not be
    given up (a final answer): a staged event is optional, a held one is written again if
    the write that carries it fails.

    An append that fails with anything but a refusal may still have landed (a timeout
    after the write reached the log, a connection lost before the commit's reply). Its
    events are then in doubt: before the next append the writer reads the session once
    to learn how many landed, and goes on after them, giving back the seqs of those that
    did not. So an unknown outcome never turns into a taken seq or a gap. When the
    failure is retriable (the store says it is briefly away), the writer does that at
    once and writes again what did not land, with backoff, for up to its policy's
    ``retry_seconds``: a run rides out a broker or database restart instead of failing.
    """

    def __init__(
        self,
        store: EventStore,
        scope: Scope,
        *,
        run_id: str,
        epoch: int,
        next_seq: int,
        policy: WritePolicy,
    ) -> None:
        self.store = store
        self.policy = policy
        self.scope = scope
        self.run_id = run_id
        self.epoch = epoch
        self.next_seq = next_seq
        #: events to go out with the next write, in seq order: staged (optional) and held
        self._staged: list[Event] = []
        #: the ids of the held ones among them (``hold``): written again if lost
        self._held: set[str] = set()
        self._in_doubt: list[Event] = []
        #: events sent without waiting for durability: the next append waits for them
        self._unacked: list[Event] = []
        #: the ids of staged events sent ahead: left out, not written again, if lost
        self._optional: set[str] = set()
        #: the events that claimed the session for this run (written by open_session),
        #: and the session as they left it
        self.opened: list[Event] = []
        self.claimed: SessionRecord | None = None
        #: the session's transcript as the claim left it, when the claim had it (see
        #: open_session's ``opening``); None: read it
        self.transcript: list[Message] | None = None
        #: told of each batch once the log acknowledged it (a run's ``emit``)
        self.observer: Callable[[list[Event]], Awaitable[None]] | None = None
        # a run's loop and its heartbeat write through the same writer, one at a time
        self._lock = asyncio.Lock()
        self._last_write = asyncio.get_running_loop().time()

    async def keep_alive(self, interval: float) -> None:
        """Append a heartbeat whenever the run has been silent for ``interval`` seconds
        (a long model call, a slow tool), so that no worker takes it for abandoned; runs
        until cancelled, or until the session is no longer this writer's."""
        from loomflow.schemas.events import RunHeartbeat

        loop = asyncio.get_running_loop()
        while True:
            due = self._last_write + interval - loop.time()
            if due > 0:
                await asyncio.sleep(due)  # a timer: the next heartbeat is due then
                continue
            try:
                await self.emit(RunHeartbeat, None)
            except InvalidEventError as exc:
                logger.warning("%s: heartbeats stop: %s", self.scope.describe(), exc)
                return
            except Exception as exc:  # the store is away: the run's own writes say so
                logger.warning("%s: a heartbeat failed: %s", self.scope.describe(), exc)
                self._last_write = loop.time()

    def make(self, cls: type[E], payload: Any, *, offset: int = 0) -> E:
        """Build the event that the next append (plus ``offset``) will write (None as the
        payload: the type's default), signed as the store appends it: what the run's
        observers hear of is what the log holds."""
        fields: dict[str, Any] = {} if payload is None else {"payload": payload}
        return self.store.sign(
            cls(
                user_id=self.scope.user_id,
                session_id=self.scope.session_id,
                run_id=self.run_id,
                seq=self.next_seq + offset,
                epoch=self.epoch,
                **fields,
            )
        )

    def stage(self, cls: type[E], payload: Any) -> E:
        """Build an event that the next ``emit`` appends in front of its own."""
        event = self.make(cls, payload)
        self._staged.append(cast("Event", event))
        self.next_seq += 1
        return event

    async def hold(self, cls: type[E], payload: Any) -> E:
        """``send`` for an event nothing acts on before the run's next write (a final
        answer, before its checkpoint and end): a store that sends ahead sends it; any
        other writes it with that next write, in the same transaction (one write fewer a
        run). Lost with that write, it is written again in front of the retry, as a sent
        event is; a crash before that write loses it, as a crash before its own would."""
        if self.store.sends_ahead:
            return await self.send(cls, payload)
        async with self._lock:
            event = self.stage(cls, payload)
            self._held.add(event.event_id)
            return event

    async def emit(self, cls: type[E], payload: Any) -> E:
        """Append one event, after any staged ones, and return once it is durable.

        Raise what the store raised. Staged events are optional (checkpoints): when a
        write that carries them fails for another reason than a refusal, the writer
        warns, learns what landed, and writes this event alone.
        """
        return await self._write(cls, payload, durable=True)

    async def send(self, cls: type[E], payload: Any) -> E:
        """``emit`` for input the caller still holds (the prompt of a pass): on Kafka it
        returns before the broker's acknowledgement, which the next ``emit`` (the model's
        answer) waits for, so the acknowledgement overlaps the model call."""
        return await self._write(cls, payload, durable=False)

    async def _write(self, cls: type[E], payload: Any, *, durable: bool) -> E:
        async with self._lock:
            return await self._write_alone(cls, payload, durable=durable)

    async def _write_alone(self, cls: type[E], payload: Any, *, durable: bool) -> E:
        give_up = asyncio.get_running_loop().time() + self.policy.retry_seconds
        if self._in_doubt:
            await self._settle_doubt(give_up)
        staged, self._staged = self._staged, []
        held, self._held = self._held, set()
        optional = [e for e in staged if e.event_id not in held]
        # what was sent ahead (a prompt) or held (an answer) is made durable by this
        # write, or written again if lost with it
        ahead = [e for e in self._unacked if e.event_id not in self._optional]
        ahead += [e for e in staged if e.event_id in held]
        self._optional = {e.event_id for e in optional}  # if this is a send, sent ahead too
        event = self.make(cls, payload)
        batch = [*staged, cast("Event", event)]
        failures = 0
        while True:
            try:
                if self.store.appends_bounded:
                    await self._append(batch, durable=durable)
                else:
                    await _within(give_up, self._append(batch, durable=durable))
                return event
            except InvalidEventError:
                raise
            except Exception as exc:
                retriable = isinstance(exc, LoomflowError) and exc.retriable
                if not retriable and (failures or not optional):
                    raise
                if retriable and asyncio.get_running_loop().time() >= give_up:
                    raise
                if not failures:
                    logger.warning(
                        "writing %s of %s failed (%s: %s); %s",
                        " and ".join(e.type for e in batch),
                        self.scope.describe(),
                        type(exc).__name__,
                        exc,
                        f"trying again for up to {self.policy.retry_seconds:g} s"
                        if retriable
                        else "the run goes on without the checkpoint",
                    )
                failures += 1
                # observers hear of what landed after all (outside the timers)
                await self._observe(await self._recover(give_up))
            if self.next_seq > event.seq:
                return event  # it landed after all
            # what did not land is written again, what was sent ahead of it or held first
            # (the answer never lands without its prompt); a staged checkpoint is left out
            lost = [e for e in ahead if e.seq >= self.next_seq]
            ahead = [self.make(type(e), e.payload, offset=k) for k, e in enumerate(lost)]
            event = self.make(cls, payload, offset=len(ahead))
            batch = [*ahead, cast("Event", event)]

    async def _recover(self, give_up: float) -> list[Event]:
        """Learn what the failed write left in the log, waiting (with backoff) while the
        store is briefly away, until ``give_up``; return the events that landed."""
        loop = asyncio.get_running_loop()
        delay = 0.05
        while True:
            try:
                return await _within(give_up, self._resolve_doubt())
            except InvalidEventError:
                raise
            except Exception as exc:
                retriable = isinstance(exc, LoomflowError) and exc.retriable
                if not retriable or loop.time() + delay >= give_up:
                    raise
            await asyncio.sleep(delay)  # backoff while a server restarts, not a wait for a result
            delay = min(delay * 2, 2.0)

    async def _append(self, batch: list[Event], *, durable: bool = True) -> None:
        self._last_write = asyncio.get_running_loop().time()
        self.next_seq = batch[-1].seq + 1
        store = self.store
        try:
            await (store.append(batch) if durable else store.send(batch))
        except InvalidEventError:
            self.next_seq = (self._unacked or batch)[0].seq  # refused: none of it counts
            self._unacked = []
            raise
        except BaseException:
            self._in_doubt = [*self._unacked, *batch]
            self._unacked = []
            raise
        if durable or not store.sends_ahead:
            acknowledged, self._unacked = [*self._unacked, *batch], []
            await self._observe(acknowledged)
        else:
            self._unacked = [*self._unacked, *batch]

    async def _observe(self, events: list[Event]) -> None:
        """Tell the run's observer of events the log acknowledged (never of events only
        handed to it: a crash could still lose those)."""
        if events and self.observer is not None:
            await self.observer(events)

    async def _resolve_doubt(self) -> list[Event]:
        """Learn how many of the events in doubt landed; return those."""
        batch = self._in_doubt
        row = await self.store.session(self.scope)  # raises while the store is away
        landed = row.last_seq if row is not None else 0
        # a batch lands as a prefix (a transaction, or records of one partition in order)
        self.next_seq = max(batch[0].seq, min(landed, batch[-1].seq) + 1)
        if self.next_seq <= batch[-1].seq:
            logger.info(
                "%s: %d event(s) from seq %d did not land; their seqs are reused",
                self.scope.describe(),
                batch[-1].seq + 1 - self.next_seq,
                self.next_seq,
            )
        self._in_doubt = []
        return [e for e in batch if e.seq < self.next_seq]

    async def _settle_doubt(self, give_up: float | None = None) -> None:
        """Learn what the events in doubt left in the log (until ``give_up``, a loop
        time), number what was staged after them again, and tell the observer of those
        that landed."""
        resolving = self._resolve_doubt()
        landed = await (resolving if give_up is None else _within(give_up, resolving))
        self._restage()  # at once: what is staged while the observer runs is numbered right
        await self._observe(landed)

    def _restage(self) -> None:
        """Number the staged and held events again from where the log goes on, once the
        events in doubt are settled: they were numbered after those, as if all had landed
        (a heartbeat that failed during the model call, then the answer held and the
        checkpoint staged)."""
        staged, held = self._staged, self._held
        self._staged, self._held = [], set()
        for event in staged:
            again = self.stage(type(event), event.payload)
            if event.event_id in held:
                self._held.add(again.event_id)

    async def confirm(self, *, visible: bool = True) -> None:
        """Wait until the read model holds this run's events; raise any refusal of them.

        ``visible=False`` asks for the verdict alone (``EventStore.confirm``): a run's
        end, whose readers wait for the read model by position themselves."""
        async with self._lock:
            await self._confirm_alone(visible)

    async def _confirm_alone(self, visible: bool) -> None:
        if self._staged:
            if self._in_doubt:
                await self._settle_doubt()
            staged, self._staged, self._held = self._staged, [], set()
            await self._append(staged)
        try:
            await self.store.confirm(self.scope, visible=visible)
        except InvalidEventError:
            raise
        except BaseException:
            self._in_doubt, self._unacked = [*self._unacked], []
            raise
        acknowledged, self._unacked = self._unacked, []
        await self._observe(acknowledged)
