"""The fold is plain Python: tested directly, without any store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loomflow.errors import (
    InvalidEventError,
    SequenceConflictError,
    SessionErasedError,
    StaleWriterError,
)
from loomflow.projections.fold import (
    AddTranscript,
    EraseSession,
    PutCheckpoint,
    RetainCheckpoints,
    SessionRow,
    fold,
    materialise,
)
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    Message,
    RunStarted,
    RunWaiting,
    SessionErased,
    SessionForked,
    SignalSent,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)

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


def run(events: list[Event]) -> tuple[SessionRow, list[object]]:
    row: SessionRow | None = None
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
