"""Fuzzing what is in the log: records on the Kafka events topic, rows in a SQLite log.

Each hypothesis example is a whole batch: a few well-formed sessions (text, journal
values and metadata drawn by hypothesis) with bad records drawn among them (bytes that
are not JSON, JSON that is not an event, unknown types, fields of the wrong type, forged
or mismatched scopes, null keys and values, duplicates, seq gaps, stale epochs, values
past what PostgreSQL holds, records over the size limit). A batch is written, the
consumers read it, and the properties are checked once per batch:

- no consumer (the projector; the audit; the analytics count) raises or stalls;
- each bad record is dead-lettered (refused, skipped) exactly once, with a reason;
- the read model equals the fold of what was not dead-lettered, and a record the fold
  refuses is dead-lettered: good records around the bad ones project as usual.

Tests elsewhere hold the single poison records of each kind
(tests/processors/test_projector.py); these draw them in numbers and in combinations.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from hypothesis import example, given
from hypothesis import strategies as st

from loomflow import Agent
from loomflow.analytics import embedded as stats_db
from loomflow.analytics.app import count_record
from loomflow.analytics.tally import Tally
from loomflow.audit.auditor import Auditor
from loomflow.errors import CorruptRecordError, InvalidEventError, LoomflowError
from loomflow.log.reader import _note_record, kafka_reader, sqlite_reader
from loomflow.log.records import decode_record
from loomflow.models import ScriptedModel
from loomflow.processors.projector import Projector
from loomflow.producers import EventProducer, scope_key
from loomflow.projections import sqlite as sql
from loomflow.projections.audit import SqliteTrail
from loomflow.projections.sqlite import EVENT_COLUMNS, decode_event_row
from loomflow.runtime import InProcStore, Scope, SqliteRuntime, SqliteStore
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    Message,
    RunStarted,
    StepRecorded,
    TurnAppended,
    Usage,
)
from loomflow.schemas.codec import decode_event
from loomflow.schemas.events import (
    MAX_EVENT_BYTES,
    CheckpointWrittenPayload,
    RunStartedPayload,
    StepRecordedPayload,
    TurnAppendedPayload,
    event_adapter,
)
from tests.faults.conftest import Trials
from tests.support.fuzzing import fuzz_settings, invalid_ids, json_values
from tests.support.kafka_env import KafkaEnv
from tests.support.readmodel import in_postgres, snapshot_of
from tests.support.waiting import eventually

# -- what a batch is made of ---------------------------------------------------------------

#: bad whatever else is in the log: each is dead-lettered
ALWAYS_BAD = frozenset(
    {
        "garbage",
        "truncated",
        "shapeless",
        "unknown type",
        "forged scope",
        "null value",
        "null key",
        "wrong key",
        "oversized",
    }
)
#: well-formed, but with values past what PostgreSQL holds, or of another type than the
#: field's: the fold may take what PostgreSQL refuses (a dead letter either way)
EXTREME = frozenset({"extreme", "retyped"})
#: whether these apply depends on what came before them: the fold says
STATEFUL = frozenset({"valid", "duplicate", "conflict", "gap", "stale"})

_TYPES = frozenset(event_adapter().json_schema()["discriminator"]["mapping"])


@dataclass(frozen=True)
class Pass:
    """One pass of a drawn session: a turn, a journal step, a checkpoint."""

    question: str
    answer: str
    step_key: str
    value: Any


@dataclass(frozen=True)
class SessionPlan:
    with_user: bool
    metadata: dict[str, Any]
    passes: list[Pass]


@dataclass(frozen=True)
class Mutation:
    """A bad record put after the ``after``-th good record, derived from it."""

    after: int
    kind: str
    data: Any = None


@dataclass(frozen=True)
class Plan:
    """A drawn batch, rendered into records with ids of one example's own."""

    sessions: list[SessionPlan]
    order: list[int]
    mutations: list[Mutation]
    oversized: bool


@dataclass
class Record:
    value: bytes | None
    key: bytes | None
    kind: str
    offset: int = 0  # what decode_record needs of a Kafka record

    @property
    def bad(self) -> bool:
        return self.kind in ALWAYS_BAD


def _passes() -> st.SearchStrategy[list[Pass]]:
    return st.lists(
        st.builds(Pass, st.text(), st.text(), st.text(min_size=1, max_size=30), json_values()),
        min_size=1,
        max_size=3,
    )


_EDGES = [
    ("seq", 2**31),
    ("seq", 2**63),
    ("seq", 2**70),
    ("epoch", 2**63),
    ("epoch", 2**70),
    ("v", 2**31),
    ("v", -1),
    ("at", "0001-01-01T00:00:00+01:00"),
    ("at", "9999-12-31T23:59:59-01:00"),
    ("at", "0001-01-01T00:00:00Z"),
    ("at", "2026-01-01T00:00:00"),
]
_FIELDS = ["seq", "epoch", "v", "at", "session_id", "user_id", "run_id", "event_id", "payload"]


def _mutation_data(kind: str) -> st.SearchStrategy[Any]:
    return {
        "garbage": st.binary(max_size=64),
        "truncated": st.integers(0, 10_000),
        "shapeless": json_values().filter(lambda v: not (isinstance(v, dict) and "type" in v)),
        "unknown type": st.text(max_size=20).filter(lambda t: t not in _TYPES),
        "retyped": st.tuples(st.sampled_from(_FIELDS), json_values()),
        "forged scope": st.tuples(
            st.sampled_from(["session_id", "user_id"]), invalid_ids().filter(_is_str)
        ),
        "wrong key": st.text(alphabet="abcdefghij", min_size=1, max_size=8),
        "gap": st.integers(2, 5),
        "extreme": st.sampled_from(_EDGES),
    }.get(kind, st.none())


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    sessions = draw(
        st.lists(
            st.builds(
                SessionPlan,
                st.booleans(),
                st.dictionaries(st.text(max_size=5), json_values(), max_size=2),
                _passes(),
            ),
            min_size=1,
            max_size=3,
        )
    )
    # each session's events (a start, then three per pass) interleaved in a drawn order
    counts = [1 + 3 * len(s.passes) for s in sessions]
    slots = [k for k, n in enumerate(counts) for _ in range(n)]
    order = draw(st.permutations(slots))
    kinds = sorted((ALWAYS_BAD | EXTREME | STATEFUL) - {"valid", "oversized"})
    mutations = draw(
        st.lists(
            st.sampled_from(kinds).flatmap(
                lambda kind: st.builds(
                    Mutation, st.integers(0, len(slots) - 1), st.just(kind), _mutation_data(kind)
                )
            ),
            min_size=1,
            max_size=12,
        )
    )
    # 8 MiB a record: one batch in twenty (not 0, which hypothesis draws often)
    oversized = draw(st.integers(0, 19)) == 13
    return Plan(sessions, list(order), mutations, oversized)


def _session_events(ns: str, k: int, plan: SessionPlan) -> list[Event]:
    user = f"u{k}" if plan.with_user else None
    common: dict[str, Any] = {"user_id": user, "session_id": f"{ns}-{k}", "run_id": "r", "epoch": 1}
    events: list[Event] = [
        RunStarted(seq=1, payload=RunStartedPayload(metadata=plan.metadata), **common)
    ]
    usage = Usage()
    for n, p in enumerate(plan.passes, start=1):
        turn = Usage(input_tokens=10 * n, output_tokens=n, cost_usd=0.001)
        usage = usage + turn
        messages = [Message.user(p.question), Message.assistant(p.answer)]
        events.append(
            TurnAppended(
                seq=len(events) + 1,
                payload=TurnAppendedPayload(messages=messages, usage=turn, model_call=True),
                **common,
            )
        )
        events.append(
            StepRecorded(
                seq=len(events) + 1,
                payload=StepRecordedPayload(step_key=p.step_key, input_hash="h", value=p.value),
                **common,
            )
        )
        events.append(
            CheckpointWritten(
                seq=len(events) + 1,
                payload=CheckpointWrittenPayload(
                    checkpoint_id=f"ckpt-{ns}-{k}-{n}",
                    turn=n,
                    cumulative_usage=usage,
                    message_count=2 * n,
                    retain=2,
                ),
                **common,
            )
        )
    return events


def render(plan: Plan, ns: str) -> list[Record]:
    """The records of ``plan``, its sessions named ``<ns>-<k>``."""
    streams = [iter(_session_events(ns, k, s)) for k, s in enumerate(plan.sessions)]
    good = [next(streams[k]) for k in plan.order]
    records = [_record(e.model_dump_json().encode(), e, "valid") for e in good]
    for mutation in sorted(plan.mutations, key=lambda m: m.after, reverse=True):
        base = good[mutation.after]
        records.insert(mutation.after + 1, _mutated(base, mutation, ns))
    if plan.oversized:
        base = good[0]
        data = orjson.loads(base.model_dump_json())
        data["payload"] = {"messages": [{"role": "user", "content": "x" * MAX_EVENT_BYTES}]}
        records.append(Record(orjson.dumps(data), _key(base), "oversized"))
    return records


def _key(event: Event) -> bytes:
    return scope_key(event.user_id, event.session_id)


def _record(value: bytes, event: Event, kind: str) -> Record:
    return Record(value, _key(event), kind)


def _mutated(base: Event, mutation: Mutation, ns: str) -> Record:
    """The bad record ``mutation`` makes of a good event."""
    kind, data = mutation.kind, mutation.data
    text = base.model_dump_json().encode()
    fields = orjson.loads(text)
    key = _key(base)
    if kind == "garbage":
        return Record(data, key, kind)
    if kind == "truncated":
        return Record(text[: data % len(text)], key, kind)
    if kind == "shapeless":
        return Record(orjson.dumps(data), key, kind)
    if kind == "null value":
        return Record(None, key, kind)
    if kind == "null key":
        return Record(text, None, kind)
    if kind == "wrong key":
        return Record(text, scope_key(f"k{data}", base.session_id), kind)
    if kind == "duplicate":
        return Record(text, key, kind)
    if kind == "unknown type":
        fields["type"] = data
    elif kind == "forged scope":
        name, forged = data
        fields[name] = forged
        user, session = fields["user_id"], fields["session_id"]
        key = f"{user or ''}/{session}".encode("utf-8", "surrogatepass")
    elif kind == "conflict":
        fields["event_id"] = f"evt-{ns}-conflict-{mutation.after}"
    elif kind == "gap":
        fields["seq"] = base.seq + data
    elif kind == "stale":
        fields["epoch"] = base.epoch - 1
        fields["seq"] = base.seq + 1
    elif kind in ("extreme", "retyped"):
        name, value = data
        # as the event after ``base``, so that the fold applies what it takes of it
        fields.update(seq=base.seq + 1, event_id=f"evt-{ns}-{kind}-{mutation.after}")
        # ids of this example's own, so that what one example writes never meets another's
        fields[name] = f"{ns}-{value}" if isinstance(value, str) and name.endswith("id") else value
    # json, not orjson: it writes ints past 64 bits (and escapes lone surrogates)
    return Record(json.dumps(fields).encode(), key, kind)


# -- the oracle: what the fold makes of a batch ---------------------------------------------


def _decoded(record: Record) -> Event | None:
    try:
        return decode_record(record)[0]
    except InvalidEventError:
        return None


def _scope(record: Record) -> tuple[str, str] | None:
    """The (user, session) of a record that decodes; None for one that does not."""
    event = _decoded(record)
    return None if event is None else (event.user_id or "", event.session_id)


def _postgres_only(reason: str) -> bool:
    """Whether a dead letter says PostgreSQL refused what the in-process fold takes: a
    value it cannot hold (a NUL in a text column, an int or a date past its range: a
    DataError), or a checkpoint id the session has (the in-process store keeps both;
    writers never reuse one)."""
    if reason.startswith("a checkpoint id that the session already has"):
        return True
    found = re.match(r"PostgreSQL refused it \((\w+)\)", reason)
    error = getattr(asyncpg.exceptions, found[1], None) if found else None
    return isinstance(error, type) and issubclass(error, asyncpg.DataError)


async def expected_model(
    records: list[Record], dead: dict[int, str], postgres_only: Counter[str]
) -> InProcStore:
    """The shared fold of the records not dead-lettered, checking on the way that each
    record the projector took is one the fold takes, and that each dead letter (by its
    index, with its reason) was bad, refused by the fold, or refused by PostgreSQL alone
    (counted in ``postgres_only`` by kind)."""
    store = InProcStore()
    for n, record in enumerate(records):
        reason = dead.get(n)
        if reason is not None and record.bad:
            continue
        event = _decoded(record)
        if event is None:  # a retyped field, say
            assert reason is not None, f"record {n} ({record.kind}) taken, but it does not decode"
            continue
        if reason is not None and _postgres_only(reason):
            postgres_only[record.kind] += 1  # rolled back alone: as if it were not there
            continue
        try:
            await store.append([event])
        except InvalidEventError as exc:
            assert reason is not None, f"record {n} ({record.kind}) taken, the fold refuses: {exc}"
            continue  # refused by both: nothing changed
        assert reason is None, (
            f"record {n} ({record.kind}) dead-lettered, the fold takes it: {reason}"
        )
    return store


# -- Kafka -------------------------------------------------------------------------------------

Run = Any  # asyncio.Runner.run


@dataclass
class _Consumers:
    """The test's consumers of one topic, kept across the examples of a property."""

    env: KafkaEnv
    projector: Projector
    producer: EventProducer
    dlq: AIOKafkaConsumer
    auditor: Auditor
    ledgers: dict[bytes, bytes] = field(default_factory=dict)
    #: event ids the audit has met, and the DLQ records seen, over every example so far
    audited: set[str] = field(default_factory=set)
    lettered: Counter[str] = field(default_factory=Counter)
    #: records written and dead-lettered, by kind, for the summary a soak prints
    kinds: Counter[str] = field(default_factory=Counter)
    dead: Counter[str] = field(default_factory=Counter)
    postgres_only: Counter[str] = field(default_factory=Counter)
    #: sessions with a record PostgreSQL alone refused, whose later records the audit (which
    #: cannot know of it) may judge otherwise than the read model
    tainted: set[tuple[str, str] | None] = field(default_factory=set)


async def _start(env: KafkaEnv, trail: Path) -> _Consumers:
    projector = await env.start_projector()
    producer = EventProducer(env.bootstrap, env.topics)
    dlq = AIOKafkaConsumer(
        bootstrap_servers=env.bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_EVENT_BYTES + 128 * 1024,
    )
    await dlq.start()
    tps = [TopicPartition(env.topics.dlq, p) for p in range(env.topics.partitions)]
    dlq.assign(tps)
    await dlq.seek_to_beginning(*tps)
    reader = kafka_reader(env.settings, group=None, start="beginning")
    trail_store = SqliteTrail(trail)
    await trail_store.open()
    await reader.open()
    return _Consumers(env, projector, producer, dlq, Auditor(reader, trail_store))


async def _stop(consumers: _Consumers) -> None:
    await consumers.producer.stop()
    await consumers.dlq.stop()
    await consumers.auditor.reader.close()
    await consumers.auditor.trail.close()
    await consumers.env.close()


async def _caught_up(env: KafkaEnv) -> bool:
    ends = await env.end_offsets()
    positions = await env.positions()
    return all(positions.get(p, 0) >= end for p, end in ends.items())


async def _check_batch(c: _Consumers, records: list[Record], ns: str) -> None:
    env, topic = c.env, c.env.topics.events
    failed = c.projector.failed_rounds
    where: list[str] = []
    for record in records:
        position = await c.producer.send_raw(topic, record.value, key=record.key)
        record.offset = position.offset
        where.append(f"{position.partition}:{position.offset}")
    await eventually(lambda: _caught_up(env), within=60, what="the projector to pass the batch")
    assert c.projector.failed_rounds == failed, "a round failed: a record the projector chokes on"

    # dead letters: one row each, with a reason, and one record each on the DLQ topic
    sources = {f"{topic}/{w.replace(':', '@')}": n for n, w in enumerate(where)}
    conn = await asyncpg.connect(env.dsn)
    try:
        rows = await conn.fetch(
            f'SELECT source, reason FROM "{env.schema}".dead_letters WHERE source = ANY($1)',
            list(sources),
        )
    finally:
        await conn.close()
    dead = {sources[row["source"]]: row["reason"] for row in rows}
    c.kinds.update(r.kind for r in records)
    c.dead.update(records[n].kind for n in dead)
    assert all(dead.values())
    await _read_dlq(c, {s for s in sources if sources[s] in dead})

    # the read model is the fold of what was not dead-lettered
    store = await expected_model(records, dead, c.postgres_only)
    model = await in_postgres(env.dsn, env.schema, only=lambda u, s: s.startswith(f"{ns}-"))
    assert model == snapshot_of(store)

    # the audit chains each record the read model accepts, once, and keeps the rest with
    # a reason: what does not decode, a second copy of an event, what the fold refused.
    # What PostgreSQL alone refused (a value it cannot hold) the audit cannot know of: the
    # sessions of such records are left out of the comparison.
    undecodable = {n for n, r in enumerate(records) if _decoded(r) is None}
    again: set[int] = set()  # a second copy of an event: the audit keeps it apart
    for n, record in enumerate(records):
        event = _decoded(record)
        if event is not None and event.event_id in c.audited:
            again.add(n)
        elif event is not None:
            c.audited.add(event.event_id)
    refused = {n for n, reason in dead.items() if not _postgres_only(reason)}
    c.tainted.update(_scope(records[n]) for n, reason in dead.items() if _postgres_only(reason))
    await asyncio.wait_for(c.auditor.catch_up(), 60)
    ours = {w: n for n, w in enumerate(where)}
    rejects = [r for r in await c.auditor.trail.rejects() if r.position in ours]
    assert all(r.reason for r in rejects)
    compared = {n for n in range(len(records)) if _scope(records[n]) not in c.tainted}
    assert sorted(ours[r.position] for r in rejects if ours[r.position] in compared) == sorted(
        (undecodable | again | refused) & compared
    )

    # the analytics count skips each record that does not decode or has another's key
    before = _skipped(c.ledgers)
    for record, w in zip(records, where, strict=True):
        count_record(c.ledgers, record.key, record.value, w)
    assert _skipped(c.ledgers) - before == len(undecodable)


def _skipped(ledgers: dict[bytes, bytes]) -> int:
    return sum(
        sum(Tally.from_ledger(value).skipped.values())
        for key, value in ledgers.items()
        if key.startswith(b"!partition/")
    )


async def _read_dlq(c: _Consumers, expected: set[str]) -> None:
    new: Counter[str] = Counter()

    async def all_there() -> bool:
        for batch in (await c.dlq.getmany(timeout_ms=100)).values():
            new.update(dict(r.headers)["source"].decode() for r in batch)
        return set(new) >= expected

    await eventually(all_there, what="each dead letter on the DLQ topic")
    assert set(new) == expected and all(n == 1 for n in new.values()), new
    assert not set(new) & set(c.lettered), "a record dead-lettered twice"
    c.lettered.update(new)


@contextmanager
def _kafka(tmp_path: Path) -> Iterator[tuple[Run, _Consumers]]:
    with asyncio.Runner() as runner:
        env = runner.run(KafkaEnv.create(partitions=2))
        consumers = runner.run(_start(env, tmp_path / "trail.db"))
        try:
            yield runner.run, consumers
        finally:
            runner.run(_stop(consumers))


_examples = itertools.count()


@pytest.mark.kafka
def test_no_record_on_the_topic_stops_a_consumer_or_reaches_the_read_model(
    tmp_path: Path, trials: Trials
) -> None:
    with _kafka(tmp_path) as (run, consumers):

        @fuzz_settings(trials(ci=6, soak=150))
        @given(plan=plans())
        def check(plan: Plan) -> None:
            ns = f"f{next(_examples)}"
            run(_check_batch(consumers, render(plan, ns), ns))

        check()
    print(f"\n{sum(consumers.kinds.values())} records, dead-lettered of each kind:")
    for kind, count in sorted(consumers.kinds.items()):
        print(f"  {kind}: {consumers.dead[kind]} of {count}")
    print(f"refused by PostgreSQL alone, by kind: {dict(consumers.postgres_only)}")


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("run.started", ("epoch",), 2**70),
        ("turn.appended", ("seq",), 2**63),  # the audit trail's OverflowError
        ("turn.appended", ("payload", "usage", "input_tokens"), 2**70),
        ("turn.appended", ("at",), "2026-01-01T00:00:00"),
        ("turn.appended", ("at",), "0001-01-01T00:00:00+01:00"),
        ("turn.appended", ("at",), "9999-12-31T23:59:59-01:00"),
        # PostgreSQL kept it as -infinity and read it back without a zone: dropped on read
        ("turn.appended", ("at",), "0001-01-01T00:00:00Z"),
    ],
)
def test_a_value_no_reader_can_use_is_refused_by_every_reader(
    kind: str, path: tuple[str, ...], value: Any
) -> None:
    """The fuzzing's examples: the projector dead-lettered them; the analytics count took
    them and crashed (an int past 64 bits in its ledger's JSON, a naive time compared
    with an aware one, a time with no UTC year), and the audit (a seq past what its
    trail's table holds)."""
    events = _session_events("s", 0, SessionPlan(False, {}, [Pass("q", "a", "k", None)]))
    key = _key(events[0])
    ledgers: dict[bytes, bytes] = {}
    for n, event in enumerate(events):
        count_record(ledgers, key, event.model_dump_json().encode(), f"0:{n}")
    fields = orjson.loads(next(e for e in events if e.type == kind).model_dump_json())
    fields.update(seq=len(events) + 1, event_id="evt-odd")
    *parents, name = path
    holder = fields
    for part in parents:
        holder = holder[part]
    holder[name] = value
    record = Record(json.dumps(fields).encode(), key, "extreme")
    assert _decoded(record) is None
    with pytest.raises(InvalidEventError):
        decode_event(record.value or b"")
    count_record(ledgers, key, record.value, f"0:{len(events)}")
    assert _skipped(ledgers) == 1


# -- SQLite ------------------------------------------------------------------------------------

#: a SQLite log's columns, as loomflow writes them (position aside)
_COLUMNS = ["user_id", "session_id", "seq", "type", "event_id", "run_id", "epoch", "v", "at",
            "payload"]  # fmt: skip


def _sql_values() -> st.SearchStrategy[Any]:
    """Anything a SQLite column may hold: another program's write is typed by its value."""
    return st.one_of(
        st.none(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=40),
        st.binary(max_size=40),
    )


_PAYLOADS = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    json_values().map(lambda v: orjson.dumps(v).decode()),
    st.just('{"messages": [{"role": "user", "content": 1}]}'),
)


@dataclass(frozen=True)
class Forgery:
    """A row another program wrote into the log (or a row of ours it changed)."""

    kind: str
    target: int
    data: Any = None


def _forgery_data(kind: str) -> st.SearchStrategy[Any]:
    return {
        "column": st.tuples(st.sampled_from(_COLUMNS), _sql_values()),
        "corrupt": st.tuples(st.sampled_from(_COLUMNS), _sql_values()),
        "payload": _PAYLOADS,
        "unknown type": st.text(max_size=20).filter(lambda t: t not in _TYPES),
        "forged scope": st.tuples(
            st.sampled_from(["session_id", "user_id"]), invalid_ids().filter(_is_str)
        ),
        "gap": st.integers(2, 5),
        "bad text": st.tuples(st.sampled_from(_COLUMNS), st.binary(max_size=8)),
        "note": st.tuples(
            st.one_of(st.just("[1, 2]"), st.just("null"), _sql_values()),
            st.one_of(st.integers(1, 9), _sql_values()),
            st.one_of(st.just("2026-01-01T00:00:00+00:00"), _sql_values()),
        ),
    }.get(kind, st.none())


_FORGERIES = ["column", "corrupt", "payload", "unknown type", "forged scope", "gap", "stale",
              "duplicate id", "next seq", "bad text", "note"]  # fmt: skip


@st.composite
def forged_logs(draw: st.DrawFn) -> tuple[list[SessionPlan], list[Forgery]]:
    sessions = draw(
        st.lists(
            st.builds(SessionPlan, st.booleans(), st.just({}), _passes()), min_size=1, max_size=3
        )
    )
    forgeries = draw(
        st.lists(
            st.sampled_from(_FORGERIES).flatmap(
                lambda kind: st.builds(
                    Forgery, st.just(kind), st.integers(0, 1000), _forgery_data(kind)
                )
            ),
            min_size=1,
            max_size=10,
        )
    )
    return sessions, forgeries


def _forge(path: Path, forgeries: list[Forgery]) -> set[str]:
    """Write the forged rows into the log at ``path``; return the sessions whose own
    rows were changed."""
    changed: set[str] = set()
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(f"SELECT position, {', '.join(_COLUMNS)} FROM loomflow_events")
        good = [dict(zip(["position", *_COLUMNS], row, strict=True)) for row in rows]
        for n, forgery in enumerate(forgeries):
            base = dict(good[forgery.target % len(good)])
            position = base.pop("position")
            last = conn.execute(
                "SELECT max(seq) FROM loomflow_events WHERE user_id = ? AND session_id = ? "
                "AND typeof(seq) = 'integer'",
                (base["user_id"], base["session_id"]),
            ).fetchone()[0]
            base["seq"] = last + 100 + n  # a seq of its own, unless the forgery says
            kind, data = forgery.kind, forgery.data
            if kind == "corrupt":
                name, value = data
                conn.execute(f"UPDATE OR IGNORE loomflow_events SET {name} = ? WHERE position = ?",
                             (value, position))  # fmt: skip
                changed.add(base["session_id"])
                continue
            if kind == "column":
                base[data[0]] = data[1]
            elif kind == "payload":
                base["payload"] = data
            elif kind == "unknown type":
                base["type"] = data
            elif kind == "forged scope":
                base[data[0]] = data[1]
            elif kind == "gap":
                base["seq"] = last + data
            elif kind == "stale":
                base["seq"], base["epoch"] = last + 1, base["epoch"] - 1
            elif kind in ("duplicate id", "next seq"):  # the seq the next append takes
                base["seq"] = last + 1
                if kind == "next seq":
                    base["event_id"] = f"evt-forged-{n}"
            elif kind == "note":  # what prune leaves, with values drawn
                conn.execute(
                    "INSERT OR IGNORE INTO loomflow_log_notes (position, user_id, session_id, "
                    "kind, seqs, through_seq, at) VALUES "
                    "((SELECT max(position) FROM loomflow_events) + ?, ?, ?, 'pruned', ?, ?, ?)",
                    (1000 + n, base["user_id"], base["session_id"], *data),
                )
                continue
            values = ["?"] * len(_COLUMNS)
            if kind == "bad text":  # bytes that are not UTF-8, in a TEXT value
                values[_COLUMNS.index(data[0])] = "CAST(? AS TEXT)"
                base[data[0]] = b"\xff" + data[1]
            for i, name in enumerate(_COLUMNS):  # text sqlite3 cannot bind (a lone
                # surrogate): the bytes another program would store for it, as TEXT
                if isinstance(base[name], str) and not _encodable(base[name]):
                    values[i] = "CAST(? AS TEXT)"
                    base[name] = base[name].encode("utf-8", "surrogatepass")
            conn.execute(
                f"INSERT OR IGNORE INTO loomflow_events ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join(values)})",
                [base[c] for c in _COLUMNS],
            )
        conn.commit()
    return changed


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _decodes(row: tuple[Any, ...]) -> bool:
    try:
        decode_event_row(row)
    except CorruptRecordError:
        return False
    return True


async def _check_forged_log(
    where: Path, sessions: list[SessionPlan], forgeries: list[Forgery]
) -> None:
    journal = where / "journal.db"
    written = [_session_events("s", k, plan) for k, plan in enumerate(sessions)]
    store = SqliteStore(journal)
    try:
        for events in written:
            await store.append(events)
    finally:
        await store.close()
    changed = _forge(journal, forgeries)
    with closing(sqlite3.connect(journal)) as conn:
        conn.text_factory = lambda text: text.decode("utf-8", "backslashreplace")
        rows = conn.execute(f"SELECT {EVENT_COLUMNS} FROM loomflow_events ORDER BY position")
        log = [tuple(row) for row in rows]
        notes = conn.execute(
            "SELECT position, user_id, session_id, seqs, through_seq, at FROM loomflow_log_notes"
        ).fetchall()
    undecodable = {row[0] for row in log if not _decodes(row)}
    undecodable |= {row[0] for row in notes if _note_record(row).note is None}
    records = len(log) + len(notes)

    # the audit chains each row that decodes once and that the read model's rule admits,
    # and keeps the others with a reason (a forged row the store never folded may be one
    # the rule refuses: another user's session at no claimed epoch, say)
    async with SqliteTrail(where / "journal.audit.db") as trail:
        async with sqlite_reader(journal) as reader:
            done = await asyncio.wait_for(Auditor(reader, trail).catch_up(), 60)
        rejects = await trail.rejects()
    rejected = {int(r.position) for r in rejects}
    chained: set[str] = set()
    again: set[int] = set()  # a second copy of an event id that was chained
    for row in log:
        if row[0] not in undecodable:
            if row[5] in chained:
                again.add(row[0])
            elif row[0] not in rejected:
                chained.add(row[5])
    refused = rejected - undecodable - again
    assert rejected >= undecodable | again
    assert all(r.reason for r in rejects) and done.entries == records - len(rejects)
    assert all(
        r.reason.startswith("refused as the read model refuses it")
        for r in rejects
        if int(r.position) in refused
    ), rejects

    # the stats skip each row that does not decode, once, with a reason
    progress = await asyncio.wait_for(stats_db.update(journal), 60)
    assert progress.records == records
    with closing(sqlite3.connect(stats_db.stats_path(journal))) as conn:
        skipped = conn.execute(
            "SELECT position, reason FROM stats_skipped WHERE kind = 'undecodable'"
        ).fetchall()
    assert sorted(int(p) for p, _ in skipped) == sorted(undecodable)
    assert all(reason for _, reason in skipped)
    assert (await stats_db.update(journal)).records == 0

    # the runtime reopens the file: sessions no forged row changed restore as written,
    # the others raise a typed error; a run on each goes on, or is a typed refusal
    runtime = SqliteRuntime(journal)
    try:
        for events in written:
            scope = Scope(events[0].session_id, events[0].user_id)
            messages = [
                m for e in events if isinstance(e, TurnAppended) for m in e.payload.messages
            ]
            try:
                state = await runtime.restore(scope)
                await runtime.list_checkpoints(scope)
                await runtime.store.read_events(scope)
            except CorruptRecordError:
                assert scope.session_id in changed
            else:
                assert state is not None
                assert state.messages == messages or scope.session_id in changed
            agent = Agent("x", model=ScriptedModel(lambda m: "ok"), runtime=runtime)
            with suppress(LoomflowError):
                await agent.run("more", session_id=scope.session_id, user_id=scope.user_id)
    finally:
        await runtime.close()


def test_a_row_that_refuses_an_append_fails_only_that_append(tmp_path: Path) -> None:
    """A stored row that holds the key of an appended event (another program's row at
    the next seq; the same checkpoint id twice) refuses that event alone, as PostgreSQL
    does: the SQLite store commits appends in rounds, and the IntegrityError failed the
    whole round (found by fuzzing)."""
    events = _session_events("s", 0, SessionPlan(False, {}, [Pass("q", "a", "k", None)]))
    checkpoint = next(e for e in events if isinstance(e, CheckpointWritten))
    again = checkpoint.model_copy(update={"seq": len(events) + 1, "event_id": "evt-again"})
    other = _session_events("t", 1, SessionPlan(False, {}, [Pass("q", "a", "k", None)]))
    with closing(sql.connect(tmp_path / "journal.db", 1000)) as conn:
        assert sql.commit_round(conn, [events]) == [None]
        outcomes = sql.commit_round(conn, [[again], other])
        assert isinstance(outcomes[0], InvalidEventError) and outcomes[1] is None
        assert sql.load_session(conn, None, "t-1") is not None


def _one(forgery: Forgery) -> tuple[list[SessionPlan], list[Forgery]]:
    """A log of one session of one pass, and ``forgery``."""
    return [SessionPlan(False, {}, [Pass("q", "a", "k", None)])], [forgery]


def test_no_row_in_a_sqlite_log_stops_a_reader_or_the_runtime(
    tmp_path: Path, trials: Trials
) -> None:
    """Rows loomflow did not write (another program's, a damaged file's) in the log the
    runtime, the audit and the stats read back."""
    folders = itertools.count()
    with asyncio.Runner() as runner:

        @fuzz_settings(trials(ci=10, soak=400))
        @given(log=forged_logs())
        @example(log=_one(Forgery("column", 0, ("user_id", None))))  # an ignored insert:
        # the readers waited for a position no row holds
        @example(log=_one(Forgery("column", 0, ("session_id", b"x"))))  # the reader raised
        # keeping a BLOB among the bytes of a row that does not decode
        @example(log=_one(Forgery("bad text", 0, ("type", b""))))  # not UTF-8: every read
        # of the log (audit, stats, read_events) failed at it, again and again
        @example(log=_one(Forgery("note", 0, ("[1, 2]", 1, b"x"))))  # a note that does not
        # decode stopped the reader
        @example(log=_one(Forgery("corrupt", 1, ("payload", b"{}"))))  # a transcript row's
        # BLOB: restore raised TypeError
        @example(log=_one(Forgery("forged scope", 0, ("session_id", "\ud800A"))))  # the
        # forger raised UnicodeEncodeError binding it (found by the soak)
        @example(log=_one(Forgery("note", 0, ("[1, 2]", b"", "2026-01-01T00:00:00+00:00"))))
        # a note's through_seq that is no int: the audit raised TypeError chaining it, and
        # stopped (found by the soak)
        @example(
            log=(
                [SessionPlan(False, {}, [Pass("", "", "0", None)])],
                [Forgery("corrupt", 0, ("user_id", 0)), Forgery("stale", 1, None)],
            )
        )  # a copy of an event whose first copy the audit refused is no second copy
        def check(log: tuple[list[SessionPlan], list[Forgery]]) -> None:
            where = tmp_path / str(next(folders))
            where.mkdir()
            runner.run(_check_forged_log(where, *log))

        check()
