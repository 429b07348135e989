"""The checkpoint benchmark's processor: the same code as the agents it serves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import loomflow
from bench import checkpoints
from loomflow.settings import Settings


def _imported_by(env: dict[str, str], cwd: Path) -> Path:
    """The loomflow package a process started with ``env`` imports."""
    done = subprocess.run(
        [sys.executable, "-c", "import loomflow; print(loomflow.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return Path(done.stdout.strip())


def test_the_processor_imports_the_loomflow_of_the_checkout_the_benchmark_runs(
    tmp_path: Path,
) -> None:
    # the editable install points at one checkout; a benchmark run from another (a
    # worktree of an older commit) must run that one's processor, not the installed one
    other = tmp_path / "checkout"
    (other / "loomflow").mkdir(parents=True)
    (other / "loomflow" / "__init__.py").write_text("")
    processor = checkpoints.Processor(Settings(), tmp_path)
    assert _imported_by(processor.environment(other), tmp_path) == (
        other / "loomflow" / "__init__.py"
    )
    assert _imported_by(processor.environment(), tmp_path) == Path(loomflow.__file__).resolve()
