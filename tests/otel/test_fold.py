"""The fold of the log into spans, on the logs of real runs (SQLite, in this process):
what each span holds, which trace a run joins, and that nothing is folded twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomflow import Agent, Tuning, wait_for_signal
from loomflow.log.reader import drain, sqlite_reader
from loomflow.models import ScriptedModel
from loomflow.otel.fold import SessionTrace, decode_state, encode_state, fold
from loomflow.otel.spans import Span
from loomflow.runtime import SqliteRuntime
from loomflow.schemas import Event, RunFinished, SessionErased, TurnAppended
from loomflow.schemas.events import RunCancelled, RunCancelledPayload

ScopeKey = tuple[str | None, str]


async def _events(db: Path) -> list[Event]:
    events: list[Event] = []
    async with sqlite_reader(db) as reader:
        async for batch in drain(reader):
            events.extend(r.event for r in batch if r.event is not None)
    return events


def _fold_all(
    events: list[Event], states: dict[ScopeKey, SessionTrace] | None = None
) -> tuple[list[Span], dict[ScopeKey, SessionTrace], list[str]]:
    states = {} if states is None else states
    spans: list[Span] = []
    refused: list[str] = []
    for event in events:
        state = states.setdefault((event.user_id, event.session_id), SessionTrace())
        folded = fold(state, event, contiguous=False)
        spans.extend(folded.spans)
        if folded.refused is not None:
            refused.append(folded.refused)
    return spans, states, refused


def lookup(city: str) -> str:
    """Look a city's population up."""
    return f"{city}: 709000"


def broken(city: str) -> str:
    """A lookup that fails."""
    raise ValueError(f"no data for {city}")


def _agent(db: Path, script: list[str | object], **options: object) -> Agent:
    return Agent(
        "Answer with data.",
        model=ScriptedModel(script),  # type: ignore[arg-type]
        runtime=SqliteRuntime(db),
        tuning=Tuning(checkpoint=True),
        name="geo",
        **options,  # type: ignore[arg-type]
    )


def _by_name(spans: list[Span]) -> dict[str, list[Span]]:
    named: dict[str, list[Span]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


async def test_a_run_is_a_trace_of_its_model_and_tool_calls(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    agent = _agent(db, [ScriptedModel.tool_call("lookup", city="Oslo"), "709000."], tools=[lookup])
    result = await agent.run("How many live in Oslo?", session_id="oslo", user_id="ada")
    await agent.runtime.close()
    events = await _events(db)
    spans, _, refused = _fold_all(events)
    assert refused == []
    named = _by_name(spans)
    assert sorted(named) == ["chat scripted", "execute_tool lookup", "invoke_agent geo"]
    (run,) = named["invoke_agent geo"]
    first, second = sorted(named["chat scripted"], key=lambda s: s.start_ns)
    (tool,) = named["execute_tool lookup"]
    assert {s.trace_id for s in spans} == {run.trace_id}
    assert run.parent_id is None and {s.parent_id for s in spans if s is not run} == {run.span_id}
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "geo"
    assert run.attributes["gen_ai.conversation.id"] == "oslo"
    assert run.attributes["user.id"] == "ada"
    assert run.attributes["loomflow.run.outcome"] == "finished"
    assert run.error is None
    # the run's usage is its model calls', which is the run's own on a new session
    assert run.attributes["gen_ai.usage.output_tokens"] == result.tokens_out
    assert run.attributes["gen_ai.usage.input_tokens"] == result.tokens_in
    assert run.attributes["loomflow.usage.cost_usd"] == pytest.approx(result.cost_usd)
    assert [e.name for e in run.events] == ["gen_ai.agent.checkpointed"]
    # times are the events': a chat span ends at its turn and lasted its latency
    turns = [e for e in events if isinstance(e, TurnAppended) and e.payload.model_call]
    for span, turn in zip((first, second), turns, strict=True):
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.request.model"] == "scripted"
        assert span.attributes["gen_ai.usage.input_tokens"] == turn.payload.usage.input_tokens
        assert span.attributes["gen_ai.usage.output_tokens"] == turn.payload.usage.output_tokens
        assert span.end_ns - span.start_ns == int((turn.payload.latency_ms or 0) * 1e6)
        assert span.kind == "client"
    assert first.end_ns <= tool.start_ns <= tool.end_ns <= second.start_ns + 1
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_0_0"
    (finished,) = [e for e in events if isinstance(e, RunFinished)]
    assert run.end_ns == int(finished.at.timestamp() * 1_000_000) * 1000


async def test_a_run_that_waits_for_a_signal_and_is_resumed_is_one_trace(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"

    async def pay(invoice: int) -> str:
        """Pay an invoice once a person approves it."""
        answer = await wait_for_signal("approve")
        return f"invoice {invoice}: {'paid' if answer['ok'] else 'refused'}"

    script = [ScriptedModel.tool_call("pay", invoice=7), "Invoice 7 is settled."]
    agent = _agent(db, script, tools=[pay])
    waited = await agent.run("Pay invoice 7.", session_id="invoice-7")
    assert waited.stop_reason == "waiting"
    await agent.signal("invoice-7", "approve", {"ok": True})
    resumed = await agent.resume(session_id="invoice-7")
    await agent.runtime.close()
    spans, _, _ = _fold_all(await _events(db))

    runs = sorted((s for s in spans if s.parent_id is None), key=lambda s: s.start_ns)
    assert [r.attributes["loomflow.run.outcome"] for r in runs] == ["waiting", "finished"]
    first, second = runs
    assert {s.trace_id for s in spans} == {first.trace_id}  # one trace across the wait
    assert [e.name for e in first.events] == ["gen_ai.agent.paused"]
    assert first.events[0].attributes["loomflow.signal.name"] == "approve"
    names = [e.name for e in second.events]
    assert names[0] == "gen_ai.agent.resumed" and "loomflow.signal.received" in names
    assert second.events[0].attributes["loomflow.resumed.after"] == "waiting"
    (continues, *replayed) = second.links
    assert (continues.span_id, continues.attributes["loomflow.link.type"]) == (
        first.span_id,
        "continues",
    )
    # the turn that asked for the tool was restored from the log, not called again
    (chat_1,) = [s for s in spans if s.name == "chat scripted" and s.parent_id == first.span_id]
    assert [(k.span_id, k.attributes["loomflow.billed"]) for k in replayed] == [
        (chat_1.span_id, False)
    ]
    assert second.attributes["loomflow.run.replayed_turns"] == 1
    # the tool ran again in the resumed run, which recorded its result
    (tool,) = [s for s in spans if s.name == "execute_tool pay"]
    assert tool.parent_id == second.span_id
    # each run's usage is its own calls': the resumed run's one answer
    assert second.attributes["loomflow.run.model_calls"] == resumed.model_calls == 1
    own = second.attributes["gen_ai.usage.output_tokens"]
    assert isinstance(own, int) and own < resumed.tokens_out


async def test_a_run_resumed_after_it_finished_starts_a_trace_that_follows_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    agent = _agent(db, ["Oslo.", "Still Oslo."])
    await agent.run("Where?", session_id="s")
    await agent.resume("And now?", session_id="s")
    await agent.runtime.close()
    spans, _, _ = _fold_all(await _events(db))
    first, second = sorted((s for s in spans if s.parent_id is None), key=lambda s: s.start_ns)
    assert first.trace_id != second.trace_id
    assert second.links[0].span_id == first.span_id
    assert second.links[0].attributes["loomflow.link.type"] == "follows"
    assert second.attributes["loomflow.run.restored_turns"] == 1


async def test_a_failed_model_call_and_a_tool_error_are_failed_spans(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    # the script has no third reply: the model call after the tool's error raises
    agent = _agent(db, [ScriptedModel.tool_call("broken", city="Oslo")], tools=[broken])
    with pytest.raises(Exception, match="has 1 reply and"):
        await agent.run("How many live in Oslo?", session_id="s")
    await agent.runtime.close()
    spans, _, _ = _fold_all(await _events(db))
    named = _by_name(spans)
    (tool,) = named["execute_tool broken"]
    assert tool.error == "ValueError: no data for Oslo"
    assert tool.attributes["error.type"] == "ValueError"
    ok, failed = sorted(named["chat scripted"], key=lambda s: s.start_ns)
    assert ok.error is None and failed.attributes["error.type"] == "ModelError"
    assert failed.start_ns == tool.end_ns and "has 1 reply and" in (failed.error or "")
    (run,) = named["invoke_agent geo"]
    assert run.attributes["loomflow.run.outcome"] == "failed"
    assert run.error is not None and run.error.startswith("ModelError: ")


async def test_a_replay_folds_nothing_and_a_fenced_writer_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    agent = _agent(db, [ScriptedModel.tool_call("lookup", city="Oslo"), "709000."], tools=[lookup])
    await agent.run("How many?", session_id="s")
    await agent.runtime.close()
    events = await _events(db)
    spans, states, refused = _fold_all(events)
    assert spans and not refused
    # the states through JSON, as the consumer stores them between batches
    states = {key: decode_state(encode_state(state)) for key, state in states.items()}
    again, _, refused = _fold_all(events, states)
    assert again == [] and len(refused) == len(events)
    # a writer of an older epoch appending after the session's last seq: fenced, refused
    last = events[-1]
    stale = last.model_copy(update={"seq": last.seq + 1, "epoch": last.epoch - 1})
    later, _, refused = _fold_all([stale], states)
    assert later == [] and "older than" in refused[0]


async def test_erasure_ends_the_run_in_flight_and_nothing_after_it_is_taken(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    agent = _agent(db, ["Oslo."])
    await agent.run("Where?", session_id="s")
    await agent.runtime.close()
    events = await _events(db)
    started, turns = events[0], [e for e in events if isinstance(e, TurnAppended)]
    # a run in flight (its end not recorded) when the session is erased
    in_flight = [started, *turns]
    erased = SessionErased(
        session_id="s", run_id="admin", seq=in_flight[-1].seq + 1, epoch=started.epoch + 1
    )
    spans, states, _ = _fold_all([*in_flight, erased])
    (run,) = [s for s in spans if s.parent_id is None]
    assert run.attributes["loomflow.run.outcome"] == "erased" and run.error
    assert states[(None, "s")] == SessionTrace(last_seq=erased.seq, epoch=erased.epoch, erased=True)
    late = turns[-1].model_copy(update={"seq": erased.seq + 1, "epoch": erased.epoch})
    assert _fold_all([late], states)[0] == []


async def test_a_cancel_ends_the_run_in_flight_and_its_resume_goes_on_in_its_trace(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    agent = _agent(db, ["Oslo."])
    await agent.run("Where?", session_id="s")
    await agent.runtime.close()
    events = await _events(db)
    started, turns = events[0], [e for e in events if isinstance(e, TurnAppended)]
    in_flight = [started, *turns]
    cancelled = RunCancelled(
        session_id="s",
        run_id=started.run_id,
        seq=in_flight[-1].seq + 1,
        epoch=started.epoch + 1,
        payload=RunCancelledPayload(reason="wrong task"),
    )
    spans, states, refused = _fold_all([*in_flight, cancelled])
    assert not refused
    (run,) = [s for s in spans if s.parent_id is None]
    assert run.attributes["loomflow.run.outcome"] == "cancelled"
    assert run.error == "cancelled: wrong task"
    last = states[(None, "s")].last
    assert states[(None, "s")].run is None and last is not None and last.outcome == "cancelled"


async def test_a_fork_is_a_trace_of_its_own_that_names_its_parent(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    agent = _agent(db, ["Oslo.", "Bergen."])
    await agent.run("Where?", session_id="s")
    await agent.run("And then?", session_id="s")
    (_, oldest) = await agent.list_checkpoints("s")
    fork = await agent.resume("Elsewhere?", session_id="s", from_checkpoint=oldest.checkpoint_id)
    await agent.runtime.close()
    spans, _, _ = _fold_all(await _events(db))
    in_fork = [s for s in spans if s.attributes["gen_ai.conversation.id"] == fork.session_id]
    (forked,) = [s for s in in_fork if s.parent_id is None]
    assert forked.attributes["loomflow.run.mode"] == "fork"
    assert forked.attributes["loomflow.fork.parent_session_id"] == "s"
    assert forked.attributes["loomflow.fork.parent_checkpoint_id"] == oldest.checkpoint_id
    assert forked.trace_id not in {s.trace_id for s in spans if s not in in_fork}
