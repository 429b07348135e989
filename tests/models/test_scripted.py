from __future__ import annotations

from loomflow.models import ScriptedModel
from loomflow.schemas import Message


async def test_a_list_script_replies_by_the_answers_in_the_request_whatever_came_before() -> None:
    model = ScriptedModel(["a", "b", "c"])
    grown = [Message.system("s"), Message.user("one")]
    first = await model.complete(grown, [])
    grown += [first.message, Message.user("two")]
    second = await model.complete(grown, [])
    # the same conversation as new objects, a shorter one, and one of another session
    copy = [m.model_copy() for m in grown]
    again = await model.complete(copy, [])
    shorter = await model.complete(grown[:2], [])
    other = await model.complete([Message.user("x" * 400), Message.assistant("y")], [])
    assert [r.message.content for r in (first, second, again, shorter, other)] == [
        "a",
        "b",
        "b",
        "a",
        "b",
    ]
    # input tokens are those of the whole request, about four characters a token
    assert second.usage == again.usage
    assert second.usage.input_tokens == len("s" + "one" + "a" + "two") // 4 + 1
    assert other.usage.input_tokens == 401 // 4 + 1
