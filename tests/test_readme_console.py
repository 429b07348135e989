"""The README's web console section, run as written: ``loomflow ui --db journal.db`` after
per_run.py, with the defaults (no LOOMFLOW_* set), prints the line the README shows,
answers on the default address with the journal's sessions, and stops on Ctrl-C."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from tests.support.readme import documented_commands
from tests.test_readme_consumers import BIN, _env, _per_run, _shape


def _start(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read().decode()


async def test_loomflow_ui_starts_as_the_readme_starts_it(tmp_path: Path) -> None:
    await _per_run(tmp_path)
    ((command, shown),) = documented_commands("loomflow ui --db journal.db")
    assert command == ["loomflow", "ui", "--db", "journal.db"]
    console = _start([str(BIN / command[0]), *command[1:]], tmp_path)
    try:
        assert console.stderr is not None
        said = await asyncio.wait_for(asyncio.to_thread(console.stderr.readline), 30)
        assert _shape(shown).search(said.strip()), (shown, said)
        (address,) = re.findall(r"http://\S+/", said)
        assert address == "http://127.0.0.1:8765/"  # the default, as the README shows

        status, listing = await asyncio.to_thread(_get, address)
        assert status == 200
        sessions = re.findall(r'href="(/sessions/sess[0-9a-z]+\?user=ada)"', listing)
        assert sessions, listing
        status, page = await asyncio.to_thread(_get, address.rstrip("/") + sessions[0])
        assert status == 200 and "Oslo" in page and "Fork here" in page
    finally:
        console.send_signal(signal.SIGINT)  # Ctrl-C, as the line says
        code = await asyncio.to_thread(console.wait, 30)
    assert code == 0, console.stderr.read() if console.stderr else ""
