"""Fuzzing the public API with ids and payloads, on the embedded runtimes.

Properties: an invalid id is an InvalidIdError wherever it is passed, and leaves the store
as it was; a valid id round-trips through run, resume, list, fork, signal and prune; two
scopes never share a storage or partition key; a value JSON cannot hold is a typed error
(signal payloads, run metadata) or the tool's recorded error (tool results), and what is
accepted is written as JSON every reader decodes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import closing, contextmanager
from datetime import date, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from loomflow import (
    Agent,
    InvalidIdError,
    LoomflowError,
    Role,
    SerializationError,
    SignalRefusedError,
    Tuning,
)
from loomflow.models import ScriptedModel
from loomflow.producers import scope_key
from loomflow.projections.rows import stored_user
from loomflow.projections.sqlite import EVENT_COLUMNS, decode_event_row
from loomflow.projections.sqlite.tables import payload_text
from loomflow.runtime import (
    InProcRuntime,
    InProcStore,
    Journal,
    Runtime,
    Scope,
    SqliteRuntime,
    SqliteStore,
)
from loomflow.schemas import Event, RunStarted, SignalSent, new_id
from loomflow.schemas.codec import decode_event
from tests.faults.conftest import Trials
from tests.support.fuzzing import (
    any_values,
    fuzz_settings,
    invalid_ids,
    json_can_hold,
    json_values,
    valid_ids,
)
from tests.support.scenario import Research
from tests.support.signals import approval_agent

BACKENDS = ["inproc", "sqlite"]
_TABLES = ("loomflow_events", "loomflow_sessions", "loomflow_checkpoints", "loomflow_steps")
_names = itertools.count()


def _runtime(backend: str, where: Path) -> Runtime:
    if backend == "inproc":
        return InProcRuntime()
    return SqliteRuntime(where / f"journal-{next(_names)}.db")


def _held(runtime: Runtime) -> object:
    """Everything the runtime's store holds, to compare before and after a refused call."""
    store = runtime.store
    if isinstance(store, InProcStore):
        return {key: (list(e.log), e.row) for key, e in store._memory.sessions.items()}
    with closing(sqlite3.connect(_path(runtime))) as conn:
        return [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in _TABLES
        ]


def _path(runtime: Runtime) -> Path:
    assert isinstance(runtime.store, SqliteStore)
    return runtime.store.path


def _events(runtime: Runtime, session: str | None = None) -> list[Event]:
    """The events in the store's log (of ``session``, of every one when None), each read
    back the way its readers read it."""
    store = runtime.store
    if isinstance(store, InProcStore):
        # memory holds the objects: the JSON they would be written as must decode to them
        logged = [
            e
            for scope, entry in store._memory.sessions.items()
            if session in (None, scope.session_id)
            for e in entry.log
        ]
        decoded = [decode_event(e.model_dump_json()) for e in logged]
        assert decoded == logged
        return decoded
    with closing(sqlite3.connect(_path(runtime))) as conn:
        rows = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM loomflow_events WHERE ?1 IS NULL OR session_id = ?1",
            (session,),
        ).fetchall()
    for row in rows:  # JSON as the standard has it (a large one inflated as readers do)
        json.loads(payload_text(row[-1], "log row"), parse_constant=_refuse)
    return [decode_event_row(row) for row in rows]


def _refuse(constant: str) -> None:
    raise AssertionError(f"the log holds {constant}, which JSON cannot")


Run = Callable[[Coroutine[Any, Any, Any]], Any]


@contextmanager
def _loop() -> Iterator[Run]:
    """One event loop for a whole property: its runtime lives across the examples."""
    with asyncio.Runner() as runner:
        yield runner.run


@contextmanager
def _opened(backend: str, where: Path) -> Iterator[tuple[Run, Runtime]]:
    """An event loop and an opened runtime on it, for a whole property."""
    with _loop() as run:
        runtime = _runtime(backend, where)
        run(runtime.open())
        try:
            yield run, runtime
        finally:
            run(runtime.close())


# -- ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_invalid_id_is_refused_and_writes_nothing(
    backend: str, tmp_path: Path, trials: Trials
) -> None:
    with _opened(backend, tmp_path) as (run, runtime):
        research = Research(passes=1)
        agent = run(research.ran(runtime, user_id="alice"))
        checkpoint = run(agent.list_checkpoints("s1", user_id="alice"))[0].checkpoint_id
        run(approval_agent(runtime, []).run("Pay.", session_id="pay"))
        parent = Scope("s1", "alice")

        def calls(bad: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
            those: dict[str, Callable[[], Awaitable[Any]]] = {
                "run(session_id)": lambda: agent.run("hi", session_id=bad),
                "run(user_id)": lambda: agent.run("hi", session_id="s1", user_id=bad),
                "resume(session_id)": lambda: agent.resume("hi", session_id=bad),
                "resume(user_id)": lambda: agent.resume("hi", session_id="s1", user_id=bad),
                "list_checkpoints(session_id)": lambda: agent.list_checkpoints(bad),
                "list_checkpoints(user_id)": lambda: agent.list_checkpoints("s1", user_id=bad),
                "signal(session_id)": lambda: agent.signal(bad, "approve", {"ok": True}),
                "signal(user_id)": lambda: agent.signal("pay", "approve", 1, user_id=bad),
                "prune(session_id)": lambda: runtime.store.prune(session_id=bad),
                "prune(user_id)": lambda: runtime.store.prune(user_id=bad),
                "erase(session_id)": lambda: runtime.store.erase(bad),
                "erase(user_id)": lambda: runtime.store.erase("s1", user_id=bad),
                "fork(session_id)": lambda: runtime.fork(parent, checkpoint, session_id=bad),
                "fork(parent)": lambda: runtime.fork(Scope(bad, "alice"), checkpoint),
                "Scope.of": lambda: _call(Scope.of, "s1", bad),
            }
            if isinstance(bad, str):  # a checkpoint id that is no str is a TypeError
                those["resume(from_checkpoint)"] = lambda: agent.resume(
                    "hi", session_id="s1", user_id="alice", from_checkpoint=bad
                )
            return those

        async def refused_everywhere(bad: Any) -> list[str]:
            wrong = []
            for name, call in calls(bad).items():
                try:
                    await call()
                except InvalidIdError:
                    continue
                except Exception as exc:
                    wrong.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
                else:
                    wrong.append(f"{name}: accepted")
            return wrong

        before = _held(runtime)

        @fuzz_settings(trials(ci=30, soak=1500))
        @given(bad=invalid_ids())
        @example(bad="s1\n")  # `$` matched before a trailing newline: the id passed
        @example(bad="alice\n")
        @example(bad="a/b")
        def check(bad: Any) -> None:
            wrong = run(refused_everywhere(bad))
            assert not wrong, f"{bad!r} was not an InvalidIdError:\n" + "\n".join(wrong)
            assert _held(runtime) == before, f"{bad!r} wrote to the store"

        check()


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_positive_limit_lists(backend: str, tmp_path: Path, trials: Trials) -> None:
    """A limit past what SQL holds lists everything (SQLite raised OverflowError)."""
    with _opened(backend, tmp_path) as (run, runtime):
        agent = run(Research(passes=3).ran(runtime))

        @fuzz_settings(trials(ci=20, soak=500))
        @given(limit=st.integers(min_value=1))
        @example(limit=2**70)
        def check(limit: int) -> None:
            metas = run(agent.list_checkpoints("s1", limit))
            assert len(metas) == min(limit, 3)

        check()


async def test_a_fork_from_an_invalid_checkpoint_id_is_an_invalid_id() -> None:
    runtime = InProcRuntime()
    agent = await Research(passes=1).ran(runtime)
    assert await agent.list_checkpoints("s1")
    with pytest.raises(InvalidIdError):
        await runtime.fork(Scope("s1"), "../s2")


@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_ids_round_trip(backend: str, tmp_path: Path, trials: Trials) -> None:
    """run, list, restore, resume, fork, signal and prune with any valid ids: each finds
    the session under exactly the ids it was written with."""

    async def round_trip(session: str, user: str | None, other: str | None, child: str) -> None:
        runtime = _runtime(backend, tmp_path)
        try:
            agent = Agent(
                "x",
                model=ScriptedModel(["ok"] * 4),
                runtime=runtime,
                tuning=Tuning(checkpoint=True),
            )
            result = await agent.run("hi", session_id=session, user_id=user)
            assert result.session_id == session
            metas = await agent.list_checkpoints(session, user_id=user)
            assert [m.session_id for m in metas] == [session]
            assert await agent.list_checkpoints(session, user_id=other) == []
            assert await runtime.restore(Scope(session, other)) is None
            resumed = await agent.resume("more", session_id=session, user_id=user)
            assert resumed.session_id == session and resumed.restored_turns == 1
            fork = await runtime.fork(
                Scope(session, user), metas[0].checkpoint_id, session_id=child
            )
            assert fork == Scope(child, user)
            state = await runtime.restore(fork)
            assert state is not None and [m.content for m in state.messages] == ["x", "hi", "ok"]
            with pytest.raises(SignalRefusedError):  # finished: no run to receive it
                await agent.signal(session, "go", {"n": 1}, user_id=user)
            pruned = await runtime.store.prune(session_id=session, user_id=user)
            assert pruned.sessions == 1
            assert await runtime.restore(Scope(session, user)) is None
            assert await runtime.restore(fork) is not None
        finally:
            await runtime.close()

    with _loop() as run:

        @fuzz_settings(trials(ci=15, soak=400))
        @given(
            session=valid_ids(),
            user=st.none() | valid_ids(),
            other=st.none() | valid_ids(),
            child=valid_ids(),
        )
        def check(session: str, user: str | None, other: str | None, child: str) -> None:
            assume(user != other and child != session)
            run(round_trip(session, user, other, child))

        check()


def test_two_scopes_never_share_a_storage_key(trials: Trials) -> None:
    """Kafka's record key and the SQL dialects' (user, session) key tell scopes apart."""
    scopes = st.tuples(st.none() | valid_ids(), valid_ids())

    @fuzz_settings(trials(ci=500, soak=20_000))
    @given(first=scopes, second=scopes)
    @example(first=(None, "a"), second=("a", "a"))
    @example(first=(None, "b"), second=("", "b"))  # '' is no user id, and never stored as one
    def check(first: tuple[str | None, str], second: tuple[str | None, str]) -> None:
        if second[0] == "":
            with pytest.raises(InvalidIdError):
                Scope(second[1], second[0])
            return
        assume(first != second)
        assert scope_key(*first) != scope_key(*second)
        assert (stored_user(first[0]), first[1]) != (stored_user(second[0]), second[1])

    check()


# -- payloads ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tool_value_is_its_json_or_a_recorded_tool_error(
    backend: str, tmp_path: Path, trials: Trials
) -> None:
    with _opened(backend, tmp_path) as (run, runtime):

        async def one(value: Any, session: str) -> None:
            runs: list[int] = []

            def fetch() -> Any:
                """Fetch something."""
                runs.append(1)
                return value

            model = ScriptedModel([ScriptedModel.tool_call("fetch"), "done", "again"])
            agent = Agent("x", model=model, runtime=runtime, tools=[fetch])
            assert (await agent.run("go", session_id=session)).output == "done"
            state = await runtime.restore(Scope(session))
            assert state is not None
            (tool,) = [m for m in state.messages if m.role is Role.TOOL]
            if isinstance(value, str):
                assert not tool.is_error
                assert tool.content == value or not json_can_hold(value)
                tool.content.encode("utf-8")
            elif json_can_hold(value):
                assert not tool.is_error and json.loads(tool.content) == _json(value)
            else:
                assert tool.is_error and "SerializationError" in tool.content, tool.content
            await agent.resume(session_id=session)  # replays the recorded result
            assert runs == [1]

        @fuzz_settings(trials(ci=25, soak=800))
        @given(value=any_values() | st.text())
        @example(value="a file name undecodable in UTF-8: \udcff")  # os.fsdecode makes these
        @example(value={"k": float("nan")})
        def check(value: Any) -> None:
            session = f"t{next(_names)}"
            run(one(value, session))
            _events(runtime, session)  # its log decodes

        check()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prompt_with_a_lone_surrogate_runs(backend: str, tmp_path: Path) -> None:
    """Text from bytes that are not UTF-8 (os.fsdecode's) in a prompt: the run wrote its
    run.started and then failed with PydanticSerializationError; now U+FFFD stands in."""
    with _opened(backend, tmp_path) as (run, runtime):
        agent = Agent("x", model=ScriptedModel(lambda messages: "ok"), runtime=runtime)
        assert run(agent.run("read \udcff.txt", session_id="p")).output == "ok"
        state = run(runtime.restore(Scope("p")))
        assert state is not None and state.messages[1].content == "read \ufffd.txt"
        _events(runtime)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_signal_payload_is_sent_as_json_or_refused_with_nothing_written(
    backend: str, tmp_path: Path, trials: Trials
) -> None:
    with _opened(backend, tmp_path) as (run, runtime):
        agent = approval_agent(runtime, [])
        run(agent.run("Pay.", session_id="pay"))

        def sent(events: list[Event]) -> Any:
            return [e for e in events if isinstance(e, SignalSent)][-1].payload.data

        @fuzz_settings(trials(ci=25, soak=800))
        @given(payload=any_values())
        def check(payload: Any) -> None:
            send = partial(agent.signal, "pay", "approve", payload)
            run(_json_or_refused(runtime, "pay", payload, send, sent))

        check()


async def test_a_signal_name_json_cannot_hold_is_a_typed_error() -> None:
    runtime = InProcRuntime()
    agent = approval_agent(runtime, [])
    await agent.run("Pay.", session_id="pay")
    with pytest.raises(ValueError) as refused:  # pydantic's ValidationError is one
        await agent.signal("pay", "approve\ud800", {"ok": True})
    # as a name that is empty or too long is refused (or a SerializationError)
    assert type(refused.value) is ValueError or isinstance(refused.value, LoomflowError)


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_metadata_is_written_as_json_or_refused_with_nothing_written(
    backend: str, tmp_path: Path, trials: Trials
) -> None:
    with _opened(backend, tmp_path) as (run, runtime):
        agent = Agent("x", model=ScriptedModel(lambda messages: "ok"), runtime=runtime)

        @fuzz_settings(trials(ci=25, soak=800))
        @given(
            metadata=st.dictionaries(
                st.text(max_size=6) | st.integers(0, 3), any_values() | json_values(), max_size=3
            )
        )
        @example(metadata={"score": float("nan")})  # was written as null
        @example(metadata={"when": b"\xff"})
        @example(metadata={1: "a"})
        def check(metadata: dict[Any, Any]) -> None:
            session = f"m{next(_names)}"

            def started(events: list[Event]) -> Any:
                (event,) = [e for e in events if isinstance(e, RunStarted)]
                return event.payload.metadata

            send = partial(agent.run, "hi", session_id=session, metadata=metadata)
            run(_json_or_refused(runtime, session, metadata, send, started))

        check()


async def _json_or_refused(
    runtime: Runtime,
    session: str,
    value: Any,
    send: Callable[[], Awaitable[Any]],
    written: Callable[[list[Event]], Any],
) -> None:
    """``send()`` (which passes ``value``) is a SerializationError that writes nothing
    when JSON cannot hold ``value``; otherwise ``written`` finds its JSON in the log of
    ``session``."""
    before = _held(runtime)
    if not json_can_hold(value):
        with pytest.raises(SerializationError):
            await send()
        assert _held(runtime) == before
        return
    await send()
    assert written(_events(runtime, session)) == _json(value)


# -- journal steps -------------------------------------------------------------------------

_HASHABLE = st.one_of(
    st.integers(),
    st.text(max_size=4),
    st.tuples(st.integers()),
    st.frozensets(st.integers(0, 3), max_size=2),
)
_TAGGED = st.one_of(  # what tagged JSON keeps as it was
    st.integers(),
    st.floats(),
    st.binary(max_size=8),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.dates(),
    st.decimals(),
    st.uuids(),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.frozensets(_HASHABLE, max_size=3),
)


def _journal_can_hold(value: Any) -> bool:
    """Whether tagged JSON keeps ``value``: JSON, and the types it tags, but no lone
    surrogates, keys that are not strings, or objects."""
    if isinstance(value, str):
        return json_can_hold(value)
    if isinstance(value, list | tuple | set | frozenset):
        return all(_journal_can_hold(item) for item in value)
    if isinstance(value, dict):
        return all(json_can_hold(k) and isinstance(k, str) for k in value) and all(
            _journal_can_hold(v) for v in value.values()
        )
    return value is None or isinstance(
        value, bool | int | float | bytes | datetime | date | Decimal | UUID
    )


def _same(a: Any, b: Any) -> bool:
    """Equality in which NaN is itself."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_nan():
        return b.is_nan() and a.is_signed() == b.is_signed()
    if isinstance(a, list | tuple) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, datetime) and isinstance(b, datetime):
        # the offset is kept, not the zone: compared across zones, a time in a repeated
        # hour (PEP 495's fold) is equal to no other
        return a.utcoffset() == b.utcoffset() and a.replace(tzinfo=None) == b.replace(tzinfo=None)
    return bool(a == b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_journal_step_replays_its_value_or_refuses_it(
    backend: str, tmp_path: Path, trials: Trials
) -> None:
    """A step's value is replayed as it was by another runtime, or is a
    SerializationError; a step key every store cannot keep is a ValueError. Either way
    nothing else is raised, and a refused step writes nothing (SQLite raised TypeError
    for an int past 64 bits, and for a lone surrogate, which InProc kept)."""
    with _opened(backend, tmp_path) as (run, runtime):

        async def step(key: Any, value: Any, session: str) -> None:
            async def work() -> Any:
                return value

            scope = Scope(session)
            journal = Journal(await runtime.open_session(scope, run_id=new_id("run")))
            try:
                got = await journal.step(key, work)
            except (ValueError, SerializationError) as exc:
                if isinstance(exc, SerializationError):
                    assert not _journal_can_hold(value), exc
                else:
                    assert isinstance(key, str) and ("\x00" in key or not json_can_hold(key))
                assert len(_events(runtime, session)) == 1  # the run's claim alone
                return
            assert _journal_can_hold(value) and got is value
            again = Journal(await runtime.open_session(scope, run_id=new_id("run")))
            replayed = await again.step(key, work)
            assert _same(replayed, value), (replayed, value)

        @fuzz_settings(trials(ci=25, soak=800))
        @given(
            key=st.text(min_size=1, max_size=12) | st.sampled_from(["a\x00b", "\ud800"]),
            value=st.one_of(any_values(), _TAGGED, st.lists(_TAGGED, max_size=3)),
        )
        @example(key="k", value=2**70)  # SQLite: TypeError, Integer exceeds 64-bit range
        @example(key="k", value=10**5000)  # past the 4300 digits str() converts
        @example(key="k", value="\ud800")  # SQLite: TypeError; InProc kept it
        @example(key="a\x00b", value=1)  # PostgreSQL: StoreError, where SQLite took it
        @example(key="k", value=frozenset([frozenset()]))  # recorded, then every replay
        # raised CorruptRecordError (a set in a set decoded as a set: unhashable)
        def check(key: Any, value: Any) -> None:
            session = f"j{next(_names)}"
            run(step(key, value, session))
            _events(runtime, session)

        check()


def _json(value: Any) -> Any:
    """``value`` as a reader of its JSON gets it back."""
    return json.loads(json.dumps(value))
