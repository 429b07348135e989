"""The log's other readers on real Kafka and PostgreSQL: the audit group beside the
projector's, ``audit verify``, and ``tail``, each started as the README starts it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import orjson
import pytest

from loomflow.log.reader import committed_offsets
from loomflow.producers import EventProducer, scope_key
from tests.support.kafka_env import ROOT, KafkaEnv, ProcessorProcess, session_events
from tests.support.scenario import Research
from tests.support.waiting import eventually

pytestmark = pytest.mark.kafka

BIN = Path(sys.executable).parent


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=3)
    yield made
    await made.close()


def _env_of(env: KafkaEnv) -> dict[str, str]:
    """This process's environment with the test's LOOMFLOW_* settings instead of ours,
    as a user's shell would have them."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    variables.update(env.variables(), PYTHONPATH=str(ROOT), NO_COLOR="1", COLUMNS="200")
    return variables


async def _loomflow(env: KafkaEnv, *argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loomflow.cli",
        *argv,
        env=_env_of(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, " ".join(out.decode().split())


async def _written(env: KafkaEnv) -> dict[int, int]:
    """End offsets of the partitions that hold records (a group commits no others)."""
    return {p: offset for p, offset in (await env.end_offsets()).items() if offset}


async def _research(env: KafkaEnv, *sessions: str) -> None:
    runtime = env.runtime()
    try:
        for session in sessions:
            await Research(passes=1).agent(runtime).run("go", session_id=session)
    finally:
        await runtime.close()


async def test_projector_audit_and_analytics_read_the_same_topic_with_their_own_positions(
    env: KafkaEnv,
) -> None:
    projector = await env.start_projector()
    analytics = ProcessorProcess(env.variables(), argv=[str(BIN / "loomflow"), "analytics"])
    try:
        await _research(env, "a", "b")
        code, out = await _loomflow(env, "audit")
        assert code == 0 and "in 2 sessions, 0 rejected" in out, out
        audited = await committed_offsets(env.settings, env.settings.audit_group)
        first = await _written(env)
        assert audited == first

        async def counted() -> bool:
            assert analytics.poll() is None, analytics.output()[-3000:]
            return await committed_offsets(env.settings, env.settings.analytics_group) == first

        await eventually(counted, within=90, what="the analytics group to commit the topic")
    finally:
        analytics.stop()

    # audit and analytics are not running: the projector goes on alone, their groups stay
    await _research(env, "c")
    ends = await _written(env)
    await eventually(
        lambda: _passed(env, ends), what="the projector to pass the new session's events"
    )
    assert await committed_offsets(env.settings, env.settings.audit_group) == audited
    assert await committed_offsets(env.settings, env.settings.analytics_group) == first
    code, out = await _loomflow(env, "audit", "verify")
    # what the audit has not read yet is not proven: pending, never a plain success
    assert code == 3, out
    assert "2 sessions, 18 entries match the log" in out and "not audited yet" in out, out

    # the projector stopped; the audit catches up with what it never saw, and only that
    await env.stop_projector(projector)
    code, out = await _loomflow(env, "audit")
    assert code == 0 and "in 1 session, 0 rejected" in out, out
    assert await committed_offsets(env.settings, env.settings.audit_group) == ends
    assert await committed_offsets(env.settings, env.settings.analytics_group) == first
    code, out = await _loomflow(env, "audit")
    assert "audited 0 new records" in out, out  # replaying from the group adds nothing
    code, out = await _loomflow(env, "audit", "verify")
    assert code == 0 and "verified 3 sessions" in out, out


async def _passed(env: KafkaEnv, ends: dict[int, int]) -> bool:
    positions = await env.positions()
    return all(positions.get(p, 0) >= end for p, end in ends.items())


async def test_verify_finds_tampering_in_postgres_and_accepts_erasure(env: KafkaEnv) -> None:
    await env.start_projector()
    await _research(env, "kept", "gone")
    runtime = env.runtime()
    try:
        assert await runtime.store.erase("gone")
    finally:
        await runtime.close()
    code, out = await _loomflow(env, "audit")
    assert code == 0, out
    code, out = await _loomflow(env, "audit", "verify")
    assert code == 0 and "verified 2 sessions" in out and "erased" in out, out

    # what erasure leaves in the trail, and each tampering found, is the trail suite's
    # (tests/audit/test_conformance.py); here, what the commands say of them
    conn = await asyncpg.connect(env.dsn)
    try:
        trail = f'"{env.schema}".audit_entries'
        await conn.execute(f"DELETE FROM {trail} WHERE session_id = 'kept' AND n = 3")
    finally:
        await conn.close()
    code, out = await _loomflow(env, "audit", "verify", "--session", "kept")
    assert code == 1, out
    assert re.search(r"deleted in session kept \(user -\) at entry 4", out), out


async def test_audit_keeps_a_record_filed_under_another_scope_and_goes_on(env: KafkaEnv) -> None:
    """A record the audit cannot chain is kept among the rejects in any trail (the trail
    suite, tests/audit/test_conformance.py); one whose key is not its event's scope
    happens only on a topic."""
    producer = EventProducer(env.bootstrap, env.topics)
    good = session_events("s1", passes=1, user="alice")
    forged = good[1].model_copy(update={"user_id": "mallory"})
    try:
        await producer.send(good[:1])
        # mallory's event, filed under alice's session key
        await producer.send_raw(
            env.topics.events, forged.model_dump_json().encode(), key=scope_key("alice", "s1")
        )
        await producer.send(good[1:])
    finally:
        await producer.stop()
    code, out = await _loomflow(env, "audit")
    assert code == 0, out
    assert f"audited {len(good) + 1} new records" in out and "1 rejected" in out, out
    conn = await asyncpg.connect(env.dsn)
    try:
        reasons = [
            r[0] for r in await conn.fetch(f'SELECT reason FROM "{env.schema}".audit_rejects')
        ]
    finally:
        await conn.close()
    assert len(reasons) == 1 and "not the scope" in reasons[0], reasons
    code, out = await _loomflow(env, "audit", "verify", "--user", "alice")
    assert code == 0 and "verified 1 session," in out, out


async def test_an_audit_beside_one_that_follows_the_topic_is_refused_saying_so(
    env: KafkaEnv,
) -> None:
    """Two audits share the audit group: the second took some of the topic's partitions
    (or none, and said it audited "0 new records") while both wrote the one trail. One
    audit writes a trail at a time: the second is refused (exit 1) naming the trail."""
    await env.start_projector()
    await _research(env, "a", "b")
    follower = _started(env, "audit", "--follow")
    try:
        assert follower.stdout is not None
        ready = await asyncio.wait_for(asyncio.to_thread(follower.stdout.readline), 60)
        assert "Ctrl-C stops" in ready, ready
        code, out = await _loomflow(env, "audit")
        assert code == 1, out
        assert (
            "loomflow audit: another `loomflow audit` is writing the audit trail in PostgreSQL "
            f"schema {env.schema} now (one at a time), and audits what this one would"
        ) in out, out
        assert "audited" not in out

        async def verified() -> bool:  # the running one audits the whole topic, alone
            code, out = await _loomflow(env, "audit", "verify")
            return code == 0 and "verified 2 sessions" in out

        await eventually(verified, within=90, what="the running audit to chain the topic")
    finally:
        follower.send_signal(signal.SIGINT)
        said, _ = await asyncio.to_thread(follower.communicate, timeout=60)
    assert follower.returncode == 0 and "in 2 sessions, 0 rejected" in said, said
    code, out = await _loomflow(env, "audit")  # let go with its process
    assert code == 0 and "audited 0 new records" in out, out


def _started(env: KafkaEnv, *argv: str) -> subprocess.Popen[str]:
    """``loomflow ARGV`` started as a process of its own, left running."""
    return subprocess.Popen(
        [sys.executable, "-m", "loomflow.cli", *argv],
        env=_env_of(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _tail(env: KafkaEnv, *options: str) -> subprocess.Popen[str]:
    return _started(env, "tail", *options)


async def test_tail_prints_events_appended_while_it_runs(env: KafkaEnv) -> None:
    await env.start_projector()
    tail = _tail(env, "--type", "run.*")
    try:
        assert tail.stderr is not None and tail.stdout is not None
        ready = await asyncio.wait_for(asyncio.to_thread(tail.stderr.readline), 60)
        assert "following Kafka topic" in ready
        await _research(env, "live")
        lines = [await asyncio.wait_for(asyncio.to_thread(tail.stdout.readline), 60)]
        lines.append(await asyncio.wait_for(asyncio.to_thread(tail.stdout.readline), 60))
    finally:
        tail.send_signal(signal.SIGINT)
        tail.wait(timeout=30)
    assert tail.returncode == 0
    assert "  live  -  #1  run.started  run" in lines[0], lines
    assert "run.finished" in lines[1] and "completed; session totals" in lines[1], lines


async def test_tail_no_follow_prints_the_topic_to_its_end_and_exits(env: KafkaEnv) -> None:
    await env.start_projector()
    await _research(env, "s1", "s2")
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "loomflow.cli", "tail", "--no-follow", "--json"),
        env=_env_of(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err
    events = [orjson.loads(line) for line in out.splitlines()]
    assert sum((await _written(env)).values()) == len(events)  # every record, once
    assert [e["type"] for e in events if e["session_id"] == "s2"][-1] == "run.finished"
    assert all(re.fullmatch(r"\d+:\d+", e["position"]) for e in events)  # partition:offset
    code, said = await _loomflow(env, "tail", "--no-follow", "--session", "nope")
    assert code == 1 and "no events of session nope in Kafka topic" in said, said


async def test_a_topic_nothing_wrote_to_is_named_not_waited_for(env: KafkaEnv) -> None:
    missing = KafkaEnv(env.settings.model_copy(update={"topic_prefix": f"none-{env.tag}"}), "x")
    for command in (["audit"], ["tail"], ["audit", "verify"]):
        code, out = await _loomflow(missing, *command)
        assert code == 1, out
        assert f"topic none-{env.tag}.events does not exist" in out, out
        assert "Traceback" not in out and "not found in cluster metadata" not in out, out
