"""The ``loomflow`` command line: the parser built from the command modules, and the
dispatch to the handler of the command given.

Each module of ``_MODULES`` adds a family of commands; what several of them share lives
in ``options`` (argument types and options), ``stores`` (where a command's log is, and
the one factory of its runtime, reader, trail and tables) and ``render`` (how rows look).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from importlib import import_module, metadata
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

__all__ = ["EXTRA_OF_MODULE", "CommandModule", "install_hint", "main", "missing_extra"]


class CommandModule(Protocol):
    """A module of ``loomflow.cli`` that adds commands (see ``_MODULES``)."""

    NAMES: tuple[str, ...]

    def add_parser(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add its commands, each with ``set_defaults(handler=...)``."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loomflow", description="Durable agent runs: crash, resume, fork."
    )
    import loomflow

    parser.add_argument("--version", action="version", version=f"%(prog)s {loomflow.__version__}")
    modules = _command_modules()
    # the usage line lists the commands in alphabetical order, not the modules' order
    names = sorted(name for module in modules for name in module.NAMES)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join(names) + "}"
    )
    for module in modules:
        module.add_parser(commands)
    _own_usage(parser)
    parser.set_defaults(on_interrupt="")  # what a command adds to "interrupted" (Ctrl-C)
    return parser


def _own_usage(parser: argparse.ArgumentParser) -> None:
    """Give every command's parser itself as ``usage_of``: an argument it does not know
    is then reported with its usage (``loomflow sessions ls --usr ada``), not the top
    level's, as argparse does for what only a subcommand could have taken."""
    parser.set_defaults(usage_of=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in set(action.choices.values()):
                _own_usage(command)


#: the modules of the commands: each has ``NAMES`` (the commands it adds),
#: ``add_parser(commands)`` and sets ``handler`` (args -> exit code) on its parsers
_MODULES: tuple[str, ...] = (
    "analytics",
    "audit",
    "keys",
    "otel",
    "service",
    "sessions",
    "tail",
    "ui",
    "worker",
)


def _command_modules() -> list[CommandModule]:
    return [import_module(f"loomflow.cli.{name}") for name in _MODULES]


#: the extra of the distribution that installs each optional module a command imports
#: (tests/test_first_contact.py checks them against the distribution's metadata)
EXTRA_OF_MODULE = {
    "rich": "cli",
    "plotly": "report",
    "asyncpg": "postgres",
    "aiokafka": "kafka",
    "faust": "kafka",
    "fastapi": "ui",
    "starlette": "ui",
    "uvicorn": "ui",
    "jinja2": "ui",
    "sse_starlette": "ui",
    "python_multipart": "ui",
}


def missing_extra(module: str | None) -> str | None:
    """The extra to install for the missing ``module`` (``rich.console``: ``cli``), or None
    when no extra provides it."""
    return EXTRA_OF_MODULE.get((module or "").partition(".")[0])


def install_hint(extra: str) -> str:
    """How to install ``extra``: from the package index, and, when this distribution was
    installed from a directory (a clone), from there."""
    hint = f"pip install 'loomflow-durable[{extra}]'"
    clone = _installed_from()
    if clone is None:
        return hint
    if clone == Path.cwd():
        return f"{hint}, or in this clone: pip install '.[{extra}]'"
    return f"{hint}, or in the clone it was installed from ({clone}): pip install '.[{extra}]'"


def _installed_from() -> Path | None:
    """The directory this distribution was installed from (its PEP 610 direct_url.json),
    or None: installed from an index or an archive, or not installed. (In the clone itself
    a build's egg-info may be found first: it has no direct_url.json, so look past it.)"""
    for distribution in metadata.distributions(name="loomflow-durable"):
        try:
            origin = json.loads(distribution.read_text("direct_url.json") or "null")
        except ValueError:
            continue
        if not isinstance(origin, dict):
            continue
        url = urlsplit(str(origin.get("url", "")))
        if "dir_info" in origin and url.scheme == "file":
            return Path(unquote(url.path))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    from loomflow.cli.render import quiet_stdout, settled, stdout_gone

    try:
        try:
            return _run(argv)
        finally:
            # flushed here, where a closed pipe can still be caught, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_gone():  # a socket of the command's own, say: a real error
            raise
        # the reader of stdout went away (`| head` has its lines): not an error, but
        # what the command found before printing it still decides the exit code
        quiet_stdout()
        return settled()
    except OSError as exc:  # stdout on a full disk (`> /dev/full`), say: one line
        with contextlib.suppress(OSError):  # what stdout holds back goes nowhere at exit
            quiet_stdout()
        print(f"loomflow: {exc}", file=sys.stderr)
        return 1


def _run(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run its command's handler."""
    args, unknown = _parser().parse_known_args(argv)
    if unknown:  # exits 2, with the usage of the command they were given to
        args.usage_of.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        # Ctrl-C: one line, as for any other way a command ends early, not a traceback
        print(f"loomflow {args.command}: interrupted{args.on_interrupt}", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        # a module of an optional extra that is not installed: name the extra
        extra = missing_extra(exc.name)
        if exc.name is None or extra is None:
            print(f"loomflow {args.command}: {exc}", file=sys.stderr)
        else:
            module = exc.name.partition(".")[0]
            print(
                f"loomflow {args.command} needs {module!r}, which comes with the [{extra}] "
                f"extra: {install_hint(extra)}",
                file=sys.stderr,
            )
        return 2
