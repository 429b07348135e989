"""Failures in the runtime conformance suite: writes that fail, land in doubt or meet a
store briefly away never end a run nor take a seq twice, a tool value JSON cannot hold
is a recorded tool error, and invalid ids are refused."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence

import pytest

from loomflow import Agent, InvalidIdError, Role, RunResult
from loomflow.errors import StoreUnavailableError
from loomflow.models import ScriptedModel
from loomflow.runtime import EventStore, Runtime, Scope
from loomflow.schemas import CheckpointWritten, Event, EventBase, TurnAppended
from loomflow.testing._support import Opened
from loomflow.testing.scenario import Research

__all__ = ["Failures"]

Write = Callable[[Sequence[Event]], Awaitable[None]]


@contextlib.contextmanager
def faulty(
    store: EventStore, fault: Callable[[Write, Sequence[Event]], Awaitable[None]]
) -> Iterator[None]:
    """Every write of ``store`` goes through ``fault(real_write, events)`` meanwhile: its
    ``append``, and its ``send`` where the store has one of its own (Kafka's)."""
    names = ["append"] + (["send"] if type(store)._send is not EventStore._send else [])
    for name in names:
        real = getattr(store, name)

        async def write(events: Sequence[Event], _real: Write = real) -> None:
            await fault(_real, events)

        setattr(store, name, write)
    try:
        yield
    finally:
        for name in names:
            delattr(store, name)


def _checkpoint_in(events: Sequence[Event]) -> str | None:
    return next((e.event_id for e in events if isinstance(e, CheckpointWritten)), None)


async def _research_under(
    runtime: Runtime,
    fault: Callable[[Write, Sequence[Event]], Awaitable[None]],
    caplog: pytest.LogCaptureFixture,
    passes: int,
) -> tuple[Research, RunResult]:
    """Run the research on session s1 with every write of the store going through
    ``fault``, capturing the runtime's warnings."""
    research = Research(passes=passes)
    with (
        faulty(runtime.store, fault),
        caplog.at_level(logging.WARNING, logger="loomflow.runtime"),
    ):
        result = await research.agent(runtime).run("Research.", session_id="s1")
    return research, result


class Failures:
    """Tests of failed writes and refused values; mixed into RuntimeConformance."""

    # --- writes that fail or land in doubt --------------------------------------------

    async def test_failed_checkpoint_write_warns_and_the_run_goes_on(
        self, runtime: Runtime, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def disk_full(write: Write, events: Sequence[Event]) -> None:
            if _checkpoint_in(events):
                raise OSError("disk full")
            await write(events)

        research, result = await _research_under(runtime, disk_full, caplog, passes=2)
        assert result.output.startswith("Pass 2:") and result.turns == 6
        warnings = [r.getMessage() for r in caplog.records]
        assert sum("checkpoint" in w and "disk full" in w for w in warnings) == 2
        assert await research.agent(runtime).list_checkpoints("s1") == []

    async def test_a_write_that_lands_and_then_raises_never_ends_the_run(
        self, runtime: Runtime, caplog: pytest.LogCaptureFixture
    ) -> None:
        in_doubt: list[str] = []

        async def lands_then_raises(write: Write, events: Sequence[Event]) -> None:
            await write(events)
            checkpoint = _checkpoint_in(events)
            if not in_doubt and checkpoint:
                in_doubt.append(checkpoint)
                raise TimeoutError("the write landed but its reply was lost")

        research, result = await _research_under(runtime, lands_then_raises, caplog, passes=3)
        assert in_doubt, "the fault was never injected"
        assert result.output.startswith("Pass 3:") and result.turns == 9
        assert any("reply was lost" in r.getMessage() for r in caplog.records)
        # the checkpoint whose write raised is there once, and no seq was taken twice or skipped
        assert len(await research.agent(runtime).list_checkpoints("s1")) == 3
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.event_id for e in events].count(in_doubt[0]) == 1

    async def test_a_write_that_never_lands_gives_its_seq_back(self, runtime: Runtime) -> None:
        failures: list[str] = []

        async def fails_once(write: Write, events: Sequence[Event]) -> None:
            checkpoint = _checkpoint_in(events)
            if not failures and checkpoint:
                failures.append(checkpoint)
                raise ConnectionResetError("connection lost before the write")
            await write(events)

        research = Research(passes=2)
        with faulty(runtime.store, fails_once):
            result = await research.agent(runtime).run("Research.", session_id="s1")
        assert failures and result.turns == 6
        assert len(await research.agent(runtime).list_checkpoints("s1")) == 1
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert failures[0] not in {e.event_id for e in events}

    @pytest.mark.parametrize("lands", [False, True], ids=["lost", "landed"])
    @pytest.mark.parametrize("outage", [1, 4], ids=["one-failure", "four-failures"])
    async def test_a_write_to_a_store_briefly_away_is_tried_again(
        self, runtime: Runtime, lands: bool, outage: int, caplog: pytest.LogCaptureFixture
    ) -> None:
        failed: list[str] = []
        landed = False

        async def away_for_a_while(write: Write, events: Sequence[Event]) -> None:
            nonlocal landed
            answer = any(isinstance(e, TurnAppended) and e.payload.model_call for e in events)
            if answer and len(failed) < outage:
                failed.append(events[-1].event_id)
                if lands and not landed:
                    landed = True
                    await write(events)  # the first attempt lands; its reply is lost
                raise StoreUnavailableError("the server went away for a moment")
            await write(events)

        research, result = await _research_under(runtime, away_for_a_while, caplog, passes=2)
        assert len(failed) == outage, "the fault was not injected as planned"
        assert result.turns == 6 and result.output.startswith("Pass 2:")
        assert research.model_calls == 6  # the answer was recorded, not asked for again
        assert any("trying again for up to" in r.getMessage() for r in caplog.records)
        events = await runtime.store.read_events(Scope("s1"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        answers = [e for e in events if isinstance(e, TurnAppended) and e.payload.model_call]
        assert len(answers) == 6  # the answer in doubt is in the log once
        assert (failed[0] in {e.event_id for e in events}) is lands

    async def test_emit_hears_once_of_a_write_that_landed_in_doubt(self, runtime: Runtime) -> None:
        heard: list[str] = []
        doubted: list[str] = []

        async def emit(item: object) -> None:
            if isinstance(item, EventBase):
                heard.append(item.event_id)

        async def lands_then_raises(write: Write, events: Sequence[Event]) -> None:
            await write(events)
            answer = any(isinstance(e, TurnAppended) and e.payload.model_call for e in events)
            if answer and not doubted:
                doubted.append(events[-1].event_id)
                raise StoreUnavailableError("the reply was lost")

        research = Research(passes=1)
        with faulty(runtime.store, lands_then_raises):
            result = await research.agent(runtime).run("Research.", session_id="s1", emit=emit)
        assert doubted, "the fault was never injected"
        logged = [e.event_id for e in await runtime.store.read_events(Scope("s1"))]
        assert heard == logged and heard.count(doubted[0]) == 1
        assert result.turns == 3

    # --- values and ids refused -------------------------------------------------------

    @pytest.mark.parametrize(
        "value", [object(), {1, 2}, b"bytes", {1: "int key"}, float("nan"), [float("inf")]]
    )
    async def test_a_tool_value_json_cannot_hold_is_a_recorded_tool_error(
        self, new_runtime: Opened[Runtime], value: object
    ) -> None:
        runs: list[int] = []

        def fetch() -> object:
            """Return something JSON cannot hold (after a side effect)."""
            runs.append(1)
            return value

        model = ScriptedModel([ScriptedModel.tool_call("fetch"), "done"])
        agent = Agent("x", model=model, runtime=new_runtime(), tools=[fetch])
        result = await agent.run("go", session_id="s1")
        assert result.output == "done"
        state = await new_runtime().restore(Scope("s1"))
        assert state is not None
        tool = next(m for m in state.messages if m.role is Role.TOOL)
        assert tool.is_error and "SerializationError" in tool.content and "fetch" in tool.content
        # recorded: a resume replays it instead of running the side effect again
        again = Agent("x", model=ScriptedModel(["ok"] * 4), runtime=new_runtime(), tools=[fetch])
        await again.resume(session_id="s1")
        assert runs == [1]

    @pytest.mark.parametrize("bad", ["", "a b", "x" * 300, "../x", "é"])
    async def test_invalid_ids_are_rejected(self, runtime: Runtime, bad: str) -> None:
        agent = Research().agent(runtime)
        with pytest.raises(InvalidIdError):
            await agent.run("hi", session_id=bad)
        with pytest.raises(InvalidIdError):
            await agent.run("hi", session_id="ok", user_id=bad)
        with pytest.raises(InvalidIdError):
            await agent.list_checkpoints(bad)
