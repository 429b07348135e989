"""The resume worker, durable signals and the lifecycle verbs on Kafka: the same proofs as
on SQLite (tests/agent/test_worker.py, tests/cli/test_sessions.py), with the log on the
broker and the projector between."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from loomflow import Agent, Message, Role, Tuning
from loomflow.agent.worker import Worker
from loomflow.errors import ModelError, RunCancelledError
from loomflow.models.scripted import ScriptedModel
from loomflow.runtime import Scope
from loomflow.runtime.base import abandoned
from tests.support import lifecycle
from tests.support.kafka_env import ROOT, KafkaEnv
from tests.support.scenario import Research
from tests.support.signals import approval_agent
from tests.support.waiting import eventually, kill_once_hanging

pytestmark = pytest.mark.kafka


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=2)
    await made.start_projector()
    yield made
    await made.close()


def _process(env: KafkaEnv, args: list[str], **extra: str) -> subprocess.Popen[str]:
    """A process configured by the environment's LOOMFLOW_* variables alone."""
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        env=dict(os.environ, **env.variables(), PYTHONPATH=str(ROOT), **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


async def _row(env: KafkaEnv, session: str) -> Any:
    runtime = env.runtime()
    try:
        return await runtime.store.session(Scope(session))
    finally:
        await runtime.close()


async def _killed_mid_run(env: KafkaEnv, session: str, log: Path, *extra: str) -> None:
    args = ["tests.support.crash_worker", "unused.db", session, str(log), "--kafka", *extra]
    await kill_once_hanging(_process(env, args))


async def test_a_worker_finishes_a_sigkilled_kafka_run_without_repeating_calls(
    env: KafkaEnv, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    await _killed_mid_run(env, "s1", log, "--hang-at", "8", "--lease", "1")
    worker = _process(
        env,
        ["loomflow.cli", "worker", "tests.support.resume_worker:research"],
        RESEARCH_LOG=str(log),
    )
    try:
        await eventually(
            lambda: _status_is(env, "s1", "finished"), within=90, what="the worker's resume"
        )
    finally:
        worker.terminate()
        _, err = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, err
    assert "abandoned" in err
    calls = Counter(log.read_text().splitlines())
    assert [calls[f"model {turn}"] for turn in range(9)] == [1] * 7 + [2, 1]
    tools = [line for line in calls if line.startswith("tool ")]
    assert tools and all(calls[line] == 1 for line in tools)


async def _status_is(env: KafkaEnv, session: str, status: str) -> bool:
    row = await _row(env, session)
    return row is not None and row.status == status


async def test_two_workers_race_for_one_abandoned_kafka_run_and_one_resumes_it(
    env: KafkaEnv, tmp_path: Path
) -> None:
    await _killed_mid_run(
        env, "s1", tmp_path / "calls.log", "--passes", "2", "--hang-at", "3", "--lease", "0.5"
    )
    await eventually(lambda: _abandoned(env, "s1"), within=30, what="the lease to pass")
    researches = [Research(passes=2) for _ in range(2)]
    runtimes = [env.runtime() for _ in range(2)]
    workers = [Worker([r.agent(rt)]) for r, rt in zip(researches, runtimes, strict=True)]
    tasks = [t for found in await asyncio.gather(*(w.scan() for w in workers)) for t in found]
    await asyncio.gather(*tasks)
    for runtime in runtimes:
        await runtime.close()
    outcomes = sorted(o.outcome for w in workers for o in w.done)
    assert outcomes.count("finished") == 1, outcomes
    assert set(outcomes) <= {"finished", "taken"}
    assert sorted(len(r.models[-1].inner.calls) for r in researches)[0] == 0
    assert await _status_is(env, "s1", "finished")


async def _abandoned(env: KafkaEnv, session: str) -> bool:
    row = await _row(env, session)
    return row is not None and abandoned(row)


async def test_a_kafka_run_waits_across_processes_and_goes_on_with_the_signal(
    env: KafkaEnv,
) -> None:
    seen: list[Any] = []
    first = env.runtime()
    result = await approval_agent(first, seen).run("Pay invoice 7.", session_id="pay")
    await first.close()
    assert result.stop_reason == "waiting"

    # through the log, as for every write on a read model the processor fills
    command = ["loomflow.cli", "signal", "pay", "approve", "--json", '{"ok": true}', "--kafka"]
    sender = _process(env, command)
    out, err = await asyncio.to_thread(sender.communicate, timeout=60)
    assert sender.returncode == 0, err
    assert out.startswith("sent approve to pay")

    runtime = env.runtime()
    agent = approval_agent(runtime, seen)
    worker = Worker([agent])
    await asyncio.gather(*await worker.scan())
    await runtime.close()
    assert [(o.reason, o.outcome) for o in worker.done] == [("signalled", "finished")]
    assert seen == [{"ok": True}]
    assert isinstance(agent.model, ScriptedModel) and len(agent.model.calls) == 1
    assert await _status_is(env, "pay", "finished")


async def test_the_lifecycle_verbs_go_through_the_kafka_log_from_other_processes(
    env: KafkaEnv,
) -> None:
    async def sessions(*argv: str, kafka: bool = True) -> tuple[int, str, str]:
        command = ["loomflow.cli", "sessions", *argv, *(["--kafka"] if kafka else [])]
        process = _process(env, command)
        out, err = await asyncio.to_thread(process.communicate, timeout=120)
        return process.returncode, out, err

    # a run of this process, cancelled from another while its model call is in flight
    entered, release = asyncio.Event(), asyncio.Event()

    async def held(messages: Sequence[Message]) -> None:
        if messages[-1].role is Role.TOOL:
            entered.set()
            await release.wait()

    runtime = env.runtime()
    model = ScriptedModel(lifecycle.RESEARCH, on_call=held)
    agent = Agent(
        "Answer with data.",
        model=model,
        runtime=runtime,
        tools=[lifecycle.population],
        tuning=Tuning(checkpoint=True),
    )
    running = asyncio.create_task(agent.run("How many people live in Oslo?", session_id="oslo"))
    await entered.wait()
    code, out, err = await sessions("cancel", "oslo", "--reason", "wrong city")
    assert code == 0 and out.startswith("cancelled run "), err
    release.set()
    with pytest.raises(RunCancelledError):
        await running
    assert len(model.calls) == 2
    assert await Worker([lifecycle.researcher(runtime=runtime)]).scan() == []
    assert await _status_is(env, "oslo", "cancelled")

    resume = ("resume", "oslo", "--agent", "tests.support.lifecycle:researcher")
    code, out, err = await sessions(*resume)
    assert code == 0 and out.splitlines()[-1] == "Oslo has 709000 people.", err
    assert await _status_is(env, "oslo", "finished")

    # a run a worker's last attempt parked, retried in another process
    parked = lifecycle.researcher(replies=1, runtime=runtime)
    with pytest.raises(ModelError):
        await parked.run("How many people live in Oslo?", session_id="bergen")
    row = await _row(env, "bergen")
    with pytest.raises(ModelError):
        await parked.take_over(
            "bergen", user_id=None, after_seq=row.last_seq, worker="w1", last_attempt=True
        )
    await runtime.close()
    assert await _status_is(env, "bergen", "stuck")
    retry = ("retry", "bergen", *resume[2:])
    code, out, err = await sessions(*retry)
    assert code == 0 and out.splitlines()[-1] == "Oslo has 709000 people.", err
    code, out, err = await sessions(*retry)
    assert code == 1 and "is not stuck (it is finished)" in err

    code, out, err = await sessions("erase", "oslo", "--yes")
    assert code == 0 and "erased session oslo (no user)" in out, err
    assert await _status_is(env, "oslo", "erased")
    # the read model the processor fills takes no write but through the log
    code, out, err = await sessions("cancel", "bergen", kafka=False)
    assert code == 2 and "pass --kafka" in err
