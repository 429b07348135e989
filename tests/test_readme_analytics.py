"""The README's stats and report commands, run as written on the journal its per_run.py
leaves, each printing a line of the shape the README shows under it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.readme import documented_commands, readme_block

BIN = Path(sys.executable).parent
_NUMBER = re.compile(r"<?\d[\d,]*(?:\.\d+)?")


def _documented() -> list[tuple[list[str], str]]:
    return documented_commands("loomflow stats --db journal.db")


def _shape(shown: str) -> re.Pattern[str]:
    """The documented line, spaces collapsed, with its numbers left open (a latency
    under a millisecond shows as <1, a slower machine's as 1 or 2)."""
    shown = " ".join(shown.split())
    parts, last = [], 0
    for match in _NUMBER.finditer(shown):
        parts += [re.escape(shown[last : match.start()]), _NUMBER.pattern]
        last = match.end()
    parts.append(re.escape(shown[last:]))
    return re.compile("".join(parts))


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOMFLOW_", "ANTHROPIC_"))}
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_stats_and_report_print_what_the_readme_shows(tmp_path: Path) -> None:
    (tmp_path / "per_run.py").write_text(readme_block("# per_run.py"))
    ran = _run([sys.executable, "per_run.py"], tmp_path)
    assert ran.returncode == 0, ran.stderr
    commands = _documented()
    assert [c[:2] for c, _ in commands] == [["loomflow", "stats"], ["loomflow", "report"]]
    for command, shown in commands:
        done = _run([str(BIN / command[0]), *command[1:]], tmp_path)
        assert done.returncode == 0, done.stderr
        lines = [" ".join(line.split()) for line in done.stdout.splitlines()]
        assert any(_shape(shown).fullmatch(line) for line in lines), (shown, done.stdout)
    assert (tmp_path / "journal.stats.db").exists()
    page = (tmp_path / "report.html").read_text()
    assert "cost-over-time" in page and "<script src=" not in page
