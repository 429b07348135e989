"""``loomflow processor``, ``loomflow rebuild`` and ``loomflow setup``: the scaled path's
service commands, configured by the LOOMFLOW_* environment alone.

faust, aiokafka, asyncpg and rich load in the handlers, so ``loomflow --help`` needs none
of them.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from loomflow.cli.options import add_loglevel, run_faust_worker
from loomflow.cli.render import console_type, count
from loomflow.control.source import read_settings

if TYPE_CHECKING:
    from loomflow.settings import Settings

__all__ = ["NAMES", "add_parser"]

NAMES = ("processor", "rebuild", "setup")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    processor.set_defaults(handler=_processor)
    rebuild = commands.add_parser(
        "rebuild",
        help="replay the Kafka log from the beginning into an empty PostgreSQL schema",
        description="Fold every event of the events topic into a new read model schema, "
        "dead-lettering what does not apply. Configured by the LOOMFLOW_* environment, like "
        "`loomflow processor`; positions are recorded for that processor's group.",
    )
    rebuild.add_argument("--schema", required=True, help="a new or empty schema to fill")
    rebuild.set_defaults(handler=_rebuild)
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
    setup.set_defaults(handler=_setup)


def _processor(args: argparse.Namespace) -> int:
    import asyncio

    from loomflow.errors import StoreError

    settings = read_settings()
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

    return run_faust_worker("processor", create_app(settings), args.loglevel)


async def _ready_to_project(settings: Settings) -> None:
    from loomflow.producers import Topics, ensure_topics

    topics = Topics.from_settings(settings)
    await ensure_topics(settings.kafka_bootstrap, topics, create=settings.auto_migrate)
    if not settings.auto_migrate:
        from loomflow.runtime import PostgresRuntime

        async with PostgresRuntime(settings=settings):
            pass  # opening checks the schema's version and says what to run


def _rebuild(args: argparse.Namespace) -> int:
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from loomflow.errors import LoomflowError
    from loomflow.processors.rebuild import rebuild

    schema: str = args.schema
    settings = read_settings()
    if settings is None:
        return 2
    console = console_type()()
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
        f"rebuilt {schema}: {count(result.records, 'record')}, {result.applied} applied, "
        f"{result.dead_lettered} dead-lettered"
    )
    return 0


def _setup(args: argparse.Namespace) -> int:
    import asyncio

    from loomflow.errors import LoomflowError
    from loomflow.runtime import KafkaRuntime, PostgresRuntime, Runtime

    postgres_only: bool = args.postgres_only
    settings = read_settings()
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
