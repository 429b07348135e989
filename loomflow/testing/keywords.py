"""The run() keywords in the runtime conformance suite: context, extra_tools, emit and
stream, output_schema, effort, each on ``run`` and through ``resume``, across a crash."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from loomflow import (
    Agent,
    Effort,
    Message,
    OutputValidationError,
    RunContext,
    RunOptionsError,
    RunResult,
    SessionState,
    TextDelta,
    Tuning,
    current_journal,
    get_run_context,
)
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope
from loomflow.schemas import Event, EventBase, RunFailed, RunStarted
from loomflow.testing._support import Opened
from loomflow.testing.scenario import CrashingModel, SimulatedCrash

__all__ = ["RunKeywords"]


class City(BaseModel):
    """The answer the structured-output tests ask for."""

    name: str
    population: int


OSLO = '{"name": "Oslo", "population": 709000}'


class _Seen:
    """What the tools, hooks and steps of a run saw of its context."""

    def __init__(self) -> None:
        self.contexts: list[tuple[str, RunContext]] = []
        self.lookups = 0

    def lookup(self, city: str) -> str:
        """Look a city up.

        Args:
            city: the city's name
        """
        self.lookups += 1
        self.contexts.append(("tool", get_run_context()))
        return f"{city}: 709000 people"

    async def lookup_in_a_step(self, city: str) -> str:
        """Look a city up, journaled."""
        journal = current_journal()
        assert journal is not None
        return await journal.step("lookup", self._step, city)

    def _step(self, city: str) -> str:
        self.contexts.append(("step", get_run_context()))
        return city.upper()

    def hook(self, state: SessionState) -> None:
        self.contexts.append(("hook", get_run_context()))


#: two lookups, an answer the schema refuses, the answer
_TWO_LOOKUPS: list[str | Message] = [
    ScriptedModel.tool_call("lookup", city="Oslo"),
    ScriptedModel.tool_call("lookup", city="Bergen"),
    "Oslo, roughly 709k",
    OSLO,
]


def _crashing(
    runtime: Runtime, replies: Sequence[str | Message], crash_at: int | None, **agent: Any
) -> Agent:
    """An agent whose model dies at its ``crash_at``-th call (None: never), as a process
    killed there would."""
    model = CrashingModel(ScriptedModel(list(replies)), crash_at)
    return Agent("x", model=model, runtime=runtime, tuning=Tuning(checkpoint=True), **agent)


async def runtime_events(runtime: Runtime, scope: Scope) -> list[Event]:
    """The session's events, read through ``runtime`` (which is then closed)."""
    try:
        return await runtime.store.read_events(scope)
    finally:
        await runtime.close()


def _city_agent(runtime: Runtime, replies: Sequence[str | Message], **agent: Any) -> Agent:
    return Agent(
        "You answer with data.",
        model=ScriptedModel(list(replies)),
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
        **agent,
    )


async def _events_of(runtime: Runtime, result: RunResult, user_id: str | None) -> list[Event]:
    """The events of ``result``'s run, from its ``run.started`` on."""
    events = await runtime.store.read_events(Scope(result.session_id, user_id))
    starts = [i for i, e in enumerate(events) if e.run_id == result.run_id]
    return events[starts[0] :] if starts else []


class RunKeywords:
    """Tests of the run() keywords; mixed into RuntimeConformance."""

    # --- context ------------------------------------------------------------------------

    async def test_the_run_context_reaches_tools_hooks_and_journal_steps(
        self, runtime: Runtime
    ) -> None:
        seen = _Seen()
        replies: list[str | Message] = [
            ScriptedModel.tool_call("lookup", city="Oslo"),
            ScriptedModel.tool_call("lookup_in_a_step", city="Oslo"),
            "done",
        ]
        agent = Agent(
            "x",
            model=ScriptedModel(replies),
            runtime=runtime,
            tuning=Tuning(stop_hooks=[seen.hook]),
            tools=[seen.lookup, seen.lookup_in_a_step],
        )
        given = RunContext(user_id="u1", metadata={"tenant": "acme", "plan": "pro"})
        result = await agent.run("go", context=given, metadata={"plan": "team"})
        assert [where for where, _ in seen.contexts] == ["tool", "step", "hook"]
        for _, context in seen.contexts:
            assert context.user_id == "u1"
            assert context.session_id == result.session_id
            assert context.run_id == result.run_id
            assert dict(context.metadata) == {"tenant": "acme", "plan": "team"}  # keyword wins
        with pytest.raises(LookupError):
            get_run_context()  # outside the run again
        started = (await _events_of(runtime, result, "u1"))[0]
        assert isinstance(started, RunStarted)
        assert started.payload.metadata == {"tenant": "acme", "plan": "team"}

    async def test_a_context_for_another_user_is_refused_before_anything_is_written(
        self, runtime: Runtime
    ) -> None:
        agent = _city_agent(runtime, ["x"])
        with pytest.raises(ValueError, match="context is for user 'u1'"):
            await agent.run("go", session_id="s1", user_id="u2", context=RunContext(user_id="u1"))
        for user in ("u1", "u2"):
            assert await runtime.store.session(Scope("s1", user)) is None
        with pytest.raises(TypeError, match="RunContext"):
            await agent.run("go", context={"user_id": "u1"})  # type: ignore[arg-type]

    # --- extra_tools --------------------------------------------------------------------

    async def test_extra_tools_are_offered_for_one_run_only(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        seen = _Seen()
        calls: list[str | Message] = [ScriptedModel.tool_call("lookup", city="Oslo"), "found it"]
        agent = _city_agent(new_runtime(), [*calls, *calls])
        first = await agent.run("go", session_id="s1", extra_tools=[seen.lookup])
        assert seen.lookups == 1 and first.output == "found it"
        assert "lookup" not in agent.tools  # the agent's own tools are unchanged
        # the next run offers no such tool: the model's call gets a tool error, no crash
        again = await agent.run("again", session_id="s1")
        assert again.output == "found it" and seen.lookups == 1
        model = agent.model
        assert isinstance(model, ScriptedModel)
        refusal = model.calls[-1][-1]
        assert refusal.is_error and "not offered" in refusal.content

    async def test_a_tool_name_given_twice_is_refused(self, runtime: Runtime) -> None:
        seen = _Seen()
        agent = _city_agent(runtime, ["x"], tools=[seen.lookup])
        with pytest.raises(ValueError, match="two tools are named 'lookup'"):
            await agent.run("go", session_id="s1", extra_tools=[seen.lookup])
        assert await runtime.store.session(Scope("s1")) is None

    # --- emit and stream ----------------------------------------------------------------

    async def test_emit_receives_every_appended_event_in_order(self, runtime: Runtime) -> None:
        seen = _Seen()
        items: list[object] = []

        async def emit(item: object) -> None:
            items.append(item)

        replies: list[str | Message] = [
            ScriptedModel.tool_call("lookup", city="Oslo"),
            "Oslo has 709000 people.",
        ]
        agent = _city_agent(runtime, replies, tools=[seen.lookup])
        result = await agent.run("go", session_id="s1", emit=emit)
        events = [i for i in items if not isinstance(i, TextDelta)]
        logged = await _events_of(runtime, result, None)
        assert [e.event_id for e in events] == [e.event_id for e in logged]  # type: ignore[attr-defined]
        assert [e.type for e in logged][:1] == ["run.started"]
        assert logged[-1].type == "run.finished"
        deltas = [i.text for i in items if isinstance(i, TextDelta)]
        assert "".join(deltas) == "Oslo has 709000 people."
        # every delta comes before the turn that records its answer
        answer_at = next(
            k for k, i in enumerate(items) if isinstance(i, EventBase) and i.seq == logged[-3].seq
        )
        assert all(isinstance(i, TextDelta) for i in items[answer_at - len(deltas) : answer_at])

    async def test_an_emit_that_raises_never_touches_the_run(self, runtime: Runtime) -> None:
        async def emit(item: object) -> None:
            raise RuntimeError("the UI went away")

        result = await _city_agent(runtime, ["fine"]).run("go", session_id="s1", emit=emit)
        assert result.output == "fine" and result.stop_reason == "completed"
        types = [e.type for e in await _events_of(runtime, result, None)]
        assert types == [
            "run.started",
            "turn.appended",
            "turn.appended",
            "checkpoint.written",
            "run.finished",
        ]

    async def test_stream_yields_the_events_and_deltas_then_the_result(
        self, runtime: Runtime
    ) -> None:
        agent = _city_agent(runtime, ["Oslo it is."])
        items = [item async for item in agent.stream("go", session_id="s1")]
        result = items[-1]
        assert isinstance(result, RunResult) and result.output == "Oslo it is."
        events = [i for i in items[:-1] if isinstance(i, EventBase)]
        logged = await _events_of(runtime, result, None)
        assert [e.event_id for e in events] == [e.event_id for e in logged]
        assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "Oslo it is."

    # --- output_schema ------------------------------------------------------------------

    async def test_parsed_is_set_after_a_retry_fixed_an_invalid_answer(
        self, runtime: Runtime
    ) -> None:
        agent = _city_agent(runtime, ["Oslo, about 700k", OSLO])
        result = await agent.run("Which city?", session_id="s1", output_schema=City)
        assert result.parsed == City(name="Oslo", population=709000)
        assert result.output == OSLO and result.model_calls == 2
        model = agent.model
        assert isinstance(model, ScriptedModel)
        retry = model.calls[1][-1]
        assert retry.role.value == "user" and "not valid City JSON" in retry.content
        options = model.options[0]
        assert options is not None and options.output_schema == City.model_json_schema()

    async def test_an_answer_that_stays_invalid_is_a_typed_error_and_the_run_failed(
        self, runtime: Runtime
    ) -> None:
        agent = _city_agent(runtime, ["no", '{"name": "Oslo"}'])
        with pytest.raises(OutputValidationError) as caught:
            await agent.run(
                "Which city?", session_id="s1", output_schema=City, output_validation_retries=1
            )
        assert caught.value.output == '{"name": "Oslo"}' and "population" in caught.value.error
        events = await runtime.store.read_events(Scope("s1"))
        assert isinstance(events[-1], RunFailed)
        assert events[-1].payload.error_type == "OutputValidationError"
        # the transcript is kept: a resume with the schema asks again and can succeed
        fixed = _city_agent(runtime, ["no", '{"name": "Oslo"}', OSLO])
        resumed = await fixed.resume(session_id="s1", output_schema=City)
        assert resumed.parsed == City(name="Oslo", population=709000)

    async def test_bad_output_schema_and_effort_are_refused(self, runtime: Runtime) -> None:
        agent = _city_agent(runtime, ["x"])
        with pytest.raises(TypeError, match="pydantic model class"):
            await agent.run("go", session_id="s1", output_schema=dict)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="effort must be one of low, medium, high, max"):
            await agent.run("go", session_id="s1", effort="extreme")
        with pytest.raises(TypeError, match="unexpected keyword arguments"):
            await agent.resume(session_id="s1", efort="high")
        assert await runtime.store.session(Scope("s1")) is None

    async def test_effort_reaches_the_model_on_run_and_resume(self, runtime: Runtime) -> None:
        agent = _city_agent(runtime, ["a", "b"], effort="low")
        await agent.run("go", session_id="s1")
        await agent.resume(session_id="s1", effort=Effort.MAX)
        model = agent.model
        assert isinstance(model, ScriptedModel)
        assert [o.effort if o else None for o in model.options] == [Effort.LOW, Effort.MAX]

    # --- all of them across a crash -----------------------------------------------------

    async def test_a_crash_then_a_resume_with_the_same_keywords_repeats_nothing(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        seen = _Seen()
        replies: list[str | Message] = [
            ScriptedModel.tool_call("lookup", city="Oslo"),
            ScriptedModel.tool_call("lookup", city="Bergen"),
            "Oslo, roughly 709k",
            OSLO,
        ]
        keywords: dict[str, Any] = {
            "context": RunContext(user_id="u1", metadata={"tenant": "acme"}),
            "extra_tools": [seen.lookup],
            "output_schema": City,
        }

        def agent(runtime: Runtime, crash_at: int | None) -> Agent:
            model = CrashingModel(ScriptedModel(list(replies)), crash_at)
            return Agent("x", model=model, runtime=runtime, tuning=Tuning(checkpoint=True))

        with pytest.raises(SimulatedCrash):  # dies asking for the retried answer
            await agent(new_runtime(), 4).run("Which city?", session_id="s1", **keywords)
        assert seen.lookups == 2
        resumed_agent = agent(new_runtime(), None)
        result = await resumed_agent.resume(session_id="s1", **keywords)
        assert seen.lookups == 2  # the recorded tool calls were not run again
        assert result.parsed == City(name="Oslo", population=709000)
        assert result.restored_turns == 3 and result.model_calls == 1
        model = resumed_agent.model
        assert isinstance(model, CrashingModel)
        assert model.inner.options[-1] is not None
        assert model.inner.options[-1].output_schema == City.model_json_schema()
        # killed again before its second lookup, the run is resumed with the same keywords:
        # that lookup runs in the resumed run, with the context given to resume()
        with pytest.raises(SimulatedCrash):
            await agent(new_runtime(), 2).run("Which city?", session_id="s2", **keywords)
        result = await agent(new_runtime(), None).resume(session_id="s2", **keywords)
        assert result.parsed == City(name="Oslo", population=709000) and seen.lookups == 4
        assert [(c.user_id, dict(c.metadata)) for _, c in seen.contexts[-2:]] == [
            ("u1", {"tenant": "acme"}),
            ("u1", {"tenant": "acme"}),
        ]
        assert seen.contexts[-1][1].session_id == "s2"

    # --- what a resume restores -----------------------------------------------------------

    async def test_a_resume_without_keywords_is_given_what_the_run_recorded(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        # killed before its second lookup; resumed by another Agent (another process),
        # with no keywords at all: the run goes on with its metadata, tool, schema,
        # retries and effort, the tools and schema found among what that Agent hosts
        seen = _Seen()
        given: dict[str, Any] = {
            "context": RunContext(user_id="u1", metadata={"tenant": "acme"}),
            "extra_tools": [seen.lookup],
            "output_schema": City,
            "output_validation_retries": 2,
            "effort": "high",
        }
        replies = [*_TWO_LOOKUPS[:3], "Oslo: 709000", OSLO]  # two answers refused
        with pytest.raises(SimulatedCrash):
            await _crashing(new_runtime(), replies, 2).run("Which city?", **given, session_id="s1")
        again = _crashing(
            new_runtime(), replies, None, extra_tools=[seen.lookup], output_schemas=[City]
        )
        result = await again.resume(session_id="s1", user_id="u1")
        assert result.parsed == City(name="Oslo", population=709000)
        # the lookup of the resumed run saw the recorded context
        assert [(c.user_id, dict(c.metadata)) for _, c in seen.contexts] == [
            ("u1", {"tenant": "acme"}),
            ("u1", {"tenant": "acme"}),
        ]
        model = again.model
        assert isinstance(model, CrashingModel)
        options = model.inner.options[0]
        assert options is not None and options.effort is Effort.HIGH
        assert options.output_schema == City.model_json_schema()
        # two invalid answers were asked again: the recorded two retries, not the default one
        assert sum("not valid City JSON" in m.content for m in model.inner.calls[-1]) == 2
        events = await runtime_events(new_runtime(), Scope("s1", "u1"))
        first, resumed = [e for e in events if isinstance(e, RunStarted)]
        assert resumed.payload.options == first.payload.options
        assert resumed.payload.options is not None and resumed.payload.options.replaced == ()
        assert [t.name for t in resumed.payload.options.extra_tools] == ["lookup"]
        assert resumed.payload.metadata == {"tenant": "acme"}

    async def test_a_resume_that_cannot_give_a_recorded_option_writes_nothing(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        seen = _Seen()
        given: dict[str, Any] = {
            "context": RunContext(user_id="u1", metadata={"tenant": "acme"}),
            "extra_tools": [seen.lookup],
            "output_schema": City,
        }
        with pytest.raises(SimulatedCrash):
            await _crashing(new_runtime(), _TWO_LOOKUPS, 2).run(
                "Which city?", **given, session_id="s1"
            )
        before = await runtime_events(new_runtime(), Scope("s1", "u1"))
        bare = _crashing(new_runtime(), _TWO_LOOKUPS, None)
        with pytest.raises(RunOptionsError) as caught:
            await bare.resume(session_id="s1", user_id="u1")
        assert any("'lookup'" in m for m in caught.value.missing), caught.value.missing
        assert any("'City'" in m for m in caught.value.missing), caught.value.missing
        assert "s1" in str(caught.value) and "extra_tools" in str(caught.value)

        class Town(BaseModel):  # another class of the same name: a schema that changed
            name: str

        Town.__name__ = "City"
        changed = _crashing(
            new_runtime(), _TWO_LOOKUPS, None, extra_tools=[seen.lookup], output_schemas=[Town]
        )
        with pytest.raises(RunOptionsError, match="output schema 'City' as it was"):
            await changed.resume(session_id="s1", user_id="u1")
        after = await runtime_events(new_runtime(), Scope("s1", "u1"))
        assert [e.event_id for e in after] == [e.event_id for e in before]  # nothing written
        assert seen.lookups == 1
        # explicit keywords replace what cannot be given, and the new run says so
        fixed = _crashing(new_runtime(), _TWO_LOOKUPS, None)
        result = await fixed.resume(
            session_id="s1", user_id="u1", extra_tools=[seen.lookup], output_schema=City
        )
        assert result.parsed == City(name="Oslo", population=709000) and seen.lookups == 2
        resumed = [e for e in await runtime_events(new_runtime(), Scope("s1", "u1"))][len(after)]
        assert isinstance(resumed, RunStarted) and resumed.payload.options is not None
        assert resumed.payload.options.replaced == ()  # the same tool and schema: no change
        assert resumed.payload.metadata == {"tenant": "acme"}  # not given: as recorded

    async def test_keywords_given_to_resume_replace_the_recorded_ones_and_say_so(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        seen = _Seen()
        with pytest.raises(SimulatedCrash):
            await _crashing(new_runtime(), _TWO_LOOKUPS, 2).run(
                "Which city?",
                session_id="s1",
                context=RunContext(user_id="u1", metadata={"tenant": "acme"}),
                extra_tools=[seen.lookup],
                output_schema=City,
            )
        again = _crashing(new_runtime(), _TWO_LOOKUPS, None, output_schemas=[City])
        result = await again.resume(
            session_id="s1",
            context=RunContext(user_id="u1", metadata={"tenant": "globex"}),
            extra_tools=[seen.lookup],
            output_validation_retries=3,
        )
        assert result.parsed == City(name="Oslo", population=709000)
        # the tool the resume gave saw the context the resume gave
        assert dict(seen.contexts[-1][1].metadata) == {"tenant": "globex"}
        resumed = [
            e
            for e in await runtime_events(new_runtime(), Scope("s1", "u1"))
            if isinstance(e, RunStarted)
        ][-1]
        assert resumed.payload.metadata == {"tenant": "globex"}
        assert resumed.payload.options is not None
        assert resumed.payload.options.replaced == ("metadata", "output_validation_retries")
        assert resumed.payload.options.output_schema is not None  # recorded, still given

    async def test_emit_and_stream_follow_a_resumed_run(self, new_runtime: Opened[Runtime]) -> None:
        seen = _Seen()
        with pytest.raises(SimulatedCrash):
            await _crashing(new_runtime(), _TWO_LOOKUPS, 2).run(
                "Which city?", session_id="s1", extra_tools=[seen.lookup], output_schema=City
            )
        items: list[object] = []

        async def emit(item: object) -> None:
            items.append(item)

        agent = _crashing(
            new_runtime(),
            [*_TWO_LOOKUPS, OSLO],
            None,
            extra_tools=[seen.lookup],
            output_schemas=[City],
        )
        result = await agent.resume(session_id="s1", emit=emit)
        logged = await _events_of(new_runtime(), result, None)
        heard = [i for i in items if isinstance(i, EventBase)]
        assert [e.event_id for e in heard] == [e.event_id for e in logged]
        assert logged[-1].type == "run.finished"
        assert "".join(i.text for i in items if isinstance(i, TextDelta)).endswith(OSLO)
        # the same through stream_resume, on a session resumed once more
        streamed = [item async for item in agent.stream_resume("And again?", session_id="s1")]
        final = streamed[-1]
        assert isinstance(final, RunResult) and final.parsed is not None
        logged = await _events_of(new_runtime(), final, None)
        heard = [i for i in streamed[:-1] if isinstance(i, EventBase)]
        assert [e.event_id for e in heard] == [e.event_id for e in logged]

    async def test_a_fork_is_given_the_options_of_the_run_it_forks(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        seen = _Seen()
        replies: list[str | Message] = [OSLO, ScriptedModel.tool_call("lookup", city="Oslo"), OSLO]
        first = await _crashing(new_runtime(), replies, None).run(
            "Which city?",
            session_id="s1",
            context=RunContext(user_id="u1", metadata={"tenant": "acme"}),
            extra_tools=[seen.lookup],
            output_schema=City,
        )
        agent = _crashing(
            new_runtime(), replies, None, extra_tools=[seen.lookup], output_schemas=[City]
        )
        await agent.resume("Once more?", session_id="s1", user_id="u1")
        older = (await agent.list_checkpoints("s1", user_id="u1"))[-1]
        fork = await agent.resume(
            "Look it up.", session_id="s1", user_id="u1", from_checkpoint=older.checkpoint_id
        )
        assert fork.session_id != first.session_id and fork.parsed is not None
        assert dict(seen.contexts[-1][1].metadata) == {"tenant": "acme"}  # the fork's lookup
        started = [
            e
            for e in await runtime_events(new_runtime(), Scope(fork.session_id, "u1"))
            if isinstance(e, RunStarted)
        ]
        assert [t.name for t in started[0].payload.options.extra_tools] == ["lookup"]  # type: ignore[union-attr]

    async def test_a_fork_made_without_a_run_is_given_the_options_when_it_runs(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        # Runtime.fork (what `loomflow sessions fork` does) writes only session.forked;
        # the fork's first run, resumed with no keywords, is given the parent's options
        seen = _Seen()
        # a scripted model answers by the turn it is at: the fork goes on at the second
        replies: list[str | Message] = [OSLO, ScriptedModel.tool_call("lookup", city="Oslo"), OSLO]
        await _crashing(new_runtime(), replies, None).run(
            "Which city?",
            session_id="s1",
            context=RunContext(user_id="u1", metadata={"tenant": "acme"}),
            extra_tools=[seen.lookup],
            output_schema=City,
        )
        runtime = new_runtime()
        [checkpoint] = await runtime.list_checkpoints(Scope("s1", "u1"))
        child = await runtime.fork(Scope("s1", "u1"), checkpoint.checkpoint_id)
        # where the tool is not hosted the fork is refused, as a resume of the parent is
        with pytest.raises(RunOptionsError, match="'lookup'"):
            await _crashing(new_runtime(), replies, None).resume(
                session_id=child.session_id, user_id="u1"
            )
        agent = _crashing(
            new_runtime(), replies, None, extra_tools=[seen.lookup], output_schemas=[City]
        )
        result = await agent.resume("Look it up.", session_id=child.session_id, user_id="u1")
        assert result.parsed == City(name="Oslo", population=709000)
        assert [(c.user_id, dict(c.metadata)) for _, c in seen.contexts] == [
            ("u1", {"tenant": "acme"})
        ], seen.contexts

    async def test_run_metadata_reads_back_exactly_as_it_was_given(
        self, new_runtime: Opened[Runtime]
    ) -> None:
        # a float PostgreSQL's jsonb would turn into an integer, NUL, a 62-bit int
        metadata = {"big": 5.279742886759849e16, "tiny": 1e-300, "n": 2**62, "nul": "a\x00b"}
        agent = _city_agent(new_runtime(), [OSLO])
        await agent.run("Which city?", session_id="s1", context=RunContext(metadata=metadata))
        runtime = new_runtime()
        row = await runtime.store.session(Scope("s1"))
        await runtime.close()
        assert row is not None and row.run_metadata == metadata
        assert [type(v) for v in row.run_metadata.values()] == [float, float, int, str]
