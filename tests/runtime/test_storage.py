"""Storage grows linearly, measured on disk: a checkpoint never copies messages that turn
events carry. (The log's own bytes are measured on every runtime by the conformance
suite's ``test_the_log_of_a_long_session_grows_linearly``.)"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from pydantic import TypeAdapter

from loomflow import Message
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.testing.scenario import digging_agent

PASSES = 200


def _bytes_on_disk(path: Path) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(f"{path}*"))  # the db, -wal and -shm


async def test_sqlite_storage_of_200_passes_stays_under_3x_the_transcript(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    runtime = SqliteRuntime(path, max_checkpoints_per_session=0)  # keep every checkpoint
    agent = digging_agent(runtime, PASSES)
    await agent.run("Research event sourcing.", session_id="long")
    assert len(await agent.list_checkpoints("long", limit=1000)) == PASSES
    final = await runtime.get_checkpoint(Scope("long"))
    assert final is not None
    await runtime.close()

    transcript = len(TypeAdapter(list[Message]).dump_json(final.messages))
    on_disk = _bytes_on_disk(path)
    assert len(final.messages) == 2 + PASSES * 4 - 1
    assert on_disk < 3 * transcript, f"{on_disk} bytes on disk for a {transcript}-byte transcript"
