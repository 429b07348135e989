"""What ``sessions show`` and ``sessions fork`` say: counts in the right number, and a
hint whose command runs as written."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from loomflow import Agent, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import SqliteRuntime
from tests.support.cli import Cli


def _journal(db: Path) -> None:
    """A session ``one`` of user ada: one run, one turn, a checkpoint."""

    async def fill() -> None:
        async with SqliteRuntime(db) as runtime:
            agent = Agent(
                "Echo.",
                model=ScriptedModel(["ok"]),
                runtime=runtime,
                tuning=Tuning(checkpoint=True),
            )
            await agent.run("hi", session_id="one", user_id="ada")

    asyncio.run(fill())


def test_show_counts_one_turn_as_one_turn(cli: Cli, tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    _journal(db)
    ran = cli("sessions", "show", "one", "--user", "ada", "--db", str(db))
    assert ran.code == 0, ran
    assert "finished, 1 turn, 3 messages" in ran.out, ran.out
    assert "transcript (3 messages)" in ran.out, ran.out


def test_fork_from_a_missing_checkpoint_hints_a_listing_that_runs(cli: Cli, tmp_path: Path) -> None:
    db = tmp_path / "my journal.db"
    _journal(db)
    ran = cli("sessions", "fork", "one", "--user", "ada", "--db", str(db), "--from", "ckpt_gone")
    assert ran.code == 1 and not ran.out, ran
    hinted = ran.err.partition("list them with `")[2].partition("`")[0]
    assert hinted == shlex.join(
        ["loomflow", "checkpoints", "ls", "one", "--db", str(db), "--user", "ada"]
    )
    listed = cli(*shlex.split(hinted)[1:], "--json")
    assert listed.code == 0 and listed.out.count("\n") == 1, listed


def test_an_argument_a_command_does_not_know_is_reported_with_its_usage(
    cli: Cli, tmp_path: Path
) -> None:
    ran = cli("sessions", "ls", "--usr", "ada", "--db", str(tmp_path / "journal.db"))
    assert ran.code == 2 and not ran.out, ran
    assert ran.err.startswith("usage: loomflow sessions ls "), ran.err
    assert "loomflow sessions ls: error: unrecognized arguments: --usr ada" in ran.err
    ran = cli("--usr")  # the top level's own: its usage, as before
    assert ran.code == 2 and ran.err.startswith("usage: loomflow [-h]"), ran.err
