"""The README's scripting commands, run as written on the journal its per_run.py leaves:
each prints JSON, a line an object, that begins as the line the README shows under it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson

from tests.support.readme import documented_commands, readme_block, user_env

MARKER = "loomflow sessions ls --db journal.db --all-users --status"
#: what differs from run to run: ids, times, numbers
_OPEN = re.compile(r"(sess|evt|run|ckpt)[0-9a-z]{26}|\d{4}-\d\d-\d\dT[\d:.]+Z|\d+(\.\d+)?")


def _shape(text: str) -> str:
    return _OPEN.sub(lambda m: m.group(1) or "0", text)


def test_the_scripting_commands_print_json_that_begins_as_the_readme_shows(
    tmp_path: Path,
) -> None:
    (tmp_path / "per_run.py").write_text(readme_block("# per_run.py"))
    env = user_env()
    ran = subprocess.run(
        [sys.executable, "per_run.py"], cwd=tmp_path, env=env, capture_output=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    commands = documented_commands(MARKER)
    assert [c[:2] for c, _ in commands] == [["loomflow", "sessions"], ["loomflow", "tail"]]
    for argv, shown in commands:
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (argv, done.stderr)
        objects = [orjson.loads(line) for line in done.stdout.splitlines()]
        assert objects and all(isinstance(o, dict) for o in objects), done.stdout
        start = shown.removesuffix("...}")
        assert _shape(done.stdout.splitlines()[0]).startswith(_shape(start)), (shown, done.stdout)
