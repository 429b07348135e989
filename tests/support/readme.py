"""The README's code blocks, as the tests that run them read them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def readme_block(marker: str, language: str = "python") -> str:
    """The README's fenced ``language`` block that contains ``marker``."""
    for block in re.findall(rf"```{language}\n(.*?)```", README, flags=re.S):
        if marker in block:
            return str(block)
    raise AssertionError(f"README.md has no {language} block containing {marker!r}")
