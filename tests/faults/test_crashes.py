"""Processes killed at random moments: an agent mid-run on each durable runtime, and the
Kafka processor mid-round.

Each trial draws its moment from a seeded generator; a failure names the seed, and
``LOOMFLOW_FAULTS_SEED=<seed>`` runs the same trials again. CI runs a few trials per
scenario; ``pytest tests/faults --soak`` runs the counts RELIABILITY.md reports.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from loomflow.producers import EventProducer
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import Event, TurnAppended, Usage
from tests.faults.conftest import Place, Trials
from tests.support.kafka_env import KafkaEnv, session_events
from tests.support.readmodel import fold_of, in_postgres, log_events
from tests.support.scenario import Research
from tests.support.waiting import eventually

SEED = int(os.environ.get("LOOMFLOW_FAULTS_SEED", secrets.randbits(32)))
PASSES = 3
#: model and tool calls of one uninterrupted run: 3 model calls and 2 tools per pass
CALLS = PASSES * 5
#: seconds each scripted model call takes, so that a kill can land inside one
LATENCY = 0.01


@dataclass
class Killed:
    """What the killed process had done: its model calls by turn, its tool calls, and
    the events it was told were acknowledged, in order."""

    model: Counter[int]
    tools: Counter[str]
    acknowledged: list[tuple[int, str]]
    finished: bool


def _read(log: Path) -> Killed:
    model: Counter[int] = Counter()
    tools: Counter[str] = Counter()
    acknowledged: list[tuple[int, str]] = []
    for line in log.read_text().splitlines() if log.exists() else []:
        kind, _, rest = line.partition(" ")
        if kind == "model":
            model[int(rest)] += 1
        elif kind == "tool":
            tools[rest] += 1
        elif kind == "event":
            seq, event_id, _type = rest.split()
            acknowledged.append((int(seq), event_id))
    return Killed(model, tools, acknowledged, finished=False)


def _calls(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.startswith(("model", "tool")))


async def _run_and_kill(
    place: Place, db: Path, session: str, log: Path, rng: random.Random
) -> Killed:
    """Start the research agent in its own process and SIGKILL it at a random moment:
    once it began a random one of its calls, plus up to one model call's time."""
    victim = await place.agent_process(
        db, session, log, "--passes", str(PASSES), "--latency", str(LATENCY)
    )
    target = rng.randint(1, CALLS - 1)
    try:
        await eventually(
            lambda: _calls(log) >= target or victim.returncode is not None,
            within=120,
            what=f"call {target} of the agent process",
        )
        await asyncio.sleep(rng.uniform(0, LATENCY))  # the moment of the fault, drawn
    finally:
        if victim.returncode is None:
            victim.send_signal(signal.SIGKILL)
        _, err = await victim.communicate()
    killed = _read(log)
    if victim.returncode != -signal.SIGKILL:
        assert victim.returncode == 0, err.decode()
        killed.finished = True
    return killed


def _model_turns(events: list[Event]) -> dict[tuple[int, str], int]:
    """(seq, event_id) of each recorded model answer -> its turn (0-based)."""
    turns: dict[tuple[int, str], int] = {}
    for event in events:
        if isinstance(event, TurnAppended) and event.payload.model_call:
            turns[(event.seq, event.event_id)] = len(turns)
    return turns


async def test_an_agent_killed_at_random_moments_loses_and_repeats_nothing(
    place: Place, trials: Trials, tmp_path: Path
) -> None:
    """SIGKILL an agent process at a random moment of its run, then resume: every event
    it was told was acknowledged is in the log, no model or tool call the log recorded
    runs again (only the one in flight may), usage is counted once, resume succeeds."""
    reference = Research(passes=PASSES)
    async with SqliteRuntime(tmp_path / "reference.db") as on:
        clean = await reference.agent(on).run("Research.", session_id="s1")
    rng = random.Random(SEED)
    count = trials(ci=5, soak=50)
    finished_early = in_flight = 0
    for trial in range(count):
        where = f"{place.name} trial {trial} (LOOMFLOW_FAULTS_SEED={SEED})"
        session, log = f"s{trial}", tmp_path / f"calls-{trial}.log"
        db = tmp_path / f"trial-{trial}.db"
        killed = await _run_and_kill(place, db, session, log, rng)
        runtime = place.runtime(db)
        try:
            row = await runtime.store.session(Scope(session))
            if killed.finished or (row is not None and row.status == "finished"):
                finished_early += 1  # the run ended before the kill did; nothing to resume
                result = None
            else:
                research = Research(passes=PASSES)
                try:
                    result = await research.agent(runtime).resume(session_id=session)
                except Exception as exc:
                    tail = (await runtime.store.read_events(Scope(session)))[-4:]
                    raise AssertionError(
                        f"{where}: resume failed; the log ends with {[e.type for e in tail]}"
                    ) from exc
            events = await runtime.store.read_events(Scope(session))
            row = await runtime.store.session(Scope(session))
        finally:
            await runtime.close()
        assert row is not None, where

        # every event the killed process was told of survived, at its seq: observers hear
        # of an event only once the log acknowledged it (a prompt Kafka sent ahead, with
        # the checkpoint staged with it, is told of with the next acknowledged append)
        stored = {(e.seq, e.event_id) for e in events}
        must = killed.acknowledged
        lost = [a for a in must if a not in stored]
        assert not lost, f"{where}: acknowledged events lost: {lost}"

        # each turn is recorded once and counted once
        turns = _model_turns(events)
        assert sorted(turns.values()) == list(range(clean.turns)), where
        recorded = sum(
            (
                e.payload.usage
                for e in events
                if isinstance(e, TurnAppended) and e.payload.model_call
            ),
            start=Usage(),
        )
        assert row.usage == recorded, f"{where}: usage rolled up {row.usage}, log {recorded}"
        assert row.turns == clean.turns and row.status == "finished", where

        if result is None:
            continue
        assert result.turns == clean.turns and result.output == clean.output, where
        assert result.restored_turns + result.model_calls == clean.turns, where
        # no recorded model or tool call ran again: only the call in flight may have
        asked = Counter(
            sum(1 for m in request if m.role.value == "assistant")
            for request in research.models[-1].inner.calls
        )
        model = killed.model + asked
        tools = killed.tools + research.tool_runs
        assert set(model) == set(range(clean.turns)), where
        acknowledged_turns = {turns[a] for a in killed.acknowledged if a in turns}
        for turn in acknowledged_turns:
            assert model[turn] == 1, f"{where}: recorded model turn {turn} was requested again"
        repeats = sum(n - 1 for n in model.values()) + sum(
            tools[k] - reference.tool_runs[k] for k in tools
        )
        assert set(tools) == set(reference.tool_runs), where
        assert all(tools[k] >= reference.tool_runs[k] for k in tools), where
        assert repeats <= 1, f"{where}: {repeats} calls ran again: {model} {tools}"
        in_flight += repeats
    assert finished_early <= count // 2, f"most kills landed after the run ended (seed {SEED})"
    print(
        f"\n{place.name}: {count} trials (seed {SEED}): {count - finished_early} killed mid-run, "
        f"{finished_early} ran to the end first, {in_flight} in-flight calls ran again, "
        "no acknowledged event lost, no recorded call repeated"
    )


# --- the processor ---------------------------------------------------------------------------

#: sessions of 25 events each added before each round
SESSIONS = 300


@pytest.fixture
async def env() -> AsyncIterator[KafkaEnv]:
    environment = await KafkaEnv.create(partitions=3)
    try:
        yield environment
    finally:
        await environment.close()


@pytest.mark.kafka
async def test_a_processor_killed_mid_round_leaves_the_model_a_rebuild_makes(
    env: KafkaEnv, trials: Trials
) -> None:
    """SIGKILL `loomflow processor` at random moments while it projects (new events
    arrive before each round): once a survivor catches up, the read model equals the
    fold of the log table by table (sessions with their usage and counts, checkpoints,
    steps, events), so nothing was applied twice or lost, and no record it was handed
    again went to the dead letters."""
    rng = random.Random(SEED)
    producer = EventProducer(env.bootstrap, env.topics, linger_ms=5)
    # one connection, polled often: the processor applies a 2,000-record batch in tens of
    # milliseconds, and a connection per look would see the round end before the kill
    watch = await asyncpg.connect(env.dsn)
    wanted = trials(ci=3, soak=20)
    mid_round = rounds = 0
    try:
        # each round: a few sessions, the processor started on them, and once it applied
        # its first batch the rest streams in while it runs: the kill lands mid-stream, or
        # now and then after the processor passed the last record (a kill, not mid-round;
        # the rounds go on until enough landed mid-round)
        while mid_round < wanted and rounds < 4 * wanted:
            events = [
                e for k in range(SESSIONS) for e in session_events(f"r{rounds}s{k}", passes=12)
            ]
            rounds += 1
            await producer.send(events[:500])
            before = await _applied(watch, env)
            victim = env.processor_process()
            try:
                deadline = time.monotonic() + 120
                while await _applied(watch, env) <= before:  # its first batch of the round
                    assert time.monotonic() < deadline, f"round {rounds}: no batch committed"
                    await asyncio.sleep(0.002)  # the poll interval, not a wait for an event
                streaming = asyncio.create_task(producer.send(events[500:]))
                await asyncio.sleep(rng.uniform(0, 0.3))  # the moment of the fault, drawn
            finally:
                output = victim.kill()
            assert victim.returncode == -signal.SIGKILL, output
            await streaming
            if await _applied(watch, env) < sum((await env.end_offsets()).values()):
                mid_round += 1
    finally:
        await producer.stop()
        await watch.close()
    assert mid_round >= wanted, f"{mid_round} of {rounds} kills landed mid-round (seed {SEED})"

    survivor = env.processor_process()
    try:
        await eventually(env.caught_up, within=180, what="the surviving processor")
    finally:
        survivor.stop()
    expected = await fold_of(await log_events(env.bootstrap, env.topics))
    assert len(expected) == SESSIONS * rounds
    assert await in_postgres(env.dsn, env.schema) == expected
    print(f"\nprocessor: {rounds} kills (seed {SEED}), {mid_round} mid-round; model == fold")
    # records the killed processors had applied and were handed again are no poison
    conn = await asyncpg.connect(env.dsn)
    try:
        letters = await conn.fetchval(f'SELECT count(*) FROM "{env.schema}".dead_letters')
    finally:
        await conn.close()
    assert letters == 0, f"{letters} redelivered records were dead-lettered"


async def _applied(conn: asyncpg.Connection, env: KafkaEnv) -> int:
    """How many records of the events topic the projector has committed."""
    try:
        applied = await conn.fetchval(
            f'SELECT coalesce(sum(next_offset), 0) FROM "{env.schema}".positions '
            "WHERE consumer = $1 AND topic = $2",
            env.group,
            env.topics.events,
        )
    except asyncpg.UndefinedTableError:
        return 0  # the first processor has not created its schema yet
    return int(applied)
