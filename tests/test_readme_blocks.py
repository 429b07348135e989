"""Every ```python block and every ```sh command of the README runs as written.

Most blocks belong to a story that a test of its section tells whole, with the services
and the files the README says come before (the journal per_run.py leaves, a processor
running): :data:`RUN_BY` names that test for each. The rest run here: each python block
as a program of its own (saved under the name its first line gives, in a temp dir, in a
fresh process, Claude answered by a local Messages API), ``make demo`` in a clone of this
checkout, and the install commands in a fresh venv. A block that no test runs fails
:func:`test_every_block_of_the_readme_is_run_as_written`: name its test in RUN_BY, or
make it a program that runs alone.

Not run, each for its reason (:data:`SKIPPED`): ``make test``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import tomllib
import venv
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropicServer, text_response
from tests.support.readme import (
    BIN,
    CONTINUES,
    ROOT,
    Block,
    block,
    blocks,
    commands,
    program,
    user_env,
)

_KAFKA = "tests/test_readme.py::test_the_readme_kafka_quickstart_runs_against_a_default_processor"
_WORKER = "tests/test_readme_worker.py::test_the_worker_example_runs_as_written"
_THIS = "tests/test_readme_blocks.py::"

#: (language, a marker of the block) -> the test that runs the block as written, every
#: command of it (each of those tests checks it has the block's commands, and only them)
RUN_BY: dict[tuple[str, str], str] = {
    ("sh", "make demo"): _THIS + "test_make_demo_runs_in_a_clone_and_leaves_only_ignored_files",
    ("sh", "pip install ."): _THIS + "test_the_install_commands_run_from_a_clone_in_a_fresh_venv",
    (
        "python",
        "# per_run.py",
    ): "tests/test_readme_use.py::test_the_per_run_example_runs_as_written",
    ("sh", "loomflow processor"): _KAFKA,
    ("python", "# kafka_quickstart.py"): _KAFKA,
    ("sh", "$ loomflow sessions ls"): (
        "tests/test_readme_use.py::test_the_readme_commands_print_what_it_shows_on_per_runs_journal"
    ),
    ("sh", "loomflow audit --db journal.db"): (
        "tests/test_readme_consumers.py::test_each_command_prints_what_the_readme_shows"
    ),
    ("sh", "loomflow sessions ls --db journal.db --all-users --status"): (
        "tests/test_readme_scripting.py::"
        "test_the_scripting_commands_print_json_that_begins_as_the_readme_shows"
    ),
    ("sh", "loomflow stats --db journal.db"): (
        "tests/test_readme_analytics.py::test_stats_and_report_print_what_the_readme_shows"
    ),
    ("sh", "loomflow analytics"): (
        "tests/cli/test_stats.py::"
        "test_the_analytics_app_on_kafka_materialises_the_sums_over_the_topic"
    ),
    ("sh", "loomflow ui --db journal.db"): (
        "tests/test_readme_console.py::test_loomflow_ui_starts_as_the_readme_starts_it"
    ),
    ("sh", "loomflow otel --db journal.db"): (
        "tests/test_readme_otel.py::test_loomflow_otel_prints_what_the_readme_shows"
    ),
    ("sh", "loomflow otel --follow"): (
        "tests/otel/test_otel_kafka.py::test_the_readme_service_follows_the_topic_until_ctrl_c"
    ),
    ("sh", "loomflow keys new writer.pem"): (
        "tests/cli/test_keys.py::test_the_readme_signing_commands_run_as_written"
    ),
    ("python", "# approval.py"): _WORKER,
    ("sh", "loomflow worker approval:agents"): _WORKER,
    ("python", "# test_my_store.py"): (
        "tests/testing/test_package.py::test_the_readme_example_runs_in_a_project_of_its_own"
    ),
}

#: commands of the README's sh blocks that no test runs, and why
SKIPPED = {
    "make test": "it is the test suite, this test among them: CI runs it (.ci/run) after "
    "make lint, and every other command of its block runs here",
}


def _claimed(of: Block) -> str | None:
    """The test RUN_BY names for a block."""
    tests = [
        test for (lang, marker), test in RUN_BY.items() if lang == of.language and marker in of.text
    ]
    assert len(tests) <= 1, f"{of} matches several markers of RUN_BY"
    return tests[0] if tests else None


def _programs() -> list[Block]:
    """The python blocks that run here, each a program of its own."""
    return [b for b in blocks("python") if _claimed(b) is None]


def test_every_block_of_the_readme_is_run_as_written() -> None:
    unclaimed = [str(b) for b in blocks() if b.language == "sh" and _claimed(b) is None]
    assert not unclaimed, (
        "README blocks no test runs: run each in a test of its section and name it in RUN_BY",
        unclaimed,
    )
    for (language, marker), test in RUN_BY.items():
        found = block(marker, language)  # exactly one block, or it raises
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text()
        defined = {
            node.name
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in defined, f"{test}, named for {found}, does not exist"
        assert marker in source, f"{test} does not read {found} (no {marker!r} in {path})"
    every = [c.text for b in blocks("sh") for c in commands(b)]
    for command, why in SKIPPED.items():
        assert command in every, f"SKIPPED names {command!r}, which the README no longer has"
        assert why
    assert _programs(), "no python block runs here, so the runner below tests nothing"


def test_the_block_parser_reads_prompts_outputs_services_and_fragments() -> None:
    text = "\n".join(
        [
            "```python",
            "# one.py",
            "x = 1",
            "```",
            "```python",
            CONTINUES,
            "print(x)",
            "```",
            "```sh",
            "loomflow worker m:f &  # Ctrl-C stops it",
            "# worker ... hosts agent",
            "# (a second line of output)",
            'loomflow signal s go --json \'{"a": "#1"}\'  # a comment',
            "```",
            "```sh",
            "$ loomflow sessions ls",
            "sess1  ada  finished",
            "```",
            "",
        ]
    )
    one, two = blocks("python", text)
    assert one.name == "one.py" and not one.continues and two.continues
    assert program(two, text) == f"# one.py\nx = 1\n\n{CONTINUES}\nprint(x)\n"
    first, second = blocks("sh", text)
    worker, signal = commands(first)
    assert worker.argv == ["loomflow", "worker", "m:f"] and worker.background and worker.service
    assert worker.shown == "worker ... hosts agent"
    assert signal.argv[-1] == '{"a": "#1"}' and not signal.service and signal.shown is None
    (ls,) = commands(second)
    assert ls.argv == ["loomflow", "sessions", "ls"] and ls.shown == "sess1  ada  finished"


# --- the python blocks that are programs of their own ------------------------------------


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return text_response(f"answer {turn + 1}", input_tokens=100, output_tokens=10)


#: what such a program prints, line by line (patterns), where the block says
PRINTS = {"research.py": ["answer 2", r"sess[0-9a-z]{26}"]}


@pytest.mark.parametrize("of", _programs(), ids=lambda b: b.name or f"line-{b.line}")
def test_a_python_block_runs_alone_as_a_program(of: Block, tmp_path: Path) -> None:
    name = of.name or f"readme_{of.line}.py"
    (tmp_path / name).write_text(program(of))
    argv = ["python", "-m", "pytest", name] if name.startswith("test_") else ["python", name]
    with FakeAnthropicServer(_reply) as server:
        env = user_env(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="test-key")
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        requests = server.requests
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    claude = set(re.findall(r"model=\"(claude-[\w.-]+)\"", of.text))
    if claude:  # it reached Claude, here the local stand-in, with the model it names
        assert requests and {r["model"] for r in requests} <= claude, requests
    if name in PRINTS:
        lines = done.stdout.splitlines()
        assert len(lines) == len(PRINTS[name]), done.stdout
        for line, pattern in zip(lines, PRINTS[name], strict=True):
            assert re.fullmatch(pattern, line), (pattern, done.stdout)


# --- the sh blocks that run here -----------------------------------------------------------


def _copy_of_checkout(to: Path) -> Path:
    """The files of this checkout a clone would have (tracked, and new ones not ignored),
    as they are now, committed in a repository of their own at ``to``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # not a file deleted since
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout"]):
        subprocess.run([*git, *step], cwd=to, check=True, capture_output=True)
    return to


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_make_demo_runs_in_a_clone_and_leaves_only_ignored_files(tmp_path: Path) -> None:
    steps = commands("make demo")
    assert [c.text for c in steps] == ["make demo", "make test"]
    demo = steps[0]
    stamp = BIN.parent / ".installed"
    if not stamp.exists():
        pytest.fail(f"run the tests from the venv `make` installs: no {stamp}")
    clone = _copy_of_checkout(tmp_path / "clone")
    # the venv these tests run in stands for the one `make` installs: linked, and newer
    # than what it was installed from, so make installs nothing into it
    (clone / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    (clone / ".git" / "info" / "exclude").write_text(".venv\n")
    before = stamp.stat().st_mtime - 60
    for name in ("pyproject.toml", "examples/demo/pyproject.toml"):
        os.utime(clone / name, (before, before))
    env = user_env()
    dry = _run(["make", "-n", *demo.argv[1:]], clone, env)
    assert dry.stdout == ".venv/bin/loomflow-demo\n", dry.stdout  # nothing to install

    done = _run(demo.argv, clone, env)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    *_, verdict, console = done.stdout.rstrip().splitlines()
    assert verdict.endswith("sessions match the log"), done.stdout[-3000:]
    assert (clone / "loomflow-demo.db").is_file()
    # it ends with the console over its log: the command it prints serves it, as printed
    shown = re.search(r"(loomflow ui --db \S+), then open (http://\S+)$", console)
    assert shown is not None, console
    command, url = shown.groups()
    assert command == "loomflow ui --db loomflow-demo.db" and url == "http://127.0.0.1:8765/"
    _console_serves([str(BIN / "loomflow"), *command.split()[1:]], clone, env, url)
    status = _run(["git", "status", "--porcelain", "--untracked-files=all"], clone, env)
    assert status.stdout == "", f"make demo leaves files git does not ignore:\n{status.stdout}"


def _console_serves(argv: list[str], cwd: Path, env: dict[str, str], url: str) -> None:
    """``argv`` (a ``loomflow ui``) says it listens at ``url``, lists sessions there, and
    stops on Ctrl-C."""
    import signal
    import urllib.request

    console = subprocess.Popen(argv, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert console.stderr is not None
        said = console.stderr.readline()
        assert f"loomflow console on {url} " in said, said
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and 'href="/sessions/sess01' in page.read().decode()
    finally:
        console.send_signal(signal.SIGINT)
        assert console.wait(30) == 0


def test_the_install_line_of_all_names_every_extra_all_installs() -> None:
    from packaging.requirements import Requirement

    (line,) = [line for line in block("pip install .", "sh").text.splitlines() if "[all]" in line]
    named = re.findall(r"\[(\w+)\]", line.partition("#")[2])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (everything,) = project["optional-dependencies"]["all"]
    assert sorted(named) == sorted(Requirement(everything).extras), line


@pytest.mark.slow
def test_the_install_commands_run_from_a_clone_in_a_fresh_venv(tmp_path: Path) -> None:
    core, everything = commands("pip install .")
    assert [core.argv, everything.argv] == [["pip", "install", "."], ["pip", "install", ".[all]"]]
    clone = _copy_of_checkout(tmp_path / "clone")
    where = tmp_path / "venv"
    venv.create(where, with_pip=True)
    env = user_env(
        PATH=os.pathsep.join([str(where / "bin"), os.environ.get("PATH", os.defpath)]),
        VIRTUAL_ENV=str(where),
    )
    python = str(where / "bin" / "python")
    extras = ("rich", "plotly", "asyncpg", "aiokafka", "faust", "pytest", "pytest_asyncio")
    has = f"import importlib.util as u; print([m for m in {extras!r} if u.find_spec(m)])"

    done = _run(core.argv, clone, env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = _run([python, "-c", f"import loomflow; {has}"], tmp_path, env)
    assert found.returncode == 0 and found.stdout == "[]\n", (found.stdout, found.stderr)
    version = _run(["loomflow", "--version"], tmp_path, env)
    assert version.returncode == 0 and version.stdout.startswith("loomflow 0."), version

    done = _run(everything.argv, clone, env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = _run([python, "-c", has], tmp_path, env)
    assert found.stdout == f"{list(extras)!r}\n", (found.stdout, found.stderr)
    scaled = "from loomflow.runtime import KafkaRuntime, PostgresRuntime; import loomflow.testing"
    assert _run([python, "-c", scaled], tmp_path, env).returncode == 0
