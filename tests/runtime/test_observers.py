"""Observers (``emit``, ``stream``) hear of an event only once the log acknowledged it,
also on a store whose ``send`` returns before the acknowledgement (Kafka's, for the
prompt of a pass): a crash can lose an event only handed to it, never one reported."""

from __future__ import annotations

from collections.abc import Sequence

from loomflow import Agent, Message, TextDelta, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import InProcStore, Runtime, Scope
from loomflow.schemas import Event, EventBase


class SendsAhead(InProcStore):
    """An in-process store whose ``send`` holds events back until the session's next
    append or confirm writes them, as Kafka acknowledges a send only later."""

    sends_ahead = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Event] = []
        self.acknowledged: set[str] = set()

    async def send(self, events: Sequence[Event]) -> None:
        self.held.extend(events)

    async def append(self, events: Sequence[Event]) -> None:
        batch, self.held = [*self.held, *events], []
        await super().append(batch)
        self.acknowledged.update(e.event_id for e in batch)

    async def confirm(self, scope: Scope, *, visible: bool = True) -> None:
        if self.held:
            await self.append([])


async def test_emit_hears_of_an_event_only_once_the_log_acknowledged_it() -> None:
    store = SendsAhead()
    heard: list[str] = []
    early: list[str] = []

    async def emit(item: object) -> None:
        if isinstance(item, EventBase):
            heard.append(item.type)  # type: ignore[attr-defined]
            if item.event_id not in store.acknowledged:
                early.append(item.type)  # type: ignore[attr-defined]

    replies: list[str | Message] = [
        ScriptedModel.tool_call("lookup", city="Oslo"),
        "709000.",
        "Still 709000.",
    ]

    def lookup(city: str) -> str:
        """Look a city up."""
        return "709000"

    agent = Agent(
        "x",
        model=ScriptedModel(replies),
        runtime=Runtime(store),
        tuning=Tuning(checkpoint=True),
        tools=[lookup],
    )
    first = await agent.run("How many?", session_id="s1", emit=emit)
    await agent.resume("And now?", session_id="s1", emit=emit)
    assert early == [], f"told of {early} before the log acknowledged them"
    # every event of both runs was heard, in the log's order
    logged = await store.read_events(Scope(first.session_id))
    assert heard == [e.type for e in logged]
    assert "turn.appended" in heard and not store.held


async def test_text_deltas_stream_before_their_turn_is_recorded() -> None:
    # deltas are the one thing an observer hears live: they are not events of the log,
    # and the turn that records the answer follows them
    store = SendsAhead()
    items = [
        item
        async for item in Agent("x", model=ScriptedModel(["a b c"]), runtime=Runtime(store)).stream(
            "go", session_id="s1"
        )
    ]
    deltas = [i for i in items if isinstance(i, TextDelta)]
    assert "".join(d.text for d in deltas) == "a b c" and not deltas[0].recorded
    answer = next(
        k for k, i in enumerate(items) if getattr(i, "type", None) == "turn.appended" and k > 2
    )
    assert items.index(deltas[-1]) < answer
