"""Projector benchmark: events/s into PostgreSQL, and end-to-end lag at a steady rate.

    .venv/bin/python -m bench.processor [--events 100000] [--workers 1,2] [--reps 3]
                                        [--lag-rate 1000] [--lag-seconds 20]
                                        [--cases throughput,ceiling,lag,single] [--json out.json]
                                        [--profile DIR] [--signatures off,require]

Needs LOOMFLOW_KAFKA_BOOTSTRAP and LOOMFLOW_POSTGRES_DSN (``dev/services.sh start``).

throughput: N events (sessions of run.started, per pass two turn.appended with ~1 KB and
~0.4 KB of messages and a checkpoint.written, then run.finished; many sessions at once)
are produced into a fresh 6-partition events topic with ``EventProducer``. Then W projector
workers, each its own process with ``loomflow processor``'s Projector defaults, join one
group on an empty schema; once every partition is assigned they are told to go, and the
clock runs until the committed positions (heard on the NOTIFY channel) reach the end
offsets. CPU seconds of the workers, of every PostgreSQL process and of the Kafka broker
(from /proc) over the same interval tell where the time goes.

signatures (``--signatures off,require``: each throughput case once per mode): with
``require`` the events are signed before they are produced (a writer's key made by
``loomflow keys new``, ``Signer.sign_event``, outside the clock) and the workers get
LOOMFLOW_KEYRING and LOOMFLOW_SIGNATURES=require in their environment, as a deployment
that signs gives its processors: each worker checks every event's signature. With
``off`` (the default) the workers' environment has no signing setting at all.
``require-threads<N>``: ``require`` with LOOMFLOW_SIGNATURE_THREADS=N in the workers'
environment (the threads that check a batch's signatures beside the loop's; ``require``
alone takes the setting's default).

lag: one worker runs; events are produced one append at a time at a steady rate, and
each event's lag is the time from its produce acknowledgement (acks=all) to the NOTIFY
of the position committed past it.

single: one worker runs; one event is produced at a time, and the next only once the
NOTIFY of the position past it was heard (as a runtime waits for its claim on an idle
projector): latency from the send and from the ack to that NOTIFY.

Every measurement runs in a fresh coordinator process (which starts fresh workers) on
its own topics and schema, both deleted at the end; this parent schedules them and prints
the median and (min-max) over repetitions. The coordinator's own garbage collector is off
while a case's clock runs (``measuring_window``): its pauses would count as the
projector's time.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import cProfile
import gc
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import (
    SYSTEM_PROMPT,
    cpu_seconds_by_command,
    loomflow_command,
    own_env,
    pass_content,
    percentile,
)

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 6
PASSES = 10  # per session: 1 + 3 * PASSES + 1 events
ACTIVE_SESSIONS = 300  # sessions whose events interleave in the log at any time
RETAIN = 20  # the runtimes' default retention
READY_TIMEOUT_S = 90.0
DONE_TIMEOUT_S = 900.0
CHILD_TIMEOUT_S = 1200
DASH = "\u2013"
#: the settings of signatures: a worker's come from its case alone
SIGNING_VARS = (
    "LOOMFLOW_SIGNING_KEY_FILE",
    "LOOMFLOW_SIGNING_KEY",
    "LOOMFLOW_KEYRING",
    "LOOMFLOW_SIGNATURES",
    "LOOMFLOW_SIGNATURE_THREADS",
)
#: ``require-threads<N>``: ``require`` with LOOMFLOW_SIGNATURE_THREADS=N
SIGNATURE_MODES = re.compile(r"off|require(-threads\d+)?")


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"{name} is not set: run `dev/services.sh start` and export what it prints")
    return value


# -- the events ---------------------------------------------------------------------------


def session_events(index: int, passes: int = PASSES) -> list[Any]:
    """One agent run as its events: the checkpoint workload's passes, one run."""
    from loomflow.schemas import (
        CheckpointWritten,
        Message,
        RunFinished,
        RunStarted,
        ToolCall,
        TurnAppended,
        Usage,
    )
    from loomflow.schemas.events import (
        CheckpointWrittenPayload,
        RunFinishedPayload,
        TurnAppendedPayload,
    )

    common = {
        "user_id": f"user-{index % 97:02d}",
        "session_id": f"sess-{index:07d}",
        "run_id": f"run-{index:07d}",
        "epoch": 1,
    }
    events: list[Any] = [RunStarted(seq=1, **common)]
    events.append(
        TurnAppended(
            seq=2, payload=TurnAppendedPayload(messages=[Message.system(SYSTEM_PROMPT)]), **common
        )
    )
    usage, count = Usage(), 1
    for k in range(1, passes + 1):
        c = pass_content(index, k)
        call = ToolCall(id=c.call_id, name=c.tool_name, arguments=c.tool_args)
        turn_usage = Usage(input_tokens=c.input_tokens, output_tokens=c.output_tokens)
        usage = usage + turn_usage
        model_turn = TurnAppendedPayload(
            messages=[Message.user(c.user), Message.assistant(c.assistant, [call])],
            usage=turn_usage,
            model_call=True,
        )
        tool_turn = TurnAppendedPayload(messages=[Message.tool(c.call_id, c.tool_result)])
        count += 3
        checkpoint = CheckpointWrittenPayload(
            checkpoint_id=f"ckpt-{index:07d}-{k:03d}",
            turn=k,
            cumulative_usage=usage,
            cursor=f"pass:{k}",
            message_count=count,
            retain=RETAIN,
        )
        events.append(TurnAppended(seq=len(events) + 1, payload=model_turn, **common))
        events.append(TurnAppended(seq=len(events) + 1, payload=tool_turn, **common))
        events.append(CheckpointWritten(seq=len(events) + 1, payload=checkpoint, **common))
    finished = RunFinishedPayload(output="done", turns=passes, usage=usage)
    events.append(RunFinished(seq=len(events) + 1, payload=finished, **common))
    return events


def event_stream(
    total: int, active: int = ACTIVE_SESSIONS, first: int = 0
) -> tuple[list[Any], int]:
    """``total`` events of many sessions, ``active`` of them interleaved at a time.

    Sessions are numbered from ``first``; every one keeps a gapless prefix of its events
    (the last ones may be cut short). Returns the events and how many sessions they touch.
    """
    out: list[Any] = []
    index = first
    while len(out) < total:
        cohort = [session_events(index + i) for i in range(active)]
        index += active
        for j in range(max(len(s) for s in cohort)):
            out.extend(s[j] for s in cohort if j < len(s))
    out = out[:total]
    return out, len({e.session_id for e in out})


# -- services: topics, schema, CPU of the other processes -----------------------------------


class Env:
    """One measurement's own topics, schema and consumer group."""

    def __init__(self, snapshots: bool = True, tag: str | None = None) -> None:
        from loomflow.producers import Topics
        from loomflow.settings import Settings

        #: whether workers publish the latest checkpoints to the snapshots topic (default)
        self.snapshots = snapshots
        self.tag = tag or secrets.token_hex(4)
        self.settings = Settings(
            kafka_bootstrap=_env("LOOMFLOW_KAFKA_BOOTSTRAP"),
            postgres_dsn=_env("LOOMFLOW_POSTGRES_DSN"),
            db_schema=f"lf_bench_proc_{self.tag}",
            topic_prefix=f"lf-bench-proc-{self.tag}",
            topic_partitions=PARTITIONS,
            processor_id=f"lf-bench-proc-{self.tag}",
        )
        self.bootstrap = self.settings.kafka_bootstrap
        self.dsn = self.settings.postgres_dsn
        self.topics = Topics.from_settings(self.settings)
        self.schema = self.settings.db_schema
        self.group = self.settings.projector_group

    async def create(self) -> None:
        from loomflow.producers import ensure_topics

        await ensure_topics(self.bootstrap, self.topics)

    async def drop(self) -> None:
        import asyncpg
        from aiokafka.admin import AIOKafkaAdminClient

        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            await conn.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            t = self.topics
            await admin.delete_topics([t.events, t.snapshots, t.dlq])
        finally:
            await admin.close()

    async def counts(self) -> dict[str, int]:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            out = {}
            for table in ("events", "sessions", "checkpoints", "dead_letters"):
                out[table] = int(
                    await conn.fetchval(f'SELECT count(*) FROM "{self.schema}".{table}')
                )
        finally:
            await conn.close()
        return out

    def worker_argv(self, expect: int, profile: Path | None, index: int) -> list[str]:
        argv = [sys.executable, "-m", "bench.processor", "--role", "worker"]
        if not self.snapshots:
            argv.append("--no-snapshots")
        argv += ["--tag", self.tag]
        argv += ["--expect", str(expect)]
        if profile is not None:
            argv += ["--profile", str(profile / f"worker-{self.tag}-{index}.pstats")]
        return argv


class PositionWatch:
    """Committed positions of one group on one topic, as the NOTIFY channel tells them."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.seen: dict[int, list[tuple[int, float]]] = {}  # partition -> (next offset, time)
        self.want: dict[int, int] = {}
        self.reached = asyncio.Event()
        self.conn: Any = None

    async def start(self) -> None:
        import asyncpg

        from loomflow.projections import postgres as pg

        self.conn = await asyncpg.connect(self.env.dsn)
        await self.conn.add_listener(pg.positions_channel(self.env.schema), self._heard)

    def _heard(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        now = time.perf_counter()
        group, topic, partition, next_offset = payload.rsplit(":", 3)
        if group != self.env.group or topic != self.env.topics.events:
            return
        self.seen.setdefault(int(partition), []).append((int(next_offset), now))
        self._check()

    def expect(self, want: dict[int, int]) -> None:
        """Set ``reached`` once every partition's position is at least ``want``'s."""
        self.want = dict(want)
        self.reached.clear()
        self._check()

    def _check(self) -> None:
        if self.want and all(
            self.seen.get(p) and self.seen[p][-1][0] >= o for p, o in self.want.items()
        ):
            self.reached.set()

    def committed_at(self, partition: int, offset: int) -> float | None:
        """When a position past ``offset`` was first committed, or None."""
        heard = self.seen.get(partition, [])
        i = bisect.bisect_right([o for o, _ in heard], offset)
        return heard[i][1] if i < len(heard) else None

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


class Workers:
    """Projector worker processes, driven over their stdin and stdout."""

    def __init__(
        self,
        env: Env,
        count: int,
        profile: Path | None,
        signing: dict[str, str] | None = None,
    ) -> None:
        self.env, self.count, self.profile = env, count, profile
        #: the signing settings of the workers' environment (none: they check nothing)
        self.signing = signing or {}
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> list[list[int]]:
        """Start them and return each one's partitions once all are assigned."""
        expect = PARTITIONS // self.count
        for i in range(self.count):
            argv = self.env.worker_argv(expect, self.profile, i)
            environment = {k: v for k, v in os.environ.items() if k not in SIGNING_VARS}
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=REPO,
                env={**environment, **self.signing},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            self.procs.append(proc)
        ready = await asyncio.wait_for(
            asyncio.gather(*(self._read(p) for p in self.procs)), READY_TIMEOUT_S
        )
        assigned = [r["ready"] for r in ready]
        union = sorted(p for a in assigned for p in a)
        if union != list(range(PARTITIONS)):
            raise RuntimeError(f"workers were assigned {assigned}, not each partition once")
        return assigned

    async def _read(self, proc: asyncio.subprocess.Process) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a worker exited early (code {await proc.wait()})")
            if line.startswith(b"{"):
                result: dict[str, Any] = json.loads(line)
                return result

    async def tell(self, word: str) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(word.encode() + b"\n")
            await proc.stdin.drain()

    async def flush(self) -> list[dict[str, Any]]:
        """Have every worker publish its due snapshots now; return when all have."""
        await self.tell("flush")
        return await asyncio.wait_for(
            asyncio.gather(*(self._read(p) for p in self.procs)), READY_TIMEOUT_S
        )

    async def stop(self) -> list[dict[str, Any]]:
        await self.tell("stop")
        reports = await asyncio.wait_for(
            asyncio.gather(*(self._read(p) for p in self.procs)), READY_TIMEOUT_S
        )
        for proc in self.procs:
            await proc.wait()
        self.procs = []
        return reports

    def kill(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()


# -- coordinator: throughput ----------------------------------------------------------------


def latest_checkpoints(events: Sequence[Any]) -> dict[bytes, str]:
    """record key -> the id of the session's last checkpoint in ``events``."""
    from loomflow.producers import scope_key

    latest: dict[bytes, str] = {}
    for event in events:
        if event.type == "checkpoint.written":
            latest[scope_key(event.user_id, event.session_id)] = event.payload.checkpoint_id
    return latest


async def check_snapshots(env: Env, latest: dict[bytes, str]) -> list[str]:
    """Problems with the snapshots topic: each session's last record must be its latest
    checkpoint, whole (it validates as a Checkpoint)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from loomflow.schemas import Checkpoint
    from loomflow.schemas.events import MAX_EVENT_BYTES

    consumer = AIOKafkaConsumer(
        bootstrap_servers=env.bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_EVENT_BYTES + 64 * 1024,
    )
    await consumer.start()
    found: dict[bytes, bytes] = {}
    try:
        partitions = [TopicPartition(env.topics.snapshots, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            while await consumer.position(tp) < ends[tp]:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    found[record.key] = record.value
    finally:
        await consumer.stop()
    problems = []
    if set(found) != set(latest):
        problems.append(f"snapshots of {len(found)} sessions, {len(latest)} checkpointed")
    stale = [k for k, cid in latest.items() if k in found and cid not in found[k][:200].decode()]
    if stale:
        problems.append(f"{len(stale)} sessions' last snapshot is not their latest checkpoint")
    for value in list(found.values())[:50]:
        Checkpoint.model_validate_json(value)  # raises if a snapshot is not a checkpoint
    return problems


async def ceiling(total: int) -> dict[str, Any]:
    """The raw ceiling on this machine: aiokafka getmany + binary COPY of the records and an
    upsert of the partition's position, one transaction per partition batch, no decoding.
    """
    import gc

    import asyncpg
    from aiokafka import AIOKafkaConsumer, TopicPartition

    env = Env()
    await env.create()
    conn = await asyncpg.connect(env.dsn)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=env.bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=2**23
    )
    try:
        events, _ = event_stream(total)
        ends, _ = await produce_all(env, events)
        del events
        gc.collect()
        s = f'"{env.schema}"'
        await conn.execute(
            f"CREATE SCHEMA {s}; CREATE TABLE {s}.raw (p int, o bigint, k bytea, v bytea); "
            f"CREATE TABLE {s}.pos (p int PRIMARY KEY, o bigint)"
        )
        await consumer.start()
        partitions = [TopicPartition(env.topics.events, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        done = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while done < total:
            for tp, records in (await consumer.getmany(timeout_ms=100, max_records=2000)).items():
                async with conn.transaction():
                    await conn.copy_records_to_table(
                        "raw",
                        schema_name=env.schema,
                        records=[(tp.partition, r.offset, r.key, r.value) for r in records],
                    )
                    await conn.execute(
                        f"INSERT INTO {s}.pos VALUES ($1, $2) ON CONFLICT (p) "
                        "DO UPDATE SET o = excluded.o",
                        tp.partition,
                        records[-1].offset + 1,
                    )
                done += len(records)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    finally:
        await consumer.stop()
        await conn.close()
        await env.drop()
    del ends
    return {
        "events": total,
        "seconds": seconds,
        "events_per_s": total / seconds,
        "cpu_us": cpu / total * 1e6,
        "ok": True,
        "problems": [],
    }


async def produce_all(env: Env, events: list[Any]) -> tuple[dict[int, int], float]:
    """Append every event; return each partition's end offset and the seconds it took."""
    from loomflow.producers import EventProducer

    producer = EventProducer(env.bootstrap, env.topics)
    await producer.start()
    ends: dict[int, int] = {}
    started = time.perf_counter()
    try:
        for i in range(0, len(events), 2000):
            for position in await producer.send(events[i : i + 2000]):
                ends[position.partition] = max(ends.get(position.partition, 0), position.offset + 1)
    finally:
        await producer.stop()
    return ends, time.perf_counter() - started


def signing_keys(directory: Path) -> tuple[Any, dict[str, str]]:
    """A writer's key made as a user makes it (``loomflow keys new``), and the settings
    a worker that requires its signatures is given."""
    from loomflow.settings import Settings

    key, keyring = directory / "writer.pem", directory / "keyring.json"
    subprocess.run(
        [*loomflow_command(), "keys", "new", str(key), "--keyring", str(keyring)],
        check=True,
        capture_output=True,
        env=own_env({k: v for k, v in os.environ.items() if k not in SIGNING_VARS}),
    )
    signer = Settings(signing_key_file=key).signer()
    return signer, {"LOOMFLOW_KEYRING": str(keyring), "LOOMFLOW_SIGNATURES": "require"}


@contextlib.contextmanager
def measuring_window() -> Iterator[None]:
    """The clock of a case, run with this coordinator's garbage collector off.

    The coordinator stands in for the agents that append and for the reader that hears
    each NOTIFY; its own pauses are not the projector's. Its full collections (of the
    ~20,000 events and tasks of the lag case) paused it 300-360 ms, gc.callbacks showed
    (2026-12-05), and every event in flight counted the pause as lag: the lag max, and
    most of the p99 above 25 ms. The workers keep the collector ``loomflow processor``
    runs with. A collection before the window clears what building the events left.
    """
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def throughput(
    total: int, workers: int, profile: Path | None, snapshots: bool, signatures: str = "off"
) -> dict[str, Any]:
    import tempfile

    # the keys before the topics: nothing is left on the servers if they cannot be made
    signed = signatures.startswith("require")
    threads = signatures.removeprefix("require-threads") if "-threads" in signatures else None
    keys = tempfile.TemporaryDirectory(prefix="lf-bench-proc-keys-")
    try:
        signer, signing = signing_keys(Path(keys.name)) if signed else (None, {})
        if threads is not None:
            signing["LOOMFLOW_SIGNATURE_THREADS"] = threads
    except BaseException:
        keys.cleanup()
        raise
    env = Env(snapshots)
    await env.create()
    crew = Workers(env, workers, profile, signing)
    watch = PositionWatch(env)
    sign_s = 0.0
    try:
        built = time.perf_counter()
        events, sessions = event_stream(total)
        latest = latest_checkpoints(events)
        build_s = time.perf_counter() - built
        if signer is not None:
            began = time.perf_counter()
            events = [signer.sign_event(e) for e in events]
            sign_s = time.perf_counter() - began
        sample = events[:: max(1, len(events) // 2000)]
        mean_bytes = statistics.fmean(len(e.model_dump_json()) for e in sample)
        ends, produce_s = await produce_all(env, events)
        del events

        assigned = await crew.start()
        await watch.start()
        watch.expect(ends)
        with measuring_window():
            cpu0 = cpu_seconds_by_command()
            t0 = time.perf_counter()
            await crew.tell("go")
            await asyncio.wait_for(watch.reached.wait(), DONE_TIMEOUT_S)
            projected = time.perf_counter()
            if env.snapshots:
                await crew.flush()  # the clock stops once the snapshots are out too
            t1 = time.perf_counter()
            cpu1 = cpu_seconds_by_command()
        reports = await crew.stop()
        counts = await env.counts()
        snapshot_problems = await check_snapshots(env, latest) if env.snapshots else []
    finally:
        crew.kill()
        await watch.close()
        await env.drop()
        keys.cleanup()

    # (time, events) of every commit; a fresh topic's offsets start at 0
    commits = sorted(
        (t, offset - (heard[i - 1][0] if i else 0))
        for heard in watch.seen.values()
        for i, (offset, t) in enumerate(heard)
    )
    first = commits[0][0]
    seconds = t1 - t0
    worker_cpu = sum(r["cpu_s"] for r in reports)
    problems = list(snapshot_problems)
    if counts["events"] != total or counts["dead_letters"]:
        problems.append(f"read model holds {counts}, expected {total} events and no dead letters")
    checked = {r.get("signatures") for r in reports}
    if checked != {"require" if signed else "off"}:
        problems.append(f"workers checked signatures {sorted(map(str, checked))}, not {signatures}")
    return {
        "events": total,
        "snapshot_flush_ms": (t1 - projected) * 1e3,
        "snapshots": sum(r["snapshots"] for r in reports),
        "sessions": sessions,
        "mean_event_bytes": mean_bytes,
        "workers": workers,
        "assigned": assigned,
        "seconds": seconds,
        "events_per_s": total / seconds,
        # from the first commit on: without the first fetch and the consumers' warm-up
        "steady_events_per_s": sum(n for _, n in commits[1:]) / (t1 - first)
        if t1 > first
        else None,
        "first_commit_ms": (first - t0) * 1e3,
        "commits": len(commits),
        "events_per_commit": total / max(1, len(commits)),
        "worker_cpu_us": worker_cpu / total * 1e6,
        "pg_cpu_us": (cpu1["postgres"] - cpu0["postgres"]) / total * 1e6,
        "kafka_cpu_us": (cpu1["java"] - cpu0["java"]) / total * 1e6,
        "worker_cpu_share": worker_cpu / seconds / workers,
        "produce_s": produce_s,
        "produce_per_s": total / produce_s,
        "build_s": build_s,
        "signatures": signatures,
        "sign_s": sign_s,
        "applied": sum(r["applied"] for r in reports),
        "redelivered": sum(r["applied"] for r in reports) - total,
        "ok": not problems,
        "problems": problems,
        "loadavg_1m": os.getloadavg()[0],
    }


# -- coordinator: lag -----------------------------------------------------------------------


async def lag(rate: float, seconds: float, profile: Path | None, snapshots: bool) -> dict[str, Any]:
    from loomflow.producers import EventProducer

    env = Env(snapshots)
    await env.create()
    crew = Workers(env, 1, profile)
    watch = PositionWatch(env)
    producer = EventProducer(env.bootstrap, env.topics)
    total = int(rate * seconds)
    try:
        warmup, _ = event_stream(100, active=10)
        events, sessions = event_stream(total, first=10)  # sessions the warm-up did not touch
        await crew.start()
        await watch.start()
        await crew.tell("go")
        await producer.start()

        # warm-up: metadata, connections, the first fetch; not measured
        ends: dict[int, int] = {}
        for position in await producer.send(warmup):
            ends[position.partition] = max(ends.get(position.partition, 0), position.offset + 1)
        watch.expect(ends)
        await asyncio.wait_for(watch.reached.wait(), 60)

        sent: list[tuple[float, float, int, int]] = []  # send, ack, partition, offset
        # a session's events are handed to the producer in order, as its one writer does
        # (a task each, unordered, let a session's later event reach Kafka first under load)
        writers: dict[str, asyncio.Lock] = {}

        async def append(event: Any) -> None:
            t_send = time.perf_counter()
            async with writers.setdefault(event.session_id, asyncio.Lock()):
                pending = await producer.enqueue([event])
            (position,) = await producer.acked(pending)
            sent.append((t_send, time.perf_counter(), position.partition, position.offset))

        with measuring_window():
            tasks = []
            cpu0 = cpu_seconds_by_command()
            started = time.perf_counter()
            for i, event in enumerate(events):
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(append(event)))
            await asyncio.gather(*tasks)
            produced_s = time.perf_counter() - started
            for _, _, partition, offset in sent:
                ends[partition] = max(ends.get(partition, 0), offset + 1)
            watch.expect(ends)
            await asyncio.wait_for(watch.reached.wait(), 120)
            cpu1 = cpu_seconds_by_command()
        reports = await crew.stop()
        counts = await env.counts()
    finally:
        crew.kill()
        await producer.stop()
        await watch.close()
        await env.drop()

    from_ack, from_send = [], []
    for t_send, t_ack, partition, offset in sent:
        committed = watch.committed_at(partition, offset)
        assert committed is not None, "waited for every position above"
        from_ack.append((committed - t_ack) * 1e3)
        from_send.append((committed - t_send) * 1e3)
    acks = [(t_ack - t_send) * 1e3 for t_send, t_ack, _, _ in sent]
    expected = total + len(warmup)
    problems = []
    if counts["events"] != expected or counts["dead_letters"]:
        problems.append(f"read model holds {counts}, expected {expected} events, no dead letters")
    return {
        "rate": rate,
        "events": total,
        "sessions": sessions,
        "produced_per_s": total / produced_s,
        "lag_p50": percentile(from_ack, 50),
        "lag_p90": percentile(from_ack, 90),
        "lag_p99": percentile(from_ack, 99),
        "lag_max": max(from_ack),
        "negative": sum(1 for v in from_ack if v < 0),
        "send_lag_p50": percentile(from_send, 50),
        "send_lag_p99": percentile(from_send, 99),
        "ack_p50": percentile(acks, 50),
        "ack_p99": percentile(acks, 99),
        "commits": sum(len(h) for h in watch.seen.values()),
        "worker_cpu_share": reports[0]["cpu_s"] / produced_s,
        "pg_cpu_share": (cpu1["postgres"] - cpu0["postgres"]) / produced_s,
        "kafka_cpu_share": (cpu1["java"] - cpu0["java"]) / produced_s,
        "ok": not problems,
        "problems": problems,
        "loadavg_1m": os.getloadavg()[0],
    }


async def single(count: int, profile: Path | None, snapshots: bool) -> dict[str, Any]:
    """One event at a time, as a runtime's claim meets an idle projector: send one event,
    wait for the NOTIFY of the position committed past it (as a runtime waits for its
    claim), then send the next. Each event's latency is from its send, and from its ack,
    to that NOTIFY."""
    from loomflow.producers import EventProducer

    env = Env(snapshots)
    await env.create()
    crew = Workers(env, 1, profile)
    watch = PositionWatch(env)
    producer = EventProducer(env.bootstrap, env.topics)
    try:
        warmup, _ = event_stream(100, active=10)
        events, sessions = event_stream(count, active=20, first=10)
        await crew.start()
        await watch.start()
        await crew.tell("go")
        await producer.start()
        ends: dict[int, int] = {}
        for position in await producer.send(warmup):
            ends[position.partition] = max(ends.get(position.partition, 0), position.offset + 1)
        watch.expect(ends)
        await asyncio.wait_for(watch.reached.wait(), 60)

        with measuring_window():
            timed: list[tuple[float, float, float]] = []  # send, ack, committed
            cpu0 = cpu_seconds_by_command()
            started = time.perf_counter()
            for event in events:
                t_send = time.perf_counter()
                (position,) = await producer.send([event])
                t_ack = time.perf_counter()
                ends[position.partition] = position.offset + 1
                watch.expect(ends)
                await asyncio.wait_for(watch.reached.wait(), 30)
                committed = watch.committed_at(position.partition, position.offset)
                assert committed is not None, "waited for it above"
                timed.append((t_send, t_ack, committed))
            elapsed = time.perf_counter() - started
            cpu1 = cpu_seconds_by_command()
        reports = await crew.stop()
        counts = await env.counts()
    finally:
        crew.kill()
        await producer.stop()
        await watch.close()
        await env.drop()

    from_send = [(c - s) * 1e3 for s, _, c in timed]
    from_ack = [(c - a) * 1e3 for _, a, c in timed]
    acks = [(a - s) * 1e3 for s, a, _ in timed]
    expected = count + len(warmup)
    problems = []
    if counts["events"] != expected or counts["dead_letters"]:
        problems.append(f"read model holds {counts}, expected {expected} events, no dead letters")
    return {
        "events": count,
        "sessions": sessions,
        "send_p50": percentile(from_send, 50),
        "send_p90": percentile(from_send, 90),
        "send_p99": percentile(from_send, 99),
        "ack_p50": percentile(acks, 50),
        "from_ack_p50": percentile(from_ack, 50),
        "from_ack_p90": percentile(from_ack, 90),
        "from_ack_p99": percentile(from_ack, 99),
        "worker_cpu_ms": reports[0]["cpu_s"] / count * 1e3,
        "pg_cpu_ms": (cpu1["postgres"] - cpu0["postgres"]) / count * 1e3,
        "seconds": elapsed,
        "ok": not problems,
        "problems": problems,
        "loadavg_1m": os.getloadavg()[0],
    }


# -- worker -----------------------------------------------------------------------------------


async def worker(args: argparse.Namespace) -> None:
    """One projector, as ``loomflow processor`` configures it; told when to go and stop."""
    from loomflow.processors import Projector
    from loomflow.processors.projector import tune_gc

    class SeekAware(Projector):
        """Knows when the seek of its latest assignment is done.

        The consumer holds its partitions (and may fetch from offset 0) before the
        rebalance listener's seek to the stored positions has finished; a round run in
        that gap applies records that the seek then delivers again. Going only after the
        seek keeps that start-up race out of the figures.
        """

        sought: frozenset[int] = frozenset()

        async def _seek(self, consumer: Any, assigned: Sequence[Any]) -> None:
            await super()._seek(consumer, assigned)
            self.sought = frozenset(tp.partition for tp in assigned)

    projector = SeekAware(Env(tag=args.tag).settings, publish_snapshots=not args.no_snapshots)
    await projector.start()
    tune_gc()  # as `loomflow processor` does once its projector has started
    loop = asyncio.get_running_loop()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(projector.assignment()) != args.expect or (
            projector.assignment() != projector.sought
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"assigned {projector.assignment()}, expected {args.expect}")
            await asyncio.sleep(0.02)
        print(json.dumps({"ready": sorted(projector.assignment())}), flush=True)
        if (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "go":
            raise RuntimeError("told to stop before going")
        stop = asyncio.Event()
        profiler = cProfile.Profile() if args.profile else None
        cpu0 = time.process_time()
        if profiler is not None:
            profiler.enable()
        task = asyncio.create_task(projector.run(stop))
        # "flush": publish every due snapshot now (inside the coordinator's clock), then
        # "stop"; an empty line means the parent is gone
        while (word := (await loop.run_in_executor(None, sys.stdin.readline)).strip()) == "flush":
            await projector.snapshots_published()
            print(json.dumps({"flushed": projector.snapshots}), flush=True)
        del word
        stop.set()
        await task
        cpu = time.process_time() - cpu0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        report = {
            "cpu_s": cpu,
            "applied": projector.applied,
            "dead": projector.dead_lettered,
            "signature_problems": projector.signature_problems,
            "signatures": projector.signatures.mode,
            "snapshots": projector.snapshots,
        }
    finally:
        await projector.stop()
    print(json.dumps(report), flush=True)


# -- parent: scheduling and reporting -----------------------------------------------------------


def run_child(argv: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.processor", *argv]
    try:
        done = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S}s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": f"exit {done.returncode}: {(tail[-1] if tail else 'no output')[:300]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _spread(runs: list[dict[str, Any]], key: str, digits: int = 0) -> str:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "n/a"
    mid = statistics.median(values)
    return f"{_fmt(mid, digits)} ({_fmt(min(values), digits)}{DASH}{_fmt(max(values), digits)})"


def _ok(runs: list[dict[str, Any]], errors: list[str]) -> str:
    oks = sum(1 for r in runs if r["ok"])
    text = "True" if oks == len(runs) else f"False ({oks}/{len(runs)})"
    return text + (f"; {len(errors)} run(s) failed: {errors[0]}" if errors else "")


def _case_table(runs: list[dict[str, Any]], title: str, columns: Any) -> list[str]:
    """A case's section: its title, then the medians (min-max) of its runs that worked."""
    fine = [r for r in runs if "error" not in r]
    errors = sorted({r["error"] for r in runs if "error" in r})
    header = ["n", *(c[0] for c in columns), "ok"]
    if not fine:
        row = ["0", f"could not run: {errors[0] if errors else 'not run'}"]
        return ["", f"## {title}", "", *_table(header, [row])]
    cells = [_spread(fine, k, d) for _, k, d in columns]
    return ["", f"## {title}", "", *_table(header, [[str(len(fine)), *cells, _ok(fine, errors)]])]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]


THROUGHPUT_COLUMNS = (
    ("events/s", "events_per_s", 0),
    ("wall s", "seconds", 2),
    ("steady events/s", "steady_events_per_s", 0),
    ("first commit ms", "first_commit_ms", 0),
    ("events/commit", "events_per_commit", 0),
    ("worker CPU µs/event", "worker_cpu_us", 1),
    ("PostgreSQL CPU µs/event", "pg_cpu_us", 1),
    ("Kafka CPU µs/event", "kafka_cpu_us", 1),
    ("worker CPU busy", "worker_cpu_share", 2),
)
SINGLE_COLUMNS = (
    ("send→commit p50 ms", "send_p50", 2),
    ("p90 ms", "send_p90", 2),
    ("p99 ms", "send_p99", 2),
    ("ack p50 ms", "ack_p50", 2),
    ("ack→commit p50 ms", "from_ack_p50", 2),
    ("p90 ms", "from_ack_p90", 2),
    ("p99 ms", "from_ack_p99", 2),
    ("worker CPU ms/event", "worker_cpu_ms", 2),
    ("PostgreSQL CPU ms/event", "pg_cpu_ms", 2),
)
LAG_COLUMNS = (
    ("produced/s", "produced_per_s", 0),
    ("lag p50 ms", "lag_p50", 1),
    ("lag p90 ms", "lag_p90", 1),
    ("lag p99 ms", "lag_p99", 1),
    ("lag max ms", "lag_max", 1),
    ("send→commit p50 ms", "send_lag_p50", 1),
    ("ack p50 ms", "ack_p50", 1),
    ("commits", "commits", 0),
    ("worker CPU busy", "worker_cpu_share", 2),
    ("PostgreSQL CPU busy", "pg_cpu_share", 2),
)


def report(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]) -> str:
    out: list[str] = []
    through = [k for k in results if k.startswith("throughput")]
    if through:
        out += [f"## throughput: {args.events:,} events already in the topic, one group", ""]
        header = ["workers", "signatures", "n", *(c[0] for c in THROUGHPUT_COLUMNS), "ok"]
        rows = []
        for key in through:
            fine = [r for r in results[key] if "error" not in r]
            errors = sorted({r["error"] for r in results[key] if "error" in r})
            workers, mode = [*key.split(":"), "off"][1:3]
            if not fine:
                reason = errors[0] if errors else "not run"
                rows.append([workers, mode, "0", f"could not run: {reason}"])
                continue
            cells = [_spread(fine, k, d) for _, k, d in THROUGHPUT_COLUMNS]
            rows.append([workers, mode, str(len(fine)), *cells, _ok(fine, errors)])
        out += _table(header, rows)
        everything = [r for k in through for r in results[k] if "error" not in r]
        if everything:
            first = everything[0]
            out += [
                "",
                f"workload: {first['sessions']:,} sessions, {first['mean_event_bytes']:,.0f} B "
                f"per event on average (JSON); produced with EventProducer (acks=all, "
                f"batches of 2,000) at {_spread(everything, 'produce_per_s')} events/s",
            ]
    if "ceiling" in results:
        fine = [r for r in results["ceiling"] if "error" not in r]
        out += [
            "",
            f"## ceiling: aiokafka getmany + binary COPY of {args.events:,} raw records and a "
            "position upsert, one transaction per partition batch, no decoding",
            "",
        ]
        header = ["n", "events/s", "wall s", "CPU µs/event"]
        if fine:
            cells = [
                _spread(fine, "events_per_s"),
                _spread(fine, "seconds", 2),
                _spread(fine, "cpu_us", 1),
            ]
            out += _table(header, [[str(len(fine)), *cells]])
        else:
            errors = sorted({r["error"] for r in results["ceiling"] if "error" in r})
            out += _table(header, [["0", f"could not run: {errors[0] if errors else 'none'}"]])
    if "lag" in results:
        title = (
            f"lag: one worker, {args.lag_rate:,.0f} events/s for {args.lag_seconds:.0f} s, "
            "one append per event"
        )
        out += _case_table(results["lag"], title, LAG_COLUMNS)
        negative = sum(r["negative"] for r in results["lag"] if "error" not in r)
        if negative:
            out.append(f"\n{negative} event(s) were committed before their ack arrived")
    if "single" in results:
        title = (
            f"single: one worker, {args.single_events:,} events one at a time, each sent "
            "once the position past the one before was NOTIFYed"
        )
        out += _case_table(results["single"], title, SINGLE_COLUMNS)
    out += targets(results)
    problems = {p for runs in results.values() for r in runs for p in r.get("problems", [])}
    for problem in sorted(problems)[:5]:
        out.append(f"verification problem: {problem}")
    return "\n".join(out)


def targets(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The issue's targets for one worker, computed from the medians of this run."""

    def median(key: str, field: str) -> float | None:
        values = [r[field] for r in results.get(key, []) if "error" not in r]
        return statistics.median(values) if values else None

    one = median("throughput:1", "events_per_s")
    raw = median("ceiling", "events_per_s")
    p99 = median("lag", "lag_p99")
    lines = ["", "## targets (medians of this run)", ""]

    def line(what: str, value: float | None, goal: str, met: bool | None) -> None:
        shown = "not measured" if value is None else f"{value:,.2f}"
        verdict = "n/a" if met is None else ("met" if met else "MISSED")
        lines.append(f"- {what}: {shown} (target {goal}): {verdict}")

    line("1 worker events/s", one, ">= 20,000", None if one is None else one >= 20_000)
    ratio = None if one is None or not raw else one / raw
    line("1 worker / raw ceiling", ratio, ">= 0.6", None if ratio is None else ratio >= 0.6)
    line("lag p99 ms at the lag rate", p99, "<= 25", None if p99 is None else p99 <= 25)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--role",
        default="parent",
        choices=("parent", "throughput", "ceiling", "lag", "single", "worker"),
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workers", default="1,2", help="throughput cases, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lag-rate", type=float, default=1000.0)
    parser.add_argument("--lag-seconds", type=float, default=20.0)
    parser.add_argument("--single-events", type=int, default=500)
    parser.add_argument("--cases", default="throughput,ceiling,lag,single")
    parser.add_argument("--json", type=Path, help="write every run's raw results here")
    parser.add_argument("--profile", type=Path, help="cProfile each worker into this directory")
    parser.add_argument(
        "--signatures",
        default="off",
        help="throughput cases: comma-separated of off, require (the events signed and "
        "every signature checked by the workers), require-threads<N> (require with "
        "LOOMFLOW_SIGNATURE_THREADS=N)",
    )
    parser.add_argument(
        "--no-snapshots",
        action="store_true",
        help="workers do not publish snapshots (Projector(publish_snapshots=False)); "
        "to see what publishing costs",
    )
    # worker
    parser.add_argument("--tag", help="names the topics, schema and group of one measurement")
    parser.add_argument("--expect", type=int)
    args = parser.parse_args()
    _env("LOOMFLOW_KAFKA_BOOTSTRAP")
    _env("LOOMFLOW_POSTGRES_DSN")
    if args.profile is not None and args.role != "worker":
        args.profile.mkdir(parents=True, exist_ok=True)

    if args.role == "worker":
        asyncio.run(worker(args))
        return
    if args.role in ("throughput", "ceiling", "lag", "single"):
        snapshots = not args.no_snapshots
        try:
            if args.role == "throughput":
                job = throughput(
                    args.events, int(args.workers), args.profile, snapshots, args.signatures
                )
            elif args.role == "ceiling":
                job = ceiling(args.events)
            elif args.role == "single":
                job = single(args.single_events, args.profile, snapshots)
            else:
                job = lag(args.lag_rate, args.lag_seconds, args.profile, snapshots)
            result = asyncio.run(job)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)
        return

    cases: list[tuple[str, list[str]]] = []
    wanted = args.cases.split(",")
    common = ["--profile", str(args.profile)] if args.profile else []
    common += ["--no-snapshots"] if args.no_snapshots else []
    modes = [m for m in args.signatures.split(",") if m]
    if any(not SIGNATURE_MODES.fullmatch(m) for m in modes):
        parser.error(f"--signatures: each of off, require, require-threads<N>, not {modes}")
    if "throughput" in wanted:
        for w in args.workers.split(","):
            for mode in modes:  # the modes of one worker count side by side
                argv = ["--role", "throughput", "--events", str(args.events), "--workers", w]
                argv += ["--signatures", mode]
                key = f"throughput:{w}" if mode == "off" else f"throughput:{w}:{mode}"
                cases.append((key, argv + common))
    if "ceiling" in wanted:
        cases.append(("ceiling", ["--role", "ceiling", "--events", str(args.events)]))
    if "lag" in wanted:
        argv = ["--role", "lag", "--lag-rate", str(args.lag_rate)]
        argv += ["--lag-seconds", str(args.lag_seconds)]
        cases.append(("lag", argv + common))
    if "single" in wanted:
        argv = ["--role", "single", "--single-events", str(args.single_events)]
        cases.append(("single", argv + common))
    results: dict[str, list[dict[str, Any]]] = {key: [] for key, _ in cases}
    started = time.perf_counter()
    for rep in range(1, args.reps + 1):
        for key, argv in cases:
            run = run_child(argv)
            results[key].append(run)
            if "error" in run:
                status = run["error"]
            elif key == "lag":
                status = f"lag p50 {run['lag_p50']:.1f} ms, p99 {run['lag_p99']:.1f} ms"
            elif key == "single":
                status = (
                    f"send→commit p50 {run['send_p50']:.2f} ms, "
                    f"ack→commit p50 {run['from_ack_p50']:.2f} ms"
                )
            elif key == "ceiling":
                status = f"{run['events_per_s']:,.0f} events/s (raw consume + COPY)"
            else:
                status = f"{run['events_per_s']:,.0f} events/s"
            _log(f"rep {rep}/{args.reps} {key:<13} {status}")
    print(
        f"# projector, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; {PARTITIONS} partitions; "
        f"loadavg {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all"
    )
    print(f"# each figure: median of {args.reps} fresh-process runs (min{DASH}max)\n")
    print(report(args, results))
    if args.json:
        args.json.write_text(json.dumps({"reps": args.reps, "results": results}, indent=1))


if __name__ == "__main__":
    main()
