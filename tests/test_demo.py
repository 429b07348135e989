"""`loomflow demo` end to end: a real worker process, a real SIGKILL, resume and fork."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SESSION_ID = r"sess[0-9a-z]{26}"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.mark.slow
def test_demo_kills_resumes_and_forks(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    # Output is parsed, so keep rich from colouring it or wrapping it to a narrow terminal.
    env.pop("FORCE_COLOR", None)
    env.update(NO_COLOR="1", COLUMNS="100")
    db = tmp_path / "demo.db"

    proc = subprocess.run(
        [sys.executable, "-m", "loomflow.cli", "demo", "--db", str(db)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    out = ANSI.sub("", proc.stdout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"
    assert "offline ScriptedModel" in out
    assert re.search(r"worker pid \d+ was killed by SIGKILL", out), out

    not_repeated = re.search(r"(\d+) model calls? (?:were|was) not repeated", out)
    assert not_repeated is not None, out
    assert int(not_repeated.group(1)) > 0

    last = [line for line in out.splitlines() if line.strip()][-2:]
    resumed = re.match(rf"resumed\s+({SESSION_ID})\b", last[0])
    forked = re.match(rf"forked\s+({SESSION_ID})\s+\(parent ({SESSION_ID})\)", last[1])
    assert resumed is not None and forked is not None, "\n".join(last)
    assert forked.group(1) != resumed.group(1)
    assert forked.group(2) == resumed.group(1)
    assert db.exists()
