"""How the faust apps are configured, checked where a user would notice it."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, as it was before the test set a worker's logging up."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("loglevel", ["warn", "error", "info"])
@pytest.mark.parametrize("which", ["processor", "analytics"])
def test_a_worker_logs_at_its_level_and_makes_no_debug_records(
    which: str, loglevel: str, root_logger: logging.Logger
) -> None:
    # faust's own worker set the root logger to DEBUG at warn and above (for a startup
    # spinner), and every debug call of aiokafka made a record nobody printed
    from loomflow.analytics.app import create_app as analytics_app
    from loomflow.processors.app import create_app as processor_app

    create = processor_app if which == "processor" else analytics_app
    worker = create(Settings()).Worker(loglevel=loglevel, redirect_stdouts=False)
    worker._setup_logging()  # what the worker does as `loomflow processor` starts it
    chosen = {"warn": logging.WARNING, "error": logging.ERROR, "info": logging.INFO}[loglevel]
    assert root_logger.level == chosen
    assert not logging.getLogger("aiokafka.consumer.fetcher").isEnabledFor(logging.DEBUG)
    assert all(handler.level >= chosen for handler in root_logger.handlers)
