"""The README's code blocks, as the tests that run them read them.

A ```python block is a program: its first line may name its file (``# per_run.py``), as the
prose around it does, and the tests save it under that name. A block that is deliberately
a fragment, continuing the program of the python block above it, opens with the line
:data:`CONTINUES`; it runs joined to that block (:func:`program`).

A ```sh block is commands, each run as written (:func:`commands`): ``# `` at the start of
a line is what the command above printed (the first such line is kept as ``shown``), or,
in a block that shows a prompt (``$ `` before each command), every line without one is.
``  # …`` after a command is a comment, and a comment that says "Ctrl-C" marks a service,
a command that runs until it is stopped; ``&`` at the end starts it in the background, as
a shell does.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: the console scripts and the python of the venv the tests run in
BIN = Path(sys.executable).parent

#: the first line of a python block that continues the program of the block above it
CONTINUES = "# (continues the block above)"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
_FILE = re.compile(r"# (\w+\.py)\b")


@dataclass(frozen=True)
class Block:
    """A fenced block of the README: its language (``""`` for a plain one), its text and
    the line its opening fence is on."""

    language: str
    text: str
    line: int

    @property
    def name(self) -> str | None:
        """The file the block is, as its first line names it (``# approval.py: …``)."""
        found = _FILE.match(self.text)
        return found.group(1) if found else None

    @property
    def continues(self) -> bool:
        return self.text.startswith(CONTINUES + "\n")

    def __str__(self) -> str:
        first = self.text.splitlines()[0] if self.text else ""
        return f"README.md:{self.line} ```{self.language} {first!r}"


def blocks(language: str | None = None, text: str = README) -> list[Block]:
    """The fenced blocks of ``text`` (the README), in order; only ``language``'s if given."""
    found = [
        Block(match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1)
        for match in _FENCE.finditer(text)
    ]
    return [b for b in found if language is None or b.language == language]


def block(marker: str, language: str = "python", text: str = README) -> Block:
    """The one block of ``language`` that contains ``marker``."""
    matching = [b for b in blocks(language, text) if marker in b.text]
    if len(matching) != 1:
        raise AssertionError(
            f"README.md has {len(matching)} {language} blocks containing {marker!r}, not one"
        )
    return matching[0]


def readme_block(marker: str, language: str = "python") -> str:
    """The text of the README's ``language`` block that contains ``marker``."""
    return block(marker, language).text


def program(of: Block, text: str = README) -> str:
    """The program a python block is: its text, after the blocks it continues."""
    python = blocks("python", text)
    at = python.index(of)
    start = at
    while python[start].continues:
        if start == 0:
            raise AssertionError(f"{of} continues no block above it")
        start -= 1
    return "\n".join(b.text for b in python[start : at + 1])


@dataclass(frozen=True)
class Command:
    """A command of an sh block: ``argv`` as a shell splits it (no prompt, no comment, no
    ``&``), the output line the README shows under it, whether it runs in the background,
    and whether it is a service (its comment says it runs until Ctrl-C)."""

    text: str
    argv: list[str]
    shown: str | None
    background: bool
    service: bool


def _comment_at(line: str) -> int:
    """Where the shell comment of ``line`` starts (a ``#`` after a blank, outside quotes),
    or its length."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return len(line)


def commands(of: Block | str) -> list[Command]:
    """The commands of an sh block (or of the sh block containing the marker ``of``)."""
    sh = block(of, "sh") if isinstance(of, str) else of
    lines = sh.text.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)  # then the rest is output
    found: list[Command] = []
    for line in lines:
        output = not line.startswith("$ ") if prompted else line.startswith("# ")
        if output:  # what the command above printed
            if found and found[-1].shown is None:
                last = found[-1]
                shown = line if prompted else line[2:]
                found[-1] = Command(last.text, last.argv, shown, last.background, last.service)
            continue
        if not line.strip() or line.lstrip().startswith("#"):  # a comment going on
            continue
        line = line.removeprefix("$ ")
        at = _comment_at(line)
        argv = shlex.split(line[:at])
        background = argv[-1] == "&"
        if background:
            argv.pop()
        found.append(Command(shlex.join(argv), argv, None, background, "Ctrl-C" in line[at:]))
    return found


def documented_commands(marker: str) -> list[tuple[list[str], str]]:
    """(command, the output line shown under it) of the README's sh block containing
    ``marker``: each ``loomflow`` command is followed by a ``# `` line of its output."""
    pairs = []
    for command in commands(marker):
        if command.argv[0] == "loomflow":
            assert command.shown is not None, f"no output shown under {command.text!r}"
            pairs.append((command.argv, command.shown))
    return pairs


#: what the tests' own process has and a user's shell does not: the venv it runs in, and,
#: under `make test`, the outer make's variables (a make started with them prints
#: "Entering directory" lines, as a sub-make does)
_NOT_IN_A_SHELL = frozenset({"VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"})


def user_env(**overrides: str) -> dict[str, str]:
    """A user's shell, as the README's commands run in it: this venv's commands first on
    PATH (as after ``. .venv/bin/activate``), no LOOMFLOW_* or ANTHROPIC_* naming, no
    colours, no outer make's variables; ``overrides`` on top."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOOMFLOW_", "ANTHROPIC_", "PYTHON")) and k not in _NOT_IN_A_SHELL
    }
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", os.defpath)])
    env.update(VIRTUAL_ENV=str(BIN.parent), NO_COLOR="1")
    env.update(overrides)
    return env
