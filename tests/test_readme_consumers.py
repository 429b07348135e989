"""The README's commands that read the log, run as written on an embedded journal.db,
each printing a line of the shape the README shows under it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.readme import documented_commands, readme_block

BIN = Path(sys.executable).parent


def _documented() -> list[tuple[list[str], str]]:
    return documented_commands("loomflow audit --db journal.db")


_OPEN = re.compile(r"sess[0-9a-z]+|\d+")


def _shape(shown: str) -> re.Pattern[str]:
    """The documented line with its ids, numbers and times left open."""
    parts, last = [], 0
    for match in _OPEN.finditer(shown):
        parts.append(re.escape(shown[last : match.start()]))
        parts.append(r"sess[0-9a-z]+" if match.group().startswith("sess") else r"\d+")
        last = match.end()
    parts.append(re.escape(shown[last:]))
    return re.compile("".join(parts))


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=60)


def _start(argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


async def _per_run(cwd: Path) -> None:
    """The README's per_run.py, which the section's commands follow: it writes journal.db."""
    script = cwd / "per_run.py"
    script.write_text(readme_block("# per_run.py"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), cwd=cwd, env=_env(), stdout=subprocess.DEVNULL
    )
    assert await asyncio.wait_for(proc.wait(), 60) == 0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    return dict(env, NO_COLOR="1", COLUMNS="300")


async def test_each_command_prints_what_the_readme_shows(tmp_path: Path) -> None:
    await _per_run(tmp_path)
    commands = _documented()
    assert [c[:2] for c, _ in commands] == [
        ["loomflow", "audit"],
        ["loomflow", "audit"],
        ["loomflow", "tail"],
    ]
    for command, shown in commands:
        argv = [str(BIN / command[0]), *command[1:]]
        if command[1] != "tail":
            done = await asyncio.to_thread(_run, argv, tmp_path)
            assert done.returncode == 0, done.stderr
            out = " ".join(done.stdout.split())
            assert _shape(shown).search(out), (shown, out)
            continue
        tail = _start(argv, tmp_path)
        try:
            assert tail.stderr is not None and tail.stdout is not None
            ready = await asyncio.wait_for(asyncio.to_thread(tail.stderr.readline), 30)
            assert b"following" in ready
            await _per_run(tmp_path)  # another run of the script, appended as tail runs
            line = await asyncio.wait_for(asyncio.to_thread(tail.stdout.readline), 30)
        finally:
            tail.send_signal(signal.SIGINT)
            tail.wait(timeout=30)
        assert _shape(shown).search(line.decode().strip()), (shown, line)
