"""A run's single writer against a store that fails on purpose: an append whose outcome is
unknown is settled by reading the log, never turned into a gap or a second copy; a store
briefly away is ridden out for the runtime's ``retry_seconds``; a staged checkpoint is
given up rather than the run; a refusal is final; observers hear of each event once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

import pytest

from loomflow.errors import StaleWriterError, StoreError, StoreUnavailableError
from loomflow.runtime import InProcStore, Runtime, Scope, SessionWriter
from loomflow.runtime import writer as writer_module
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    Message,
    RunHeartbeat,
    TurnAppended,
    Usage,
    new_id,
)
from loomflow.schemas.events import CheckpointWrittenPayload, TurnAppendedPayload
from loomflow.schemas.sessions import SessionRecord
from tests.support.waiting import eventually

SCOPE = Scope("s1")


class Failing(InProcStore):
    """An in-process store whose next appends fail as planned: each entry is the error
    to raise and whether the batch landed first (an outcome the writer cannot see)."""

    def __init__(self) -> None:
        super().__init__()
        self.plan: list[tuple[Exception, bool]] = []
        self.appends = 0

    async def append(self, events: Sequence[Event]) -> None:
        self.appends += 1
        if self.plan:
            error, landed = self.plan.pop(0)
            if landed:
                await super().append(events)
            raise error
        await super().append(events)


async def _writer(store: Failing, retry_seconds: float = 5) -> tuple[SessionWriter, list[str]]:
    runtime = Runtime(store, retry_seconds=retry_seconds)
    writer = await runtime.open_session(SCOPE, run_id=new_id("run"))
    heard: list[str] = []

    async def observe(events: list[Event]) -> None:
        heard.extend(e.event_id for e in events)

    writer.observer = observe
    return writer, heard


def _said(text: str) -> TurnAppendedPayload:
    return TurnAppendedPayload(messages=[Message.user(text)])


def _checkpoint() -> CheckpointWrittenPayload:
    return CheckpointWrittenPayload(
        checkpoint_id=new_id("ckpt"),
        turn=0,
        cumulative_usage=Usage(),
        message_count=1,
        retain=20,
    )


async def _log(store: Failing) -> list[Event]:
    return await store.read_events(SCOPE)


async def test_an_append_that_landed_before_its_error_is_not_written_twice() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    store.plan = [(StoreUnavailableError("the reply was lost"), True)]
    event = await writer.emit(TurnAppended, _said("a"))
    after = await writer.emit(TurnAppended, _said("b"))
    log = await _log(store)
    assert [e.event_id for e in log[1:]] == [event.event_id, after.event_id]
    assert [e.seq for e in log] == [1, 2, 3]  # no gap, no second copy
    assert heard == [event.event_id, after.event_id]  # each heard of once


async def test_an_append_that_did_not_land_is_written_again_at_its_seq() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    store.plan = [(StoreUnavailableError("away"), False), (StoreUnavailableError("away"), False)]
    event = await writer.emit(TurnAppended, _said("a"))
    log = await _log(store)
    assert [e.seq for e in log] == [1, 2] and log[-1].type == "turn.appended"
    assert heard == [log[-1].event_id] and event.seq == 2
    assert store.appends == 4  # the claim, two failures, the write that landed


async def test_a_store_away_past_retry_seconds_fails_the_write_with_its_error() -> None:
    store = Failing()
    writer, heard = await _writer(store, retry_seconds=0)
    store.plan = [(StoreUnavailableError("away for good"), False)] * 50
    with pytest.raises(StoreUnavailableError, match="away for good"):
        await writer.emit(TurnAppended, _said("a"))
    assert heard == []
    store.plan = []
    event = await writer.emit(TurnAppended, _said("a"))  # back: the seq was given back
    assert event.seq == 2 and [e.seq for e in await _log(store)] == [1, 2]


async def test_a_write_carrying_a_staged_checkpoint_gives_up_the_checkpoint_not_the_run() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    await writer.emit(TurnAppended, _said("a"))
    writer.stage(CheckpointWritten, _checkpoint())
    store.plan = [(StoreError("disk I/O error"), False)]  # not retriable
    event = await writer.emit(TurnAppended, _said("b"))
    log = await _log(store)
    assert [e.type for e in log] == ["run.started", "turn.appended", "turn.appended"]
    assert log[-1].event_id == event.event_id and event.seq == 3
    assert heard[-1] == event.event_id and len(heard) == 2


async def test_a_failure_that_is_not_retriable_and_carries_nothing_optional_is_raised() -> None:
    store = Failing()
    writer, _ = await _writer(store)
    store.plan = [(StoreError("disk I/O error"), False)]
    with pytest.raises(StoreError, match="disk I/O error"):
        await writer.emit(TurnAppended, _said("a"))
    assert store.appends == 2  # tried once: only a retriable error is tried again


async def test_a_refused_append_is_final_and_leaves_nothing_heard() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    fresh, _ = await _writer(store)  # another run claims the session: this one is stale
    with pytest.raises(StaleWriterError):
        await writer.emit(TurnAppended, _said("late"))
    with pytest.raises(StaleWriterError):
        await writer.emit(RunHeartbeat, None)
    assert heard == []
    assert await fresh.emit(TurnAppended, _said("mine"))  # the claimant writes on
    assert [e.run_id for e in await _log(store)][-1] == fresh.run_id


async def test_a_staged_event_goes_out_in_front_of_the_next_and_with_confirm() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    await writer.emit(TurnAppended, _said("a"))
    staged = writer.stage(CheckpointWritten, _checkpoint())
    await writer.confirm()  # the end of a run writes what was staged
    log = await _log(store)
    assert log[-1].event_id == staged.event_id and heard[-1] == staged.event_id
    assert writer.next_seq == 4


class Unbounded(Failing):
    """The same store, taken for one whose appends may hang (a server's): the writer
    arms its timer around each."""

    appends_bounded = False


@pytest.mark.parametrize("store_type", [Failing, Unbounded])
async def test_writes_through_either_path_land_once_each(store_type: type[Failing]) -> None:
    store = store_type()
    writer, heard = await _writer(store)
    store.plan = [(StoreUnavailableError("away"), False), (StoreUnavailableError("lost"), True)]
    first = await writer.emit(TurnAppended, _said("a"))
    second = await writer.emit(TurnAppended, _said("b"))
    log = await _log(store)
    assert [e.event_id for e in log[1:]] == [first.event_id, second.event_id] == heard


async def test_an_append_that_hangs_fails_as_the_store_being_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Hangs(Unbounded):
        async def append(self, events: Sequence[Event]) -> None:
            if any(isinstance(e, TurnAppended) for e in events):
                await asyncio.Event().wait()  # a server that never answers
            await super().append(events)

    monkeypatch.setattr(writer_module, "MIN_ATTEMPT_SECONDS", 0.2)
    store = Hangs()
    writer, heard = await _writer(store, retry_seconds=0)
    with pytest.raises(StoreUnavailableError, match="did not answer a write within"):
        await asyncio.wait_for(writer.emit(TurnAppended, _said("a")), 10)
    assert heard == []


class SendsAhead(Failing):
    """``send`` holds events until the next append or confirm writes them, as Kafka
    acknowledges a send only later."""

    sends_ahead = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Event] = []
        self.confirm_fails: Exception | None = None

    async def send(self, events: Sequence[Event]) -> None:
        self.held.extend(events)

    async def append(self, events: Sequence[Event]) -> None:
        batch, self.held = [*self.held, *events], []
        await super().append(batch)

    async def confirm(self, scope: Scope, *, visible: bool = True) -> None:
        if self.confirm_fails is not None:
            raise self.confirm_fails
        if self.held:
            await self.append([])


async def test_emit_is_durable_send_is_not_and_observers_hear_once_durable() -> None:
    store = SendsAhead()
    writer, heard = await _writer(store)
    prompt = await writer.send(TurnAppended, _said("prompt"))
    assert store.held == [prompt] and heard == []  # handed over, not in the log yet
    answer = await writer.emit(TurnAppended, _said("answer"))
    assert not store.held and heard == [prompt.event_id, answer.event_id]
    again = await writer.send(TurnAppended, _said("next"))
    assert heard[-1] == answer.event_id
    await writer.confirm()  # the end of a run: what was sent is acknowledged, and heard
    assert heard[-1] == again.event_id
    assert [e.event_id for e in await _log(store)][1:] == heard


async def test_a_confirm_that_fails_leaves_what_was_sent_in_doubt_for_the_next_write() -> None:
    store = SendsAhead()
    writer, heard = await _writer(store)
    sent = await writer.send(TurnAppended, _said("prompt"))
    store.confirm_fails = StoreUnavailableError("away")
    with pytest.raises(StoreUnavailableError):
        await writer.confirm()
    store.confirm_fails, store.held = None, []  # the send was lost with the connection
    # the sent event never reached the log: the next write takes its seq
    after = await writer.emit(TurnAppended, _said("again"))
    assert after.seq == sent.seq and heard == [after.event_id]


async def test_the_log_is_read_again_after_a_failure_until_the_store_answers() -> None:
    class SlowToAnswer(Failing):
        def __init__(self) -> None:
            super().__init__()
            self.reads_fail: list[Exception] = []

        async def session(self, scope: Scope) -> SessionRecord | None:
            if self.reads_fail:
                raise self.reads_fail.pop(0)
            return await super().session(scope)

    store = SlowToAnswer()
    writer, heard = await _writer(store)
    store.plan = [(StoreUnavailableError("lost"), True)]
    store.reads_fail = [StoreUnavailableError("restarting")] * 2
    event = await writer.emit(TurnAppended, _said("a"))
    assert [e.event_id for e in await _log(store)][1:] == [event.event_id] == heard
    # an error of the read that is not the store's own is not ridden out
    store.plan = [(StoreUnavailableError("lost"), False)]
    store.reads_fail = [OSError("bad descriptor")]
    with pytest.raises(OSError, match="bad descriptor"):
        await writer.emit(TurnAppended, _said("b"))


async def test_a_silent_run_sends_heartbeats_rides_out_a_failed_one_and_stops_when_fenced() -> None:
    store = Failing()
    writer, _ = await _writer(store)
    beats = asyncio.create_task(writer.keep_alive(0.05))
    try:

        async def beats_in_log() -> int:
            return sum(isinstance(e, RunHeartbeat) for e in await _log(store))

        await eventually(lambda: beats_in_log(), what="a heartbeat")
        store.plan = [(StoreError("disk I/O error"), False)]  # one heartbeat fails
        seen = await beats_in_log()
        await eventually(lambda: store.plan == [], what="the failing heartbeat")
        await eventually(
            lambda: _more(beats_in_log(), seen), what="a heartbeat after the failed one"
        )
        await _writer(store)  # another run claims the session: this writer is fenced
        await asyncio.wait_for(beats, 10)  # heartbeats stop by themselves
    finally:
        beats.cancel()


async def _more(count: Awaitable[int], than: int) -> bool:
    return await count > than


async def test_what_was_sent_ahead_and_lost_with_a_failed_append_is_written_again_first() -> None:
    """A prompt sent ahead of the answer (Kafka acknowledges both at once) and lost with
    the append that failed is written again in front of the answer, not dropped: the
    answer never lands without the prompt it answers."""
    store = SendsAhead()
    writer, heard = await _writer(store)
    writer.stage(CheckpointWritten, _checkpoint())  # optional: given up if lost
    await writer.send(TurnAppended, _said("prompt"))
    # the batch of both is lost, then the one written again
    store.plan = [(StoreUnavailableError("away"), False)] * 2
    answer = await writer.emit(TurnAppended, _said("answer"))
    log = await _log(store)
    said = [e.payload.messages[0].content for e in log if isinstance(e, TurnAppended)]
    assert said == ["prompt", "answer"] and [e.seq for e in log] == [1, 2, 3]
    assert not any(isinstance(e, CheckpointWritten) for e in log)
    assert log[-1].event_id == answer.event_id and heard == [e.event_id for e in log[1:]]


async def test_a_held_event_goes_out_with_the_next_write_in_one_append() -> None:
    """On a store that does not send ahead, ``hold`` writes nothing: the held event (a
    final answer) goes in front of the next write, with what was staged between, in one
    append; observers hear of it only then."""
    store = Failing()
    writer, heard = await _writer(store)
    answer = await writer.hold(TurnAppended, _said("answer"))
    checkpoint = writer.stage(CheckpointWritten, _checkpoint())
    assert store.appends == 1 and heard == []  # the claim alone
    end = await writer.emit(RunHeartbeat, None)
    assert store.appends == 2  # one append for the three
    log = await _log(store)
    assert [e.event_id for e in log[1:]] == [answer.event_id, checkpoint.event_id, end.event_id]
    assert heard == [e.event_id for e in log[1:]] and [e.seq for e in log] == [1, 2, 3, 4]


async def test_a_held_event_is_written_at_confirm_when_no_write_follows() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    answer = await writer.hold(TurnAppended, _said("answer"))
    await writer.confirm()
    assert [e.event_id for e in (await _log(store))[1:]] == [answer.event_id] == heard


async def test_a_held_event_lost_with_a_failed_write_is_written_again_unlike_a_staged_one() -> None:
    """A staged checkpoint is optional and given up with the write that failed; a held
    answer is not: it is written again in front of the event that carried it."""
    store = Failing()
    writer, heard = await _writer(store)
    await writer.hold(TurnAppended, _said("answer"))
    writer.stage(CheckpointWritten, _checkpoint())
    store.plan = [(StoreError("disk I/O error"), False)]  # not retriable: the checkpoint goes
    end = await writer.emit(RunHeartbeat, None)
    log = await _log(store)
    said, end_written = log[1:]
    assert isinstance(said, TurnAppended) and isinstance(end_written, RunHeartbeat)
    assert said.payload.messages[0].content == "answer" and [e.seq for e in log] == [1, 2, 3]
    assert log[-1].event_id == end.event_id and heard == [e.event_id for e in log[1:]]


async def test_a_store_that_sends_ahead_is_sent_a_held_event() -> None:
    store = SendsAhead()
    writer, heard = await _writer(store)
    answer = await writer.hold(TurnAppended, _said("answer"))
    assert store.held == [answer] and heard == []
    await writer.emit(RunHeartbeat, None)
    assert not store.held and heard[0] == answer.event_id


async def test_a_write_carrying_only_a_held_event_fails_as_its_own_write_would() -> None:
    """Nothing optional to give up: an error that is not the store's being away raises,
    and the held event is not in the log (as the answer written alone would not be)."""
    store = Failing()
    writer, heard = await _writer(store)
    await writer.hold(TurnAppended, _said("answer"))
    store.plan = [(StoreError("disk I/O error"), False)]
    with pytest.raises(StoreError, match="disk I/O error"):
        await writer.emit(RunHeartbeat, None)
    assert len(await _log(store)) == 1 and heard == []


@pytest.mark.parametrize("landed", [False, True])
async def test_events_staged_after_a_write_in_doubt_are_numbered_where_the_log_goes_on(
    landed: bool,
) -> None:
    """A heartbeat fails during the final model call (landed or not: unknown); then the
    answer is held and the checkpoint staged, numbered as if the heartbeat had landed.
    The run's end settles the doubt first and writes all three at the seqs the log has
    free: no gap, no seq twice, the answer kept."""
    store = Failing()
    writer, heard = await _writer(store)
    store.plan = [(StoreError("disk I/O error"), landed)]
    with pytest.raises(StoreError):
        await writer.emit(RunHeartbeat, None)
    await writer.hold(TurnAppended, _said("answer"))
    writer.stage(CheckpointWritten, _checkpoint())
    end = await writer.emit(RunHeartbeat, None)
    log = await _log(store)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert [e.type for e in log[1 + landed :]] == [
        "turn.appended",
        "checkpoint.written",
        "run.heartbeat",
    ]
    assert log[-1].event_id == end.event_id and heard == [e.event_id for e in log[1:]]
    # numbered again, still held: a failure of the write gives up the checkpoint only
    store.plan = [(StoreError("disk I/O error"), landed)]
    with pytest.raises(StoreError):
        await writer.emit(RunHeartbeat, None)
    await writer.hold(TurnAppended, _said("again"))
    writer.stage(CheckpointWritten, _checkpoint())
    store.plan = [(StoreError("disk I/O error"), False)]
    await writer.emit(RunHeartbeat, None)
    log = await _log(store)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert [e.type for e in log[-2:]] == ["turn.appended", "run.heartbeat"]


async def test_a_confirm_writes_what_was_staged_after_a_write_in_doubt_at_free_seqs() -> None:
    store = Failing()
    writer, heard = await _writer(store)
    store.plan = [(StoreError("disk I/O error"), False)]
    with pytest.raises(StoreError):
        await writer.emit(RunHeartbeat, None)
    answer = await writer.hold(TurnAppended, _said("answer"))
    await writer.confirm()
    log = await _log(store)
    said = log[1]
    assert [e.seq for e in log] == [1, 2] and isinstance(said, TurnAppended)
    assert said.payload.messages[0].content == "answer" and heard == [said.event_id]
    assert answer.seq == 3  # numbered past the heartbeat in doubt, written at its seq
