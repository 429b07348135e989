"""Every name a package lists in ``__all__`` is there: the ones it imports with itself and the
ones its module-level ``__getattr__`` loads on first use, so ``from loomflow import X`` works
for every X the package names, however lean its import is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = (
    "loomflow",
    "loomflow.runtime",
    "loomflow.schemas",
    "loomflow.projections",
    "loomflow.projections.sqlite",
)


def test_every_name_a_package_exports_resolves_in_a_new_process() -> None:
    # a new process: in this one, earlier tests have imported the modules that hold them
    code = (
        "import importlib, json\n"
        f"packages = {PACKAGES!r}\n"
        "missing = {}\n"
        "for name in packages:\n"
        "    package = importlib.import_module(name)\n"
        "    missing[name] = [n for n in package.__all__ if not hasattr(package, n)]\n"
        "print(json.dumps(missing))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {name: [] for name in PACKAGES}
