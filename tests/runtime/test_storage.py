"""Storage grows linearly: a checkpoint never copies messages that turn events carry."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from pydantic import TypeAdapter

from loomflow import Agent, Message, Role, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import Scope, SqliteRuntime

PASSES = 200


def _reply(messages: list[Message]) -> Message | str:
    # each pass: one tool call with small arguments, then a ~600-character answer
    if messages[-1].role is Role.TOOL:
        return "The findings so far, restated in full for the reader. " * 11
    return ScriptedModel.tool_call("search", query="event sourcing", page=len(messages))


def _bytes_on_disk(path: Path) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(f"{path}*"))  # the db, -wal and -shm


def search(query: str, page: int) -> str:
    """Search the notes."""
    return f"{query} result page {page}: " + "x" * 370


async def test_sqlite_storage_of_200_passes_stays_under_3x_the_transcript(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    runtime = SqliteRuntime(path, max_checkpoints_per_session=0)  # keep every checkpoint

    def more(state):  # type: ignore[no-untyped-def]
        return "Please dig one level deeper into the topic. " * 4 if state.passes < PASSES else None

    agent = Agent(
        "You are a careful researcher.",
        model=ScriptedModel(_reply),
        runtime=runtime,
        tuning=Tuning(checkpoint=True, stop_hooks=[more], max_stop_hook_iterations=PASSES),
        tools=[search],
    )
    await agent.run("Research event sourcing.", session_id="long")
    assert len(await agent.list_checkpoints("long", limit=1000)) == PASSES
    final = await runtime.get_checkpoint(Scope("long"))
    assert final is not None
    await runtime.close()

    transcript = len(TypeAdapter(list[Message]).dump_json(final.messages))
    on_disk = _bytes_on_disk(path)
    assert len(final.messages) == 2 + PASSES * 4 - 1
    assert on_disk < 3 * transcript, f"{on_disk} bytes on disk for a {transcript}-byte transcript"
