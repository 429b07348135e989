from __future__ import annotations

import pytest

from loomflow.errors import ModelError
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


async def test_a_script_asked_past_its_end_says_why_and_what_to_do() -> None:
    """The README's approval.py run once more after its run finished sends a new prompt
    to a session whose transcript holds every scripted answer: the error says so, and
    what to give the model (it said only which reply was asked for)."""
    model = ScriptedModel(["Settled."])
    done = [Message.user("Pay."), Message.assistant("Settled."), Message.user("Pay.")]
    with pytest.raises(ModelError) as raised:
        await model.complete(done, [])
    assert str(raised.value) == (
        "scripted model 'scripted' has 1 reply and was asked for reply 2: the conversation "
        "holds every reply of its script already (a session given another prompt once its "
        "script was done, or a run longer than its script); give it more replies, or a "
        "function of the messages"
    )
