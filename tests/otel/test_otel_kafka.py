"""``loomflow otel`` on Kafka, started as the README starts it (the LOOMFLOW_* settings of a
user's shell, no group named): its own consumer group, its runs in flight in the read
model's schema. A run killed in a model call (SIGKILL, its own process) and resumed gives
one trace holding each span the topic records once; an endpoint that is down moves no
committed offset, and the spans arrive once when it is up."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from loomflow.log.reader import committed_offsets, kafka_reader
from loomflow.otel.fold import SessionTrace, decode_state
from tests.support.kafka_env import ROOT, KafkaEnv
from tests.support.otlp import OtlpReceiver, Received, free_port, log_events, recorded_spans
from tests.support.readme import commands
from tests.support.scenario import Research
from tests.support.waiting import eventually, kill_once_hanging

pytestmark = pytest.mark.kafka

BIN = Path(sys.executable).parent


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=2)
    yield made
    await made.close()


def _shell(env: KafkaEnv, **more: str) -> dict[str, str]:
    """A user's shell: the environment's LOOMFLOW_* settings, and no one else's."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("LOOMFLOW_", "OTEL_"))}
    return dict(shell, **env.variables(), PYTHONPATH=str(ROOT), **more)


async def _otel(env: KafkaEnv, endpoint: str, *options: str, **more: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "loomflow"),
        "otel",
        *options,
        env=_shell(env, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **more),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def _process(env: KafkaEnv, argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, cwd=ROOT, env=_shell(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _service(env: KafkaEnv, argv: list[str], endpoint: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        env=_shell(env, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _crash(env: KafkaEnv, tmp_path: Path) -> None:
    """The research agent's run on session s1 through KafkaRuntime(), killed inside its
    fifth model call."""
    worker = [sys.executable, "-m", "tests.support.crash_worker", "unused.db", "s1"]
    options = ["--hang-at", "5", "--passes", "2", "--kafka"]
    await kill_once_hanging(_process(env, [*worker, str(tmp_path / "log"), *options]))


async def _written(env: KafkaEnv) -> dict[int, int]:
    return {p: offset for p, offset in (await env.end_offsets()).items() if offset}


async def _kept(env: KafkaEnv) -> SessionTrace:
    conn = await asyncpg.connect(env.dsn)
    try:
        state = await conn.fetchval(
            f'SELECT state FROM "{env.schema}".otel_sessions WHERE session_id = $1', "s1"
        )
    finally:
        await conn.close()
    return decode_state(state)


def _runs(spans: list[Received]) -> list[Received]:
    return sorted((s for s in spans if s.parent_id is None), key=lambda s: s.start_ns)


async def test_a_crashed_and_resumed_run_on_kafka_is_one_trace_with_each_span_once(
    env: KafkaEnv, tmp_path: Path
) -> None:
    await env.start_projector()
    await _crash(env, tmp_path)
    with OtlpReceiver() as receiver:
        code, out, err = await _otel(env, receiver.url)
        assert code == 0, err
        assert "sent 7 spans (0 runs, 1 trace)" in out and "(group " in out, out
        assert await committed_offsets(env.settings, env.settings.otel_group) == await _written(env)
        # the run in flight, its span so far, is kept in the read model's schema
        assert (await _kept(env)).run is not None

        runtime = env.runtime()
        try:
            result = await Research(passes=2).agent(runtime).resume(session_id="s1")
        finally:
            await runtime.close()
        assert result.restored_turns == 4
        before = await committed_offsets(env.settings, env.settings.otel_group)

        # the endpoint is down: exit code 3, one line, and the group's offsets stay
        down = f"http://127.0.0.1:{free_port()}"
        code, out, err = await _otel(env, down, "--retry-for", "1", OTEL_EXPORTER_OTLP_TIMEOUT="1")
        assert code == 3 and out == "" and len(err.splitlines()) == 1, (out, err)
        assert "did not accept 5 spans ([Errno 111] Connection refused)" in err, err
        assert await committed_offsets(env.settings, env.settings.otel_group) == before

        code, out, err = await _otel(env, receiver.url)
        assert code == 0 and "sent 5 spans (2 runs, 1 trace)" in out, (out, err)
        code, out, _ = await _otel(env, receiver.url)
        assert "sent 0 spans (0 runs, 0 traces) from 0 new records" in out, out
        assert await committed_offsets(env.settings, env.settings.otel_group) == await _written(env)
        spans = receiver.received()

    assert (await _kept(env)).run is None
    assert receiver.duplicates() == []
    topic = await log_events(kafka_reader(env.settings, group=None, start="beginning"))
    assert {s.span_id for s in spans} == recorded_spans(topic)
    assert len({s.trace_id for s in spans}) == 1
    crashed, resumed = _runs(spans)
    assert crashed.attributes["loomflow.run.outcome"] == "interrupted"
    assert resumed.attributes["loomflow.run.outcome"] == "finished"
    links = {attributes["loomflow.link.type"]: span_id for _, span_id, attributes in resumed.links}
    assert links["continues"] == crashed.span_id
    (fourth,) = [s for s in spans if s.attributes.get("loomflow.turn") == 4]
    assert links["replayed"] == fourth.span_id


async def test_the_readme_service_follows_the_topic_until_ctrl_c(env: KafkaEnv) -> None:
    """``loomflow otel --follow`` as the README starts it: a run made while it runs is
    exported, and Ctrl-C (SIGINT) ends it cleanly."""
    (command,) = commands("loomflow otel --follow")
    assert command.argv == ["loomflow", "otel", "--follow"] and command.service
    await env.start_projector()
    with OtlpReceiver() as receiver:
        service = _service(env, [str(BIN / command.argv[0]), *command.argv[1:]], receiver.url)
        try:
            runtime = env.runtime()
            try:
                await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
            finally:
                await runtime.close()

            def run_span() -> bool:
                return any(s.parent_id is None for s in receiver.received())

            await eventually(run_span, within=60, what="the run's span at the receiver")
            service.send_signal(signal.SIGINT)
            _, err = await asyncio.to_thread(service.communicate, timeout=60)
        finally:
            if service.poll() is None:
                service.kill()
                service.communicate()
        assert service.returncode == 0, err
        assert receiver.duplicates() == []
        (run,) = [s for s in receiver.received() if s.parent_id is None]
        assert run.attributes["loomflow.run.outcome"] == "finished"
