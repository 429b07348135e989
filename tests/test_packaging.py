"""Our distribution alone, without extras, in a fresh venv: what an embedded user installs.

It imports none of the scaled path's drivers nor the Anthropic SDK, runs the spec page's
SQLite code against the local Messages-API server, says which extra a scaled runtime or a
command needs, has no demo command, reports its version (also as ``python -m loomflow``
and ``loomflow.__version__``) and carries its license, URLs and classifiers. The demo's own
distribution (examples/demo) installs beside it into another fresh venv, and runs there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropicServer, text_response

pytestmark = pytest.mark.slow  # builds a venv from the package index

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("anthropic", "faust", "aiokafka", "asyncpg", "rich", "pydantic_settings")


def _venv_with(where: Path, *sources: Path) -> Path:
    """The python of a new venv at ``where`` with ``pip install`` of ``sources`` alone."""
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *map(str, sources)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.fixture(scope="module")
def core_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv with ``pip install <this checkout>`` and nothing else."""
    yield _venv_with(tmp_path_factory.mktemp("core-venv"), ROOT)


def _serves(loomflow: Path, cwd: Path, *args: str) -> None:
    """``loomflow ui ARGS --port 0`` starts, lists the log's sessions, and stops on Ctrl-C."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LOOMFLOW_"))}
    console = subprocess.Popen(
        [str(loomflow), "ui", *args, "--port", "0"],
        cwd=cwd,
        env=clean,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert console.stderr is not None
        said = console.stderr.readline()
        address = re.search(r"http://\S+/", said)
        assert address is not None, said
        with urllib.request.urlopen(address.group(), timeout=30) as page:
            assert page.status == 200 and "sess01" in page.read().decode()
    finally:
        console.send_signal(signal.SIGINT)
        assert console.wait(30) == 0


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


def test_a_runtime_alone_loads_neither_the_agent_nor_a_driver(tmp_path: Path) -> None:
    """``import loomflow`` and a SqliteRuntime (a reader's, a worker's store, the console)
    load the agent's layer only when one of its names is used."""
    code = (
        "import sys, loomflow\n"
        "from loomflow.runtime import SqliteRuntime\n"
        "SqliteRuntime('journal.db')\n"
        "print(' '.join(sorted(sys.modules)))\n"
        "from loomflow import Agent, Effort\n"
        "import loomflow.agent, loomflow.models.base\n"
        "assert Agent is loomflow.agent.Agent and Effort is loomflow.models.base.Effort\n"
        "assert loomflow.Tuning is loomflow.agent.Tuning\n"
    )
    done = _run(Path(sys.executable), "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    modules = done.stdout.split()
    ours = sorted(m for m in modules if m.startswith(("loomflow.agent", "loomflow.models")))
    assert ours == [], ours
    # the runtime reads its LOOMFLOW_* settings (pydantic_settings); no driver, no SDK
    heavy = set(HEAVY) - {"pydantic_settings"}
    loaded = sorted(m for m in modules if m.split(".")[0] in heavy)
    assert loaded == [], loaded


def test_a_scaled_runtime_names_its_extra(core_python: Path) -> None:
    done = _run(core_python, "-c", "from loomflow.runtime import KafkaRuntime")
    assert done.returncode == 1
    assert "pip install 'loomflow-durable[kafka]'" in done.stderr


@pytest.mark.parametrize(
    ("command", "module", "extra"),
    [
        (["sessions", "ls", "--db", "journal.db"], "rich", "cli"),
        (["sessions", "ls"], "rich", "cli"),
        (["audit", "--db", "journal.db"], "rich", "cli"),
        (["report", "--db", "journal.db", "--html", "r.html"], "plotly", "report"),
        (["processor"], "aiokafka", "kafka"),
        (["setup"], "asyncpg", "postgres"),
        (["ui", "--db", "journal.db"], "fastapi", "ui"),
    ],
)
def test_a_command_without_its_extra_names_that_extra(
    core_python: Path, tmp_path: Path, command: list[str], module: str, extra: str
) -> None:
    done = _run(core_python.parent / "loomflow", *command, cwd=tmp_path)
    assert done.returncode == 2
    # one line: the extra the command needs, from the index, and from the clone it came from
    assert done.stderr == (
        f"loomflow {command[0]} needs {module!r}, which comes with the [{extra}] extra: "
        f"pip install 'loomflow-durable[{extra}]', or in the clone it was installed from "
        f"({ROOT}): pip install '.[{extra}]'\n"
    )
    in_clone = _run(core_python.parent / "loomflow", *command, cwd=ROOT)
    assert in_clone.stderr.endswith(f", or in this clone: pip install '.[{extra}]'\n")


def test_the_command_has_no_demo(core_python: Path) -> None:
    listed = _run(core_python.parent / "loomflow", "--help")
    assert listed.returncode == 0, listed.stderr
    assert "demo" not in listed.stdout, listed.stdout
    done = _run(core_python.parent / "loomflow", "demo")
    assert done.returncode == 2
    assert "invalid choice: 'demo'" in done.stderr, done.stderr


def test_the_demo_installs_beside_the_library_and_runs(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    python = _venv_with(tmp_path_factory.mktemp("demo-venv"), ROOT, ROOT / "examples" / "demo")
    done = _run(python.parent / "loomflow-demo", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    # the last check of the demo, once its workers, run process, `loomflow worker`s and
    # `loomflow signal` all ran from this venv
    *_, verdict, console = done.stdout.rstrip().splitlines()
    assert verdict.endswith("sessions match the log"), done.stdout[-3000:]
    assert (tmp_path / "loomflow-demo.db").is_file()  # the default --db
    # and the console it names at the end serves that log from this venv (the demo's
    # distribution brings the [ui] extra), on a free port here
    command = re.search(r"loomflow ui --db (\S+),", console)
    assert command is not None, console
    assert command.group(1) == "loomflow-demo.db", console  # as typed, in the demo's directory
    _serves(python.parent / "loomflow", tmp_path, "--db", command.group(1))


def test_the_command_reports_its_version(core_python: Path) -> None:
    done = _run(core_python.parent / "loomflow", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loomflow 0.1.0"
    module = _run(core_python, "-m", "loomflow", "--version")
    assert module.returncode == 0 and module.stdout == done.stdout, module.stderr
    package = _run(core_python, "-c", "import loomflow; print(loomflow.__version__)")
    assert package.returncode == 0 and package.stdout == "0.1.0\n", package.stderr


def test_the_distribution_carries_its_license_urls_and_classifiers(core_python: Path) -> None:
    done = _run(
        core_python,
        "-c",
        "import json; from importlib import metadata; "
        "d = metadata.distribution('loomflow-durable'); m = d.metadata; "
        "print(json.dumps({k: m.get_all(k) for k in "
        "('License-Expression', 'License-File', 'Project-URL', 'Classifier')} | "
        "{'text': d.read_text('licenses/LICENSE')}))",
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert found["License-Expression"] == ["Apache-2.0"] and found["License-File"] == ["LICENSE"]
    assert found["text"] == (ROOT / "LICENSE").read_text()
    assert found["Project-URL"] == [f"{k}, {v}" for k, v in project["urls"].items()]
    assert found["Classifier"] == project["classifiers"]


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
