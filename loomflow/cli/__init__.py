"""The ``loomflow`` command line: the parser built from the command modules, and the
dispatch to the handler of the command given.

Each module of ``_MODULES`` adds a family of commands; what several of them share lives
in ``options`` (argument types and options), ``stores`` (where a command's log is, and
the one factory of its runtime, reader, trail and tables) and ``render`` (how rows look).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module, metadata
from typing import Protocol

__all__ = ["CommandModule", "main"]


class CommandModule(Protocol):
    """A module of ``loomflow.cli`` that adds commands (see ``_MODULES``)."""

    NAMES: tuple[str, ...]

    def add_parser(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add its commands, each with ``set_defaults(handler=...)``."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loomflow", description="Durable agent runs: crash, resume, fork."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    modules = _command_modules()
    # the usage line lists the commands in alphabetical order, not the modules' order
    names = sorted(name for module in modules for name in module.NAMES)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join(names) + "}"
    )
    for module in modules:
        module.add_parser(commands)
    return parser


#: the modules of the commands: each has ``NAMES`` (the commands it adds),
#: ``add_parser(commands)`` and sets ``handler`` (args -> exit code) on its parsers
_MODULES: tuple[str, ...] = ("analytics", "audit", "otel", "service", "sessions", "tail", "worker")


def _command_modules() -> list[CommandModule]:
    return [import_module(f"loomflow.cli.{name}") for name in _MODULES]


def _version() -> str:
    try:
        return metadata.version("loomflow-durable")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ModuleNotFoundError as exc:
        # the commands use optional extras, most of them several
        print(
            f"loomflow {args.command}: {exc}; pip install 'loomflow-durable[all]'",
            file=sys.stderr,
        )
        return 2
