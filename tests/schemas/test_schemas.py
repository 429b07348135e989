from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import orjson
import pytest

from loomflow.errors import (
    CorruptRecordError,
    InvalidEventError,
    InvalidIdError,
    SerializationError,
    UnsafeDeserializationError,
)
from loomflow.schemas import (
    Message,
    RedactedThinkingBlock,
    RunFinished,
    ThinkingBlock,
    ToolCall,
    TurnAppended,
    Usage,
    new_id,
    validate_id,
)
from loomflow.schemas.codec import (
    decode_event,
    decode_value,
    encode_event,
    encode_value,
    input_hash,
)
from loomflow.schemas.events import MAX_EVENT_BYTES


def test_new_ids_sort_by_creation_time() -> None:
    ids = [new_id("ckpt") for _ in range(2000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith("ckpt") and len(i) == 30 for i in ids)
    validate_id(ids[0], "checkpoint id")


@pytest.mark.parametrize("bad", ["", " ", "a/b", "x" * 201, None, 7, "-lead"])
def test_invalid_ids(bad: object) -> None:
    with pytest.raises(InvalidIdError):
        validate_id(bad, "session_id")


def test_usage_adds_up() -> None:
    a = Usage(
        input_tokens=1, cached_input_tokens=2, cache_write_tokens=3, output_tokens=4, cost_usd=0.1
    )
    total = a + a
    assert total == Usage(
        input_tokens=2, cached_input_tokens=4, cache_write_tokens=6, output_tokens=8, cost_usd=0.2
    )
    assert total.total_tokens == 20


def _event(**payload: object) -> TurnAppended:
    return TurnAppended(
        session_id="s",
        run_id="r",
        seq=1,
        epoch=1,
        payload={"messages": [Message.user("hi")], **payload},
    )


def test_events_round_trip_as_json() -> None:
    event = _event()
    assert decode_event(encode_event(event)) == event
    assert b'"type":"turn.appended"' in encode_event(event)


# An assistant message as events carried it before messages had thinking blocks.
_OLD_ASSISTANT = (
    b'{"role":"assistant","content":"Checking.","tool_calls":[{"id":"toolu_1","name":"lookup",'
    b'"arguments":{"topic":"kafka"}}],"tool_call_id":null,"is_error":false}'
)


def test_messages_without_thinking_serialise_as_before() -> None:
    old = Message.model_validate_json(_OLD_ASSISTANT)

    assert old.thinking == []
    assert old.model_dump_json().encode() == _OLD_ASSISTANT
    assert old == Message.assistant(
        "Checking.", [ToolCall(id="toolu_1", name="lookup", arguments={"topic": "kafka"})]
    )
    assert "thinking" not in old.model_dump()


def test_thinking_blocks_round_trip_in_events_and_stored_payloads() -> None:
    thinking: list[ThinkingBlock | RedactedThinkingBlock] = [
        ThinkingBlock(type="thinking", thinking="first, the log", signature="c2ln"),
        RedactedThinkingBlock(type="redacted_thinking", data="ZW5j"),
    ]
    message = Message.assistant("Done.", thinking=thinking)
    event = TurnAppended(
        session_id="s", run_id="r", seq=1, epoch=1, payload={"messages": [message]}
    )

    assert decode_event(encode_event(event)) == event
    # the SQL read models store payloads without their defaults: the kinds must survive
    stored = event.payload.model_dump_json(exclude_defaults=True)
    assert type(event.payload).model_validate_json(stored).messages[0].thinking == thinking


@pytest.mark.parametrize(
    "raw",
    [
        b"{",
        b'{"type": "nope", "session_id": "s"}',
        b'{"type": "turn.appended", "session_id": "s", "run_id": "r", "seq": 0, "epoch": 1, '
        b'"payload": {"messages": []}}',
        b'{"type": "turn.appended", "session_id": "s", "run_id": "r", "seq": 1, "epoch": 1, '
        b'"payload": {"messages": [], "surprise": 1}}',
    ],
)
def test_invalid_events_are_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(InvalidEventError) as info:
        decode_event(raw)
    assert info.value.reason


def test_oversized_events_are_refused_before_parsing() -> None:
    with pytest.raises(InvalidEventError, match="exceeds"):
        decode_event(b" " * (MAX_EVENT_BYTES + 1))


def test_tagged_json_round_trips_common_types() -> None:
    value = {
        "tuple": (1, "a"),
        "set": {1, 2},
        "bytes": b"\x00\xff",
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2026, 1, 2),
        "money": Decimal("1.10"),
        "id": uuid.UUID(int=5),
        "nan": float("inf"),
        "__lf__": "a user key that looks like a tag",
        "nested": [{"x": (1,)}],
    }
    assert decode_value(encode_value(value)) == value


def test_tagged_json_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(SerializationError):
        encode_value(object())
    with pytest.raises(SerializationError, match="key"):
        encode_value({1: "int key"})


def test_plain_json_refuses_nan_and_infinities_it_would_write_as_null() -> None:
    from loomflow.schemas.codec import dumps

    for value in (float("nan"), [1.0, float("inf")], {"a": {"b": -float("inf")}}):
        with pytest.raises(SerializationError, match="NaN"):
            dumps(value)
    assert dumps({"a": None, "b": [1.5, None]}) == b'{"a":null,"b":[1.5,null]}'


def test_pickle_is_opt_in_and_never_loaded_from_a_json_store() -> None:
    stored = encode_value({"a"}, "pickle")
    assert decode_value(stored, "pickle") == {"a"}
    with pytest.raises(UnsafeDeserializationError):
        decode_value(stored, "json")


def test_unknown_tags_are_corrupt_records() -> None:
    with pytest.raises(CorruptRecordError):
        decode_value({"__lf__": "martian", "v": 1})
    with pytest.raises(CorruptRecordError):
        decode_value({"__lf__": "datetime", "v": "not a date"})


def test_input_hash_is_stable_and_order_insensitive_for_keys() -> None:
    assert input_hash({"a": 1, "b": 2}) == input_hash({"b": 2, "a": 1})
    assert input_hash([1, 2]) != input_hash([2, 1])


def test_the_scope_of_an_event_is_the_scope_a_caller_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    # stores key their rows by scope_of(event) and callers look them up by Scope(...)
    from loomflow.schemas import RunStarted, Scope
    from loomflow.schemas import scope as scopes

    monkeypatch.setattr(scopes, "_MAX_KNOWN", 2)
    rows = {}
    for user in (None, "alice", "bob"):  # the third fills the kept scopes: made again
        event = RunStarted(user_id=user, session_id="s1", run_id="r", seq=1, epoch=1)
        rows[scopes.scope_of(event)] = user
        assert scopes.scope_of(event) == Scope("s1", user)
    assert rows == {Scope("s1"): None, Scope("s1", "alice"): "alice", Scope("s1", "bob"): "bob"}
    assert Scope("s1", "alice") != Scope("s1") and Scope("s1") != ("s1", None)


# -- run.finished: the answer once ------------------------------------------------------

_OLD_FINISH = (
    b'{"event_id":"evt_1","v":1,"user_id":null,"session_id":"s1","run_id":"r1","seq":4,'
    b'"epoch":1,"at":"2026-12-01T12:00:00Z","type":"run.finished","payload":{"output":'
    b'"Oslo it is.","turns":1,"usage":{"input_tokens":9},"stop_reason":"completed"}}'
)


def test_a_run_finished_written_with_its_answer_reads_as_it_did() -> None:
    event = decode_event(_OLD_FINISH)
    assert isinstance(event, RunFinished)
    assert event.payload.output == "Oslo it is." and event.payload.turns == 1
    # the answer it carries is the answer, whatever transcript a reader holds
    assert event.payload.answer([Message.assistant("something else")]) == "Oslo it is."
    assert orjson.loads(event.model_dump_json())["payload"]["output"] == "Oslo it is."


def test_a_run_finished_without_its_answer_takes_it_from_the_transcript() -> None:
    event = decode_event(_OLD_FINISH.replace(b'"output":"Oslo it is.",', b""))
    assert isinstance(event, RunFinished) and event.payload.output is None
    transcript = [
        Message.user("Where?"),
        Message.assistant("Oslo it is."),
        Message.user("Thanks"),
    ]
    assert event.payload.answer(transcript) == "Oslo it is."
    assert event.payload.answer([Message.user("Where?")]) == ""
    assert "output" not in orjson.loads(event.model_dump_json())["payload"]
