"""What a new user meets first, beside the README: ``loomflow.__version__``, ``python -m
loomflow``, the LICENSE, and a command that names the extra it is missing.

The same on a fresh install without extras is in tests/test_packaging.py (slow)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import loomflow
from loomflow import cli
from loomflow.cli import EXTRA_OF_MODULE, install_hint, main, missing_extra

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt, the license's own text
APACHE_2 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_version_is_the_installed_distributions() -> None:
    assert loomflow.__version__ == metadata.version("loomflow-durable") == PROJECT["version"]


def test_python_dash_m_loomflow_is_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loomflow", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"loomflow {loomflow.__version__}\n"
    bare = subprocess.run(
        [sys.executable, "-m", "loomflow"], capture_output=True, text=True, timeout=60
    )
    assert bare.returncode == 2 and bare.stderr.startswith("usage: loomflow "), bare.stderr


def test_the_license_is_the_apache_2_text_the_metadata_names() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]


def test_the_project_has_urls_and_classifiers_of_what_it_supports() -> None:
    assert PROJECT["urls"], "no [project.urls]"
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())
    classifiers = PROJECT["classifiers"]
    assert not [c for c in classifiers if c.startswith("License ::")]  # the expression says it
    assert PROJECT["requires-python"] == ">=3.11"
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers and (ROOT / "loomflow" / "py.typed").exists()


def _extra_of(distribution: str) -> set[str]:
    """The extras of loomflow-durable that require ``distribution`` (not through another)."""
    extras = set()
    for line in metadata.requires("loomflow-durable") or []:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) != canonicalize_name(distribution):
            continue
        if requirement.marker is None:
            continue
        extras |= {
            e for e in PROJECT["optional-dependencies"] if requirement.marker.evaluate({"extra": e})
        }
    return extras


def test_each_optional_module_is_named_with_the_extra_that_installs_it() -> None:
    providers = metadata.packages_distributions()
    for module, extra in EXTRA_OF_MODULE.items():
        (distribution,) = providers[module]
        assert extra in _extra_of(distribution), (module, distribution, extra)
    assert missing_extra("rich.console") == "cli" and missing_extra("approval") is None


@pytest.fixture
def without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if the [cli] extra were not installed."""
    for name in [m for m in sys.modules if m == "rich" or m.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich: ModuleNotFoundError


def test_a_command_without_its_extra_names_that_extra(
    without_rich: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli, "_installed_from", lambda: None)  # as from the package index
    assert main(["sessions", "ls", "--db", str(tmp_path / "journal.db")]) == 2
    _, err = capsys.readouterr()
    assert err == (
        "loomflow sessions needs 'rich', which comes with the [cli] extra: "
        "pip install 'loomflow-durable[cli]'\n"
    )


def test_installed_from_a_clone_the_hint_says_how_to_install_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this venv has the checkout installed (make's `pip install -e .`)
    assert cli._installed_from() == ROOT
    monkeypatch.chdir(ROOT)
    assert install_hint("cli") == (
        "pip install 'loomflow-durable[cli]', or in this clone: pip install '.[cli]'"
    )
    monkeypatch.chdir(tmp_path)
    assert install_hint("kafka") == (
        "pip install 'loomflow-durable[kafka]', or in the clone it was installed from "
        f"({ROOT}): pip install '.[kafka]'"
    )
