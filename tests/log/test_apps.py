"""How the faust apps are configured, checked where a user would notice it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from loomflow.log.apps import new_app
from loomflow.settings import Settings


def test_the_data_directory_shadows_no_package_for_python_run_from_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a directory named loomflow in the temp dir would be imported as loomflow (a namespace
    # package, found before the editable install's finder) by Python started there
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app = new_app("lf-test-datadir", Settings())
    assert Path(app.conf.datadir).is_relative_to(tmp_path) and any(tmp_path.iterdir())
    done = subprocess.run(
        [sys.executable, "-c", "from loomflow import Agent"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
