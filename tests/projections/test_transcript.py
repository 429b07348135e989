"""decode_transcript: the log rows of a transcript back into its messages, or the row to blame."""

from __future__ import annotations

import pytest

from loomflow.errors import CorruptRecordError
from loomflow.projections.transcript import decode_transcript
from loomflow.schemas import Message, ThinkingBlock, ToolCall
from loomflow.schemas.events import TurnAppendedPayload


def _row(seq: int, *messages: Message) -> tuple[int, str]:
    payload = TurnAppendedPayload(messages=list(messages), step_key=f"s{seq}")
    return seq, payload.model_dump_json(exclude_defaults=True)


def test_rows_decode_to_the_messages_written() -> None:
    written = [
        Message.system("be brief"),
        Message.user("héllo"),
        Message.assistant(
            "looking",
            [ToolCall(id="c1", name="search", arguments={"q": "x", "n": 2**64 - 1, "f": 0.5})],
            thinking=[ThinkingBlock(type="thinking", thinking="hm", signature="sig")],
        ),
        Message.tool("c1", "found", is_error=True),
    ]
    rows = [_row(1, *written[:2]), _row(2, written[2]), _row(4, written[3])]
    assert decode_transcript("s1", rows) == written


def test_an_int_wider_than_orjson_takes_still_decodes() -> None:
    # another program's row may hold one; pydantic decodes what orjson refuses
    wide = (
        '{"messages":[{"role":"assistant","tool_calls":[{"id":"c","name":"t","arguments":{"n":'
        + str(2**70)
        + "}}]}]}"
    )
    [message] = decode_transcript("s1", [(3, wide)])
    assert message.tool_calls[0].arguments == {"n": 2**70}


@pytest.mark.parametrize(
    "payload",
    [
        '{"messages":[{"role":"user","content":"cut',  # text that ends early
        '{"messages":[{"role":"nobody"}]}',  # a value the model refuses
        '{"messages":"not a list"}',
        '{"other":1}',  # no messages
        "[1, 2]",  # not an object
        "null",
    ],
)
def test_a_damaged_row_is_named_by_its_seq(payload: str) -> None:
    rows = [_row(1, Message.user("fine")), (7, payload), _row(8, Message.user("after"))]
    with pytest.raises(CorruptRecordError, match=r"seq 7|do not decode together"):
        decode_transcript("s1", rows)
