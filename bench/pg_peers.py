"""PostgresRuntime beside its peers on the same PostgreSQL: LangGraph's AsyncPostgresSaver, DBOS.

    .venv/bin/python -m bench.pg_peers [--stacks ours,langgraph,dbos] [--cases turn,put]
                                       [--turns 30] [--passes 100] [--reps 3] [--json out.json]

Needs LOOMFLOW_POSTGRES_DSN. Every stack works on the PostgreSQL it names, in a schema of
its own made and dropped by the measuring process; the peers run from the peers venv
(.cache/bench-peers, installed here on first use with the pins of ``PEER_REQUIREMENTS``),
this file run by path with that venv's python, as bench/turn.py runs loomflow 0.20.0.

**turn**: one session of ``--turns`` user turns (30 by default), each the same work on every
stack: the user's message (200 characters), the model's call of ``search_docs``, the tool's
result (400 characters), the model's answer (600 characters); texts and tool arguments are
``bench.workload.pass_content``'s, so the stacks keep the same bytes. The model answers at
once by a counter (tool call, then answer); the tool is the same synchronous function,
run in a thread by each stack (ours and LangGraph's ToolNode do so themselves, DBOS's step
by ``asyncio.to_thread``). A turn's figure is the wall time of the call a user awaits.

- ``ours``: the spec's code, as bench/turn.py's ``Ours``: ``Agent(..., runtime=
  PostgresRuntime(...), tuning=Tuning(checkpoint=True), tools=[search_docs])`` with a
  ``ScriptedModel``; ``agent.run`` for turn 1, ``agent.resume(prompt, session_id=...)`` after.
- ``langgraph``: a ``StateGraph(MessagesState)`` with a model node and a ``ToolNode``
  (``tools_condition`` between them), compiled with ``AsyncPostgresSaver`` (its
  ``from_conn_string`` defaults; ``setup()`` untimed); ``graph.ainvoke({"messages":
  [HumanMessage(prompt)]}, {"configurable": {"thread_id": ...}})`` per turn, the system
  message in the first turn's input. The model is langchain's ``GenericFakeChatModel`` fed
  by a generator, with its async call answering in the loop (the base class would run it in
  a thread, as no real async chat model does).
- ``dbos``: a ``@DBOS.workflow()`` per user turn whose steps are the model calls
  (``@DBOS.step()``) and the tool call, with the transcript kept in a table of the user's
  read and appended by DBOS datasource transactions (``AsyncSQLAlchemyDatasource``,
  ``@ds.transaction()`` with its defaults: each records its output, exactly once). DBOS's
  system tables and the datasource's go in a schema of the run's own
  (``dbos_system_schema``), in the same database: DBOS needs no CREATE DATABASE there.

**put**: one session of ``--passes`` passes (100 by default) of the checkpoint workload
(user message, assistant message with a tool call, tool result), a checkpoint per pass
holding the transcript so far, timed per pass:

- ``ours``: bench/checkpoints.py's lf-pg put (``LoomflowAdapter``: the pass's three appends
  as the agent loop makes them and the staged checkpoint; the last pass with ``confirm()``).
- ``langgraph``: ``saver.aput(config, checkpoint, metadata, new_versions)`` of the graph's
  channels (the ``messages`` channel holds the transcript as langchain messages), as the
  pregel loop calls it after a step.
- ``dbos``: one ``@DBOS.step()`` inside a workflow whose recorded output is the transcript
  (the messages as dicts): what DBOS writes to keep a pass's state.

Every (stack, case, repetition) runs in a fresh process, which first makes an untimed
warm-up session (3 turns; 3 passes). Figures: turn: p50 of turns 1-10 and of turns
11-N per session; put: p50 and p99 of all passes, p50 of the last 20; then the median and
(min-max) over ``--reps``. "/ best peer": ours over the faster peer's median.

**ok**: the stored transcript (ours: the latest checkpoint; LangGraph: the thread's state;
DBOS: its messages table, and for put the last step's recorded output) equals the one built
here independently, message by message (role, text, tool call id), and every turn's output
was the scripted answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    # run by path with the peers venv's python: our source tree appended, for bench/
    sys.path.append(str(REPO))

from bench.checkpoints import (  # noqa: E402
    DASH,
    PEER_VENV,
    _clean_env,
    ensure_peers,
    run_measurement,
    schedule,
)
from bench.workload import (  # noqa: E402
    SYSTEM_PROMPT,
    PassContent,
    SearchDocs,
    pass_content,
    percentile,
)

STACKS = ("ours", "langgraph", "dbos")
PEERS = ("langgraph", "dbos")
CASES = ("turn", "put")
#: peer -> the pip requirements of the peers venv
PEER_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "langgraph": (
        "langgraph==1.2.24",
        "langgraph-checkpoint-postgres==3.2.0",
        "psycopg[binary,pool]==3.3.9",
    ),
    "dbos": ("dbos==3.4.0", "psycopg[binary]==3.3.9"),
}
#: stack -> the packages whose versions its runs report
VERSION_NAMES: dict[str, tuple[str, ...]] = {
    "langgraph": (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "langchain-core",
        "psycopg",
    ),
    "dbos": ("dbos", "SQLAlchemy", "psycopg"),
}
DEFAULT_TURNS, DEFAULT_PASSES = 30, 100
WARMUP = 3
FIRST = 10  # turns 1-10 apart: the later ones are the figure
LAST_N = 20
TARGET = 0.5  # ours per turn <= 0.5x the best peer's
CHILD_TIMEOUT_S = 600

#: a message as every stack's check sees it: (role, text, tool call id)
Norm = tuple[str, str, str]


# -- what every stack must have stored ---------------------------------------------------------


def call_id(content: PassContent) -> str:
    """The model's tool call id in a turn of this content (every stack uses the same)."""
    return f"toolu_{content.call_id}"


def turn_transcript(index: int, turns: int) -> list[Norm]:
    """What ``turns`` user turns of session ``index`` leave: the system message, then per
    turn the user's message, the tool call, its result and the answer."""
    out: list[Norm] = [("system", SYSTEM_PROMPT, "")]
    for k in range(1, turns + 1):
        c = pass_content(index, k)
        call = call_id(c)
        out += [
            ("user", c.user, ""),
            ("assistant", "", call),
            ("tool", c.tool_result, call),
            ("assistant", c.assistant, ""),
        ]
    return out


def put_transcript(index: int, passes: int) -> list[Norm]:
    """The checkpoint workload's transcript after ``passes`` passes (bench.checkpoints)."""
    out: list[Norm] = [("system", SYSTEM_PROMPT, "")]
    for k in range(1, passes + 1):
        c = pass_content(index, k)
        out += [
            ("user", c.user, ""),
            ("assistant", c.assistant, c.call_id),
            ("tool", c.tool_result, c.call_id),
        ]
    return out


def transcript_problems(stored: Sequence[Norm], expected: Sequence[Norm]) -> list[str]:
    """Where the stored transcript differs from the expected one (empty: it does not)."""
    for i, (got, want) in enumerate(zip(stored, expected, strict=False)):
        if tuple(got) != tuple(want):
            return [
                f"message {i} is {got[0]} {got[1][:30]!r} ({got[2] or '-'}), expected "
                f"{want[0]} {want[1][:30]!r} ({want[2] or '-'})"
            ]
    if len(stored) != len(expected):
        return [f"the stored transcript holds {len(stored)} messages, expected {len(expected)}"]
    return []


def turn_figures(ms: Sequence[float]) -> dict[str, Any]:
    """p50 of turns 1-10 and of the turns after them."""
    first, later = ms[:FIRST], ms[FIRST:]
    return {
        "first_p50": percentile(first, 50) if first else None,
        "turn_p50": percentile(later, 50) if later else None,
        "turns": len(ms),
    }


def put_figures(ms: Sequence[float]) -> dict[str, Any]:
    return {
        "put_p50": percentile(ms, 50),
        "put_p99": percentile(ms, 99),
        "last20_put_p50": percentile(ms[-LAST_N:], 50),
        "passes": len(ms),
    }


async def drive(
    turn: Callable[[int, str], Awaitable[str]], index: int, turns: int
) -> tuple[list[float], list[str]]:
    """Run ``turns`` user turns one after another: per-turn ms and the wrong outputs."""
    ms: list[float] = []
    problems: list[str] = []
    for k in range(1, turns + 1):
        c = pass_content(index, k)
        t0 = time.perf_counter_ns()
        output = await turn(k, c.user)
        ms.append((time.perf_counter_ns() - t0) / 1e6)
        if output != c.assistant:
            problems.append(f"turn {k}: output {str(output)[:40]!r} is not the scripted answer")
    return ms, problems


def _schema(stack: str) -> str:
    return f"lf_bench_{stack}_{secrets.token_hex(4)}"


def _dsn() -> str:
    dsn = os.environ.get("LOOMFLOW_POSTGRES_DSN")
    if not dsn:
        raise RuntimeError(
            "bench.pg_peers needs LOOMFLOW_POSTGRES_DSN: run `dev/postgres.sh start` and "
            "export what it prints"
        )
    return dsn


def _peer(module: str) -> Any:
    """A module of the peers venv (untyped: mypy has no stubs for them here)."""
    return importlib.import_module(module)


# -- ours --------------------------------------------------------------------------------------


async def ours_turn(turns: int) -> dict[str, Any]:
    from bench.turn import Ours, _open_store
    from loomflow.runtime import Scope

    with tempfile.TemporaryDirectory(prefix="lf-bench-pgpeers-") as tmp:
        async with _open_store("lf-pg", Path(tmp)) as opened:
            result: dict[str, Any] = {}
            for index, count in ((-1, WARMUP), (0, turns)):
                session = Ours(index, count, opened.runtime, "scripted")

                async def turn(k: int, prompt: str, session: Ours = session) -> str:
                    return await (session.first(prompt) if k == 1 else session.next(prompt))

                try:
                    ms, problems = await drive(turn, index, count)
                finally:
                    await session.close()
                found = await opened.runtime.get_checkpoint(Scope(session.session_id))
                stored = [] if found is None else [_our_norm(m) for m in found.messages]
                problems += transcript_problems(stored, turn_transcript(index, count))
                result = {**turn_figures(ms), "problems": problems}
            return result


def _our_norm(message: Any) -> Norm:
    role = str(getattr(message.role, "value", message.role))
    call = message.tool_calls[0].id if message.tool_calls else (message.tool_call_id or "")
    return (role, message.content, call)


async def ours_put(passes: int) -> dict[str, Any]:
    from bench.checkpoints import LoomflowAdapter

    with tempfile.TemporaryDirectory(prefix="lf-bench-pgpeers-") as tmp:
        adapter = LoomflowAdapter("lf-pg", Path(tmp))
        try:
            await adapter.open()
            result: dict[str, Any] = {}
            for index, count in ((-1, WARMUP), (0, passes)):
                handle = await adapter.seed(index)
                ms: list[float] = []
                for k in range(1, count + 1):
                    new = adapter.add(handle, k, pass_content(index, k))
                    t0 = time.perf_counter_ns()
                    await adapter.put(handle, k, new)
                    if k == count:
                        await adapter.finish(handle)
                    ms.append((time.perf_counter_ns() - t0) / 1e6)
                messages, _ = await adapter.get_latest(handle)
                stored = [_our_norm(m) for m in messages]
                problems = transcript_problems(stored, put_transcript(index, count))
                result = {**put_figures(ms), "problems": problems}
            await adapter.close()
            return result
        finally:
            await adapter.teardown()


# -- LangGraph: a StateGraph on AsyncPostgresSaver ---------------------------------------------


async def _admin(sql: str) -> None:
    psycopg = _peer("psycopg")
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await conn.execute(sql)


@contextlib.asynccontextmanager
async def _own_schema(stack: str) -> AsyncIterator[str]:
    """A schema made for this run and dropped after it, whatever happens."""
    schema = _schema(stack)
    await _admin(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        await _admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.asynccontextmanager
async def _saver() -> AsyncIterator[Any]:
    """``AsyncPostgresSaver.from_conn_string`` on a schema of its own (its search_path)."""
    conninfo = _peer("psycopg.conninfo")
    aio = _peer("langgraph.checkpoint.postgres.aio")
    async with _own_schema("lg") as schema:
        dsn = conninfo.make_conninfo(_dsn(), options=f"-c search_path={schema}")
        async with aio.AsyncPostgresSaver.from_conn_string(dsn) as saver:
            await saver.setup()
            yield saver


def _scripted_chat_model(script: Iterator[Any]) -> Any:
    fakes = _peer("langchain_core.language_models.fake_chat_models")

    async def _agenerate(
        self: Any, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        return self._generate(messages, stop=stop, **kwargs)

    model = type("ScriptedChatModel", (fakes.GenericFakeChatModel,), {"_agenerate": _agenerate})
    return model(messages=script)


def _lc_norm(message: Any) -> Norm:
    role = {"human": "user", "ai": "assistant"}.get(message.type, message.type)
    calls = getattr(message, "tool_calls", None) or []
    call = calls[0]["id"] if calls else (getattr(message, "tool_call_id", None) or "")
    return (role, str(message.content), call)


class LangGraphSession(SearchDocs):
    """One session as a LangGraph user writes it: a model node and a ToolNode."""

    def __init__(self, index: int, turns: int, saver: Any) -> None:
        self.index = index
        self.contents = [pass_content(index, k) for k in range(1, turns + 1)]
        self.results(self.contents)
        graph = _peer("langgraph.graph")
        prebuilt = _peer("langgraph.prebuilt")
        tools = _peer("langchain_core.tools")
        self.lc = _peer("langchain_core.messages")
        model = _scripted_chat_model(self._script())

        async def call_model(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = graph.StateGraph(graph.MessagesState)
        builder.add_node("model", call_model)
        builder.add_node("tools", prebuilt.ToolNode([tools.tool(self.search_docs)]))
        builder.add_edge(graph.START, "model")
        builder.add_conditional_edges("model", prebuilt.tools_condition)
        builder.add_edge("tools", "model")
        self.graph = builder.compile(checkpointer=saver)
        thread = f"bench-pg-{index}-{secrets.token_hex(4)}"
        self.config = {"configurable": {"thread_id": thread}}

    def _script(self) -> Iterator[Any]:
        for c in self.contents:
            call = {"name": c.tool_name, "args": c.tool_args, "id": call_id(c)}
            yield self.lc.AIMessage(content="", tool_calls=[call])
            yield self.lc.AIMessage(content=c.assistant)

    async def turn(self, k: int, prompt: str) -> str:
        new = [self.lc.HumanMessage(prompt)]
        if k == 1:
            new.insert(0, self.lc.SystemMessage(SYSTEM_PROMPT))
        state = await self.graph.ainvoke({"messages": new}, self.config)
        return str(state["messages"][-1].content)

    async def stored(self) -> list[Norm]:
        state = await self.graph.aget_state(self.config)
        return [_lc_norm(m) for m in state.values.get("messages", [])]


async def langgraph_turn(turns: int) -> dict[str, Any]:
    async with _saver() as saver:
        result: dict[str, Any] = {}
        for index, count in ((-1, WARMUP), (0, turns)):
            session = LangGraphSession(index, count, saver)
            ms, problems = await drive(session.turn, index, count)
            problems += transcript_problems(await session.stored(), turn_transcript(index, count))
            result = {**turn_figures(ms), "problems": problems}
        return result


async def langgraph_put(passes: int) -> dict[str, Any]:
    base = _peer("langgraph.checkpoint.base")
    lc = _peer("langchain_core.messages")
    async with _saver() as saver:
        result: dict[str, Any] = {}
        for index, count in ((-1, WARMUP), (0, passes)):
            thread = {"thread_id": f"bench-pg-put-{index}-{secrets.token_hex(4)}"}
            config: dict[str, Any] = {"configurable": {**thread, "checkpoint_ns": ""}}
            messages: list[Any] = [lc.SystemMessage(SYSTEM_PROMPT)]
            versions: dict[str, Any] = {}
            ms: list[float] = []
            for k in range(1, count + 1):
                c = pass_content(index, k)
                call = {"name": c.tool_name, "args": c.tool_args, "id": c.call_id}
                messages += [
                    lc.HumanMessage(c.user),
                    lc.AIMessage(content=c.assistant, tool_calls=[call]),
                    lc.ToolMessage(content=c.tool_result, tool_call_id=c.call_id),
                ]
                t0 = time.perf_counter_ns()
                # what the pregel loop hands the saver after a step that wrote the channel
                new_versions = {"messages": saver.get_next_version(versions.get("messages"), None)}
                versions.update(new_versions)
                state = {
                    "channel_values": {"messages": list(messages)},
                    "channel_versions": dict(versions),
                    "versions_seen": {"model": dict(versions)},
                }
                checkpoint = base.create_checkpoint(state, None, k)
                meta = {"source": "loop", "step": k, "parents": {}}
                config = await saver.aput(config, checkpoint, meta, new_versions)
                ms.append((time.perf_counter_ns() - t0) / 1e6)
            found = await saver.aget_tuple({"configurable": {**thread, "checkpoint_ns": ""}})
            stored = [] if found is None else found.checkpoint["channel_values"]["messages"]
            problems = transcript_problems(
                [_lc_norm(m) for m in stored], put_transcript(index, count)
            )
            result = {**put_figures(ms), "problems": problems}
        return result


# -- DBOS: a durable workflow per user turn ----------------------------------------------------


def _dict_norm(message: dict[str, Any]) -> Norm:
    calls = message.get("tool_calls") or []
    call = calls[0]["id"] if calls else (message.get("tool_call_id") or "")
    return (message["role"], message.get("content") or "", call)


@dataclass
class DbosApp:
    """The workflows, steps and transactions a DBOS user writes, registered before launch."""

    dbos: Any
    schema: str
    user_turn: Callable[[str, str], Awaitable[str]]
    session_puts: Callable[[str, int, int], Awaitable[int]]
    messages: Callable[[str], Awaitable[list[dict[str, Any]]]]
    #: session -> the scripted model's replies and the tool's answers
    sessions: dict[str, SearchDocs]
    replies: dict[str, Iterator[dict[str, Any]]]
    #: session -> the put case's per-pass ms
    put_ms: dict[str, list[float]]


@contextlib.asynccontextmanager
async def _dbos_app() -> AsyncIterator[DbosApp]:
    dbos = _peer("dbos")
    sqlalchemy = _peer("sqlalchemy")
    async with _own_schema("dbos") as schema:
        table = f'"{schema}".messages'
        await _admin(
            f"CREATE TABLE {table} (session_id text, seq int, message jsonb NOT NULL, "
            "PRIMARY KEY (session_id, seq))"
        )
        DBOS = dbos.DBOS
        DBOS(
            config={
                "name": "lf-bench-pg-peers",
                "system_database_url": _dsn(),
                "dbos_system_schema": schema,
                "log_level": "WARNING",
            }
        )
        ds = await dbos.AsyncSQLAlchemyDatasource.create(_dsn(), schema=schema)
        sessions: dict[str, SearchDocs] = {}
        replies: dict[str, Iterator[dict[str, Any]]] = {}
        put_ms: dict[str, list[float]] = {}
        select = sqlalchemy.text(f"SELECT message FROM {table} WHERE session_id = :s ORDER BY seq")
        insert = sqlalchemy.text(
            f"INSERT INTO {table} (session_id, seq, message) VALUES (:s, :q, CAST(:m AS jsonb))"
        )

        @ds.transaction()  # type: ignore[untyped-decorator]
        async def load(session_id: str) -> list[dict[str, Any]]:
            rows = await ds.sql_session().execute(select, {"s": session_id})
            return [row[0] for row in rows]

        @ds.transaction()  # type: ignore[untyped-decorator]
        async def append(session_id: str, start: int, new: list[dict[str, Any]]) -> int:
            rows = [
                {"s": session_id, "q": start + i, "m": json.dumps(m)} for i, m in enumerate(new)
            ]
            await ds.sql_session().execute(insert, rows)
            return len(rows)

        @DBOS.step()  # type: ignore[untyped-decorator]
        async def call_model(session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
            return next(replies[session_id])

        @DBOS.step()  # type: ignore[untyped-decorator]
        async def call_tool(session_id: str, name: str, args: dict[str, Any]) -> str:
            tool = getattr(sessions[session_id], name)
            return str(await asyncio.to_thread(tool, **args))

        @DBOS.workflow()  # type: ignore[untyped-decorator]
        async def user_turn(session_id: str, prompt: str) -> str:
            history = await load(session_id)
            new: list[dict[str, Any]] = []
            if not history:
                new.append({"role": "system", "content": SYSTEM_PROMPT})
            new.append({"role": "user", "content": prompt})
            while True:
                reply = await call_model(session_id, history + new)
                new.append(reply)
                if not reply.get("tool_calls"):
                    break
                for call in reply["tool_calls"]:
                    result = await call_tool(session_id, call["name"], call["args"])
                    new.append({"role": "tool", "content": result, "tool_call_id": call["id"]})
            await append(session_id, len(history), new)
            return str(reply["content"])

        @DBOS.step()  # type: ignore[untyped-decorator]
        async def checkpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return messages

        @DBOS.workflow()  # type: ignore[untyped-decorator]
        async def session_puts(session_id: str, index: int, passes: int) -> int:
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
            ms = put_ms.setdefault(session_id, [])
            for k in range(1, passes + 1):
                c = pass_content(index, k)
                call = {"id": c.call_id, "name": c.tool_name, "args": c.tool_args}
                messages += [
                    {"role": "user", "content": c.user},
                    {"role": "assistant", "content": c.assistant, "tool_calls": [call]},
                    {"role": "tool", "content": c.tool_result, "tool_call_id": c.call_id},
                ]
                t0 = time.perf_counter_ns()
                await checkpoint(list(messages))
                ms.append((time.perf_counter_ns() - t0) / 1e6)
            return passes

        async def messages(session_id: str) -> list[dict[str, Any]]:
            return list(await load(session_id))

        DBOS.launch()
        try:
            yield DbosApp(
                dbos, schema, user_turn, session_puts, messages, sessions, replies, put_ms
            )
        finally:
            DBOS.destroy(destroy_registry=True)
            await ds.engine.dispose()


def _dbos_script(contents: Sequence[PassContent]) -> Iterator[dict[str, Any]]:
    for c in contents:
        call = {"id": call_id(c), "name": c.tool_name, "args": c.tool_args}
        yield {"role": "assistant", "content": "", "tool_calls": [call]}
        yield {"role": "assistant", "content": c.assistant}


async def dbos_turn(turns: int) -> dict[str, Any]:
    async with _dbos_app() as app:
        result: dict[str, Any] = {}
        for index, count in ((-1, WARMUP), (0, turns)):
            session_id = f"bench-pg-{index}-{secrets.token_hex(4)}"
            tool = SearchDocs()
            contents = [pass_content(index, k) for k in range(1, count + 1)]
            tool.results(contents)
            app.sessions[session_id] = tool
            app.replies[session_id] = _dbos_script(contents)

            async def turn(k: int, prompt: str, session_id: str = session_id) -> str:
                return await app.user_turn(session_id, prompt)

            ms, problems = await drive(turn, index, count)
            stored = [_dict_norm(m) for m in await app.messages(session_id)]
            problems += transcript_problems(stored, turn_transcript(index, count))
            result = {**turn_figures(ms), "problems": problems}
        return result


async def dbos_put(passes: int) -> dict[str, Any]:
    async with _dbos_app() as app:
        result: dict[str, Any] = {}
        for index, count in ((-1, WARMUP), (0, passes)):
            session_id = f"bench-pg-put-{index}-{secrets.token_hex(4)}"
            with app.dbos.SetWorkflowID(session_id):
                await app.session_puts(session_id, index, count)
            steps = await app.dbos.DBOS.list_workflow_steps_async(session_id)
            last = steps[-1]["output"] if steps else []
            problems = transcript_problems(
                [_dict_norm(m) for m in last or []], put_transcript(index, count)
            )
            if len(steps) != count:
                problems.append(f"the workflow recorded {len(steps)} steps for {count} passes")
            result = {**put_figures(app.put_ms[session_id]), "problems": problems}
        return result


# -- the measuring process ---------------------------------------------------------------------

JOBS: dict[tuple[str, str], Callable[[int], Coroutine[Any, Any, dict[str, Any]]]] = {
    ("ours", "turn"): ours_turn,
    ("ours", "put"): ours_put,
    ("langgraph", "turn"): langgraph_turn,
    ("langgraph", "put"): langgraph_put,
    ("dbos", "turn"): dbos_turn,
    ("dbos", "put"): dbos_put,
}


def _versions(stack: str) -> dict[str, str]:
    found = {}
    for name in VERSION_NAMES.get(stack, ()):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def child(argv: Sequence[str] | None = None) -> None:
    """One measurement process: prints exactly one JSON line on stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", required=True, choices=STACKS)
    parser.add_argument("--case", required=True, choices=CASES)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"stack": args.stack, "case": args.case}
    try:
        result.update(asyncio.run(JOBS[args.stack, args.case](args.count)))
        result["ok"] = not result["problems"]
        result["problems"] = result["problems"][:3]
        result["versions"] = _versions(args.stack)
        result["loadavg_1m"] = os.getloadavg()[0]
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)


def run_child(stack: str, case: str, count: int) -> dict[str, Any]:
    if stack == "ours":
        cmd = [sys.executable, "-m", "bench.pg_peers"]
    else:
        cmd = [str(PEER_VENV / "bin" / "python"), str(REPO / "bench" / "pg_peers.py")]
    cmd += ["--child", "--stack", stack, "--case", case, "--count", str(count)]
    labels = {"stack": stack, "case": case}
    return run_measurement(cmd, labels, _clean_env(), CHILD_TIMEOUT_S)


# -- parent: scheduling and reporting ----------------------------------------------------------

Runs = dict[str, list[dict[str, Any]]]


def _fine(runs: Runs, stack: str) -> list[dict[str, Any]]:
    return [r for r in runs.get(stack, []) if "error" not in r]


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _cell(runs: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "n/a"
    mid, lo, hi = statistics.median(values), min(values), max(values)
    return f"{mid:.2f} ({lo:.2f}{DASH}{hi:.2f})"


def best_peer(runs: Runs, key: str) -> tuple[str, float] | None:
    """The peer with the lowest median of ``key`` in these runs, and that median."""
    medians = [(p, _median(_fine(runs, p), key)) for p in PEERS]
    found = [(p, m) for p, m in medians if m]
    return min(found, key=lambda pm: pm[1]) if found else None


def vs_best(runs: Runs, key: str) -> dict[str, Any]:
    """Ours over the best peer on ``key``: the ratio and what it is made of (None where a
    side is missing); ``met`` against the 0.5x target."""
    ours = _median(_fine(runs, "ours"), key)
    best = best_peer(runs, key)
    if ours is None or best is None:
        return {"ratio": None, "ours": ours, "peer": None, "peer_value": None, "met": None}
    ratio = ours / best[1]
    return {
        "ratio": ratio,
        "ours": ours,
        "peer": best[0],
        "peer_value": best[1],
        "met": ratio <= TARGET,
    }


def turn_target(results: dict[str, Runs]) -> dict[str, Any]:
    """PostgresRuntime per turn (turns 11-N) over the best peer's, against 0.5x."""
    return vs_best(results.get("turn", {}), "turn_p50")


def _ok(runs: list[dict[str, Any]], all_runs: list[dict[str, Any]]) -> str:
    oks = sum(1 for r in runs if r.get("ok"))
    text = "True" if oks == len(runs) else f"False ({oks}/{len(runs)})"
    errors = sorted({r["error"] for r in all_runs if "error" in r})
    if errors:
        text += f"; {len(all_runs) - len(runs)} failed: {errors[0]}"
    return text.replace("|", "/")


def _table(
    runs: Runs, stacks: Sequence[str], columns: Sequence[tuple[str, str]], key: str
) -> list[str]:
    header = ["stack", "n", *(label for label, _ in columns), "/ best peer", "ok"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    best = best_peer(runs, key)
    for stack in stacks:
        fine = _fine(runs, stack)
        if not fine:
            errors = sorted({r["error"] for r in runs.get(stack, []) if "error" in r})
            why = (errors[0] if errors else "not run").replace("|", "/")
            out.append(f"| {stack} | 0 | could not run: {why} |" + " |" * (len(header) - 3))
            continue
        mine = _median(fine, key)
        ratio = f"{mine / best[1]:.2f}x" if best and mine is not None else "n/a"
        cells = [stack, str(len(fine)), *(_cell(fine, k) for _, k in columns), ratio]
        out.append("| " + " | ".join([*cells, _ok(fine, runs.get(stack, []))]) + " |")
    return out


def report(results: dict[str, Runs], stacks: Sequence[str], turns: int, passes: int) -> str:
    out: list[str] = []
    if "turn" in results:
        runs = results["turn"]
        out += [
            f"## turn: a user turn with one tool call, a checkpoint per pass; {turns} turns "
            "per session",
            "",
        ]
        columns = [(f"turns 1{DASH}10 p50 ms", "first_p50")]
        columns.append((f"turns 11{DASH}{turns} p50 ms", "turn_p50"))
        out += _table(runs, stacks, columns, "turn_p50")
        target = turn_target(results)
        out.append("")
        out.append(_target_line(target, f"turns 11{DASH}{turns} p50"))
    if "put" in results:
        runs = results["put"]
        out += [
            "",
            f"## put: a pass's checkpoint of the transcript so far; {passes} passes per session",
            "",
        ]
        columns = [("put p50 ms", "put_p50"), ("put p99 ms", "put_p99")]
        columns.append(("last 20 puts p50 ms", "last20_put_p50"))
        out += _table(runs, stacks, columns, "put_p50")
    problems = sorted(
        {
            f"{stack} {case}: {p}"
            for case, by_stack in results.items()
            for stack, runs in by_stack.items()
            for r in runs
            for p in r.get("problems", [])
        }
    )
    out += [f"  verification problem: {p}" for p in problems[:8]]
    return "\n".join(out)


def _target_line(target: dict[str, Any], what: str) -> str:
    if target["ratio"] is None:
        return f"  target: PostgresRuntime per turn <= {TARGET}x the best peer: not measured"
    verdict = "met" if target["met"] else "MISSED"
    return (
        f"  target: PostgresRuntime per turn <= {TARGET}x the best peer ({what}): "
        f"{target['ratio']:.2f}x ({target['ours']:.2f} ms / {target['peer']}'s "
        f"{target['peer_value']:.2f} ms): {verdict}"
    )


def _status(run: dict[str, Any]) -> str:
    if "error" in run:
        return str(run["error"])
    if "turn_p50" in run:
        text = f"turn p50 {run['turn_p50']:.2f} ms"
    else:
        text = f"put p50 {run['put_p50']:.2f} ms"
    return text + ("" if run.get("ok") else f"; {run.get('problems')}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--stacks", default=",".join(STACKS))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS)
    parser.add_argument("--passes", type=int, default=DEFAULT_PASSES)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every run's raw results here")
    args = parser.parse_args(argv)
    stacks = [s for s in args.stacks.split(",") if s]
    cases = [c for c in args.cases.split(",") if c]
    unknown = [s for s in stacks if s not in STACKS] + [c for c in cases if c not in CASES]
    if unknown or args.reps < 1 or args.turns <= FIRST or args.passes < 1:
        parser.error(
            f"unknown {unknown} (stacks: {', '.join(STACKS)}; cases: {', '.join(CASES)}), "
            f"or --reps < 1, --turns <= {FIRST}, --passes < 1"
        )
    _dsn()
    broken = ensure_peers(stacks, PEER_REQUIREMENTS)
    started = time.perf_counter()

    def run(stack: str, case: str) -> dict[str, Any]:
        return run_child(stack, case, args.turns if case == "turn" else args.passes)

    results = schedule(args.reps, dict.fromkeys(cases, stacks), run, broken, _status)
    versions: dict[str, str] = {}
    for by_stack in results.values():
        for runs in by_stack.values():
            for r in runs:
                versions.update(r.get("versions", {}))
    print(
        f"# PostgresRuntime and its peers on one PostgreSQL, {datetime.now(UTC):%Y-%m-%d %H:%M} "
        f"UTC; {os.cpu_count()} cores; Python {platform.python_version()}; loadavg "
        f"{os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all"
    )
    if versions:
        print("# peers: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"# each figure: median of {args.reps} fresh-process runs (min{DASH}max)\n")
    print(report(results, stacks, args.turns, args.passes))
    out = {
        "reps": args.reps,
        "turns": args.turns,
        "passes": args.passes,
        "results": results,
        "turn_target": turn_target(results),
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.argv.remove("--child")
        child()
    else:
        main()
