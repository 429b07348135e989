"""The event-store conformance suite: what every :class:`loomflow.runtime.EventStore`
does with the events it is given, whatever it keeps them in.

Events here are made by hand (:class:`SessionLog`), not by an agent, so each rule of the
log and its read model is checked on its own: idempotent retries, seq and epoch rules
and their typed errors, reads of sessions, checkpoints, transcripts, steps and events,
retention, pruning, erasure and scoping by user.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest

from loomflow import InvalidIdError, Message, ToolCall, Usage, new_id
from loomflow.errors import (
    InvalidEventError,
    SequenceConflictError,
    SessionErasedError,
    StaleWriterError,
)
from loomflow.runtime import EventStore, PruneResult, Scope
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    RunFailed,
    RunFinished,
    RunStarted,
    SessionForked,
    StepRecorded,
    TranscriptCompacted,
    TurnAppended,
)
from loomflow.schemas.events import (
    CheckpointWrittenPayload,
    RunFailedPayload,
    RunFinishedPayload,
    RunStartedPayload,
    SessionForkedPayload,
    StepRecordedPayload,
    TranscriptCompactedPayload,
    TurnAppendedPayload,
)
from loomflow.schemas.signing import Keyring, Signer
from loomflow.testing._support import Opened, Suite, commit, opened_fixture, required_fixture

__all__ = ["SessionLog", "StoreConformance"]


class SessionLog:
    """One session's events, made in order as its single writer makes them.

    Each method returns the next event (seq, epoch, message count and usage carried
    on); pass ``seq=`` or ``epoch=`` to make an event out of turn instead, which leaves
    the log where it was. ``at`` stamps every event made with that time.
    """

    def __init__(
        self, session_id: str, user_id: str | None = None, *, at: datetime | None = None
    ) -> None:
        self.scope = Scope(session_id, user_id)
        self.at = at
        self.run_id = new_id("run")
        self.seq = 0
        self.epoch = 0
        self.turns = 0
        self.message_count = 0
        self.usage = Usage()

    def _envelope(self, seq: int | None, epoch: int | None) -> dict[str, Any]:
        in_turn = seq is None and epoch is None
        if in_turn:
            self.seq += 1
        envelope: dict[str, Any] = {
            "user_id": self.scope.user_id,
            "session_id": self.scope.session_id,
            "run_id": self.run_id,
            "seq": seq if seq is not None else self.seq + (0 if in_turn else 1),
            "epoch": self.epoch if epoch is None else epoch,
        }
        if self.at is not None:
            envelope["at"] = self.at
        return envelope

    def claim(self, *, agent: str | None = None) -> RunStarted:
        """A run (of ``agent``) starts: it claims the session with the next epoch."""
        self.epoch += 1
        self.run_id = new_id("run")
        return RunStarted(payload=RunStartedPayload(agent=agent), **self._envelope(None, None))

    def fork(self, parent: Scope, checkpoint_id: str, messages: Sequence[Message]) -> SessionForked:
        """The first event of a session forked from ``parent``'s checkpoint."""
        self.epoch += 1
        self.message_count = len(messages)
        payload = SessionForkedPayload(
            parent_session_id=parent.session_id,
            parent_checkpoint_id=checkpoint_id,
            messages=list(messages),
            turn=self.turns,
            cumulative_usage=self.usage,
        )
        return SessionForked(payload=payload, **self._envelope(None, None))

    def turn(
        self,
        *messages: Message | str,
        usage: Usage | None = None,
        seq: int | None = None,
        epoch: int | None = None,
    ) -> TurnAppended:
        """A turn adding ``messages`` (text is a user message); a turn with usage is a
        model call."""
        made = [Message.user(m) if isinstance(m, str) else m for m in messages]
        payload = TurnAppendedPayload(
            messages=made, usage=usage or Usage(), model_call=usage is not None
        )
        event = TurnAppended(payload=payload, **self._envelope(seq, epoch))
        if seq is None and epoch is None:
            self.message_count += len(made)
            self.turns += int(usage is not None)
            self.usage = self.usage + payload.usage
        return event

    def compact(self, *messages: Message | str) -> TranscriptCompacted:
        """The whole transcript replaced by ``messages``: a new base."""
        made = [Message.user(m) if isinstance(m, str) else m for m in messages]
        payload = TranscriptCompactedPayload(messages=made, replaced_messages=self.message_count)
        self.message_count = len(made)
        return TranscriptCompacted(payload=payload, **self._envelope(None, None))

    def checkpoint(self, *, retain: int = 0) -> CheckpointWritten:
        """A checkpoint of the transcript so far; the newest ``retain`` are kept (< 1: all)."""
        payload = CheckpointWrittenPayload(
            checkpoint_id=new_id("ckpt"),
            turn=self.turns,
            cumulative_usage=self.usage,
            message_count=self.message_count,
            retain=retain,
        )
        return CheckpointWritten(payload=payload, **self._envelope(None, None))

    def step(self, key: str, value: Any, *, input_hash: str = "inputs") -> StepRecorded:
        """A journal entry: ``value`` recorded for ``key`` and its inputs."""
        payload = StepRecordedPayload(step_key=key, input_hash=input_hash, value=value)
        return StepRecorded(payload=payload, **self._envelope(None, None))

    def finish(self) -> RunFinished:
        payload = RunFinishedPayload(output="done", turns=self.turns, usage=self.usage)
        return RunFinished(payload=payload, **self._envelope(None, None))

    def fail(self, error: str = "the model is away") -> RunFailed:
        payload = RunFailedPayload(error_type="ModelError", error=error)
        return RunFailed(payload=payload, **self._envelope(None, None))

    def run(self, turns: int) -> list[Event]:
        """A run's events: its claim, then per turn a question, a journal step and a
        checkpoint (what the log suites read and audit)."""
        events: list[Event] = [self.claim()]
        for k in range(turns):
            events += [self.turn(f"q{k}"), self.step(f"fetch-{k}", k), self.checkpoint()]
        return events


#: a writer's clock two hours east of UTC: stores keep the moment, in UTC
_PLUS_TWO = timezone(timedelta(hours=2))


def _answer(text: str) -> Usage:
    return Usage(input_tokens=10 * len(text), output_tokens=len(text), cost_usd=0.001)


class StoreConformance(Suite):
    """Subclass in a test module and define the fixture ``open_store``: a callable that
    returns a new store on the test's storage, each seeing what the earlier ones wrote.

    ``atomic_appends``: an append whose batch is refused in part stores none of it (one
    transaction). A store that writes a log before it folds it (Kafka) sets it False:
    there a batch lands as a prefix, everything before the refused event and nothing
    after it.
    """

    atomic_appends: ClassVar[bool] = True

    factory = "open_store"
    open_store = required_fixture("open_store", "EventStore")
    new_store = opened_fixture("new_store")
    store = opened_fixture("store", one=True)

    # --- reads of what is not there ---------------------------------------------------

    async def test_an_unknown_session_reads_as_nothing(self, store: EventStore) -> None:
        scope = Scope("nobody", "alice")
        assert await store.session(scope) is None
        assert await store.checkpoint(scope, None) is None
        assert await store.checkpoint(scope, new_id("ckpt")) is None
        assert await store.list_checkpoints(scope, 10) == []
        assert await store.step(scope, "fetch") is None
        assert await store.read_events(scope) == []
        assert await store.erase("nobody", user_id="alice") is False
        assert await store.prune(session_id="nobody") == PruneResult()

    # --- the log ------------------------------------------------------------------------

    async def test_events_read_back_in_order_exactly_as_written(
        self, store: EventStore, new_store: Opened[EventStore]
    ) -> None:
        log = SessionLog("s1", "alice")
        call = ToolCall(id="c1", name="search", arguments={"zeta": 1, "alpha": {"y": 2, "b": 3}})
        events: list[Event] = [
            log.claim(),
            log.turn("Find it."),
            log.turn(Message.assistant("", [call]), usage=_answer("search")),
            log.turn(Message.tool("c1", "NUL \x00 inside")),
            log.step("fetch", {"zeta": [1, 2], "alpha": None}),
            log.checkpoint(),
        ]
        await store.send(events[:2])  # sent without waiting: the next append waits for it
        await commit(store, events[2:])
        for reader in (store, new_store()):
            read = await reader.read_events(log.scope)
            assert read == events
            # key order and every byte kept: a restored transcript is the same prompt prefix
            assert [e.model_dump_json() for e in read] == [e.model_dump_json() for e in events]
            assert await reader.read_events(log.scope, 3) == events[3:]
            assert await reader.read_events(log.scope, log.seq) == []

    async def test_a_signed_event_reads_back_with_its_signature_holding(
        self, store: EventStore, new_store: Opened[EventStore]
    ) -> None:
        # what a signature covers must survive the store's columns: the moment of ``at``
        # whatever its offset or microseconds, the payload's key order and every byte
        signer = Signer.generate()
        keyring = Keyring.of(signer.trusted())
        log = SessionLog("s1", "alice", at=datetime(2026, 3, 1, 9, 30, tzinfo=_PLUS_TWO))
        call = ToolCall(id="c1", name="search", arguments={"zeta": 1, "alpha": {"y": 2.5}})
        made: list[Event] = [
            log.claim(),
            log.turn("Find it. \u00e9\u00e8 \x00"),
            log.turn(Message.assistant("", [call]), usage=_answer("search")),
        ]
        log.at = datetime(2026, 3, 1, 7, 31, 2, 123456, tzinfo=UTC)
        made += [log.step("fetch", {"zeta": [1, 2], "alpha": None}), log.checkpoint()]
        signed = [signer.sign_event(event) for event in made]
        unsigned = log.turn("an unsigned one")
        await commit(store, [*signed, unsigned])
        for reader in (store, new_store()):
            *read, plain = await reader.read_events(log.scope)
            assert [e.sig for e in read] == [e.sig for e in signed]
            assert [keyring.event_problem(e) for e in read] == [None] * len(signed)
            assert plain.sig is None and "sig" not in plain.model_dump(mode="json")

    async def test_a_store_with_a_key_signs_what_it_appends_and_keeps_a_signature_given(
        self, store: EventStore, new_store: Opened[EventStore]
    ) -> None:
        ours, theirs = Signer.generate(), Signer.generate()
        keyring = Keyring.of(ours.trusted(), theirs.trusted())
        store.signer = ours  # what the settings' LOOMFLOW_SIGNING_KEY gives a store
        log = SessionLog("s1", "alice")
        claim = log.claim()
        copied = theirs.sign_event(log.turn("signed where it was written"))
        events: list[Event] = [claim, copied, log.turn("q")]
        await store.send(events[:1])
        await commit(store, events[1:])
        again = events[2]  # a retry of an append whose outcome was not seen: the same bytes
        await commit(store, [again])
        read = await new_store().read_events(log.scope)
        assert [e.event_id for e in read] == [e.event_id for e in events]
        assert [e.sig.key if e.sig else None for e in read] == [
            ours.key_id,
            theirs.key_id,
            ours.key_id,
        ]
        assert [keyring.event_problem(e) for e in read] == [None, None, None]
        assert read[2] == ours.sign_event(again)

    async def test_the_session_row_follows_its_events(self, store: EventStore) -> None:
        log = SessionLog("s1")
        claim = log.claim()
        await commit(store, [claim])
        row = await store.session(log.scope)
        assert row is not None
        assert (row.session_id, row.user_id, row.last_seq, row.epoch) == ("s1", None, 1, 1)
        assert (row.status, row.turns, row.message_count, row.last_run_id) == (
            "running",
            0,
            0,
            claim.run_id,
        )
        later: list[Event] = [log.turn("q"), log.turn(Message.assistant("a"), usage=_answer("a"))]
        later.append(log.finish())
        await commit(store, later)
        row = await store.session(log.scope)
        assert row is not None
        assert (row.last_seq, row.epoch, row.status) == (4, 1, "finished")
        assert (row.turns, row.usage, row.message_count, row.base_seq) == (1, log.usage, 2, 0)
        assert row.created_at == claim.at and row.updated_at == later[-1].at
        assert row.parent_session_id is None and row.parent_checkpoint_id is None

    async def test_a_retried_append_is_stored_once(self, store: EventStore) -> None:
        log = SessionLog("s1")
        first: list[Event] = [log.claim(), log.turn("hi")]
        await store.append(first)
        await store.append(first)  # its outcome was not seen: the writer sends it again
        await store.append(first[1:])
        second = log.turn("again")
        await store.append([first[1], second])  # overlapping what is stored: only new lands
        await store.confirm(log.scope)
        stored = [e.event_id for e in (*first, second)]
        assert [e.event_id for e in await store.read_events(log.scope)] == stored
        row = await store.session(log.scope)
        assert row is not None and row.last_seq == 3 and row.message_count == 2
        clash = log.turn("another writer's", seq=2)  # same seq, another event: not a retry
        with pytest.raises(SequenceConflictError):
            await commit(store, [clash])
        assert [e.event_id for e in await store.read_events(log.scope)] == stored

    async def test_seq_and_epoch_rules_refuse_with_typed_errors(self, store: EventStore) -> None:
        async def refused(log: SessionLog, event: Event, error: type[InvalidEventError]) -> None:
            before = await store.read_events(log.scope)
            with pytest.raises(error) as caught:
                await commit(store, [event])
            assert caught.value.reason  # says why
            assert await store.read_events(log.scope) == before  # nothing of it stored

        start = SessionLog("starts-late")
        await refused(start, start.turn("x", seq=2), SequenceConflictError)
        assert await store.session(start.scope) is None

        logs = {name: SessionLog(name) for name in ("gap", "taken", "stale", "jump", "fork")}
        for log in logs.values():
            await commit(store, [log.claim(), log.turn("first")])
        gap = logs["gap"]
        await refused(gap, gap.turn("skips one", seq=gap.seq + 2), SequenceConflictError)
        taken = logs["taken"]
        await refused(taken, taken.turn("same seq", seq=taken.seq), SequenceConflictError)

        stale = logs["stale"]
        old_epoch = stale.epoch
        await commit(store, [stale.claim()])  # another run took the session over
        late = stale.turn("late", seq=stale.seq + 1, epoch=old_epoch)
        await refused(stale, late, StaleWriterError)  # even with the right seq

        jump = logs["jump"]  # only a claim (run.started, session.forked) moves the epoch on
        await refused(jump, jump.turn("ahead", epoch=jump.epoch + 1), InvalidEventError)
        fork = logs["fork"]
        copied = fork.fork(Scope("elsewhere"), new_id("ckpt"), [Message.user("copied")])
        await refused(fork, copied, InvalidEventError)  # a fork is a session's first event

        for name, log in logs.items():
            row = await store.session(log.scope)
            assert row is not None and row.last_seq == (3 if name == "stale" else 2), name

    async def test_concurrent_appends_land_whole_and_a_refused_batch_fails_alone(
        self, store: EventStore, new_store: Opened[EventStore]
    ) -> None:
        logs = [SessionLog(f"s{n}") for n in range(20)]
        bad = SessionLog("bad")
        await asyncio.gather(*(commit(store, [log.claim()]) for log in [*logs, bad]))

        async def write(log: SessionLog) -> None:
            for k in range(5):
                await store.append([log.turn(f"{k}")])
            await store.confirm(log.scope)

        good = [bad.turn("one"), bad.turn("two")]
        # refused in the middle: a gap, and after it an event that would follow the gap
        batch = [*good, bad.turn("gap", seq=bad.seq + 2), bad.turn("after", seq=bad.seq + 3)]
        outcomes = await asyncio.gather(
            *(write(log) for log in logs), commit(store, batch), return_exceptions=True
        )
        assert all(o is None for o in outcomes[:-1]), outcomes
        assert isinstance(outcomes[-1], SequenceConflictError), outcomes[-1]
        reader = new_store()  # what was committed, not what the writing store remembers
        for log in logs:
            transcript = await reader.transcript(log.scope, 0, 6, 5)
            assert [m.content for m in transcript] == list("01234"), log.scope
        kept = [] if self.atomic_appends else good  # all or nothing, or the prefix
        read = await reader.read_events(bad.scope)
        assert [e.event_id for e in read[1:]] == [e.event_id for e in kept]
        row = await reader.session(bad.scope)
        assert row is not None and row.last_seq == 1 + len(kept)

    # --- checkpoints, transcripts, steps ------------------------------------------------

    async def test_checkpoints_list_newest_first_and_read_by_id(self, store: EventStore) -> None:
        log = SessionLog("s1", "alice")
        events: list[Event] = [log.claim()]
        checkpoints: list[CheckpointWritten] = []
        for n in range(3):
            events += [log.turn(f"q{n}"), log.turn(Message.assistant(f"a{n}"), usage=_answer("a"))]
            checkpoints.append(log.checkpoint())
            events.append(checkpoints[-1])
        await commit(store, events)
        ids = [c.payload.checkpoint_id for c in reversed(checkpoints)]
        assert [c.checkpoint_id for c in await store.list_checkpoints(log.scope, 50)] == ids
        assert [c.checkpoint_id for c in await store.list_checkpoints(log.scope, 2)] == ids[:2]
        newest = await store.checkpoint(log.scope, None)
        assert newest is not None and newest.checkpoint_id == ids[0]
        first = await store.checkpoint(log.scope, checkpoints[0].payload.checkpoint_id)
        assert first is not None
        written = checkpoints[0]
        assert (first.seq, first.base_seq, first.turn, first.message_count) == (4, 0, 1, 2)
        assert first.cumulative_usage == written.payload.cumulative_usage
        assert first.cursor is None and first.created_at == written.at
        assert await store.checkpoint(log.scope, new_id("ckpt")) is None

    async def test_transcripts_fold_from_the_latest_base(self, store: EventStore) -> None:
        log = SessionLog("s1")
        await commit(store, [log.claim(), log.turn("q1"), log.turn("q2"), log.checkpoint()])
        early = await store.checkpoint(log.scope, None)
        assert early is not None
        compacted = log.compact("Summary of q1 and q2")
        await commit(store, [compacted, log.turn("q3"), log.checkpoint()])
        late = await store.checkpoint(log.scope, None)
        assert late is not None and late.base_seq == compacted.seq
        row = await store.session(log.scope)
        assert row is not None and (row.base_seq, row.message_count) == (compacted.seq, 2)

        def texts(messages: list[Message]) -> list[str]:
            return [m.content for m in messages]

        before = await store.transcript(log.scope, early.base_seq, early.seq, early.message_count)
        assert texts(before) == ["q1", "q2"]
        prefix = await store.transcript(log.scope, 0, 2, 1)
        assert texts(prefix) == ["q1"]
        now = await store.transcript(log.scope, row.base_seq, row.last_seq, row.message_count)
        assert texts(now) == ["Summary of q1 and q2", "q3"]

        child = SessionLog("child")
        await commit(store, [child.fork(log.scope, late.checkpoint_id, now), child.turn("q4")])
        forked = await store.session(child.scope)
        assert forked is not None
        assert (forked.parent_session_id, forked.parent_checkpoint_id) == ("s1", late.checkpoint_id)
        read = await store.transcript(child.scope, forked.base_seq, forked.last_seq, 3)
        assert texts(read) == [*texts(now), "q4"]

    async def test_a_step_reads_as_its_latest_entry(self, store: EventStore) -> None:
        log = SessionLog("s1")
        value = {"zeta": 1, "alpha": [1, "two", None], "nested": {"b": True, "a": 0.5}}
        await commit(store, [log.claim(), log.step("fetch", value, input_hash="first")])
        step = await store.step(log.scope, "fetch")
        assert step is not None
        assert (step.step_key, step.input_hash, step.seq, step.serializer) == (
            "fetch",
            "first",
            2,
            "json",
        )
        assert step.value == value and list(step.value) == list(value)  # key order kept
        again = log.step("fetch", "rerun", input_hash="second")
        await commit(store, [again])  # same key, changed inputs: the newest entry counts
        latest = await store.step(log.scope, "fetch")
        assert latest is not None and (latest.input_hash, latest.value) == ("second", "rerun")
        assert latest.at == again.at
        assert await store.step(log.scope, "other") is None
        assert await store.step(Scope("s1", "bob"), "fetch") is None

    async def test_retention_keeps_the_newest_checkpoints_each_asks_for(
        self, store: EventStore
    ) -> None:
        kept, unbounded = SessionLog("kept"), SessionLog("unbounded")
        for log, retain in ((kept, 2), (unbounded, 0)):
            events: list[Event] = [log.claim()]
            for n in range(4):
                events += [log.turn(f"q{n}"), log.checkpoint(retain=retain)]
            await commit(store, events)
        read = await store.read_events(kept.scope)
        newest = [e.seq for e in read if isinstance(e, CheckpointWritten)]
        listed = await store.list_checkpoints(kept.scope, 50)
        assert [c.seq for c in listed] == newest[::-1][:2]
        assert len(await store.list_checkpoints(unbounded.scope, 50)) == 4
        # retention drops checkpoints, never the log or the transcript
        assert len(await store.read_events(kept.scope)) == 9
        row = await store.session(kept.scope)
        assert row is not None and row.message_count == 4

    # --- users ------------------------------------------------------------------------------

    async def test_the_same_session_id_is_a_separate_session_per_user(
        self, store: EventStore
    ) -> None:
        logs = [SessionLog("shared", user) for user in ("alice", "bob", None)]
        for n, log in enumerate(logs):
            events: list[Event] = [log.claim()]
            events += [log.turn(f"{log.scope.user_id} {k}") for k in range(n + 1)]
            events += [log.step("fetch", n), log.checkpoint()]
            await commit(store, events)
        for n, log in enumerate(logs):
            row = await store.session(log.scope)
            assert row is not None and row.user_id == log.scope.user_id
            assert row.message_count == n + 1
            step = await store.step(log.scope, "fetch")
            assert step is not None and step.value == n
            listed = await store.list_checkpoints(log.scope, 50)
            assert [c.message_count for c in listed] == [n + 1]
            others = [other for other in logs if other is not log]
            for other in others:
                theirs = (await store.list_checkpoints(other.scope, 50))[0].checkpoint_id
                assert await store.checkpoint(log.scope, theirs) is None
            read = await store.read_events(log.scope)
            assert {e.user_id for e in read} == {log.scope.user_id} and len(read) == n + 4
        assert await store.session(Scope("shared", "carol")) is None

    # --- prune and erase ----------------------------------------------------------------

    async def test_prune_needs_a_valid_filter(self, store: EventStore) -> None:
        with pytest.raises(ValueError):
            await store.prune()  # refuses to delete the whole store
        with pytest.raises(ValueError):
            await store.prune(before=datetime(2026, 1, 1))  # naive: ambiguous
        with pytest.raises(InvalidIdError):
            await store.prune(session_id="../x")
        with pytest.raises(InvalidIdError):
            await store.prune(user_id="a b")

    async def test_prune_deletes_whole_sessions_by_filter(self, store: EventStore) -> None:
        logs = {
            (user, sid): SessionLog(sid, user)
            for user in ("alice", "bob", None)
            for sid in ("done", "live")
        }
        for log in logs.values():
            await commit(store, [log.claim(), log.turn("q"), log.checkpoint(), log.step("k", 1)])

        def gone(*keys: tuple[str | None, str]) -> set[tuple[str | None, str]]:
            return set(keys)

        async def remaining() -> set[tuple[str | None, str]]:
            found = set()
            for key, log in logs.items():
                row = await store.session(log.scope)
                if row is not None and row.status != "erased":
                    found.add(key)
                    assert await store.step(log.scope, "k") is not None
                    assert len(await store.list_checkpoints(log.scope, 50)) == 1
                else:
                    assert await store.list_checkpoints(log.scope, 50) == []
                    assert await store.checkpoint(log.scope, None) is None
            return found

        every = set(logs)
        result = await store.prune(session_id="done", user_id="alice")
        assert (result.sessions, result.checkpoints, result.events) == (1, 1, 4)
        assert await remaining() == every - gone(("alice", "done"))
        result = await store.prune(user_id=None)  # the sessions without a user
        assert (result.sessions, result.checkpoints, result.events) == (2, 2, 8)
        assert await remaining() == every - gone(("alice", "done"), (None, "done"), (None, "live"))
        result = await store.prune(session_id="done")  # whoever's it is
        assert (result.sessions, result.checkpoints) == (1, 1)
        assert await remaining() == gone(("alice", "live"), ("bob", "live"))
        assert await store.prune(session_id="done") == PruneResult()

    async def test_prune_before_a_time_takes_old_sessions_and_checkpoints(
        self, store: EventStore
    ) -> None:
        cutoff = datetime.now(UTC) - timedelta(days=30)
        old = SessionLog("old", at=cutoff - timedelta(days=1))
        await commit(store, [old.claim(), old.turn("q"), old.checkpoint(), old.checkpoint()])
        live = SessionLog("live", at=cutoff - timedelta(days=1))
        early: list[Event] = [live.claim(), live.turn("q"), live.checkpoint(), live.checkpoint()]
        await commit(store, early)
        live.at = cutoff + timedelta(days=1)
        await commit(store, [live.turn("r"), live.checkpoint()])

        nothing = await store.prune(before=cutoff - timedelta(days=2))
        assert (nothing.sessions, nothing.checkpoints) == (0, 0)
        assert len(await store.list_checkpoints(old.scope, 50)) == 2
        result = await store.prune(before=cutoff)
        # old is deleted whole; in live, only the checkpoints written before the cutoff go
        assert (result.sessions, result.checkpoints) == (1, 4)
        assert result.events >= old.seq
        assert await store.list_checkpoints(old.scope, 50) == []
        assert [c.seq for c in await store.list_checkpoints(live.scope, 50)] == [live.seq]
        row = await store.session(live.scope)
        assert row is not None and row.status == "running" and row.message_count == 2

    async def test_erase_leaves_a_tombstone_and_nothing_else(self, store: EventStore) -> None:
        alice, bob = SessionLog("s1", "alice"), SessionLog("s1", "bob")
        for log in (alice, bob):
            await commit(store, [log.claim(), log.turn("secret"), log.step("k", 1)])
            await commit(store, [log.checkpoint()])
        replayed = (await store.read_events(alice.scope))[1]
        assert await store.erase("s1", user_id="alice") is True
        row = await store.session(alice.scope)
        assert row is not None and row.status == "erased"
        assert (row.message_count, row.turns) == (0, 0)
        events = await store.read_events(alice.scope)
        assert events and all(e.type == "session.erased" for e in events)
        assert await store.list_checkpoints(alice.scope, 50) == []
        assert await store.step(alice.scope, "k") is None
        with pytest.raises(SessionErasedError):  # not undone by a late or redelivered event
            await commit(store, [alice.turn("late")])
        with pytest.raises(SessionErasedError):
            await commit(store, [replayed])
        assert await store.erase("s1", user_id="alice") is False
        assert len(await store.read_events(bob.scope)) == 4  # bob's session of that id stays
        assert len(await store.list_checkpoints(bob.scope, 50)) == 1

    async def test_prune_keeps_the_tombstone_that_refuses_an_erased_sessions_events(
        self, store: EventStore
    ) -> None:
        log = SessionLog("s1", "alice")
        await commit(store, [log.claim(), log.turn("secret"), log.checkpoint()])
        replayed = await store.read_events(log.scope)
        assert await store.erase("s1", user_id="alice") is True
        await store.prune(user_id="alice")
        await store.prune(before=datetime.now(UTC) + timedelta(days=1))
        for event in replayed:  # the whole log again, from its first event
            with pytest.raises(SessionErasedError):
                await commit(store, [event])
        row = await store.session(log.scope)
        assert row is not None and row.status == "erased"
        assert [e.type for e in await store.read_events(log.scope)] == ["session.erased"]
        assert await store.list_checkpoints(log.scope, 50) == []
