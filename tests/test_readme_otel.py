"""The README's ``loomflow otel`` commands, run as written (no option beyond ``--db``, the
endpoint from ``OTEL_EXPORTER_OTLP_ENDPOINT`` as the README exports it) on the journal.db
of its per_run.py, each printing a line of the shape the README shows under it; what they
send is what the log records, once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.otlp import OtlpReceiver
from tests.support.readme import documented_commands, readme_block

BIN = Path(sys.executable).parent

_OPEN = re.compile(r"\d+")


def _shape(shown: str) -> re.Pattern[str]:
    """The documented line with its numbers left open."""
    parts, last = [], 0
    for match in _OPEN.finditer(shown):
        parts.append(re.escape(shown[last : match.start()]))
        parts.append(r"\d+")
        last = match.end()
    parts.append(re.escape(shown[last:]))
    return re.compile("".join(parts))


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LOOMFLOW_", "OTEL_"))}


def test_loomflow_otel_prints_what_the_readme_shows(tmp_path: Path) -> None:
    (tmp_path / "per_run.py").write_text(readme_block("# per_run.py"))
    ran = subprocess.run(
        [sys.executable, "per_run.py"], cwd=tmp_path, env=_env(), capture_output=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    block = readme_block("loomflow otel --db journal.db", "sh")
    (export,) = [line for line in block.splitlines() if line.startswith("export ")]
    name, _, documented = export.split("#")[0].strip().removeprefix("export ").partition("=")
    assert name == "OTEL_EXPORTER_OTLP_ENDPOINT"
    commands = documented_commands("loomflow otel --db journal.db")
    assert [c for c, _ in commands] == [["loomflow", "otel", "--db", "journal.db"]] * 2
    with OtlpReceiver() as receiver:
        env = dict(_env(), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
        for command, shown in commands:
            done = subprocess.run(
                [str(BIN / command[0]), *command[1:]],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            expected = _shape(shown.replace(documented, receiver.url))
            assert expected.fullmatch(done.stdout.strip()), (shown, done.stdout)
    spans = receiver.received()
    assert receiver.duplicates() == []
    runs = [s for s in spans if s.parent_id is None]
    assert len(runs) == 2 and len(spans) == 6  # per_run.py's two runs: 3 model calls, a tool
    assert {s.attributes["user.id"] for s in runs} == {"ada"}
