"""The hash a model call records is that of the transcript it was sent, however the run
got its transcript (a resume in the same process, another agent, a reopened store)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from loomflow import Agent, Tuning
from loomflow.agent.hashes import TranscriptHashes
from loomflow.models import ScriptedModel
from loomflow.runtime import InProcRuntime, Runtime, Scope, SqliteRuntime
from loomflow.schemas import Message, Role, TranscriptCompacted, TurnAppended


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def reply(messages: Sequence[Message]) -> Message | str:
    """A tool call for each user message, then an answer once its result is in."""
    if messages[-1].role is Role.TOOL:
        return f"answer {len(messages)}"
    return ScriptedModel.tool_call("lookup", query=f"q{len(messages)}")


def agent(runtime: Runtime, tuning: Tuning | None = None) -> Agent:
    return Agent(
        "Be brief.",
        model=ScriptedModel(reply),
        runtime=runtime,
        tuning=tuning or Tuning(checkpoint=True),
        tools=[lookup],
    )


def expected_hash(transcript: list[Message]) -> str:
    digest = hashlib.sha256()
    for message in transcript:
        digest.update(message.model_dump_json().encode())
    digest.update(orjson.dumps(["scripted", ["lookup"]]))
    return digest.hexdigest()[:32]


async def check_hashes(runtime: Runtime, session_id: str) -> int:
    """Check every model call of the session against its transcript; how many there were."""
    transcript: list[Message] = []
    calls = 0
    for event in await runtime.store.read_events(Scope(session_id)):
        if isinstance(event, TranscriptCompacted):
            transcript = list(event.payload.messages)
        elif isinstance(event, TurnAppended):
            if event.payload.model_call:
                assert event.payload.input_hash == expected_hash(transcript), (event.seq, calls)
                calls += 1
            transcript += event.payload.messages
    return calls


@pytest.mark.parametrize("kind", ["inproc", "sqlite"])
async def test_model_calls_record_the_hash_of_what_they_were_sent(
    tmp_path: Path, kind: str
) -> None:
    def open_runtime() -> Runtime:
        return InProcRuntime() if kind == "inproc" else SqliteRuntime(tmp_path / "journal.db")

    runtime = open_runtime()
    first, second = agent(runtime), agent(runtime)
    await first.run("one", session_id="s")
    await first.resume("two", session_id="s")  # from where its own run left the hash
    await second.resume("three", session_id="s")  # an agent that never saw the session
    await first.resume("four", session_id="s")  # the session moved on without it
    # a compacted transcript is hashed anew, and the next run starts from it
    compacting = Tuning(checkpoint=True, auto_compact_at_tokens=1, compact_keep_messages=2)
    await agent(runtime, compacting).resume("five", session_id="s")
    await first.resume("six", session_id="s")
    assert await check_hashes(runtime, "s") == 12
    if kind == "sqlite":
        await runtime.close()
        runtime = open_runtime()  # a restart: the transcript comes back as new objects
        later = agent(runtime)
        await later.resume("seven", session_id="s")
        await later.resume("eight", session_id="s")
        assert await check_hashes(runtime, "s") == 16
    await runtime.close()


def test_a_run_given_other_objects_for_the_same_messages_hashes_what_differs() -> None:
    # as on Kafka, where a resume reads back as new objects what the last run appended
    hashes = TranscriptHashes()
    extra = orjson.dumps(["scripted", ["lookup"]])
    messages = [Message.system("s"), Message.user("one"), Message.assistant("a")]
    run = hashes.start((None, "s"), messages[:1])
    run.extend(messages[1:])
    hashes.keep((None, "s"), run)
    copies = [messages[0], *(m.model_copy() for m in messages[1:]), Message.user("two")]
    again = hashes.start((None, "s"), copies)
    assert again.hexdigest(extra)[:32] == expected_hash(copies)
    changed = [Message.system("other"), *copies[1:]]
    assert hashes.start((None, "s"), changed).hexdigest(extra)[:32] == expected_hash(changed)
