"""Our distribution alone, without extras, in a fresh venv: what an embedded user installs.

It imports none of the scaled path's drivers nor the Anthropic SDK, runs the spec page's
SQLite code against the local Messages-API server, says which extra a scaled runtime
and the demo need, and reports its version.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropicServer, text_response

pytestmark = pytest.mark.slow  # builds a venv from the package index

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("anthropic", "faust", "aiokafka", "asyncpg", "rich", "pydantic_settings")


@pytest.fixture(scope="module")
def core_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv with ``pip install <this checkout>`` and nothing else."""
    where = tmp_path_factory.mktemp("core-venv")
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    yield python


def _run(
    program: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ANTHROPIC"))}
    return subprocess.run(
        [str(program), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd or tempfile.gettempdir(),  # never the checkout: the installed code only
        env={**clean, **(env or {})},
    )


def test_the_embedded_install_imports_no_driver_and_no_sdk(core_python: Path) -> None:
    done = _run(core_python, "-X", "importtime", "-c", "import loomflow; print(loomflow.__file__)")
    assert done.returncode == 0, done.stderr
    assert str(ROOT) not in done.stdout  # the installed package, not this checkout
    modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert loaded == [], loaded


def test_a_scaled_runtime_names_its_extra(core_python: Path) -> None:
    done = _run(core_python, "-c", "from loomflow.runtime import KafkaRuntime")
    assert done.returncode == 1
    assert "pip install 'loomflow-durable[kafka]'" in done.stderr


def test_the_demo_names_its_extra(core_python: Path) -> None:
    done = _run(core_python.parent / "loomflow", "demo")
    assert done.returncode == 2
    assert "pip install 'loomflow-durable[cli]'" in done.stderr


def test_the_command_reports_its_version(core_python: Path) -> None:
    done = _run(core_python.parent / "loomflow", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loomflow 0.1.0"


def test_the_spec_code_runs_on_the_embedded_install(core_python: Path, tmp_path: Path) -> None:
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return text_response(f"answer {turn + 1}", input_tokens=100, output_tokens=10)

    script = ROOT / "tests" / "support" / "spec_example.py"
    with FakeAnthropicServer(reply) as server:
        done = _run(
            core_python,
            str(script),
            "both",
            "sqlite",
            cwd=tmp_path,
            env={"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "test-key"},
        )
    assert done.returncode == 0, done.stderr[-3000:]
    first, resumed, fork = (json.loads(line) for line in done.stdout.splitlines())
    assert first["output"] == "answer 1" and resumed["restored_turns"] == 1
    assert fork["parent_session_id"] == "research-2026-07-04"
    assert len(server.requests) == 3
