"""The ``loomflow`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module, metadata
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from loomflow.demo import WORKER_COMMAND

if TYPE_CHECKING:
    from loomflow.settings import Settings

__all__ = ["CommandModule", "add_loglevel", "main"]


class CommandModule(Protocol):
    """A module of ``loomflow.cli`` that adds commands (see ``_MODULES``)."""

    NAMES: tuple[str, ...]

    def add_parser(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add its commands, each with ``set_defaults(handler=...)``."""


#: the extra that installs all a command needs, where [all] would be more than that
_EXTRAS = {"demo": "cli"}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_loglevel(parser: argparse.ArgumentParser) -> None:
    """The ``--loglevel`` of a command that runs a faust worker."""
    parser.add_argument(
        "--loglevel",
        default="info",
        choices=("crit", "error", "warn", "info", "debug"),
        help="(default: %(default)s)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loomflow", description="Durable agent runs: crash, resume, fork."
    )
    # The metavar lists only public commands, so the worker stays out of --help.
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join(_public_commands()) + "}"
    )
    demo = commands.add_parser(
        "demo",
        help="kill an agent run with SIGKILL, resume it, fork it, let workers finish runs",
        description="Run a research agent in a worker process, SIGKILL it mid-run, resume "
        "the session from its SQLite log without repeating model calls, then fork it from an "
        "older checkpoint. Then two `loomflow worker` processes finish a run whose process, "
        "and then whose worker, is SIGKILLed, and a run that waits for `loomflow signal`. "
        "Offline unless ANTHROPIC_API_KEY is set.",
    )
    demo.add_argument(
        "--db",
        type=Path,
        default=Path("loomflow-demo.db"),
        metavar="PATH",
        help="SQLite log to use; deleted at start with its -wal/-shm files and its "
        "-calls.jsonl record of model calls (default: %(default)s)",
    )
    demo.add_argument(
        "--kill-after-turns",
        type=_positive_int,
        default=3,
        metavar="N",
        help="SIGKILL the worker once N turns are in the log (default: %(default)s)",
    )
    demo.add_argument(
        "--model",
        default="claude-opus-4-7",
        metavar="NAME",
        help="Claude model used when ANTHROPIC_API_KEY is set (default: %(default)s)",
    )
    processor = commands.add_parser(
        "processor",
        help="project the Kafka log into PostgreSQL (a faust-streaming worker)",
        description="Consume loomflow.events, fold it into the PostgreSQL read model, publish "
        "snapshots, dead-letter bad events. Configured like KafkaRuntime, by the LOOMFLOW_* "
        "environment (LOOMFLOW_KAFKA_BOOTSTRAP, LOOMFLOW_POSTGRES_DSN, LOOMFLOW_SCHEMA, "
        "LOOMFLOW_TOPIC_PREFIX, LOOMFLOW_TOPIC_PARTITIONS, LOOMFLOW_PROCESSOR_ID); with none "
        "set, both use the same defaults.",
    )
    add_loglevel(processor)
    rebuild = commands.add_parser(
        "rebuild",
        help="replay the Kafka log from the beginning into an empty PostgreSQL schema",
        description="Fold every event of the events topic into a new read model schema, "
        "dead-lettering what does not apply. Configured by the LOOMFLOW_* environment, like "
        "`loomflow processor`; positions are recorded for that processor's group.",
    )
    rebuild.add_argument("--schema", required=True, help="a new or empty schema to fill")
    setup = commands.add_parser(
        "setup",
        help="create or migrate the PostgreSQL schema and create the Kafka topics, now",
        description="For deploys that migrate ahead: create or migrate the read model's "
        "schema and create the topics, as the LOOMFLOW_* environment names them; processes "
        "started afterwards with LOOMFLOW_AUTO_MIGRATE=false only check the schema version.",
    )
    setup.add_argument(
        "--postgres-only",
        action="store_true",
        help="the schema alone, for PostgresRuntime without Kafka",
    )
    for module in _command_modules():
        module.add_parser(commands)
    worker = commands.add_parser(WORKER_COMMAND)
    worker.add_argument("--db", type=Path, required=True)
    worker.add_argument("--session-id", required=True)
    worker.add_argument("--backend", choices=("scripted", "anthropic"), required=True)
    worker.add_argument("--model", required=True)
    worker.add_argument("--lease", type=float, default=None)
    worker.add_argument("--step", choices=("worker", "unattended"), default="worker")
    return parser


#: modules of the commands that read the log or a store: each has ``NAMES`` (the commands it
#: adds), ``add_parser(commands)`` and sets ``handler`` (args -> exit code) on its parsers
_MODULES: tuple[str, ...] = ("analytics", "audit", "sessions", "tail", "worker")


def _command_modules() -> list[CommandModule]:
    return [import_module(f"loomflow.cli.{name}") for name in _MODULES]


def _public_commands() -> list[str]:
    names = ["demo", "processor", "rebuild", "setup"]
    for module in _command_modules():
        names.extend(module.NAMES)
    return sorted(names)


def _version() -> str:
    try:
        return metadata.version("loomflow-durable")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _settings() -> Settings | None:
    """The LOOMFLOW_* settings, or None after printing why they do not validate."""
    from pydantic import ValidationError

    from loomflow.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        print(f"loomflow: invalid LOOMFLOW_* setting: {exc}", file=sys.stderr)
        return None


def _run_processor(loglevel: str) -> int:
    import asyncio

    from loomflow.errors import StoreError

    settings = _settings()
    if settings is None:
        return 2
    # the topics exist, with the log's configuration, before faust's agents subscribe; with
    # automatic migration off, the schema and topics must be there already (loomflow setup)
    try:
        asyncio.run(_ready_to_project(settings))
    except StoreError as exc:
        print(f"loomflow processor: {exc}", file=sys.stderr)
        return 1
    from loomflow.processors.app import create_app

    app = create_app(settings)
    # faust's worker reads its own command line; no web server, whatever faust defaults to
    sys.argv = ["loomflow processor", "worker", "--without-web", "--loglevel", loglevel]
    app.main()
    return 0


async def _ready_to_project(settings: Settings) -> None:
    from loomflow.producers import Topics, ensure_topics

    topics = Topics.from_settings(settings)
    await ensure_topics(settings.kafka_bootstrap, topics, create=settings.auto_migrate)
    if not settings.auto_migrate:
        from loomflow.runtime import PostgresRuntime

        async with PostgresRuntime(settings=settings):
            pass  # opening checks the schema's version and says what to run


def _run_rebuild(schema: str) -> int:
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from loomflow.errors import LoomflowError
    from loomflow.processors.rebuild import rebuild

    settings = _settings()
    if settings is None:
        return 2
    console = Console()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(f"rebuilding into {schema}", total=None)
        try:
            result = asyncio.run(
                rebuild(
                    settings,
                    schema=schema,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
            )
        except (LoomflowError, ValueError) as exc:
            console.print(f"[red]rebuild failed:[/red] {exc}")
            return 1
    console.print(
        f"rebuilt {schema}: {result.records} records, {result.applied} applied, "
        f"{result.dead_lettered} dead-lettered"
    )
    return 0


def _run_setup(postgres_only: bool) -> int:
    import asyncio

    from loomflow.errors import LoomflowError
    from loomflow.runtime import KafkaRuntime, PostgresRuntime, Runtime

    settings = _settings()
    if settings is None:
        return 2
    runtime: Runtime = (
        PostgresRuntime(settings=settings) if postgres_only else KafkaRuntime(settings=settings)
    )

    async def set_up() -> None:
        try:
            await runtime.setup()
        finally:
            await runtime.close()

    try:
        asyncio.run(set_up())
    except LoomflowError as exc:
        print(f"loomflow setup: {exc}", file=sys.stderr)
        return 1
    done = f"schema {settings.db_schema!r} is at the current version"
    if not postgres_only:
        done += f"; topics {settings.topic_prefix}.* exist"
    print(f"loomflow setup: {done}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ModuleNotFoundError as exc:
        # the CLI's commands use optional extras: the demo rich alone, the others several
        extra = _EXTRAS.get(args.command, "all")
        print(
            f"loomflow {args.command}: {exc}; pip install 'loomflow-durable[{extra}]'",
            file=sys.stderr,
        )
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    if args.command == "demo":
        from loomflow.demo.view import run_demo

        return run_demo(args.db, args.kill_after_turns, args.model)
    if args.command == "processor":
        return _run_processor(args.loglevel)
    if args.command == "rebuild":
        return _run_rebuild(args.schema)
    if args.command == "setup":
        return _run_setup(args.postgres_only)
    # the worker loads the scenario alone: no rich in a process that prints nothing
    from loomflow.demo.scenario import run_worker

    return run_worker(args.db, args.session_id, args.backend, args.model, args.lease, args.step)
