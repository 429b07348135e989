"""``loomflow ... | head``: a command whose reader goes away after a line ends quietly,
with exit code 0, as the README ("Scripting: JSON, filters, exit codes") promises."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from loomflow import Agent, Tuning, new_id
from loomflow.models import ScriptedModel
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas.signing import Keyring, Signer
from tests.support.cli import Cli

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

#: more than a pipe holds (64 KiB on Linux), so the command is still writing when its
#: reader goes: with less, it could write everything before and never see the pipe close
PLENTY = 128 * 1024


@dataclass(frozen=True)
class Big:
    """A journal and a keyring whose listings run to hundreds of KiB."""

    db: Path
    keyring: Path


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Big:
    where = tmp_path_factory.mktemp("big")
    db, keyring = where / "journal.db", where / "keyring.json"

    async def fill() -> None:
        # every checkpoint kept: one a run, 600 runs of one session
        async with SqliteRuntime(db, max_checkpoints_per_session=0) as runtime:
            agent = Agent(
                "Echo.",
                model=ScriptedModel(["All is well here. " * 8] * 600),
                runtime=runtime,
                tuning=Tuning(checkpoint=True),
            )
            await agent.run("hi", session_id="many", user_id="ada")
            for _ in range(599):
                await agent.resume("again", session_id="many", user_id="ada")
            for n in range(600):
                scope = Scope(f"s{n}", "ada")
                await runtime.open_session(scope, run_id=new_id("run"), agent="agent")

    asyncio.run(fill())
    signers = (Signer.generate() for _ in range(1000))
    Keyring.of(*(s.trusted(("events",)) for s in signers)).save(keyring)
    return Big(db, keyring)


def _argv(big: Big, command: str) -> list[str]:
    """``command`` on ``big``'s files, every row of it."""
    keyring = ["--keyring", str(big.keyring)]
    db = ["--db", str(big.db), "--limit", "100000"]
    return {
        "keys list --json": ["keys", "list", *keyring, "--json"],
        "checkpoints ls --json": ["checkpoints", "ls", "many", "--user", "ada", *db, "--json"],
        "sessions show": ["sessions", "show", "many", "--user", "ada", "--db", str(big.db)],
        "sessions ls --json": ["sessions", "ls", "--all-users", *db, "--json"],
    }[command]


def _first_line(argv: list[str]) -> tuple[str, int, str]:
    """``loomflow ARGV | head -1``: the line read, the exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    run = subprocess.Popen(
        [str(BIN / "loomflow"), *argv],
        cwd=ROOT,
        env=dict(env, NO_COLOR="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None and run.stderr is not None
    try:
        line = run.stdout.readline()
        run.stdout.close()  # the reader goes, as head does with its line
        code = run.wait(timeout=60)
    finally:
        run.kill()
    return line, code, run.stderr.read()


@pytest.mark.parametrize(
    "command",
    [
        "keys list --json",
        "checkpoints ls --json",
        "sessions show",
        "sessions ls --json",
    ],
)
def test_a_reader_gone_after_a_line_ends_the_command_quietly_with_0(
    cli: Cli, big: Big, command: str
) -> None:
    argv = _argv(big, command)
    whole = cli(*argv)
    assert whole.code == 0 and len(whole.out.encode()) > PLENTY, (command, len(whole.out))

    line, code, err = _first_line(argv)
    assert line.strip() and line == whole.out.splitlines(keepends=True)[0]
    assert (code, err) == (0, ""), (command, code, err)


def _one_run(db: Path) -> None:
    """A journal at ``db`` with one finished run whose answer is "All is well."."""

    async def write() -> None:
        async with SqliteRuntime(db) as runtime:
            agent = Agent("Echo.", model=ScriptedModel(["All is well."]), runtime=runtime)
            await agent.run("hi", session_id="s1")

    asyncio.run(write())


def test_a_verdict_cut_off_by_its_reader_still_decides_the_exit_code(
    cli: Cli, tmp_path: Path
) -> None:
    """`loomflow audit verify | head` of a tampered log: the pipe cut before the report
    must not turn the verdict into 0 (a new user's trial: `PIPESTATUS` "0 0", so a CI step
    with `set -o pipefail` passed a tampered log). Here the reader is gone before the
    command writes at all."""
    import sqlite3

    db = tmp_path / "journal.db"
    _one_run(db)
    assert cli("audit", "--db", str(db)).code == 0
    with sqlite3.connect(db) as conn:  # one byte of a recorded message, changed
        conn.execute(
            "UPDATE loomflow_events SET payload = replace(payload, 'All is', 'All IS') "
            "WHERE payload LIKE '%All is well%'"
        )
    argv = [str(BIN / "loomflow"), "audit", "verify", "--db", str(db)]
    assert cli(*argv[1:]).code == 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    read, write_end = os.pipe()
    os.close(read)  # no reader at all: the first write is refused
    try:
        done = subprocess.run(argv, env=env, stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (1, "")


def test_output_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """stdout on a full disk (`> /dev/full`): exit 1 and one line saying so (a new
    user's trial got a traceback ending in OSError)."""
    db = tmp_path / "journal.db"
    _one_run(db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [str(BIN / "loomflow"), "sessions", "ls", "--db", str(db)],
            env=env,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 1
    assert done.stderr == "loomflow: [Errno 28] No space left on device\n"
