"""The README's per-run example, run as a user would: saved as a file and started alone;
then the README's ``loomflow`` commands on the journal it left."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

from loomflow.runtime import DatabaseStore, Scope, SqliteRuntime
from tests.support.readme import README, block, commands, user_env

ID = re.compile(r"(sess|ckpt)[0-9a-z]{26}")
TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? UTC")


def _per_run(tmp_path: Path) -> list[str]:
    """Run per_run.py in ``tmp_path``; its output lines."""
    per_run = block("# per_run.py")
    assert per_run.name == "per_run.py" and "`python per_run.py`" in README
    (tmp_path / per_run.name).write_text(per_run.text)
    done = subprocess.run(
        ["python", per_run.name],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_per_run_example_runs_as_written(tmp_path: Path) -> None:
    lines = _per_run(tmp_path)
    assert lines[:2] == ["event: run.started", "event: turn.appended"]
    assert "event: run.finished" in lines
    assert "name='Oslo' population=709000" in lines
    assert lines[-1] == "Still Oslo."


def _shape(line: str) -> str:
    """A line of output with what differs from run to run (ids, times) left out."""
    return " ".join(TIME.sub("<time>", ID.sub(r"<\1>", line)).split())


def test_the_readme_commands_print_what_it_shows_on_per_runs_journal(tmp_path: Path) -> None:
    _per_run(tmp_path)
    shown = block("$ loomflow sessions ls", "sh")
    steps = commands(shown)
    # each command, then the one line it printed
    assert len(shown.text.splitlines()) == 2 * len(steps)
    assert [command.argv[:2] for command in steps] == [
        ["loomflow", "sessions"],
        ["loomflow", "sessions"],
        ["loomflow", "checkpoints"],
        ["loomflow", "sessions"],
        ["loomflow", "prune"],
    ]

    async def journal() -> tuple[str, dict[int, str]]:
        async with SqliteRuntime(tmp_path / "journal.db") as runtime:
            store = runtime.store
            assert isinstance(store, DatabaseStore)
            (session,) = await store.list_sessions(user_id="ada")
            rows = await store.list_checkpoints(Scope(session.session_id, "ada"), 10)
            return session.session_id, {row.turn: row.checkpoint_id for row in rows}

    # the README's ids stand for this journal's: its one session, its checkpoints by turn
    session, by_turn = asyncio.run(journal())
    first = steps[0].shown or ""
    ids = {m.group(): session for m in re.finditer(r"sess[0-9a-z]{26}", first + steps[1].text)}
    for found in re.finditer(r"(ckpt[0-9a-z]{26}) +(\d+) ", shown.text):
        ids[found.group(1)] = by_turn[int(found.group(2))]
    env = {k: v for k, v in user_env().items() if k not in ("COLUMNS", "FORCE_COLOR")}
    env.pop("NO_COLOR")  # as in a terminal: a pipe gets no colours anyway
    for step in steps:
        argv = [ids.get(arg, arg) for arg in step.argv]
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (argv, done.stderr)
        assert _shape(step.shown or "") in [_shape(line) for line in done.stdout.splitlines()], (
            argv,
            done.stdout,
        )
