"""Isolation as properties, on every runtime: one user never reaches another's session,
and an erased session never comes back.

Hypothesis draws a victim and an intruder (a named user and none, ids that are prefixes of
each other, ids that differ only in case, a user and session that spell another user and
session when joined) and a list of what the intruder tries, passing the victim's session
id, checkpoint ids and journal step key: listing, reading, resuming, forking, pruning,
erasing, signalling. Each attempt is made twice in lockstep: on the victim's session, and
on a session id and checkpoint ids that nobody has. The two must read the same (the typed
"not found" error, an empty result, or the intruder's own new session), so a session's
existence does not leak; and the victim's log, checkpoints and read-model row are
unchanged at the end, its waiting run still able to take a signal.

The erasure property erases a session while a writer still holds it, prunes or not, and
then has that writer (with its old epoch) write, and replays the session's old events:
each is refused, and the session stays erased in list, read and resume. On Kafka the
late and replayed events are produced onto the topic directly and must be dead-lettered,
and a rebuild of the topic into a fresh read model keeps every erased session erased.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from aiokafka.errors import KafkaError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loomflow import (
    Agent,
    Checkpoint,
    CheckpointMeta,
    Role,
    RunResult,
    Tuning,
    new_id,
    wait_for_signal,
)
from loomflow.errors import (
    CheckpointNotFoundError,
    LoomflowError,
    SessionErasedError,
    SessionNotFoundError,
)
from loomflow.models import ScriptedModel
from loomflow.processors.rebuild import rebuild
from loomflow.producers import EventProducer, Topics, scope_key
from loomflow.projections.fold import CheckpointRow
from loomflow.runtime import DatabaseStore, PostgresStore, RestoredState, Runtime, Scope
from loomflow.runtime.kafka import KafkaRuntime
from loomflow.schemas import Event, EventBase, Message, TurnAppended
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.schemas.sessions import SessionRecord
from loomflow.settings import Settings
from tests.faults.conftest import Trials
from tests.support.backends import BACKENDS, Backend
from tests.support.kafka_env import KafkaEnv
from tests.support.readmodel import in_postgres, read_records
from tests.support.scenario import Research
from tests.support.waiting import eventually

T = TypeVar("T")

# Hypothesis draws in its own thread while the runtime's tasks (aiokafka's among them) go on
# on the loop and use the random module; that is not a strategy drawing from it.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning"
)

#: examples per runtime (CI, --soak): one costs ~100x more on Kafka than in memory
_EXAMPLES = {"inproc": (100, 2000), "sqlite": (40, 800), "postgres": (15, 300), "kafka": (6, 120)}


@pytest.fixture(
    params=[
        "inproc",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.postgres]),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = BACKENDS[request.param](tmp_path)
    await made.open()
    yield made
    await made.close()


@pytest.fixture
async def runtime(backend: Backend) -> AsyncIterator[Runtime]:
    opened = backend.runtime()
    yield opened
    await opened.close()


def _examples(backend: Backend, trials: Trials) -> int:
    ci, soak = _EXAMPLES[backend.name]
    return trials(ci=ci, soak=soak)


async def _hold(
    strategy: st.SearchStrategy[T],
    check: Callable[[T], Coroutine[Any, Any, None]],
    n: int,
    known: Sequence[T] = (),
) -> None:
    """Check a property on the ``known`` values and on ``n`` values that hypothesis draws
    from ``strategy`` (shrinking a failing one), each checked on this event loop.

    Hypothesis drives its examples from a thread, so this loop stays free to run what the
    runtime needs meanwhile (Kafka's projector is a task of it).
    """
    loop = asyncio.get_running_loop()

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(strategy)
    def holds(value: T) -> None:
        asyncio.run_coroutine_threadsafe(check(value), loop).result(timeout=300)

    for value in known:
        holds = example(value)(holds)
    await asyncio.to_thread(holds)


def _tag() -> str:
    return secrets.token_hex(3)


# -- who tries to reach whose session -----------------------------------------------------

_PART = st.text(alphabet="ab01", min_size=1, max_size=3)
_SEP = st.sampled_from(".:-@_+=")


@dataclass(frozen=True)
class Pair:
    """A victim's session and an intruder with the session id it passes, before the
    example's tags make them unique to it."""

    victim_user: str | None
    victim_session: str
    intruder: str | None
    target: str

    def tagged(self, tag: str) -> Pair:
        """The same ids, made the example's own: users and sessions keep every prefix
        relation and every joined spelling they had."""

        def user(u: str | None) -> str | None:
            return None if u is None else f"u{tag}.{u}"

        return Pair(
            user(self.victim_user),
            f"{self.victim_session}-{tag}",
            user(self.intruder),
            f"{self.target}-{tag}",
        )


@st.composite
def _pairs(draw: st.DrawFn) -> Pair:
    shape = draw(st.sampled_from(["none", "prefix", "case", "other", "joined"]))
    session = draw(_PART)
    if shape == "none":  # a named user and the sessions run without a user
        named = draw(_PART)
        victim, intruder = draw(st.sampled_from([(named, None), (None, named)]))
    elif shape == "prefix":  # "a" and "a.b", "u" and "u:1"
        short = draw(_PART)
        long = f"{short}{draw(_SEP)}{draw(_PART)}"
        victim, intruder = draw(st.sampled_from([(short, long), (long, short)]))
    elif shape == "case":
        victim = draw(st.text(alphabet="abAB", min_size=1, max_size=4).filter(str.islower))
        intruder = victim.upper()
    elif shape == "other":
        victim = draw(_PART)
        intruder = draw(_PART.filter(lambda u: u != victim))
    else:  # user "p", session "q:r" beside user "p:q", session "r": both join to "p:q:r"
        p, q, r, sep = draw(_PART), draw(_PART), draw(_PART), draw(_SEP)
        pairs = [
            Pair(p, f"{q}{sep}{r}", f"{p}{sep}{q}", r),
            Pair(f"{p}{sep}{q}", r, p, f"{q}{sep}{r}"),
        ]
        return draw(st.sampled_from(pairs))
    return Pair(victim, session, intruder, session)


_ATTEMPTS = (
    "list_sessions",
    "list_checkpoints",
    "get_checkpoint",
    "restore",
    "read",
    "resume",
    "resume_from",
    "fork",
    "signal",
    "prune_session",
    "prune_user",
    "erase",
)


@dataclass(frozen=True)
class Intrusion:
    pair: Pair
    attempts: tuple[str, ...]


_INTRUSIONS = st.builds(
    Intrusion,
    _pairs(),
    st.lists(st.sampled_from(_ATTEMPTS), min_size=1, max_size=8).map(tuple),
)
#: tried on every run: each attempt, by a named user on a session run without one, by
#: "u:1" on the session of "u" (after a resume gave it a session of that id), and by a
#: user whose id joined to its session's spells the victim's
_KNOWN_INTRUSIONS = [
    Intrusion(Pair(None, "s", "a", "s"), _ATTEMPTS),
    Intrusion(Pair("u", "s", "u:1", "s"), ("resume", *_ATTEMPTS)),
    Intrusion(Pair("p", "q:r", "p:q", "r"), _ATTEMPTS),
]


# -- agents --------------------------------------------------------------------------------


def _approver(runtime: Runtime) -> Agent:
    """An agent whose tool waits for the signal "approve"."""

    async def approve(amount: int) -> str:
        """Ask a person to approve a payment."""
        return f"approved: {await wait_for_signal('approve')}"

    def reply(messages: Sequence[Message]) -> Message | str:
        if messages[-1].role is Role.TOOL:
            return "Paid."
        return ScriptedModel.tool_call("approve", amount=5)

    return Agent("You pay.", model=ScriptedModel(reply), runtime=runtime, tools=[approve])


class _Counting:
    """A checkpointing agent that answers "mine" and counts its model calls."""

    def __init__(self, runtime: Runtime) -> None:
        self.calls = 0

        def reply(messages: Sequence[Message]) -> str:
            self.calls += 1
            return "mine"

        self.agent = Agent(
            "x", model=ScriptedModel(reply), runtime=runtime, tuning=Tuning(checkpoint=True)
        )


async def _victim(runtime: Runtime, scope: Scope) -> list[str]:
    """Give ``scope`` a session that a misdirected call would change: two checkpoints and
    a run waiting for the signal "approve"; return its checkpoint ids, oldest first."""
    session, user = scope.session_id, scope.user_id
    await Research(passes=2).agent(runtime).run("Research.", session_id=session, user_id=user)
    waiting = await _approver(runtime).run("Pay.", session_id=session, user_id=user)
    assert waiting.stop_reason == "waiting"
    metas = await runtime.list_checkpoints(scope)
    assert len(metas) == 2
    return [m.checkpoint_id for m in reversed(metas)]


# -- what a user sees ----------------------------------------------------------------------

Listing = Callable[[str | None], Awaitable[list[SessionRecord]]]


def _listing(runtime: Runtime, readers: list[PostgresStore]) -> Listing | None:
    """How sessions are listed on this runtime: its store's listing, or on Kafka the read
    model's (as ``loomflow sessions ls`` reads it) once the projector has applied the log
    (a run returns before that); None in memory, which lists nothing."""
    store: DatabaseStore | None = None
    if isinstance(runtime.store, DatabaseStore):
        store = runtime.store
    elif isinstance(runtime, KafkaRuntime):
        store = PostgresStore.from_settings(runtime.settings, create=False)
        readers.append(store)
    if store is None:
        return None
    reader = store

    async def listed(user: str | None) -> list[SessionRecord]:
        if isinstance(runtime, KafkaRuntime):
            await runtime.store.synced()
        return await reader.list_sessions(user_id=user, limit=100_000)

    return listed


async def _state(runtime: Runtime, scope: Scope, checkpoints: list[str]) -> dict[str, Any]:
    """Everything of a session that its user can see: the read model's row, the
    checkpoints, each materialised, and the log."""
    return {
        "row": await runtime.store.session(scope),
        "checkpoints": await runtime.store.list_checkpoints(scope, 1000),
        "full": [await runtime.get_checkpoint(scope, c) for c in [None, *checkpoints]],
        "log": await runtime.store.read_events(scope),
    }


_GENERATED = re.compile(r"\b(sess|run|ckpt)[0-9a-z]{26}\b")


def _brief(value: object) -> object:
    """What an attempt returned, without the times and generated ids that differ between
    two sessions of the same history."""
    if isinstance(value, Checkpoint | RestoredState):
        kind = type(value).__name__
        turns = value.turn if isinstance(value, Checkpoint) else value.turns
        return (kind, turns, [m.content for m in value.messages])
    if isinstance(value, RunResult):
        return (
            value.session_id,
            value.output,
            value.turns,
            value.restored_turns,
            value.stop_reason,
            value.parent_session_id,
            value.parent_checkpoint_id,
        )
    if isinstance(value, CheckpointMeta):
        return (value.session_id, value.checkpoint_id, value.turn)
    if isinstance(value, CheckpointRow):
        return (value.checkpoint_id, value.seq, value.turn, value.message_count)
    if isinstance(value, list):
        return [_brief(v) for v in value]
    if isinstance(value, EventBase):
        return type(value).__name__
    if isinstance(value, SessionRecord):
        return (value.user_id, value.session_id, value.status, value.turns, value.parent_session_id)
    return value


@dataclass(frozen=True)
class World:
    """The ids an intruder passes: the victim's, or ones nobody has."""

    target: str
    checkpoints: list[str]
    step_key: str

    def names(self) -> dict[str, str]:
        names = {self.target: "<session>"}
        names.update({c: f"<checkpoint {i}>" for i, c in enumerate(self.checkpoints)})
        return names


async def _outcome(call: Callable[[], Awaitable[object]], world: World) -> str:
    """An attempt's result or typed error, with the world's ids named alike."""
    try:
        text = repr(_brief(await call()))
    except LoomflowError as exc:
        text = f"{type(exc).__name__}: {exc}"
    for real, name in sorted(world.names().items(), key=lambda item: -len(item[0])):
        text = text.replace(real, name)
    return _GENERATED.sub("<id>", text)


async def _attempt(
    attempt: str, runtime: Runtime, intruder: str | None, world: World, listed: Listing | None
) -> list[str]:
    """Make one attempt on ``world``'s ids as ``intruder``; return its outcomes."""
    scope = Scope(world.target, intruder)
    store = runtime.store
    agent = _Counting(runtime).agent
    ckpts = world.checkpoints

    async def listing() -> list[SessionRecord]:
        assert listed is not None
        rows = await listed(intruder)
        assert {r.user_id for r in rows} <= {intruder}, "a listing showed another user's sessions"
        return [r for r in rows if r.session_id == world.target]

    calls: list[Callable[[], Awaitable[object]]]
    match attempt:
        case "list_sessions":
            calls = [] if listed is None else [listing]
        case "list_checkpoints":
            calls = [
                lambda: agent.list_checkpoints(world.target, user_id=intruder),
                lambda: store.list_checkpoints(scope, 1000),
            ]
        case "get_checkpoint":
            calls = [partial(runtime.get_checkpoint, scope, c) for c in [None, *ckpts]]
        case "restore":
            calls = [partial(runtime.restore, scope, c) for c in [None, *ckpts]]
        case "read":
            calls = [lambda: store.read_events(scope), lambda: store.step(scope, world.step_key)]
        case "resume":
            calls = [lambda: agent.resume("Mine?", session_id=world.target, user_id=intruder)]
        case "resume_from":
            calls = [
                partial(
                    agent.resume,
                    "Mine?",
                    session_id=world.target,
                    user_id=intruder,
                    from_checkpoint=c,
                )
                for c in ckpts
            ]
        case "fork":
            calls = [partial(runtime.fork, scope, c) for c in ckpts]
        case "signal":
            calls = [
                lambda: agent.signal(world.target, "approve", {"ok": True}, user_id=intruder),
                lambda: runtime.signal(scope, "approve", {"ok": True}),
            ]
        case "prune_session":
            calls = [lambda: store.prune(session_id=world.target, user_id=intruder)]
        case "erase":
            calls = [lambda: store.erase(world.target, user_id=intruder)]
        case _:
            raise AssertionError(f"no attempt {attempt!r}")
    return [await _outcome(call, world) for call in calls]


# -- one user never reaches another's session ----------------------------------------------


async def test_one_user_never_reaches_another_users_session(
    backend: Backend, runtime: Runtime, trials: Trials
) -> None:
    readers: list[PostgresStore] = []
    listed = _listing(runtime, readers)

    async def check(intrusion: Intrusion) -> None:
        tag = _tag()
        pair = intrusion.pair.tagged(tag)
        victim = Scope.of(pair.victim_session, pair.victim_user)
        checkpoints = await _victim(runtime, victim)
        before = await _state(runtime, victim, checkpoints)
        assert before["row"].waiting is not None
        step_key = before["row"].waiting.step_key
        real = World(pair.target, checkpoints, step_key)
        ghost = World(
            f"{intrusion.pair.target}-g{tag}", [new_id("ckpt") for _ in checkpoints], step_key
        )
        for attempt in intrusion.attempts:
            if attempt == "prune_user":
                # store-wide for the intruder, so once for both worlds: it prunes both
                await runtime.store.prune(user_id=pair.intruder, before=datetime.now(UTC))
                continue
            seen = await _attempt(attempt, runtime, pair.intruder, real, listed)
            unknown = await _attempt(attempt, runtime, pair.intruder, ghost, listed)
            assert seen == unknown, (
                f"{attempt} by {pair.intruder!r} on {victim.describe()} differs from the "
                f"same on a session nobody has:\n  victim's: {seen}\n  unknown:  {unknown}"
            )
        assert await _state(runtime, victim, checkpoints) == before
        # the victim's run still waits, and takes the signal its user sends
        assert await runtime.signal(victim, "approve", {"ok": True}) > before["row"].last_seq

    try:
        await _hold(_INTRUSIONS, check, _examples(backend, trials), _KNOWN_INTRUSIONS)
    finally:
        for reader in readers:
            await reader.close()


# -- an erased session never comes back ---------------------------------------------------


@dataclass(frozen=True)
class Afterlife:
    """What happens to an erased session: maybe a prune, a late write of the writer that
    held it, replays of its old events, in ``order``."""

    user: str | None
    prune: str
    order: tuple[str, ...]
    replays: tuple[int, ...]


_AFTERLIVES = st.builds(
    Afterlife,
    st.one_of(st.none(), _PART),
    st.sampled_from(["none", "session", "user", "before"]),
    st.permutations(["prune", "late", "replay"]).map(tuple),
    st.lists(st.integers(min_value=0, max_value=63), min_size=1, max_size=4).map(tuple),
)
#: tried on every run: the whole log replayed after a prune of the user's sessions, which
#: brought the session back (transcript, checkpoints) while prune deleted tombstones
_KNOWN_AFTERLIVES = [Afterlife("a", "user", ("prune", "late", "replay"), tuple(range(20)))]


@dataclass
class _Kafka:
    """Writes onto a Kafka runtime's topic that bypass the runtime (a late process, a
    replaying tool), and what the projector made of them."""

    settings: Settings
    producer: EventProducer

    @classmethod
    def of(cls, runtime: KafkaRuntime) -> _Kafka:
        settings = runtime.settings
        return cls(
            settings, EventProducer(settings.kafka_bootstrap, Topics.from_settings(settings))
        )

    async def dead_letters(self, schema: str | None = None) -> set[str]:
        """Ids of the events dead-lettered in the read model (or ``schema``)."""
        conn = await asyncpg.connect(self.settings.postgres_dsn)
        try:
            rows = await conn.fetch(
                f'SELECT event_id FROM "{schema or self.settings.db_schema}".dead_letters '
                "WHERE event_id IS NOT NULL"
            )
        finally:
            await conn.close()
        return {row[0] for row in rows}

    async def refused(self, events: list[Event]) -> None:
        """Produce ``events`` onto the topic; return once the projector dead-lettered
        each of them."""
        await self.producer.send(events)
        wanted = {e.event_id for e in events}
        await eventually(
            lambda: self._has(wanted), within=30, what=f"the dead letters of {len(wanted)} events"
        )

    async def _has(self, wanted: set[str]) -> bool:
        return wanted <= await self.dead_letters()


async def _stays_erased(
    runtime: Runtime, scope: Scope, checkpoints: list[str], listed: Listing | None
) -> None:
    """The erased session is nowhere: not listed, read, restored, resumed, forked or
    signalled, and its log is its tombstone."""
    assert [e.type for e in await runtime.store.read_events(scope)] == ["session.erased"]
    row = await runtime.store.session(scope)
    assert row is not None and row.status == "erased" and row.turns == 0
    for checkpoint in [None, *checkpoints]:
        assert await runtime.get_checkpoint(scope, checkpoint) is None
        assert await runtime.restore(scope, checkpoint) is None
    assert await runtime.list_checkpoints(scope) == []
    if listed is not None:
        assert scope.session_id not in {r.session_id for r in await listed(scope.user_id)}
    follower = _Counting(runtime)
    for checkpoint in checkpoints:
        with pytest.raises(CheckpointNotFoundError):
            await follower.agent.resume(
                session_id=scope.session_id, user_id=scope.user_id, from_checkpoint=checkpoint
            )
        with pytest.raises(CheckpointNotFoundError):
            await runtime.fork(scope, checkpoint)
    with pytest.raises(SessionErasedError):
        await follower.agent.resume("Again.", session_id=scope.session_id, user_id=scope.user_id)
    assert follower.calls == 0
    with pytest.raises(SessionNotFoundError):
        await runtime.signal(scope, "approve", {"ok": True})
    assert await runtime.store.erase(scope.session_id, user_id=scope.user_id) is False
    assert [e.type for e in await runtime.store.read_events(scope)] == ["session.erased"]


def _late(event: Event, scope: Scope, seq: int) -> Event:
    """A turn that the writer of ``event`` (its run and old epoch) writes at ``seq``."""
    return TurnAppended(
        user_id=scope.user_id,
        session_id=scope.session_id,
        run_id=event.run_id,
        seq=seq,
        epoch=event.epoch,
        payload=TurnAppendedPayload(messages=[Message.user("late")]),
    )


async def test_an_erased_session_never_comes_back(
    backend: Backend, runtime: Runtime, trials: Trials
) -> None:
    readers: list[PostgresStore] = []
    listed = _listing(runtime, readers)
    kafka = _Kafka.of(runtime) if isinstance(runtime, KafkaRuntime) else None
    erased: list[tuple[Scope, list[str], set[str]]] = []

    async def check(afterlife: Afterlife) -> None:
        tag = _tag()
        user = None if afterlife.user is None else f"u{tag}.{afterlife.user}"
        scope = Scope.of(f"e-{tag}", user)
        await (
            Research(passes=2)
            .agent(runtime)
            .run("Research.", session_id=scope.session_id, user_id=user)
        )
        checkpoints = [m.checkpoint_id for m in reversed(await runtime.list_checkpoints(scope))]
        # a writer that still holds the session when it is erased
        writer = await runtime.open_session(scope, run_id=new_id("run"))
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("secret")]))
        old = await runtime.store.read_events(scope)
        assert await runtime.store.erase(scope.session_id, user_id=user) is True
        tombstone = (await runtime.store.read_events(scope))[-1].seq
        refused: set[str] = set()
        for step in afterlife.order:
            if step == "prune" and afterlife.prune == "session":
                await runtime.store.prune(session_id=scope.session_id, user_id=user)
            elif step == "prune" and afterlife.prune == "user":
                await runtime.store.prune(user_id=user)
            elif step == "prune" and afterlife.prune == "before":
                await runtime.store.prune(before=datetime.now(UTC))
            elif step == "late":
                with pytest.raises(SessionErasedError):
                    await writer.emit(
                        TurnAppended, TurnAppendedPayload(messages=[Message.user("late")])
                    )
                    await writer.confirm()  # a log-first store refuses it in its projector
            elif step == "replay":
                replays = [old[i % len(old)] for i in afterlife.replays]
                replays.append(_late(old[-1], scope, tombstone + 1))
                if kafka is not None:  # onto the topic, as a process that missed the erasure
                    await kafka.refused(replays)
                    refused |= {e.event_id for e in replays}
                else:
                    for event in replays:
                        with pytest.raises(SessionErasedError):
                            await runtime.store.append([event])
        await _stays_erased(runtime, scope, checkpoints, listed)
        erased.append((scope, checkpoints, refused))

    try:
        await _hold(_AFTERLIVES, check, _examples(backend, trials), _KNOWN_AFTERLIVES)
        if kafka is not None:
            await _rebuilt_stays_erased(kafka, erased)
    finally:
        for reader in readers:
            await reader.close()
        if kafka is not None:
            await kafka.producer.stop()


async def _rebuilt_stays_erased(
    kafka: _Kafka, erased: list[tuple[Scope, list[str], set[str]]]
) -> None:
    """A read model rebuilt from the topic holds each erased session as the live one
    does, as a tombstone, and dead-letters its late and replayed events again."""
    schema = f"{kafka.settings.db_schema}_rb"
    try:
        await rebuild(kafka.settings, schema=schema)
        live = await in_postgres(kafka.settings.postgres_dsn, kafka.settings.db_schema)
        rebuilt = await in_postgres(kafka.settings.postgres_dsn, schema)
        store = PostgresStore(kafka.settings.postgres_dsn, schema=schema, create=False)
        replayed = Runtime(store)
        try:
            for scope, checkpoints, refused in erased:
                key = (scope.user_id, scope.session_id)
                assert rebuilt[key] == live[key]
                assert [e.type for e in await store.read_events(scope)] == ["session.erased"]
                assert await replayed.restore(scope) is None
                assert await replayed.list_checkpoints(scope) == []
                for checkpoint in checkpoints:
                    assert await replayed.get_checkpoint(scope, checkpoint) is None
                assert refused <= await kafka.dead_letters(schema)
        finally:
            await replayed.close()
    finally:
        conn = await asyncpg.connect(kafka.settings.postgres_dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


@pytest.mark.kafka
@pytest.mark.postgres
async def test_an_erased_sessions_snapshot_goes_with_it() -> None:
    """The snapshots topic is a projection too: once a session is erased, what compaction
    keeps of its key is a tombstone, not its last transcript."""
    env = await KafkaEnv.create()
    runtime = env.runtime()
    try:
        projector = await env.start_projector(snapshot_interval=3600)
        scope = Scope("s1", "alice")
        key = scope_key(scope.user_id, scope.session_id)
        await Research(passes=2).agent(runtime).run("Research.", session_id="s1", user_id="alice")

        async def snapshot() -> tuple[bool, bytes | None]:
            """Whether the topic has a record of the session, and the latest one's value."""
            await asyncio.wait_for(projector.snapshots_published(), 30)
            try:
                records = await read_records(
                    env.bootstrap, env.topics.snapshots, env.topics.partitions
                )
            except KafkaError as exc:
                if not exc.retriable:  # a new topic's leader is still being elected
                    raise
                return False, None
            latest = {record.key: record.value for record in records}
            return key in latest, latest.get(key)

        await eventually(lambda: _published(snapshot), within=30, what="the session's snapshot")
        assert await runtime.store.erase("s1", user_id="alice") is True
        await eventually(lambda: _tombstoned(snapshot), within=30, what="a tombstone for it")
    finally:
        await runtime.close()
        await env.close()


async def _published(snapshot: Callable[[], Awaitable[tuple[bool, bytes | None]]]) -> bool:
    there, value = await snapshot()
    return there and value is not None


async def _tombstoned(snapshot: Callable[[], Awaitable[tuple[bool, bytes | None]]]) -> bool:
    there, value = await snapshot()
    return there and value is None
