"""The README's per-run example, run as a user would: saved as a file and started alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.readme import readme_block


def test_the_per_run_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "per_run.py"
    script.write_text(readme_block("# per_run.py"))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:2] == ["event: run.started", "event: turn.appended"]
    assert "event: run.finished" in lines
    assert "name='Oslo' population=709000" in lines
    assert lines[-1] == "Still Oslo."
