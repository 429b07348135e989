"""The checkpoint benchmark's processor: the same code as the agents it serves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import loomflow
from bench import checkpoints, workload
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


def test_every_loomflow_command_of_the_benchmarks_runs_the_checkout_they_import(
    tmp_path: Path,
) -> None:
    """The audit, console, signing and processor benchmarks start ``loomflow`` itself
    (keys, audit, ui): ``loomflow_command()`` with ``own_env`` runs the checkout given,
    not the one the virtualenv's script was installed from."""
    other = tmp_path / "checkout"
    (other / "loomflow" / "cli").mkdir(parents=True)
    (other / "loomflow" / "__init__.py").write_text("")
    (other / "loomflow" / "cli" / "__init__.py").write_text(
        "def main():\n    print('checkout cli:', __file__)\n    return 0\n"
    )
    done = subprocess.run(
        [*workload.loomflow_command(), "keys", "--help"],
        env=workload.own_env({"PATH": "/usr/bin:/bin"}, other),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == f"checkout cli: {other / 'loomflow' / 'cli' / '__init__.py'}"
