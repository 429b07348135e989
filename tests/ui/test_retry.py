"""Retry in the console: a stuck run taken over once more by the agent of ``--agent``,
in the console's process, through the verb ``loomflow sessions retry`` uses (recorded as
its run.started, by "loomflow ui"); refused without agents and for a run not stuck."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import RunStarted
from tests.support import lifecycle
from tests.support.console_app import console, until

LIFECYCLE = "tests.support.lifecycle"


def _status(db: Path) -> str | None:
    async def read() -> str | None:
        async with SqliteRuntime(db) as runtime:
            row = await runtime.session(Scope("oslo"))
            return None if row is None else row.status

    return asyncio.run(read())


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_retry_in_the_console_takes_the_stuck_run_over_with_its_agents(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    lifecycle.TOOL_RUNS.clear()
    asyncio.run(lifecycle.park(db))
    assert _status(db) == "stuck"

    with console(db) as client:  # no --agent: it says how instead
        page = client.get("/sessions/oslo")
        assert 'id="retry"' in page.text
        refused = client.post("/sessions/oslo/retry", data={"csrf": _csrf(page.text)})
        assert refused.status_code == 400
        assert "start it with --agent module:factory" in refused.text
    assert _status(db) == "stuck"

    with console(db, agent=f"{LIFECYCLE}:researcher") as client:
        page = client.get("/sessions/oslo")
        started = client.post(
            "/sessions/oslo/retry", data={"csrf": _csrf(page.text)}, follow_redirects=False
        )
        assert started.status_code == 303, started.text
        assert until(lambda: _status(db) == "finished", what="the retried run to finish")
        after = client.get("/sessions/oslo")
        assert "the retry ended: completed" in after.text
        # a run that is not stuck is not retried
        again = client.post("/sessions/oslo/retry", data={"csrf": _csrf(after.text)})
        assert again.status_code == 400 and "is not stuck" in again.text
    assert lifecycle.TOOL_RUNS["Oslo"] == 1  # recorded before, so replayed: never run again

    async def events() -> list[RunStarted]:
        async with SqliteRuntime(db) as runtime:
            read = await runtime.store.read_events(Scope("oslo"))
        return [e for e in read if isinstance(e, RunStarted)]

    *_, took = asyncio.run(events())
    assert str(took.payload.worker).startswith("loomflow ui@")
