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
