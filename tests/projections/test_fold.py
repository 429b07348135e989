"""The fold is plain Python: tested directly, without any store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loomflow.errors import (
    InvalidEventError,
    RunCancelledError,
    SequenceConflictError,
    SessionErasedError,
    StaleWriterError,
)
from loomflow.projections.fold import (
    AddTranscript,
    DeleteCheckpoints,
    EraseSession,
    PutCheckpoint,
    RetainCheckpoints,
    fold,
    materialise,
    project,
)
from loomflow.schemas import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    Message,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunStarted,
    RunWaiting,
    Scope,
    SessionErased,
    SessionForked,
    SignalSent,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)
from loomflow.schemas.sessions import SessionRecord

U = Usage(input_tokens=10, output_tokens=2, cost_usd=0.01)


def turn(seq: int, *texts: str, epoch: int = 1, model: bool = False) -> TurnAppended:
    return TurnAppended(
        session_id="s",
        run_id="r",
        seq=seq,
        epoch=epoch,
        payload={"messages": [Message.user(t) for t in texts], "usage": U, "model_call": model},
    )


def ckpt(seq: int, count: int, retain: int = 2) -> CheckpointWritten:
    return CheckpointWritten(
        session_id="s",
        run_id="r",
        seq=seq,
        epoch=1,
        payload={
            "checkpoint_id": f"ckpt{seq}",
            "turn": 1,
            "cumulative_usage": U,
            "message_count": count,
            "retain": retain,
        },
    )


def run(events: list[Event]) -> tuple[SessionRecord, list[object]]:
    row: SessionRecord | None = None
    out: list[object] = []
    for event in events:
        row, mutations = fold(row, event)
        out.extend(mutations)
    assert row is not None
    return row, out


def started(seq: int = 1, epoch: int = 1) -> RunStarted:
    return RunStarted(session_id="s", run_id="r", seq=seq, epoch=epoch)


def test_turns_accumulate_usage_messages_and_model_turns() -> None:
    row, mutations = run([started(), turn(2, "a", "b"), turn(3, "c", model=True)])
    assert (row.last_seq, row.turns, row.message_count) == (3, 1, 3)
    assert row.usage == U + U
    assert [type(m) for m in mutations] == [AddTranscript, AddTranscript]


def test_checkpoints_record_position_and_apply_retention() -> None:
    _, mutations = run([started(), turn(2, "a"), ckpt(3, 1)])
    put = mutations[1]
    assert isinstance(put, PutCheckpoint) and put.row.seq == 3 and put.row.base_seq == 0
    assert mutations[2] == RetainCheckpoints(2)
    _, unbounded = run([started(), turn(2, "a"), ckpt(3, 1, retain=0)])
    assert not any(isinstance(m, RetainCheckpoints) for m in unbounded)


def test_a_checkpoint_with_the_wrong_message_count_is_refused() -> None:
    with pytest.raises(InvalidEventError, match="claims 5 messages"):
        run([started(), turn(2, "a"), ckpt(3, 5)])


def test_sequence_gaps_and_repeats_are_conflicts() -> None:
    with pytest.raises(SequenceConflictError):
        run([started(), turn(3, "a")])
    with pytest.raises(SequenceConflictError):
        run([started(), turn(2, "a"), turn(2, "b")])


def test_an_older_epoch_is_fenced_and_only_run_started_claims_a_new_one() -> None:
    with pytest.raises(StaleWriterError):
        run([started(), started(2, epoch=2), turn(3, "late", epoch=1)])
    with pytest.raises(InvalidEventError, match="claims a new epoch"):
        run([started(), turn(2, "sneaky", epoch=5)])


def test_erasure_is_a_tombstone() -> None:
    erased = SessionErased(session_id="s", run_id="admin", seq=3, epoch=1)
    row, mutations = run([started(), turn(2, "secret"), erased])
    assert row.status == "erased" and row.message_count == 0
    assert isinstance(mutations[-1], EraseSession)
    with pytest.raises(SessionErasedError):
        fold(row, turn(4, "late"))


def test_events_of_another_session_are_refused() -> None:
    row, _ = run([started()])
    other = RunStarted(session_id="t", run_id="r", seq=2, epoch=2)
    with pytest.raises(InvalidEventError, match="folded into"):
        fold(row, other)


def test_materialise_starts_again_at_each_base() -> None:
    compacted = TranscriptCompacted(
        session_id="s",
        run_id="r",
        seq=4,
        epoch=1,
        payload={"messages": [Message.user("summary")], "replaced_messages": 2},
    )
    events: list[Event] = [turn(2, "a"), turn(3, "b"), compacted, turn(5, "c")]
    assert [m.content for m in materialise(events)] == ["summary", "c"]
    row, _ = run([started(), *events])
    assert row.base_seq == 4 and row.message_count == 2


def test_a_fork_starts_from_its_copied_transcript_and_lineage() -> None:
    forked = SessionForked(
        session_id="s",
        run_id="r",
        seq=1,
        epoch=1,
        payload={
            "parent_session_id": "p",
            "parent_checkpoint_id": "ckptX",
            "messages": [Message.user("a"), Message.user("b")],
            "turn": 4,
            "cumulative_usage": U,
        },
    )
    row, _ = run([forked, started(2), turn(3, "c")])
    assert (row.parent_session_id, row.parent_checkpoint_id) == ("p", "ckptX")
    assert row.turns == 4 and row.message_count == 3 and row.usage == U + U
    with pytest.raises(InvalidEventError, match="first event"):
        run([started(), forked.model_copy(update={"seq": 2})])


def test_a_signal_recorded_past_the_deadline_does_not_answer_the_wait() -> None:
    until = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    waits = RunWaiting(
        session_id="s",
        run_id="r",
        seq=2,
        epoch=1,
        payload={"signal": "approve", "step_key": "tool:1:signal:approve", "until": until},
    )

    def sent(at: datetime) -> SignalSent:
        payload = {"name": "approve", "data": {"ok": True}}
        return SignalSent(session_id="s", run_id="x", seq=3, epoch=2, at=at, payload=payload)

    in_time, _ = run([started(), waits, sent(until - timedelta(microseconds=1))])
    assert in_time.status == "signalled"
    for late in (until, until + timedelta(seconds=1)):
        row, _ = run([started(), waits, sent(late)])
        # the wait times out (a worker takes it as such); the signal stays in the inbox,
        # where a later wait of that name may receive it
        assert row.status == "waiting" and [s.name for s in row.inbox] == ["approve"]


# --- what each event does to the row and the read model (mutation testing's survivors) --


def _event(cls: type, seq: int, epoch: int = 1, **payload: object) -> Event:
    return cls(session_id="s", run_id="r", seq=seq, epoch=epoch, payload=payload)  # type: ignore[no-any-return]


def _waits(seq: int, signal: str = "approve", epoch: int = 1) -> Event:
    step = f"tool:1/signal:{signal}#1"
    return _event(RunWaiting, seq, epoch, signal=signal, step_key=step)


def _signal(seq: int, name: str = "approve", epoch: int = 2) -> Event:
    return _event(SignalSent, seq, epoch=epoch, name=name, data=None)


def _failed(seq: int, error: str = "boom", parked: bool | None = None, epoch: int = 1) -> Event:
    return _event(RunFailed, seq, epoch, error_type="ModelError", error=error, parked=parked)


def _finished(seq: int, epoch: int = 1) -> Event:
    return _event(RunFinished, seq, epoch, output="done", turns=1, usage=Usage())


def _taken(seq: int, epoch: int) -> RunStarted:
    return RunStarted(session_id="s", run_id="w", seq=seq, epoch=epoch, payload={"worker": "w1"})


def test_a_new_session_starts_and_is_updated_at_its_events_times() -> None:
    first = started()
    row, _ = fold(None, first)
    assert row.created_at == row.updated_at == first.at
    later = turn(2, "a").model_copy(update={"at": first.at + timedelta(seconds=5)})
    row, _ = fold(row, later)
    assert row.created_at == first.at and row.updated_at == later.at


def test_refusals_say_what_was_expected_and_what_to_do() -> None:
    with pytest.raises(SequenceConflictError, match="expects seq 2, got 4"):
        run([started(), turn(4, "a")])
    erased = SessionErased(session_id="s", run_id="admin", seq=2, epoch=1)
    row, _ = run([started(), erased])
    with pytest.raises(SessionErasedError, match="was erased; start a new session id"):
        fold(row, turn(3, "late"))


def test_a_turn_adds_its_messages_after_the_base_and_a_model_turn_ends_a_wait() -> None:
    row, mutations = run([started(), _waits(2), turn(3, "x", model=True)])
    assert mutations == [AddTranscript(3, False, [Message.user("x")])]
    assert row.waiting is None  # the resumed run went on past where it waited
    row, _ = run([started(), _waits(2), turn(3, "result")])
    assert row.waiting is not None  # a tool's result alone does not end it


def test_a_compaction_is_a_new_base_and_a_model_call_of_the_budget() -> None:
    compacted = _event(
        TranscriptCompacted, 3, messages=[Message.user("summary")], usage=U, replaced_messages=1
    )
    row, mutations = run([started(), turn(2, "a", model=True), compacted])
    assert mutations[-1] == AddTranscript(3, True, [Message.user("summary")])
    assert row.usage == U + U and row.spent == U + U and row.spent_calls == 2


def test_a_fork_is_a_base_at_its_own_seq() -> None:
    forked = _event(
        SessionForked,
        1,
        parent_session_id="p",
        parent_checkpoint_id="ckptX",
        messages=[Message.user("a")],
        turn=2,
        cumulative_usage=U,
    )
    row, mutations = fold(None, forked)
    assert mutations == [AddTranscript(1, True, [Message.user("a")])] and row.base_seq == 1


def test_a_checkpoint_keeps_its_cursor_and_a_retention_of_one_is_applied() -> None:
    written = _event(
        CheckpointWritten,
        3,
        checkpoint_id="ckpt1",
        turn=1,
        cumulative_usage=U,
        cursor="pass:1",
        message_count=1,
        retain=1,
    )
    _, mutations = run([started(), turn(2, "a"), written])
    put = mutations[1]
    assert isinstance(put, PutCheckpoint) and put.row.cursor == "pass:1"
    assert mutations[2] == RetainCheckpoints(1)


def test_pruned_checkpoints_are_deleted() -> None:
    pruned = _event(CheckpointsPruned, 2, checkpoint_ids=["ckpt1", "ckpt2"])
    _, mutations = run([started(), pruned])
    assert mutations == [DeleteCheckpoints(["ckpt1", "ckpt2"])]


def test_a_finished_run_clears_its_wait_inbox_attempts_and_error() -> None:
    events = [started(), _waits(2), _signal(3, "other"), _failed(4, epoch=2), _taken(5, 3)]
    row, _ = run([*events, _finished(6, epoch=3)])
    assert (row.status, row.waiting, row.inbox, row.attempts, row.last_error) == (
        "finished",
        None,
        (),
        0,
        None,
    )
    # a run that waited, was resumed by a worker and finished no longer waits
    row, _ = run([started(), _waits(2), _taken(3, 2), _finished(4, epoch=2)])
    assert row.waiting is None and row.status == "finished"


def test_a_failed_run_drops_its_wait_and_inbox_and_keeps_its_error_short() -> None:
    row, _ = run([started(), _waits(2), _signal(3, "other"), _failed(4, "x" * 900, epoch=2)])
    assert row.status == "failed" and row.waiting is None and row.inbox == ()
    assert row.last_error is not None and len(row.last_error) == 500
    parked, _ = run([started(), _failed(2, parked=True)])
    assert parked.status == "stuck"


def test_a_parked_run_keeps_its_wait_and_inbox_for_the_person_who_resumes_it() -> None:
    # a worker that cannot continue a signalled run parks it: the signal must not be lost
    row, _ = run([started(), _waits(2), _signal(3, "approve"), _failed(4, parked=True, epoch=2)])
    assert row.status == "stuck"
    assert row.waiting is not None and row.waiting.signal == "approve"
    assert [s.name for s in row.inbox] == ["approve"]


def _cancelled(seq: int, epoch: int, reason: str = "") -> Event:
    return _event(RunCancelled, seq, epoch, reason=reason)


def test_a_cancel_fences_its_run_and_keeps_the_wait_for_whoever_resumes_it() -> None:
    row, mutations = run([started(), _waits(2), _signal(3, "other"), _cancelled(4, 3, "oops")])
    assert (row.status, row.epoch, row.last_run_id, mutations) == ("cancelled", 3, "r", [])
    assert row.last_error == "cancelled: oops"
    assert row.waiting is not None and [s.name for s in row.inbox] == ["other"]
    plain, _ = run([started(), _cancelled(2, 2)])
    assert plain.last_error == "cancelled: no reason given"
    # the cancelled run's next write names the cancel; one fenced before it does not
    with pytest.raises(RunCancelledError, match=r"run r of session s \(no user\) was cancelled"):
        fold(plain, turn(3, "late", epoch=1))
    fenced, _ = run([started(), started(2, epoch=2), _cancelled(3, 3)])
    with pytest.raises(StaleWriterError) as refused:
        fold(fenced, turn(4, "older still", epoch=1))
    assert not isinstance(refused.value, RunCancelledError)
    # what an administrator appends at the session's epoch goes in; a resume claims it
    pruned, _ = fold(plain, _event(CheckpointsPruned, 3, 2, checkpoint_ids=["ckpt1"]))
    assert pruned.status == "cancelled"
    resumed, _ = fold(pruned, started(4, epoch=3))
    assert (resumed.status, resumed.epoch) == ("running", 3)


def test_a_wait_is_signalled_only_by_a_signal_of_its_name() -> None:
    row, _ = run([started(), _signal(2, "other"), _waits(3, epoch=2)])
    assert row.status == "waiting"  # another name in the inbox answers nothing
    row, _ = run([started(), _signal(2, "approve"), _waits(3, epoch=2)])
    assert row.status == "signalled"


def test_a_wait_resets_the_attempts_and_takes_of_its_run() -> None:
    row, _ = run([started(), _taken(2, 2), _taken(3, 3)])
    assert (row.attempts, row.takes) == (2, 2)
    row, _ = fold(row, _waits(4, epoch=3))
    assert (row.attempts, row.takes) == (0, 0)


def test_a_callers_run_starts_a_budget_of_its_own_a_workers_take_does_not() -> None:
    events: list[Event] = [started(), turn(2, "a", model=True), _taken(3, 2)]
    events.append(turn(4, "b", epoch=2, model=True))
    row, _ = run(events)
    assert (row.takes, row.spent_calls, row.spent) == (1, 2, U + U)
    row, _ = fold(row, started(5, epoch=3))
    assert (row.takes, row.spent_calls, row.spent) == (0, 0, Usage())


def test_an_erasure_forgets_the_transcript_usage_and_inbox() -> None:
    forked = _event(
        SessionForked,
        1,
        parent_session_id="p",
        parent_checkpoint_id="ckptX",
        messages=[Message.user("a")],
        turn=3,
        cumulative_usage=U,
    )
    events = [forked, started(2), _waits(3), _signal(4, "other", epoch=3)]
    erased = SessionErased(session_id="s", run_id="admin", seq=5, epoch=3)
    row, _ = run([*events, erased])
    assert (row.turns, row.usage, row.base_seq, row.waiting, row.inbox) == (
        0,
        Usage(),
        0,
        None,
        (),
    )


def test_project_skips_an_event_given_twice_in_one_batch() -> None:
    first = started()
    changed, changes = project({}, [first, first], {})
    assert [c.event.event_id for c in changes] == [first.event_id]
    assert changed[Scope("s")].last_seq == 1


def test_project_forgets_only_the_erased_sessions_stored_ids() -> None:
    other = RunStarted(session_id="t", run_id="r", seq=1, epoch=1)
    rows: dict[Scope, SessionRecord | None] = {
        Scope("s"): run([started(), turn(2, "a")])[0],
        Scope("t"): fold(None, other)[0],
    }
    again = turn(2, "a")
    stored: dict[tuple[Scope, int], str] = {
        (Scope("s"), 2): again.event_id,
        (Scope("t"), 1): other.event_id,
    }
    erased = SessionErased(session_id="s", run_id="admin", seq=3, epoch=1)
    # another session's redelivery in the same batch is still recognised and skipped
    _, changes = project(rows, [erased, other], stored)
    assert [c.event.type for c in changes] == ["session.erased"]
    # the erased session's own earlier ids are forgotten: a redelivery after the erasure
    # is refused as the erased session's event, not skipped as one already stored
    with pytest.raises(SessionErasedError):
        project(rows, [erased, again], stored)
