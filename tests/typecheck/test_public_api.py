"""The public API's types for plain and coroutine functions: mypy checks them in
``make lint``, pytest runs them.

Every ``assert_type`` is checked by mypy; every call marked ``# type: ignore[...]`` must
stay refused, because ``warn_unused_ignores`` fails lint on an ignore that is no longer
needed. So a signature that loosens to ``...`` or ``Any``, or that stops accepting a
coroutine function, fails ``make lint``. At run time the same calls show that the values
are what the types say.
"""

from __future__ import annotations

from typing import assert_type

from loomflow import Agent, Message, SessionState, Tuning, current_journal, new_id
from loomflow.agent import Tool, as_tool
from loomflow.models import ScriptedModel
from loomflow.runtime import InProcRuntime, Journal, Scope


async def charge(order: str, *, cents: int = 100) -> dict[str, int]:
    """Charge an order (a coroutine function)."""
    return {order: cents}


def receipt(order: str) -> str:
    """Write a receipt (a plain function)."""
    return f"receipt for {order}"


@as_tool
async def lookup(topic: str, limit: int = 2) -> list[str]:
    """Look a topic up."""
    return [topic] * limit


async def pay(order: str) -> str:
    """Charge an order once, however often the tool runs: the README's journaled step."""
    journal = current_journal()
    assert_type(journal, Journal | None)
    assert journal is not None  # None outside an agent run
    assert_type(await journal.step("charge", charge, order), dict[str, int])
    return assert_type(await journal.step("receipt", receipt, order), str)


async def _journal() -> Journal:
    runtime = InProcRuntime()
    return Journal(await runtime.open_session(Scope("s1"), run_id=new_id("run")))


async def test_a_step_returns_what_its_plain_or_coroutine_function_returns() -> None:
    journal = await _journal()
    charged = await journal.step("charge", charge, "o-1", cents=250)
    assert assert_type(charged, dict[str, int]) == {"o-1": 250}
    written = await journal.step("receipt", receipt, "o-1")
    assert assert_type(written, str) == "receipt for o-1"
    assert assert_type(await journal.step("answer", lambda: 42), int) == 42


async def test_a_tool_journals_its_steps_through_current_journal() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("pay", order="o-1"), "paid"])
    result = await Agent("x", model=model, tools=[pay, lookup, receipt]).run("pay")
    assert result.output == "paid"
    assert model.calls[-1][-1].content == "receipt for o-1"


async def test_a_tool_invokes_to_what_its_function_returns() -> None:
    assert assert_type(await lookup.invoke({"topic": "t"}), list[str]) == ["t", "t"]
    written = as_tool(receipt)
    assert assert_type(await written.invoke({"order": "o"}), str) == "receipt for o"
    assert as_tool(written) is written
    assert assert_type(await as_tool(charge).invoke({"order": "o"}), dict[str, int]) == {"o": 100}
    untyped: Tool = written  # a bare Tool is Tool[..., Any]
    assert untyped.name == "receipt"


async def test_stop_hooks_may_be_plain_or_coroutine_functions() -> None:
    def once_more(state: SessionState) -> str | None:
        return "again" if state.passes == 1 else None

    async def then_stop(state: SessionState) -> Message | None:
        return None

    hooks = Tuning(stop_hooks=[once_more, then_stop, lambda s: None if s.passes else "never"])
    result = await Agent("x", model=ScriptedModel(lambda m: "ok"), tuning=hooks).run("go")
    assert result.model_calls == 2


async def _refused(journal: Journal) -> None:
    """Calls mypy must refuse (never run): each ignore that stops being needed fails lint."""
    await journal.step("charge", charge, 1)  # type: ignore[call-overload]
    await journal.step("charge", charge)  # type: ignore[call-overload]
    await journal.step("charge", charge, "o", colour="red")  # type: ignore[call-arg]
    await journal.step("receipt", receipt, "o", "o")  # type: ignore[call-overload]
    lookup.fn(1)  # type: ignore[arg-type]

    async def counts(state: SessionState) -> int:
        return state.passes

    Tuning(stop_hooks=[counts])  # type: ignore[list-item]
