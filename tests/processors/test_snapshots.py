"""What a published snapshot holds: the checkpoint's transcript, joined from the message
arrays of its stored payloads."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from loomflow.processors.snapshots import _snapshot
from loomflow.projections.fold import CheckpointRow
from loomflow.schemas import Checkpoint, Message, Usage


def _array(messages: list[Message], spaced: bool = False) -> str:
    text = orjson.dumps([m.model_dump(mode="json") for m in messages]).decode()
    return f"[ {text[1:-1]} ]" if spaced else text


def test_a_snapshot_is_the_transcript_as_the_messages_parsed_and_written_again() -> None:
    """Turns that added no message and arrays spaced by another JSON writer leave the
    transcript whole: the bytes are those of parsing every message and writing the
    checkpoint again, as snapshots were made before they were joined as text."""
    messages = [
        Message.system("Be brief."),
        Message.user('Say "hi", \u00e9\u4e2d.'),
        Message.assistant("hi"),
        Message.tool("call-1", "{}"),
    ]
    arrays = [
        _array(messages[:2]),
        "[]",
        _array([]),
        "[ ]",
        _array(messages[2:3], spaced=True),
        _array(messages[3:]),
    ]
    row = CheckpointRow(
        checkpoint_id="ckpt-1",
        seq=9,
        base_seq=0,
        turn=2,
        message_count=4,
        cumulative_usage=Usage(input_tokens=10, output_tokens=3, cost_usd=0.25),
        cursor="pass:2",
        created_at=datetime(2026, 12, 5, 8, 0, tzinfo=UTC),
    )

    value = _snapshot("s1", row, arrays)

    checkpoint = Checkpoint.model_validate_json(value)
    assert checkpoint.messages == messages
    assert (checkpoint.session_id, checkpoint.checkpoint_id, checkpoint.turn) == ("s1", "ckpt-1", 2)
    assert value == orjson.dumps(
        {
            "session_id": "s1",
            "checkpoint_id": "ckpt-1",
            "turn": 2,
            "messages": [m for array in arrays for m in orjson.loads(array)],
            "cumulative_usage": row.cumulative_usage.model_dump(),
            "cursor": "pass:2",
            "created_at": row.created_at,
        }
    )
