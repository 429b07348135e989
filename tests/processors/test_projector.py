"""The projector against real Kafka and PostgreSQL: dead letters, kills, rebalances, rebuild."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord

from loomflow.processors import Projector
from loomflow.producers import EventProducer, scope_key
from loomflow.runtime import Scope
from loomflow.schemas import Checkpoint, Message, TurnAppended
from loomflow.schemas.events import MAX_EVENT_BYTES, TurnAppendedPayload
from tests.support.kafka_env import ROOT, KafkaEnv, ProcessorProcess, session_events, topic_configs
from tests.support.readmodel import fold_of, in_postgres, log_events, read_records
from tests.support.scenario import Research
from tests.support.waiting import eventually

pytestmark = pytest.mark.kafka


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    made = await KafkaEnv.create(partitions=3)
    yield made
    await made.close()


async def test_bad_records_are_dead_lettered_and_processing_goes_on(env: KafkaEnv) -> None:
    await env.start_projector()
    producer = EventProducer(env.bootstrap, env.topics)
    good = session_events("s1", passes=2)
    key = scope_key(None, "s1")
    await producer.send(good[:1])
    huge = TurnAppended(
        session_id="s1",
        run_id="r",
        seq=2,
        epoch=1,
        payload=TurnAppendedPayload(messages=[Message.user("x" * (MAX_EVENT_BYTES + 10))]),
    )
    stale = good[1].model_copy(update={"epoch": 0})
    bad = [
        (b"{not json", key),
        (b'{"type": "martian.landed", "session_id": "s1"}', key),
        (huge.model_dump_json().encode(), key),
        (good[1].model_dump_json().encode(), scope_key(None, "someone-else")),
        (stale.model_dump_json().encode(), key),
    ]
    for raw, record_key in bad:
        await producer.send_raw(env.topics.events, raw, key=record_key)
    await producer.send(good[1:])
    await producer.stop()
    await eventually(env.caught_up, what="the projector to pass every record")

    runtime = env.runtime()
    state = await runtime.restore(Scope("s1"))
    assert state is not None and state.turns == 2 and len(state.messages) == 4
    await runtime.close()

    conn = await asyncpg.connect(env.dsn)
    try:
        letters = await conn.fetch(
            f'SELECT reason, error_type FROM "{env.schema}".dead_letters ORDER BY id'
        )
    finally:
        await conn.close()
    reasons = [r["reason"] for r in letters]
    assert len(reasons) == 5, reasons
    # the wrong-scope record sits on another partition: compare without order
    for expected in ("Invalid JSON", "martian.landed", "exceeds", "not the scope", "older than"):
        assert sum(expected in reason for reason in reasons) == 1, (expected, reasons)
    refused = [r for r in letters if "older than" in r["reason"]]
    assert refused[0]["error_type"] == "StaleWriterError"

    dlq = AIOKafkaConsumer(
        env.topics.dlq, bootstrap_servers=env.bootstrap, auto_offset_reset="earliest"
    )
    await dlq.start()
    try:
        seen: list[str] = []

        async def read_dlq() -> bool:
            for records in (await dlq.getmany(timeout_ms=200)).values():
                seen.extend(dict(r.headers)["reason"].decode() for r in records)
            return len(seen) >= 5

        await eventually(read_dlq, what="five dead letters on the DLQ topic")
    finally:
        await dlq.stop()
    assert sorted(seen) == sorted(reasons)


async def test_rebuild_equals_the_live_read_model(env: KafkaEnv, tmp_path: Path) -> None:
    await env.start_projector()
    runtime = env.runtime(max_checkpoints_per_session=2)
    research = Research(passes=3)
    await research.agent(runtime).run("Research.", session_id="a", user_id="alice")
    await research.agent(runtime).run("Research.", session_id="b")
    metas = await research.agent(runtime).list_checkpoints("b")
    await (
        Research(passes=3)
        .agent(runtime)
        .resume("fork", session_id="b", from_checkpoint=metas[-1].checkpoint_id)
    )
    await runtime.store.erase("a", user_id="alice")
    producer = EventProducer(env.bootstrap, env.topics)
    await producer.send_raw(env.topics.events, b"{junk", key=b"/b")
    await producer.stop()
    await eventually(env.caught_up, what="the live projection")
    await runtime.close()

    rebuilt = f"{env.schema}_rb"
    env.extra_schemas.append(rebuilt)
    result = await _rebuild(env, rebuilt)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"rebuilt {rebuilt}" in result.stdout

    live = await in_postgres(env.dsn, env.schema)
    assert live == await in_postgres(env.dsn, rebuilt)
    assert live == await fold_of(await log_events(env.bootstrap, env.topics))
    assert len(live) == 3 and live[("alice", "a")]["session"]["status"] == "erased"

    again = await _rebuild(env, rebuilt)
    assert again.returncode == 1 and "already holds a read model" in again.stdout


def _share_all(a: Projector, b: Projector) -> bool:
    """Whether two workers each hold partitions, none twice, together all three."""
    mine, theirs = a.assignment(), b.assignment()
    return bool(mine and theirs and not mine & theirs and mine | theirs == {0, 1, 2})


async def test_two_workers_share_partitions_and_survive_a_restart(env: KafkaEnv) -> None:
    first = await env.start_projector()
    second = await env.start_projector()
    await eventually(
        lambda: _share_all(first, second), what="both workers to hold disjoint partitions"
    )

    producer = EventProducer(env.bootstrap, env.topics)
    for n in range(20):
        await producer.send(session_events(f"before-{n}", passes=3))
    await env.stop_projector(second)
    for n in range(20):
        await producer.send(session_events(f"during-{n}", passes=3))
    await eventually(lambda: first.assignment() == {0, 1, 2}, what="the rebalance to the survivor")
    third = await env.start_projector()
    for n in range(20):
        await producer.send(session_events(f"after-{n}", passes=3))
    await producer.stop()
    await eventually(env.caught_up, what="the workers to catch up")
    await eventually(
        lambda: _share_all(first, third), what="the restarted worker to take its share"
    )
    expected = await fold_of(await log_events(env.bootstrap, env.topics))
    assert len(expected) == 60
    assert await in_postgres(env.dsn, env.schema) == expected


async def _rebuild(env: KafkaEnv, schema: str) -> subprocess.CompletedProcess[str]:
    """``loomflow rebuild --schema SCHEMA`` in its own process, configured like ``env``."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "loomflow.cli", "rebuild", "--schema", schema],
        env=dict(os.environ, **env.variables(), PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _some_progress(env: KafkaEnv) -> bool:
    return sum((await env.positions()).values()) > 0


async def test_a_kafka_agent_killed_mid_run_resumes_elsewhere_without_repeats(
    env: KafkaEnv, tmp_path: Path
) -> None:
    await env.start_projector()
    log = tmp_path / "calls.log"
    victim = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.crash_worker",
        str(tmp_path / "unused.db"),
        "s1",
        str(log),
        "--hang-at",
        "8",
        "--kafka",
        env=dict(os.environ, **env.variables(), PYTHONPATH=str(ROOT)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert victim.stdout is not None
        line = await asyncio.wait_for(victim.stdout.readline(), 90)
        assert line.decode().strip() == "HANGING"
    finally:
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
    assert victim.returncode == -signal.SIGKILL

    runtime = env.runtime()
    research = Research(passes=3)
    result = await research.agent(runtime).resume(session_id="s1")
    await runtime.close()
    killed_run = Counter(log.read_text().splitlines())
    resumed = [
        sum(1 for m in request if m.role.value == "assistant")
        for request in research.models[-1].inner.calls
    ]
    assert resumed == [7, 8]
    assert all(killed_run[f"model {turn}"] == 1 for turn in range(8))
    for name, count in research.tool_runs.items():
        assert killed_run[f"tool {name}"] + count == 1, name
    assert result.turns == 9 and result.restored_turns == 7


def _named(dsn: str, application_name: str) -> str:
    """``dsn`` whose connections report ``application_name`` in pg_stat_activity."""
    parts = urlsplit(dsn)
    query = "&".join(q for q in (parts.query, f"application_name={application_name}") if q)
    return urlunsplit(parts._replace(query=query))


async def test_a_lost_database_connection_is_retried_without_loss_or_duplicates(
    env: KafkaEnv,
) -> None:
    # the projector's pool is told apart by its application name: the database is shared,
    # and only this projector's connections are cut
    name = f"lf-test-projector-{env.tag}"
    settings = env.settings.model_copy(update={"postgres_dsn": _named(env.dsn, name)})
    projector = Projector(settings, poll_ms=20, session_timeout_ms=6_000, heartbeat_interval_ms=500)
    await projector.start()
    stop = asyncio.Event()
    env.running.append((projector, stop, asyncio.create_task(projector.run(stop))))
    producer = EventProducer(env.bootstrap, env.topics)
    await producer.send([e for n in range(100) for e in session_events(f"a{n}", passes=5)])
    await eventually(lambda: _some_progress(env), what="a first committed batch")

    conn = await asyncpg.connect(env.dsn)
    try:  # cut every connection of the projector's pool, mid-run
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1",
            name,
        )
    finally:
        await conn.close()
    assert killed >= 1
    await producer.send([e for n in range(100) for e in session_events(f"b{n}", passes=5)])
    await producer.stop()

    await eventually(env.caught_up, what="the projector to recover and catch up")
    expected = await fold_of(await log_events(env.bootstrap, env.topics))
    assert len(expected) == 200
    assert await in_postgres(env.dsn, env.schema) == expected
    assert projector.dead_lettered == 0


def _poison(env: KafkaEnv) -> list[tuple[bytes | None, bytes | None, str]]:
    """(value, key, why) of records a fuzzer or a broken producer may put on the topic."""
    key = scope_key(None, "s1")
    valid = session_events("s1", passes=1)[0].model_dump_json()
    huge_epoch = valid.replace('"epoch":1', f'"epoch":{2**70}').encode()
    return [
        (None, key, "a null value (a tombstone)"),
        (b"\xff\xfe\x00 not UTF-8", key, "bytes that are not UTF-8"),
        (b'{"type": "run.started", "session_id": "s1\x00"}', key, "a raw NUL byte"),
        (valid.replace('"r"', '"r\\u0000"').encode(), key, "an escaped NUL in an id"),
        (b"[" * 5000, key, "nesting past any parser's limit"),
        (b"null", key, "JSON null"),
        (b'["an", "array"]', key, "a JSON array"),
        (b"{}", key, "an object without a type"),
        (huge_epoch, key, "an epoch PostgreSQL cannot hold"),
        (valid.encode(), None, "a valid event without a key"),
        (b"x" * (MAX_EVENT_BYTES + 10), key, "an oversized record"),
    ]


async def test_nothing_on_the_topic_stops_the_processor(env: KafkaEnv) -> None:
    """Each poison record is dead-lettered with its bytes; the partition moves on."""
    victim = env.processor_process()  # `loomflow processor`, as it runs in production
    try:
        producer = EventProducer(env.bootstrap, env.topics)
        poison = _poison(env)
        for value, key, _ in poison:
            await producer.send_raw(env.topics.events, value, key=key)
        # then a valid session on the same partition, with a NUL in a message
        good = session_events("s1", passes=3)
        nul = TurnAppended(
            session_id="s1",
            run_id="r",
            seq=len(good) + 1,
            epoch=1,
            payload=TurnAppendedPayload(messages=[Message.user("before\x00after")]),
        )
        await producer.send([*good, nul])
        await producer.stop()
        await eventually(env.caught_up, within=90, what="the processor to pass it all")
        assert victim.poll() is None, victim.output()[-3000:]
    finally:
        err = victim.stop()
    assert "Traceback" not in err, err

    runtime = env.runtime()
    state = await runtime.restore(Scope("s1"))
    await runtime.close()
    assert state is not None and state.turns == 3
    assert state.messages[-1].content == "before\x00after"

    conn = await asyncpg.connect(env.dsn)
    try:
        letters = await conn.fetch(
            f'SELECT record, record_key, null_value, reason FROM "{env.schema}".dead_letters '
            "ORDER BY id"
        )
    finally:
        await conn.close()

    # the keyless record lands on any partition: compare without order
    def kept(value: bytes | None, key: bytes | None, null: bool) -> tuple[bytes, bytes, bool]:
        return value or b"", key or b"", null

    stored = sorted(kept(r["record"], r["record_key"], r["null_value"]) for r in letters)
    assert stored == sorted(kept(v, k, v is None) for v, k, _ in poison)
    assert [r["null_value"] for r in letters if r["record"] is None] == [True]  # null stays null
    assert all(r["reason"] for r in letters)

    dlq = AIOKafkaConsumer(
        env.topics.dlq,
        bootstrap_servers=env.bootstrap,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_EVENT_BYTES + 128 * 1024,
    )
    await dlq.start()
    try:
        seen: list[tuple[bytes, bool]] = []

        async def read_dlq() -> bool:
            for records in (await dlq.getmany(timeout_ms=200)).values():
                seen.extend((r.value, "null_value" in dict(r.headers)) for r in records)
            return len(seen) >= len(poison)

        await eventually(read_dlq, what="every poison record on the DLQ topic")
    finally:
        await dlq.stop()
    expected = [(v or b"", v is None) for v, _, _ in poison]
    assert sorted(seen) == sorted(expected)

    # a rebuild of the same log dead-letters the same records and ends
    rebuilt = f"{env.schema}_rb"
    env.extra_schemas.append(rebuilt)
    result = await _rebuild(env, rebuilt)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(poison)} dead-lettered" in result.stdout
    assert await in_postgres(env.dsn, rebuilt) == await in_postgres(env.dsn, env.schema)


async def test_each_sessions_latest_checkpoint_is_published_whole(env: KafkaEnv) -> None:
    """The compacted snapshots topic ends with every session's latest checkpoint, as a
    Checkpoint equal to what the runtime reads, keyed by scope; a flush does not wait for
    the interval."""
    projector = await env.start_projector(snapshot_interval=3600)
    runtime = env.runtime()
    scopes = [Scope("a"), Scope("b", "alice")]
    keys = {scope: scope_key(scope.user_id, scope.session_id) for scope in scopes}
    records: list[ConsumerRecord] = []

    async def each_latest_published() -> bool:
        # a run returns once its checkpoints are projected; they are due for publishing
        # a moment later, so a flush may come before the newest
        await asyncio.wait_for(projector.snapshots_published(), 30)
        records[:] = await read_records(env.bootstrap, env.topics.snapshots, env.topics.partitions)
        latest = {record.key: record.value for record in records}  # what compaction keeps
        for scope in scopes:
            value = latest.get(keys[scope])
            expected = await runtime.get_checkpoint(scope)
            if value is None or Checkpoint.model_validate_json(value) != expected:
                return False
        return True

    for scope in scopes:
        agent = Research(passes=3).agent(runtime)
        await agent.run("Research.", session_id=scope.session_id, user_id=scope.user_id)
    await eventually(each_latest_published, what="both sessions' latest checkpoints")
    before = len(records)
    await Research(passes=4).agent(runtime).resume(session_id="a")  # a newer checkpoint
    await eventually(each_latest_published, what="session a's newer checkpoint")
    assert runtime.settings.snapshots_topic == env.topics.snapshots
    assert {r.key for r in records} == set(keys.values()) and len(records) > before
    latest = {record.key: record.value for record in records}
    turns = [Checkpoint.model_validate_json(latest[keys[s]] or b"").turn for s in scopes]
    assert turns == [12, 9]
    await runtime.close()

    configs = await topic_configs(env.bootstrap, env.topics.snapshots)
    assert configs[env.topics.snapshots]["cleanup.policy"] == "compact"


async def test_the_processor_app_runs_under_fausts_own_command(env: KafkaEnv) -> None:
    """``faust -A loomflow.processors.app worker --without-web``, as the README names it:
    a run's return waits for the processor, so it returns only if that app projects."""
    faust = ProcessorProcess(
        env.variables(),
        argv=[
            str(Path(sys.executable).parent / "faust"),
            "-A",
            "loomflow.processors.app",
            "worker",
            "--without-web",
            "--loglevel",
            "warn",
        ],
    )
    try:
        runtime = env.runtime()
        try:
            result = await Research(passes=2).agent(runtime).run("Research.", session_id="s1")
            listed = await runtime.store.list_checkpoints(Scope("s1"), 10)
        finally:
            await runtime.close()
        assert result.turns == 6 and len(listed) == 2
        assert faust.poll() is None, faust.output()[-3000:]
    finally:
        out = faust.stop()
    assert "Traceback" not in out, out[-3000:]
