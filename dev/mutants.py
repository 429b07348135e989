"""Mutation testing of one source file with mutmut, on the offline tests that exercise it.

    make mutants FILE=loomflow/projections/fold.py
    make mutants FILE=loomflow/runtime/writer.py TESTS="tests/runtime/test_storage.py"
    .venv/bin/python dev/mutants.py loomflow/projections/fold.py [PYTEST SELECTION ...]

mutmut reads its settings from ``[tool.mutmut]`` in the pyproject.toml of the directory it
runs in, and copies the tree into ``mutants/`` there. So that each file gets its own
settings and its own cache, and nothing is written into the work tree, this copies the
tree's files (tracked, and untracked ones git does not ignore) to ``.cache/mutants/NAME/``,
adds a ``[tool.mutmut]`` table for FILE to the copy's pyproject.toml, and runs
``mutmut run`` there, from scratch each time. Only FILE is mutated; the rest of the
package is copied as it is. The tests run without services: LOOMFLOW_* variables are
cleared and ``-m "not kafka and not postgres and not slow"`` is added to every pytest run.

The selection is TESTS (pytest arguments) or, when none are given, the one SELECTIONS
names for FILE. It prints the counts of each status, each mutant that was not killed, and
the time the run took; ``cd .cache/mutants/NAME && ../../../.venv/bin/mutmut show MUTANT``
prints a mutant's diff, and ``mutmut browse`` there opens mutmut's browser of them.

MUTMUT_CHILDREN (default 2) is how many mutants run at once: the development machine has
two cores; use 1 when something else runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the offline tests that exercise each file, as pytest arguments
SELECTIONS: dict[str, list[str]] = {
    # the fold's own tests, the store and runtime conformance suites on the offline
    # stores, and the worker's: every append and every projection goes through the fold
    "loomflow/projections/fold.py": [
        "tests/projections",
        "tests/runtime/test_conformance.py::TestInProcStore",
        "tests/runtime/test_conformance.py::TestSqliteStore",
        "tests/runtime/test_conformance.py::TestInProcRuntime",
        "tests/runtime/test_conformance.py::TestSqliteRuntime",
        "tests/agent/test_worker.py",
        "tests/agent/test_worker_budget.py",
    ],
    # a run's single writer: its observers, retries and doubt, under the runtime suites
    "loomflow/runtime/writer.py": [
        "tests/runtime/test_writer.py",
        "tests/runtime/test_observers.py",
        "tests/runtime/test_conformance.py::TestInProcRuntime",
        "tests/runtime/test_conformance.py::TestSqliteRuntime",
        "tests/agent/test_worker_budget.py",
    ],
    # the worker in process (tests that start `loomflow worker` run the installed package,
    # not the mutant: they cannot kill one)
    "loomflow/agent/worker.py": [
        "tests/agent/test_worker.py",
        "tests/agent/test_worker_budget.py",
    ],
}

#: added to every pytest run mutmut makes: no services, no cache written into the copy,
#: the plugin that lets mutmut 3.7 run under pytest 9, and 30 s per test (pytest-timeout),
#: so that a mutant which hangs a test (a poll loop that never waits) fails it, as a hang
#: should
OFFLINE = [
    "-m",
    "not kafka and not postgres and not slow",
    "-p",
    "no:cacheprovider",
    "-p",
    "dev.mutmut_pytest9",
    "--timeout=30",
]


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _copy_tree(work: Path) -> None:
    """The work tree's files as they are now (edits not committed included)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted, not yet committed
            continue
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _configure(work: Path, file: str, tests: list[str]) -> None:
    pyproject = work / "pyproject.toml"
    text = pyproject.read_text()
    if "[tool.mutmut]" in text:
        raise SystemExit("pyproject.toml has a [tool.mutmut] table; this script adds its own")
    pyproject.write_text(
        text
        + "\n[tool.mutmut]  # added by dev/mutants.py to this copy only\n"
        + 'source_paths = ["loomflow"]\n'
        + 'also_copy = ["dev/"]\n'
        + f"only_mutate = {_toml_list([file])}\n"
        + f"pytest_add_cli_args = {_toml_list(OFFLINE)}\n"
        + f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
    )


def _mutmut(work: Path, *args: str, capture: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=work,
        env=env,
        check=True,
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    return done.stdout or ""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    file, tests = argv[0], argv[1:]
    if not (ROOT / file).is_file() or not file.startswith("loomflow/") or not file.endswith(".py"):
        raise SystemExit(f"{file!r} is not a module of the loomflow package (give its path)")
    tests = tests or SELECTIONS.get(file, [])
    if not tests:
        raise SystemExit(f"no test selection for {file}: give the tests as pytest arguments")
    work = ROOT / ".cache" / "mutants" / file.removesuffix(".py").replace("/", ".")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _copy_tree(work)
    _configure(work, file, tests)
    children = os.environ.get("MUTMUT_CHILDREN", "2")
    print(f"mutating {file} in {work.relative_to(ROOT)}, tests: {' '.join(tests)}", flush=True)
    started = time.monotonic()
    _mutmut(work, "run", "--max-children", children)
    took = time.monotonic() - started
    _mutmut(work, "export-cicd-stats")
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    left = [
        line.strip()
        for line in _mutmut(work, "results", capture=True).splitlines()
        if line.strip() and not line.strip().endswith(": killed")
    ]
    print(f"\n{file}: {took:.0f} s with {children} children")
    print("  " + ", ".join(f"{k} {v}" for k, v in stats.items() if v or k in ("killed", "total")))
    killed, total = stats["killed"], stats["total"]
    print(f"  score: {killed}/{total} killed ({100 * killed / max(total, 1):.1f}%)")
    for line in left:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
