"""The README's Kafka path as a new user takes it: defaults only, each process on its own.

``loomflow processor`` is started with no options and no LOOMFLOW_* naming (only the
service addresses, when the test services are not at the defaults), before its topics
exist; then the README's ``kafka_quickstart.py`` runs, unchanged, in its own process. Both
must meet on the default topics, schema and group, as they would on a user's machine.

These tests own the default names (topics ``loomflow.*``, schema ``loomflow``): they delete
them first and last, so run them only against the test services.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from loomflow.runtime import KafkaRuntime, Scope
from loomflow.settings import Settings
from tests.support.backends import drop_environment
from tests.support.readme import README, block, commands
from tests.support.readme import user_env as readme_shell
from tests.support.services import kafka_bootstrap, postgres_dsn
from tests.support.waiting import eventually

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[1]


def user_env() -> dict[str, str]:
    """A user's shell (this venv's commands on PATH) with no LOOMFLOW_* naming: only
    where the services are, if not the defaults."""
    env = readme_shell()
    defaults = Settings.model_construct()  # the defaults alone, no environment read
    if kafka_bootstrap() != defaults.kafka_bootstrap:
        env["LOOMFLOW_KAFKA_BOOTSTRAP"] = kafka_bootstrap()
    if postgres_dsn() != "postgresql://loomflow:loomflow@127.0.0.1:5432/loomflow":
        env["LOOMFLOW_POSTGRES_DSN"] = postgres_dsn()
    return env


def user_settings() -> Settings:
    return Settings(kafka_bootstrap=kafka_bootstrap(), postgres_dsn=postgres_dsn())


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


@pytest.fixture
async def default_names() -> AsyncIterator[Settings]:
    """An empty broker and database as far as the default names go, before and after."""
    settings = user_settings()
    names = {settings.events_topic, settings.snapshots_topic, settings.dlq_topic}

    async def clear() -> None:
        await drop_environment(settings)

        async def gone() -> bool:
            return not names & await _topics(settings.kafka_bootstrap)

        await eventually(gone, what="the default topics to be deleted")

    await clear()
    yield settings
    await clear()


def _steps() -> tuple[list[str], list[str]]:
    """The README's two commands: the processor (a service, in a terminal of its own) and
    the quickstart, which is the python block named as the file it runs."""
    serve, run = commands("loomflow processor")
    assert serve.argv == ["loomflow", "processor"] and serve.service
    assert run.argv == ["python", block("# kafka_quickstart.py").name]
    return serve.argv, run.argv


@pytest.fixture
def processor(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``loomflow processor`` exactly as the README starts it (output to a file: a pipe
    nobody reads would fill up and block it); stopped after."""
    command, _ = _steps()
    with (tmp_path / "processor.log").open("wb") as log:
        proc = subprocess.Popen(
            command,
            env=user_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # never leave a worker behind
        proc.wait()
        raise


async def test_the_readme_kafka_quickstart_runs_against_a_default_processor(
    default_names: Settings, processor: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    # the processor was started on a broker without its topics: it creates them, as the log
    # must be (kept forever, the partitions the settings say)
    async def created() -> bool:
        return default_names.events_topic in await _topics(default_names.kafka_bootstrap)

    await eventually(created, within=60, what="the processor to create the default topics")
    admin = AIOKafkaAdminClient(bootstrap_servers=default_names.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([default_names.events_topic])
        configs = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, default_names.events_topic)]
        )
    finally:
        await admin.close()
    assert len(described[0]["partitions"]) == default_names.topic_partitions
    entries = {c[0]: c[1] for c in configs[0].resources[0][4]}
    assert entries["retention.ms"] == "-1" and entries["cleanup.policy"] == "delete"

    _, run = _steps()
    (tmp_path / run[1]).write_text(block("# kafka_quickstart.py").text)
    proc = await asyncio.create_subprocess_exec(
        *run,
        cwd=tmp_path,
        env=user_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    first, again, fork = (line.split(" ", 1) for line in out.decode().splitlines())
    session, fork_session = first[0], fork[0]
    assert first == [session, "A log."] and again == [session, "Ordered per key."]
    assert fork_session.startswith("sess") and fork_session != session
    assert fork[1] == "Ordered per key."

    # another process (this one), with the same defaults, sees everything at once
    async with KafkaRuntime(settings=user_settings()) as runtime:
        assert len(await runtime.list_checkpoints(Scope(session))) == 2
        forked = await runtime.store.session(Scope(fork_session))
        assert forked is not None and forked.parent_session_id == session

    # the README's `loomflow sessions ls --all-users` "with no option" lists what it projected
    (listing,) = re.findall(r"`(loomflow sessions ls[^`]*)` with no option", README)
    command = shlex.split(listing)
    assert command == ["loomflow", "sessions", "ls", "--all-users"]
    done = await asyncio.to_thread(
        subprocess.run,
        command,
        env=dict(user_env(), NO_COLOR="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^(sess[0-9a-z]{26}) ", done.stdout, flags=re.M)
    assert sorted(listed) == sorted([session, fork_session]), done.stdout
    assert processor.poll() is None, "the processor died"
