"""What an Agent talks to: a runtime over an event store (a log plus its read model)."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self

from loomflow.errors import (
    CancelRefusedError,
    CheckpointNotFoundError,
    CorruptRecordError,
    InvalidIdError,
    LoomflowError,
    ProjectionTimeoutError,
    RunCancelledError,
    RunTakenError,
    SequenceConflictError,
    SerializationError,
    SessionBusyError,
    SessionNotFoundError,
    SignalRefusedError,
    StaleWriterError,
)
from loomflow.lifecycle import Resource
from loomflow.runtime.store import EventStore
from loomflow.runtime.writer import SessionWriter, WritePolicy
from loomflow.schemas.clock import utcnow
from loomflow.schemas.ids import new_id, validate_id
from loomflow.schemas.options import DEFAULT_LEASE_SECONDS, Serializer
from loomflow.schemas.scope import Scope

if TYPE_CHECKING:
    # the event models, imported by the methods that write them: a runtime made and not
    # yet used has built none of them
    from loomflow.schemas import (
        Checkpoint,
        CheckpointMeta,
        Event,
        Message,
        RunOptions,
        Usage,
    )
    from loomflow.schemas.events import SessionForkedPayload
    from loomflow.schemas.sessions import SessionRecord
    from loomflow.settings import Settings

__all__ = ["RestoredState", "Runtime", "abandoned"]

logger = logging.getLogger(__name__)

#: this machine's name, in the ``process`` (host:pid) each run.started records
_HOST = socket.gethostname()


def abandoned(row: SessionRecord, default_lease: float = DEFAULT_LEASE_SECONDS) -> bool:
    """Whether the session's run is running and its writer has been silent past its
    lease (the one its run.started recorded, else ``default_lease``). A fork that no run
    has continued (``loomflow sessions fork``) has the status running but no run, so it
    is never abandoned."""
    if row.status != "running" or row.last_run_id is None:
        return False
    lease = row.lease_seconds or default_lease
    return (utcnow() - row.updated_at).total_seconds() > lease


def _text(value: str) -> bool:
    """Whether every store and JSON can keep ``value``: no NUL, no lone surrogate."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


@dataclass(frozen=True)
class RestoredState:
    """A session's transcript, turn count and usage at a point of its log."""

    messages: list[Message]
    turns: int
    usage: Usage
    seq: int
    checkpoint_id: str | None
    session: SessionRecord


class Runtime(Resource):
    """Durable execution for an Agent: events to a store, restore, checkpoints, journal."""

    supports_checkpoints = True

    def __init__(
        self,
        store: EventStore,
        *,
        max_checkpoints_per_session: int | None = None,
        serializer: Serializer | None = None,
        lease_seconds: float | None = None,
        retry_seconds: float | None = None,
        settings: Settings | None = None,
    ) -> None:
        """Each option unset here comes from ``settings``, else the ``LOOMFLOW_*``
        environment, else its default (see :class:`loomflow.settings.Settings`)."""
        from loomflow.settings import Settings  # pydantic-settings: once a runtime is built

        self._settings = resolved = Settings.resolve(
            settings,
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
        )
        self._store = store
        if store.signer is None:  # a store built apart signs with the runtime's key
            store.signer, store.signing_refused = resolved.writer_key()
        #: checkpoints a session keeps (< 1 keeps all)
        self.max_checkpoints_per_session = resolved.max_checkpoints_per_session
        self.serializer: Serializer = resolved.serializer
        #: how long a run's writer may stay silent before the run counts as abandoned and
        #: a worker may resume it; recorded in each run.started, so a worker follows the
        #: lease of the run it looks at. The writer sends a heartbeat after a third of it.
        self.lease_seconds = resolved.lease_seconds
        #: how long a run's writes keep trying while the store is briefly away (a broker
        #: or database restart) before the run fails with the store's error; the run
        #: stays resumable, and nothing it recorded is lost
        self.retry_seconds = resolved.retry_seconds

    @property
    def settings(self) -> Settings:
        """The options this runtime was built with, as every loomflow process reads them."""
        return self._settings

    @property
    def store(self) -> EventStore:
        return self._store

    @classmethod
    async def connect(cls, *args: Any, **kwargs: Any) -> Self:
        """A runtime built from the constructor's arguments and opened: connected, with
        what its store needs created or migrated; a failed open closes it again."""
        return await cls(*args, **kwargs).__aenter__()

    async def open(self) -> None:
        """Connect now (creating or migrating what the store needs) instead of on first use."""
        await self._store.open()

    async def setup(self) -> None:
        """Create or migrate the store's schema (and topics) now; see ``EventStore.setup``."""
        await self._store.setup()

    async def close(self) -> None:
        """Release the store's connections and threads; the runtime cannot be used after."""
        await self._store.close()

    async def session(self, scope: Scope) -> SessionRecord | None:
        """The session as its log has it now (None: no events), for a process that
        decides what to do with it (a worker about to take a run over)."""
        return await self._store.session(scope)

    async def sessions_in_flight(self, limit: int = 500) -> list[SessionRecord]:
        """The sessions a worker looks at, of every user (see
        ``EventStore.sessions_in_flight``)."""
        return await self._store.sessions_in_flight(limit)

    async def claimed(self, writer: SessionWriter) -> RestoredState:
        """The session restored as ``writer``'s claim (``open_session``) left it: what a
        run needs before its first model call, without reading the session again.
        ``checkpoint_id`` names the checkpoint a ``mode="resume"`` claim continues from
        (None: it had none and replays the log)."""
        from loomflow.schemas.events import RunStarted

        row = writer.claimed
        started = next((e for e in writer.opened if isinstance(e, RunStarted)), None)
        if row is None or started is None:
            raise ValueError("claimed() takes the writer of a claim made by open_session()")
        # the claim was confirmed: the store holds every event of the session up to it
        messages = writer.transcript
        if messages is None:
            messages = await self._transcript_of(writer.scope, row)
        return RestoredState(
            messages=messages,
            turns=row.turns,
            usage=row.usage,
            seq=row.last_seq,
            checkpoint_id=started.payload.from_checkpoint,
            session=row,
        )

    async def open_session(
        self,
        scope: Scope,
        *,
        run_id: str,
        mode: Literal["run", "resume", "fork"] = "run",
        from_checkpoint: str | None = None,
        metadata: dict[str, Any] | None = None,
        options: RunOptions | None = None,
        prepare: Callable[[SessionRecord | None], tuple[dict[str, Any] | None, RunOptions | None]]
        | None = None,
        fork: SessionForkedPayload | None = None,
        model: str | None = None,
        agent: str | None = None,
        claim_after: int | None = None,
        worker: str | None = None,
        opening: Callable[[SessionRecord | None, list[Message]], list[Message] | None]
        | None = None,
    ) -> SessionWriter:
        """Claim the session for one writer (a new epoch) and record that a run started
        (with the name of the ``model`` it calls and of the ``agent`` it belongs to, when
        given: analytics count runs per model, and a resume needs the agent). A run the
        session still had running is named as ``interrupted``: from here on its writes
        are refused (StaleWriterError), and this event records how it ended.

        The run's ``metadata`` and ``options`` are recorded with it; ``prepare``, when
        given, makes them instead from the session's row as the claim finds it (a run
        that continues another restores what that one recorded): what it raises refuses
        the claim, with nothing written.

        ``mode="resume"`` without ``from_checkpoint`` continues from the session's
        newest checkpoint, found by the same read (a run of mode "run" when it has
        none). The writer's ``claimed`` is the session as the claim left it (see
        ``claimed``). ``claim_after``
        makes the claim conditional: it is written only right after that
        seq, so of several processes taking over the same run (workers) exactly one
        wins; the others get RunTakenError and write nothing.

        ``opening``, given the session as the claim finds it and its transcript, makes the
        messages a run's prompt opens with when they are known before the claim (None:
        not known, the run records them itself): on a store that appends at once, they
        go in the claim's own transaction, one write fewer a run, and ``claimed`` does
        not read the transcript again.

        ProjectionTimeoutError: the claim is in the log, but a log-first store (Kafka) did
        not hear its verdict in time. Unless a worker made it (a worker's take-over is
        taken over again later), the run is then parked after it (``stuck``, the error
        recorded), so that no worker continues a run its caller was told had failed.
        """
        from loomflow.projections.fold import fold
        from loomflow.schemas.events import (
            RunStarted,
            RunStartedPayload,
            SessionForked,
            TurnAppended,
            TurnAppendedPayload,
        )

        newest = mode == "resume" and from_checkpoint is None
        for attempt in range(8):
            # a claim made of what the store knows is refused if it was stale: then read
            # (a conditional claim reads: a stale seq would refuse it without trying)
            known = attempt == 0 and claim_after is None
            read = self._store.claim_head if known else self._store.head
            row, latest = await read(scope, checkpoint=newest)
            if fork is not None and row is not None:
                raise InvalidIdError(f"fork target {scope.describe()} already exists")
            if claim_after is not None and (row is None or row.last_seq != claim_after):
                raise RunTakenError(
                    f"{scope.describe()} moved on past seq {claim_after}: another process "
                    "took the run first"
                )
            if prepare is not None:
                metadata, options = prepare(row)
            started = RunStartedPayload(
                mode="run" if newest and latest is None else mode,
                from_checkpoint=latest if newest else from_checkpoint,
                metadata=metadata or {},
                options=options,
                model=model,
                agent=agent,
                lease_seconds=self.lease_seconds,
                worker=worker,
                process=f"{_HOST}:{os.getpid()}",
                # a run still in flight ends with this claim: its writer is fenced
                interrupted=row.last_run_id
                if row is not None and row.status == "running"
                else None,
            )
            writer = SessionWriter(
                self._store,
                scope,
                policy=WritePolicy(self.retry_seconds, self.serializer),
                run_id=run_id,
                epoch=(row.epoch if row else 0) + 1,
                next_seq=(row.last_seq if row else 0) + 1,
            )
            events: list[Event] = []
            if fork is not None:
                events.append(writer.make(SessionForked, fork))
            events.append(writer.make(RunStarted, started, offset=len(events)))
            transcript = None  # as the claim leaves it, when read here (a claim adds none)
            if opening is not None and fork is None and not self._store.sends_ahead:
                transcript = [] if row is None else await self._transcript_of(scope, row)
                prompt = opening(row, transcript)
                if prompt:
                    payload = TurnAppendedPayload(messages=prompt)
                    events.append(writer.make(TurnAppended, payload, offset=len(events)))
                    transcript = [*transcript, *prompt]
            try:
                await self._store.append(events)
                # the one synchronous point of a run: the claim holds before it goes on
                await self._store.confirm(scope, visible=False)
            except SequenceConflictError:
                if claim_after is not None:
                    raise RunTakenError(
                        f"{scope.describe()}: another process claimed the session at seq "
                        f"{claim_after + 1} first"
                    ) from None
                continue  # another writer opened the session between our read and write
            except (StaleWriterError, RunCancelledError):
                if not known:
                    raise
                # what the store knew was older than another process's claims (or its
                # cancel): the epoch is refused before the seq; read the session, claim again
                continue
            except ProjectionTimeoutError as exc:
                if worker is None and await self._park_unconfirmed(writer, len(events), exc):
                    raise ProjectionTimeoutError(
                        f"{exc} Run {run_id} of {scope.describe()} was parked (stuck) before "
                        "any model call: resume the session once a processor runs"
                    ) from exc
                raise
            writer.next_seq += len(events)
            writer.opened = events
            for event in events:  # the session as the claim left it, without reading it again
                row, _ = fold(row, event)
            writer.claimed = row
            writer.transcript = transcript
            return writer
        raise SequenceConflictError(
            f"could not claim {scope.describe()}: other writers keep appending to it"
        )

    async def _park_unconfirmed(
        self, writer: SessionWriter, after: int, exc: ProjectionTimeoutError
    ) -> bool:
        """The claim is in the log, but its verdict did not come in time, and the caller
        hears that its run failed: park that run right after the claim (stuck, for a
        person; its wait and signals kept), so that no worker continues a run whose
        caller was told it failed and whose prompt the log never got. False when the
        log did not take that either: then the caller's error stands alone."""
        from loomflow.schemas.events import RunFailed, RunFailedPayload

        parked = writer.make(
            RunFailed,
            RunFailedPayload(error_type=type(exc).__name__, error=str(exc)[:2000], parked=True),
            offset=after,
        )
        try:
            await self._store.append([parked])
        except LoomflowError as failed:
            logger.warning(
                "%s: the unconfirmed claim of run %s could not be parked (%s)",
                writer.scope.describe(),
                writer.run_id,
                failed,
            )
            return False
        return True

    async def signal(self, scope: Scope, name: str, data: Any = None) -> int:
        """Send the signal ``name`` with ``data`` (JSON) to the session's run; return the
        seq of its ``signal.sent`` event.

        The signal stays in the session's inbox until a ``wait_for_signal(name)`` of the
        session's run receives it, or the run ends: a run that waits for it is resumed by
        a worker (or by ``agent.resume``); an abandoned run receives it when it gets to
        its wait. Sending claims the session (a new epoch), which fences a writer that
        went silent past its lease.

        Raises SessionNotFoundError for an unknown or erased session (of this user),
        SessionBusyError while a live run holds the session (retriable: send it again
        once the run waits), SignalRefusedError when no run is in flight (the session
        finished, failed or is stuck) or when the run's wait for ``name`` already timed
        out (its resumed wait raises SignalTimeoutError), SerializationError for data
        that is not JSON (NaN and infinities included) or is larger than MAX_SIGNAL_BYTES.
        """
        from loomflow.schemas.codec import dumps
        from loomflow.schemas.events import MAX_SIGNAL_BYTES, SignalSent, SignalSentPayload

        if not isinstance(name, str) or not name.strip() or len(name) > 200 or not _text(name):
            raise ValueError(
                "a signal name must be a non-empty string of <= 200 characters, without "
                f"NUL or lone surrogates, not {name!r}"
            )
        try:  # JSON as the standard has it: no NaN or infinities, no dates or sets
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"signal {name!r}: its payload is not JSON: {exc}") from exc
        size = len(dumps(data))  # and str keys only, as every event's JSON has them
        if size > MAX_SIGNAL_BYTES:
            raise SerializationError(
                f"signal {name!r} carries {size} bytes of JSON; the limit is {MAX_SIGNAL_BYTES}: "
                "send a reference (an id, a URL) instead of the data"
            )
        payload = SignalSentPayload(name=name, data=data)

        def receivable(row: SessionRecord) -> None:
            if row.last_run_id is None:
                # a fork no run has continued (`loomflow sessions fork`): the log gives it
                # the status running, but no run is in flight, now or once a lease lapses
                raise SignalRefusedError(
                    f"{scope.describe()} is a fork that no run has continued, so no run is "
                    f"in flight to receive signal {name!r}: resume it first"
                )
            if row.status in ("finished", "failed", "stuck", "cancelled"):
                raise SignalRefusedError(
                    f"{scope.describe()} has no run in flight to receive signal {name!r} "
                    f"(it is {row.status}); signals go to a run that waits, or that will"
                )
            waiting = row.waiting
            if (
                row.status == "waiting"
                and waiting is not None
                and waiting.signal == name
                and waiting.until is not None
                and utcnow() >= waiting.until
            ):
                raise SignalRefusedError(
                    f"the wait of run {row.last_run_id} of {scope.describe()} for signal "
                    f"{name!r} timed out at {waiting.until.isoformat()}; the run will see "
                    "SignalTimeoutError when resumed, so the signal would answer nothing"
                )
            if row.status == "running" and not abandoned(row, self.lease_seconds):
                raise SessionBusyError(
                    f"run {row.last_run_id} of {scope.describe()} is running; a signal is "
                    "delivered to a run that waits for it or to an idle session: send it "
                    "again once the run waits or ends"
                )

        try:
            seq = await self._store.append_admin(
                scope, SignalSent, payload, claim=True, check=receivable
            )
        except SequenceConflictError:
            raise SessionBusyError(
                f"{scope.describe()} keeps changing; send the signal again"
            ) from None
        if seq is None:
            raise SessionNotFoundError(
                f"no {scope.describe()} to signal; list them with `loomflow sessions ls`"
            )
        return seq

    async def cancel(self, scope: Scope, reason: str = "") -> int:
        """Cancel the session's run; return the seq of its ``run.cancelled`` event.

        From any process, whatever the run is doing: running (live or abandoned), waiting
        for a signal, or parked by a worker (stuck). The event claims the session (a new
        epoch), so a live run stops at its next step: its next append is refused with
        RunCancelledError (on Kafka its runtime hears of the cancel from the projector
        before that append), and nothing more of it is recorded; a model or tool call
        in flight completes, unrecorded. Workers never resume a cancelled session, and it
        refuses signals; ``agent.resume(session_id=...)`` continues it on purpose, where
        it stopped (a run that waited goes on in its wait, with its inbox).

        Raises SessionNotFoundError for an unknown or erased session (of this user),
        CancelRefusedError when no run is in flight (the session finished or failed, was
        cancelled already, or is a fork with no run yet), ValueError for a ``reason``
        longer than 2,000 characters or holding NUL.
        """
        from loomflow.schemas.events import RunCancelled, RunCancelledPayload

        if not isinstance(reason, str) or len(reason) > 2000 or not _text(reason):
            raise ValueError(
                "a cancel's reason is a string of <= 2000 characters without NUL or lone "
                f"surrogates, not {reason!r}"[:300]
            )

        def cancellable(row: SessionRecord) -> None:
            if row.last_run_id is None:
                raise CancelRefusedError(
                    f"{scope.describe()} has had no run yet (it was forked): nothing to "
                    "cancel; erase it if it is not wanted"
                )
            if row.status in ("finished", "failed", "cancelled"):
                raise CancelRefusedError(
                    f"{scope.describe()} has no run in flight to cancel: it is "
                    f"{row.status}; no worker resumes it"
                )

        try:
            seq = await self._store.append_admin(
                scope,
                RunCancelled,
                RunCancelledPayload(reason=reason),
                claim=True,
                check=cancellable,
                latest_run=True,
            )
        except SequenceConflictError:
            raise SessionBusyError(f"{scope.describe()} keeps changing; cancel it again") from None
        if seq is None:
            raise SessionNotFoundError(
                f"no {scope.describe()} to cancel; list them with `loomflow sessions ls`"
            )
        return seq

    async def fork_origin(self, parent: Scope, checkpoint_id: str) -> SessionForkedPayload:
        """What a fork of ``parent`` at ``checkpoint_id`` starts from: its lineage, the
        transcript, turn and usage at that checkpoint, and the metadata and options of the
        parent's latest run, which the fork's runs continue (the ``session.forked``
        payload).

        Raises CheckpointNotFoundError when the checkpoint is not one of ``parent``'s,
        InvalidIdError when ``checkpoint_id`` is no id at all.
        """
        from loomflow.schemas.events import SessionForkedPayload

        validate_id(checkpoint_id, "checkpoint id")
        state = await self.restore(parent, checkpoint_id)
        if state is None:
            raise CheckpointNotFoundError(
                f"no checkpoint {checkpoint_id} for {parent.describe()}; list them with "
                "agent.list_checkpoints(session_id, user_id=...)"
            )
        return SessionForkedPayload(
            parent_session_id=parent.session_id,
            parent_checkpoint_id=checkpoint_id,
            messages=state.messages,
            turn=state.turns,
            cumulative_usage=state.usage,
            metadata=state.session.run_metadata,
            options=state.session.run_options,
        )

    async def fork(
        self, parent: Scope, checkpoint_id: str, *, session_id: str | None = None
    ) -> Scope:
        """Start a new session of the same user from a checkpoint of ``parent``, without
        running it; return the new session's scope.

        The new session holds one event, the ``session.forked`` a fork by
        ``agent.resume(..., from_checkpoint=...)`` starts with, so it is resumed or run
        like any other session (its transcript is the parent's at the checkpoint).
        ``session_id`` names it (a new ``sess…`` id when None). Raises
        CheckpointNotFoundError for a checkpoint that is not ``parent``'s, InvalidIdError
        when ``session_id`` exists.
        """
        from loomflow.schemas.events import SessionForked

        origin = await self.fork_origin(parent, checkpoint_id)
        child = Scope.of(new_id("sess") if session_id is None else session_id, parent.user_id)
        taken = InvalidIdError(f"fork target {child.describe()} already exists")
        existing = await self._store.session(child)
        if existing is not None and existing.status == "erased":
            raise InvalidIdError(
                f"fork target {child.describe()} was erased: an erased session's id is not "
                "used again"
            )
        if existing is not None:
            raise taken
        event = SessionForked(
            user_id=child.user_id,
            session_id=child.session_id,
            run_id=new_id("run"),  # no run yet: the first one claims the session after this
            seq=1,
            epoch=1,
            payload=origin,
        )
        try:
            await self._store.append([event])
            await self._store.confirm(child)
        except SequenceConflictError:
            raise taken from None  # created by someone else between the check and the write
        except ProjectionTimeoutError as exc:  # a log-first store: the fork is written
            raise ProjectionTimeoutError(
                f"{exc} The fork {child.describe()} is in the log: do not make it again"
            ) from exc
        return child

    async def restore(self, scope: Scope, checkpoint_id: str | None = None) -> RestoredState | None:
        """Rebuild the session at its last event, or at a checkpoint; None if unknown."""
        row = await self._store.session(scope)
        if row is None or row.status == "erased":
            return None
        if checkpoint_id is None:
            return RestoredState(
                messages=await self._transcript(
                    scope, row.base_seq, row.last_seq, row.message_count
                ),
                turns=row.turns,
                usage=row.usage,
                seq=row.last_seq,
                checkpoint_id=None,
                session=row,
            )
        ckpt = await self._store.checkpoint(scope, checkpoint_id)
        if ckpt is None:
            return None
        return RestoredState(
            messages=await self._transcript(scope, ckpt.base_seq, ckpt.seq, ckpt.message_count),
            turns=ckpt.turn,
            usage=ckpt.cumulative_usage,
            seq=ckpt.seq,
            checkpoint_id=ckpt.checkpoint_id,
            session=row,
        )

    async def get_checkpoint(
        self, scope: Scope, checkpoint_id: str | None = None
    ) -> Checkpoint | None:
        """The full checkpoint (messages materialised), newest when id is None."""
        from loomflow.schemas.checkpoints import Checkpoint

        ckpt = await self._store.checkpoint(scope, checkpoint_id)
        if ckpt is None:
            return None
        return Checkpoint(
            session_id=scope.session_id,
            checkpoint_id=ckpt.checkpoint_id,
            turn=ckpt.turn,
            messages=await self._transcript(scope, ckpt.base_seq, ckpt.seq, ckpt.message_count),
            cumulative_usage=ckpt.cumulative_usage,
            cursor=ckpt.cursor,
            created_at=ckpt.created_at,
        )

    async def _transcript_of(self, scope: Scope, row: SessionRecord) -> list[Message]:
        """The transcript of ``scope`` as far as ``row``, its session, goes."""
        return await self._transcript(scope, row.base_seq, row.last_seq, row.message_count)

    async def _transcript(
        self, scope: Scope, base_seq: int, upto_seq: int, expected: int
    ) -> list[Message]:
        messages = await self._store.transcript(scope, base_seq, upto_seq, expected)
        if len(messages) != expected:
            raise CorruptRecordError(
                f"transcript of {scope.describe()} up to seq {upto_seq} has {len(messages)} "
                f"messages where {expected} were recorded: the store lost or gained rows"
            )
        return messages

    async def list_checkpoints(self, scope: Scope, limit: int = 50) -> list[CheckpointMeta]:
        """Checkpoint metadata, newest first; never loads messages."""
        from loomflow.schemas.checkpoints import CheckpointMeta

        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, not {limit!r}")
        rows = await self._store.list_checkpoints(scope, limit)
        return [
            CheckpointMeta(
                session_id=scope.session_id,
                checkpoint_id=r.checkpoint_id,
                turn=r.turn,
                created_at=r.created_at,
            )
            for r in rows
        ]
