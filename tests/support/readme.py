"""The README's code blocks, as the tests that run them read them."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def readme_block(marker: str, language: str = "python") -> str:
    """The README's fenced ``language`` block that contains ``marker``."""
    for block in re.findall(rf"```{language}\n(.*?)```", README, flags=re.S):
        if marker in block:
            return str(block)
    raise AssertionError(f"README.md has no {language} block containing {marker!r}")


def documented_commands(marker: str) -> list[tuple[list[str], str]]:
    """(command, the output line shown under it) of the README's sh block containing
    ``marker``: each ``loomflow`` line is followed by a ``# `` line of its output."""
    lines = readme_block(marker, "sh").splitlines()
    pairs = []
    for command, shown in itertools.pairwise(lines):
        if command.startswith("loomflow "):
            assert shown.startswith("# "), f"no output shown under {command!r}"
            pairs.append((shlex.split(command.split("  #")[0]), shown[2:]))
    return pairs
