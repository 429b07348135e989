"""loomflow.testing as a third party meets it: an extra to install, nothing loaded by
``import loomflow``, and the README's subclasses running under pytest-asyncio's strict
mode, outside our own configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.readme import readme_block


def _python(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_import_loomflow_loads_neither_the_suite_nor_pytest() -> None:
    done = _python(
        "-c",
        "import sys, loomflow, loomflow.runtime; "
        "print(sorted(m for m in ('loomflow.testing', 'pytest', 'pytest_asyncio') "
        "if m in sys.modules))",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_pytest_the_import_names_the_extra() -> None:
    for missing in ("pytest", "pytest_asyncio"):
        done = _python(
            "-c", f"import sys; sys.modules[{missing!r}] = None; import loomflow.testing"
        )
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError:"), done.stderr
        assert f"'{missing}'" in last and "pip install 'loomflow-durable[testing]'" in last


def _readme_example() -> str:
    """The README's ``test_my_store.py``, as a user copies it."""
    return readme_block("# test_my_store.py")


_FORGOTTEN = """

class TestForgotten(RuntimeConformance):
    pass
"""


def test_the_readme_example_runs_in_a_project_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "test_my_store.py").write_text(_readme_example() + _FORGOTTEN)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    done = _python(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "-rfE", cwd=tmp_path
    )
    output = done.stdout + done.stderr
    summary = output.strip().splitlines()[-1]
    # every test of the two subclasses passes; the class without the fixture errors,
    # each of its tests saying what to define
    assert " failed" not in summary, output[-5000:]
    passed = int(summary.split(" passed")[0].split()[-1])
    errors = int(summary.split(" error")[0].split()[-1])
    forgotten = output.count("TestForgotten::")
    assert errors == forgotten > 40 and passed > errors, output[-5000:]  # runtime + store tests
    assert "TestForgotten must define the fixture open_runtime" in output
