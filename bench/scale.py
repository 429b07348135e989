"""Scale benchmark: list, get and resume in a store holding a million checkpoints.

    .venv/bin/python -m bench.scale [--sessions 10000 --per-session 100]
                                    [--peer-sessions 1000] [--stores lf-sqlite,lg-sqlite@1000,...]
                                    [--samples 300] [--copies 5] [--fresh] [--json out.json]

Each store is loaded by one process and measured by another, started after the first
exits, so nothing the writer cached helps a read. Our stores run in this venv, the peers
(LangGraph's AsyncSqliteSaver and AsyncPostgresSaver, PyPI loomflow 0.20.0) in the peers
venv of bench/checkpoints.py, this file run there by path.

**Load.** ``--sessions`` sessions of ``--per-session`` passes each, written by
``--workers`` sessions at a time. A pass is a short user message (~50 characters) and a
short assistant answer (~120), then one checkpoint; every checkpoint is kept. Ours write
through the runtime's writer as the Agent loop does (``open_session``, the system message,
per pass ``writer.send`` of the user message, ``writer.emit`` of the answer with its usage
as a model step, ``writer.stage`` of the checkpoint; ``RunFinished`` and ``confirm`` at the
end), so concurrent sessions share commits. The peers write one checkpoint per pass
holding the whole transcript (see peer_runner.py). ``store@N`` runs a store with N
sessions instead (the peers' default is ``--peer-sessions``: LangGraph stores the whole
transcript per checkpoint, so a million of them takes tens of GB and far longer).

**Sizes.** SQLite: the file plus its WAL after the writer closed; PostgreSQL: the sum of
pg_total_relation_size of the schema's tables (indexes and TOAST included).

**Cache.** A loaded SQLite file is kept under .cache/bench-scale/, keyed by store, sizes and
the store's schema or package version, and reused by a later run (the table says
"cached" and gives the load time of the run that wrote it); ``--fresh`` deletes and
reloads it. The measuring process works on a copy of it (the resumes write to their
sessions); that copy, just written, is in the OS page cache. PostgreSQL schemas are
always loaded fresh, measured as the load left them and dropped at the end.

**list / get.** In the measuring process, over ``--samples`` random sessions each (two
disjoint samples, so a get never reads pages the list of the same session just read):
``agent.list_checkpoints(session_id)`` (limit 50, metadata only) and
``runtime.get_checkpoint(scope)`` (the latest checkpoint with its messages); peers: their
list of 50 and their latest-checkpoint read. Rows are checked (50 rows, newest first;
the latest holds every message written).

**resume 10 / 1,000.** Two ways to read "resume within 1.5x from 10 to 1,000
checkpoints", ``--copies`` sessions of each kind, written into the loaded store (untimed)
by the measuring process before it measures anything, all at once:

- *natural*: a session of 10 passes against one of 1,000 passes, one checkpoint each: the
  transcript grows 100x too (21 against 2,001 messages), so decoding it grows.
- *same transcript*: 1,000 passes with a checkpoint at every 100th pass (10 checkpoints)
  against a checkpoint at every pass (1,000): only the number of checkpoints differs.
  This is the one judged against the target: what a user can hold against the store is
  that more checkpoints make resuming slower; a longer transcript costs every store.

Ours: ``await agent.resume(prompt, session_id=...)`` of a new Agent on a new runtime (its
connection opened before the clock starts) with a ScriptedModel answering one short pass,
then ``runtime.restore(scope)`` alone on another new runtime (the session's pages now in the
OS cache: the restore's own work); each session resumed once.
Peers: their latest-checkpoint read on a freshly opened store, which is what their resume
reads. Figures are medians over the copies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import os
import platform
import random
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    # run by path in the peers venv: appended, so the PyPI loomflow there stays first
    sys.path.append(str(REPO))

from bench.checkpoints import (  # noqa: E402
    PEER_REQUIREMENTS,
    _clean_env,
    _log,
    _peer_python,
    ensure_peers,
)
from bench.workload import LIST_LIMIT, SYSTEM_PROMPT, _text, percentile  # noqa: E402

CACHE = REPO / ".cache" / "bench-scale"
#: bump when what a load writes changes, so cached files are not reused (3: the load
#: writes the bulk alone; the measuring process writes the resume sessions into a copy)
CONTENT_VERSION = 3
USER_CHARS, ANSWER_CHARS = 50, 120
POOL = 997  # distinct texts of each kind; a pass picks by (session, pass)
RESUME_SHORT, RESUME_LONG = 10, 1_000
#: the resume session kinds: the short session, the long one, the long one with a tenth
#: of its checkpoints (each kind's passes and checkpoint stride: Plan.kinds)
RESUME_KINDS = ("r10", "r1000", "r1000c10")
RESUME_BASE = 9_000_000
OUR_STORES = ("lf-sqlite", "lf-pg")
PEER_STORES = ("lg-sqlite", "lg-pg", "lf020-sqlite")
PG_STORES = ("lf-pg", "lg-pg")
#: the peers' pip requirements beyond what bench/checkpoints.py installs
LG_PG_REQUIREMENTS = ("langgraph-checkpoint-postgres==3.2.0", "psycopg[binary]==3.3.9")
CHILD_TIMEOUT_S = 3 * 3600
RESUME_PROMPT = "One more question: which source was the most useful?"
RESUME_ANSWER = "The second one; it covered the index."
DASH = "\u2013"


# -- the workload ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Every session a load writes: the bulk, then the resume kinds' copies."""

    sessions: int
    per_session: int
    copies: int
    #: passes of the long resume sessions (smaller only in tests)
    long: int = RESUME_LONG

    def kinds(self) -> dict[str, tuple[int, int]]:
        """Resume kind -> (passes, a checkpoint every this many passes)."""
        short, sparse = RESUME_KINDS[0], RESUME_KINDS[2]
        return {
            short: (RESUME_SHORT, 1),
            "r1000": (self.long, 1),
            sparse: (self.long, max(1, self.long // 10)),
        }

    def bulk(self) -> list[tuple[int, int, int]]:
        """(index, passes, stride) of each session the load writes."""
        return [(index, self.per_session, 1) for index in range(self.sessions)]

    def resumes(self) -> list[tuple[int, int, int]]:
        """(index, passes, stride) of the resume sessions, the long ones first."""
        kinds = self.kinds()
        return [
            (self.resume_index(kind, copy), *kinds[kind])
            for kind in reversed(RESUME_KINDS)
            for copy in range(self.copies)
        ]

    def resume_index(self, kind: str, copy: int) -> int:
        # far above the bulk's indices, so that a cached file loaded with other sizes
        # never holds them
        return RESUME_BASE + RESUME_KINDS.index(kind) * self.copies + copy


def checkpoints(specs: Sequence[tuple[int, int, int]]) -> int:
    return sum(-(-passes // stride) for _, passes, stride in specs)


def _pool(seed: int, chars: int) -> list[str]:
    rng = random.Random(seed)
    return [_text(rng, chars) for _ in range(POOL)]


_USERS = _pool(1, USER_CHARS)
_ANSWERS = _pool(2, ANSWER_CHARS)


def pass_text(index: int, k: int) -> tuple[str, str]:
    """The user message and the answer of pass ``k`` of session ``index``: the same in every
    store and process."""
    return _USERS[(index * 31 + k) % POOL], _ANSWERS[(index * 17 + 3 * k) % POOL]


def _checkpoint_at(k: int, passes: int, stride: int) -> bool:
    return k % stride == 0 or k == passes


def session_name(index: int) -> str:
    return f"scale-{index:06d}"


# -- the stores (child side) ---------------------------------------------------------------


class ScaleStore(ABC):
    """One store, loaded or measured in one process."""

    async def open(self) -> None:  # noqa: B027 - some stores open on first use
        pass

    @abstractmethod
    async def write(self, index: int, passes: int, stride: int) -> None:
        """Write session ``index``: ``passes`` passes, a checkpoint every ``stride``."""

    @abstractmethod
    async def list50(self, index: int) -> tuple[int, int | None]:
        """Newest-first list of up to 50: (rows, turn of the first row)."""

    @abstractmethod
    async def latest(self, index: int) -> tuple[int, str, int]:
        """The latest checkpoint: (messages, the last one's text, turn)."""

    @abstractmethod
    async def resume(self, index: int, passes: int) -> tuple[float | None, float, list[str]]:
        """A resume of session ``index`` on fresh instances: (restore ms or None, resume ms,
        problems)."""

    async def close(self) -> None:  # noqa: B027
        pass


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


class Ours(ScaleStore):
    """SqliteRuntime or PostgresRuntime, every checkpoint kept."""

    def __init__(self, store: str, target: str) -> None:
        self.store, self.target = store, target
        self.runtime = self._runtime()
        # built once: list50 times the listing, not the building of an Agent
        self.lister = self._agent(self.runtime)

    def _runtime(self) -> Any:
        from loomflow.runtime import PostgresRuntime, SqliteRuntime

        if self.store == "lf-sqlite":
            return SqliteRuntime(self.target, max_checkpoints_per_session=0)
        return PostgresRuntime(
            _postgres_dsn(), schema=self.target, max_checkpoints_per_session=0, max_size=4
        )

    async def _connect(self, runtime: Any) -> None:
        from loomflow.runtime import Scope

        # a session that does not exist: the connection opens, nothing of a session is read
        await runtime.restore(Scope("scale-none"))

    async def open(self) -> None:
        await self._connect(self.runtime)

    async def write(self, index: int, passes: int, stride: int) -> None:
        from loomflow.runtime import Scope
        from loomflow.schemas import (
            CheckpointWritten,
            Message,
            RunFinished,
            TurnAppended,
            Usage,
            new_id,
        )
        from loomflow.schemas.events import (
            CheckpointWrittenPayload,
            RunFinishedPayload,
            TurnAppendedPayload,
        )

        name = session_name(index)
        writer = await self.runtime.open_session(
            Scope(name), run_id=new_id("run"), model="scripted"
        )
        await writer.emit(
            TurnAppended, TurnAppendedPayload(messages=[Message.system(SYSTEM_PROMPT)])
        )
        usage, count, answer = Usage(), 1, ""
        for k in range(1, passes + 1):
            user, answer = pass_text(index, k)
            await writer.send(TurnAppended, TurnAppendedPayload(messages=[Message.user(user)]))
            turn_usage = Usage(input_tokens=60 + 45 * k, output_tokens=30)
            usage = usage + turn_usage
            await writer.emit(
                TurnAppended,
                TurnAppendedPayload(
                    messages=[Message.assistant(answer)],
                    usage=turn_usage,
                    model_call=True,
                    step_key=f"model:{k}",
                    # the loop hashes the transcript so far: a 32-hex digest either way
                    input_hash=hashlib.sha256(f"{name}:{k}".encode()).hexdigest()[:32],
                ),
            )
            count += 2
            if _checkpoint_at(k, passes, stride):
                # rides with the next append, as the Agent's checkpoint does
                writer.stage(
                    CheckpointWritten,
                    CheckpointWrittenPayload(
                        checkpoint_id=new_id("ckpt"),
                        turn=k,
                        cumulative_usage=usage,
                        cursor=f"pass:{k}",
                        message_count=count,
                        retain=0,
                    ),
                )
        await writer.emit(
            RunFinished,
            RunFinishedPayload(output=answer, turns=passes, usage=usage, model="scripted"),
        )
        await writer.confirm()

    def _agent(self, runtime: Any) -> Any:
        from loomflow import Agent, Tuning
        from loomflow.models import ScriptedModel

        model = ScriptedModel(lambda messages: RESUME_ANSWER)
        return Agent(SYSTEM_PROMPT, model=model, runtime=runtime, tuning=Tuning(checkpoint=True))

    async def list50(self, index: int) -> tuple[int, int | None]:
        metas = await self.lister.list_checkpoints(session_name(index), LIST_LIMIT)
        return len(metas), metas[0].turn if metas else None

    async def latest(self, index: int) -> tuple[int, str, int]:
        from loomflow.runtime import Scope

        found = await self.runtime.get_checkpoint(Scope(session_name(index)))
        if found is None:
            return 0, "", -1
        return len(found.messages), found.messages[-1].content, found.turn

    async def resume(self, index: int, passes: int) -> tuple[float | None, float, list[str]]:
        from loomflow.runtime import Scope

        problems: list[str] = []
        name = session_name(index)
        runtime = self._runtime()
        try:
            await self._connect(runtime)
            agent = self._agent(runtime)
            t0 = time.perf_counter_ns()
            result = await agent.resume(RESUME_PROMPT, session_id=name)
            resume_ms = _ms(t0)
            seen = agent.model.calls[0] if agent.model.calls else []
        finally:
            await runtime.close()
        if result.restored_turns != passes or result.model_calls != 1:
            problems.append(
                f"{name}: resume restored {result.restored_turns} turns, made "
                f"{result.model_calls} model calls"
            )
        if len(seen) != 2 * passes + 2 or seen[-1].content != RESUME_PROMPT:
            problems.append(f"{name}: the resumed model saw {len(seen)} messages")
        gc.collect()
        # after the resume: the session's pages are in the OS cache, so this is the
        # restore's own work; the resume added a pass (its prompt and answer)
        runtime = self._runtime()
        try:
            await self._connect(runtime)
            t0 = time.perf_counter_ns()
            state = await runtime.restore(Scope(name))
            restore_ms = _ms(t0)
        finally:
            await runtime.close()
        if state is None or len(state.messages) != 2 * passes + 3:
            problems.append(f"{name}: restore read {state and len(state.messages)} messages")
        return restore_ms, resume_ms, problems

    async def close(self) -> None:
        await self.runtime.close()


class Peer(ScaleStore):
    """A peer's checkpoint store, through bench/peer_runner.py's adapters; each pass's
    messages are the two short ones of this workload."""

    def __init__(self, store: str, target: str) -> None:
        self.store, self.target = store, target
        self.adapter = self._adapter()
        self.handles: dict[int, Any] = {}

    def _adapter(self) -> Any:
        import bench.peer_runner as peers

        if self.store == "lg-sqlite":
            return peers.LangGraphSqlite(Path(self.target))
        if self.store == "lg-pg":
            return _langgraph_postgres(peers.LangGraphSqlite, self.target)
        if self.store == "lf020-sqlite":
            import loomflow

            if Path(loomflow.__file__).resolve().parent == REPO / "loomflow":
                raise RuntimeError("imported our loomflow, not the PyPI 0.20.0")
            adapter = peers.Loomflow020Sqlite(Path(self.target))
            # every checkpoint kept, as ours keep them here
            adapter.runtime = peers._peer("loomflow.runtime").SqliteRuntime(
                Path(self.target), max_checkpoints_per_session=0
            )
            adapter.store = adapter.runtime.store
            return adapter
        raise ValueError(f"unknown peer store {self.store!r}")

    async def open(self) -> None:
        await self.adapter.open()

    def _add(self, handle: Any, user: str, answer: str) -> None:
        if self.store.startswith("lg-"):
            handle.messages += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": answer},
            ]
            handle.usage = {
                "input_tokens": handle.usage["input_tokens"] + 60,
                "output_tokens": handle.usage["output_tokens"] + 30,
            }
            return
        lf = self.adapter.types
        handle.messages += [
            lf.Message(role=lf.Role.USER, content=user),
            lf.Message(role=lf.Role.ASSISTANT, content=answer),
        ]
        handle.usage = lf.Usage(
            input_tokens=handle.usage.input_tokens + 60,
            output_tokens=handle.usage.output_tokens + 30,
        )

    async def write(self, index: int, passes: int, stride: int) -> None:
        handle = await self.adapter.seed(index)
        for k in range(1, passes + 1):
            self._add(handle, *pass_text(index, k))
            if _checkpoint_at(k, passes, stride):
                await self.adapter.put(handle, k, None)

    async def _handle(self, adapter: Any, index: int) -> Any:
        # a handle names the session; its messages are not read back
        return await adapter.seed(index)

    async def list50(self, index: int) -> tuple[int, int | None]:
        rows = await self.adapter.list50(await self._handle(self.adapter, index))
        return rows, None

    async def latest(self, index: int) -> tuple[int, str, int]:
        messages, turn = await self.adapter.get_latest(await self._handle(self.adapter, index))
        return len(messages), _content(messages[-1]) if messages else "", turn

    async def resume(self, index: int, passes: int) -> tuple[float | None, float, list[str]]:
        fresh = Peer(self.store, self.target).adapter
        await fresh.open()
        try:
            await fresh.list50(await self._handle(fresh, 0))  # connections, another session
            handle = await self._handle(fresh, index)
            t0 = time.perf_counter_ns()
            messages, turn = await fresh.get_latest(handle)
            ms = _ms(t0)
        finally:
            await fresh.close()
        problems = []
        if len(messages) != 2 * passes + 1 or turn != passes:
            problems.append(f"session {index}: read {len(messages)} messages, turn {turn}")
        return None, ms, problems

    async def close(self) -> None:
        await self.adapter.close()


def _content(message: Any) -> str:
    return str(message["content"] if isinstance(message, dict) else message.content)


def _langgraph_postgres(base: Any, schema: str) -> Any:
    """LangGraph's AsyncPostgresSaver on its own schema: the sqlite adapter with another
    saver (the write and read calls are the same)."""

    class LangGraphPostgres(base):  # type: ignore[misc]
        def __init__(self) -> None:
            self.files: list[Path] = []
            self._stack = contextlib.AsyncExitStack()

        async def open(self) -> None:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            dsn = _postgres_dsn()
            sep = "&" if "?" in dsn else "?"
            self.saver = await self._stack.enter_async_context(
                AsyncPostgresSaver.from_conn_string(f"{dsn}{sep}options=-csearch_path%3D{schema}")
            )
            await self.saver.setup()

    return LangGraphPostgres()


def _postgres_dsn() -> str:
    dsn = os.environ.get("LOOMFLOW_POSTGRES_DSN")
    if not dsn:
        raise RuntimeError("lf-pg and lg-pg need LOOMFLOW_POSTGRES_DSN (dev/postgres.sh start)")
    return dsn


def _make(store: str, target: str) -> ScaleStore:
    return Ours(store, target) if store in OUR_STORES else Peer(store, target)


async def write_all(
    store: ScaleStore, specs: Sequence[tuple[int, int, int]], workers: int
) -> dict[str, Any]:
    """Write every session of ``specs``, ``workers`` at a time; the write's wall time."""
    pending = iter(specs)
    done = 0
    total = checkpoints(specs)
    step = max(1, len(specs) // 10)
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal done
        for index, passes, stride in pending:
            await store.write(index, passes, stride)
            done += 1
            if done % step == 0:
                _log(f"  {done:,}/{len(specs):,} sessions, {time.perf_counter() - started:,.0f} s")

    await store.open()
    try:
        await asyncio.gather(*(worker() for _ in range(workers)))
        wall = time.perf_counter() - started
    finally:
        await store.close()
    return {"load_s": wall, "checkpoints": total, "ckpt_per_s": total / wall}


async def measure(
    make: Callable[[], ScaleStore], plan: Plan, samples: int, workers: int
) -> dict[str, Any]:
    """Write the resume sessions (untimed); then list / get over random sessions of the
    bulk, with a new store instance; then the resume kinds."""
    written = await write_all(make(), plan.resumes(), workers)
    store = make()
    rng = random.Random(12)
    chosen = rng.sample(range(plan.sessions), min(plan.sessions, 2 * samples))
    listed, got = chosen[: len(chosen) // 2] or chosen, chosen[len(chosen) // 2 :] or chosen
    passes = plan.per_session
    want_rows = min(LIST_LIMIT, passes)
    problems: list[str] = []
    lists: list[float] = []
    gets: list[float] = []
    rows_seen: set[int] = set()
    await store.open()
    try:
        for index in listed:
            t0 = time.perf_counter_ns()
            rows, turn = await store.list50(index)
            lists.append(_ms(t0))
            rows_seen.add(rows)
            if rows != want_rows or turn not in (None, passes):
                problems.append(f"session {index}: listed {rows} rows from turn {turn}")
        for index in got:
            t0 = time.perf_counter_ns()
            count, last, turn = await store.latest(index)
            gets.append(_ms(t0))
            if count != 2 * passes + 1 or last != pass_text(index, passes)[1] or turn != passes:
                problems.append(f"session {index}: latest has {count} messages, turn {turn}")
    finally:
        await store.close()
    result: dict[str, Any] = {
        "resume_checkpoints": written["checkpoints"],
        "list_p50": percentile(lists, 50),
        "list_p99": percentile(lists, 99),
        "list_rows": sorted(rows_seen),
        "get_p50": percentile(gets, 50),
        "get_p99": percentile(gets, 99),
        "samples": len(listed),
    }
    resumes: dict[str, list[float]] = {kind: [] for kind in RESUME_KINDS}
    restores: dict[str, list[float]] = {kind: [] for kind in RESUME_KINDS}
    # copy by copy, the kinds in turn: drift in the machine's load hits every kind alike
    for copy in range(plan.copies):
        for kind, (kind_passes, _) in plan.kinds().items():
            # the garbage the load of earlier samples left is not this sample's cost
            gc.collect()
            restore_ms, resume_ms, found = await store.resume(
                plan.resume_index(kind, copy), kind_passes
            )
            resumes[kind].append(resume_ms)
            if restore_ms is not None:
                restores[kind].append(restore_ms)
            problems += found
    for kind in RESUME_KINDS:
        result[f"{kind}_resume"] = statistics.median(resumes[kind])
        result[f"{kind}_restore"] = statistics.median(restores[kind]) if restores[kind] else None
    result["problems"] = problems[:5]
    result["ok"] = not problems
    return result


def child(argv: Sequence[str]) -> None:
    """One load or measurement in this process: exactly one JSON line on stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=("load", "measure"))
    parser.add_argument("--store", required=True)
    parser.add_argument("--target", required=True, help="SQLite file or PostgreSQL schema")
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--per-session", type=int, required=True)
    parser.add_argument("--copies", type=int, required=True)
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--long-passes", type=int, default=RESUME_LONG)
    args = parser.parse_args(argv)
    plan = Plan(args.sessions, args.per_session, args.copies, args.long_passes)
    out: dict[str, Any] = {"store": args.store, "phase": args.phase}
    try:
        if args.phase == "load":
            store = _make(args.store, args.target)
            out.update(asyncio.run(write_all(store, plan.bulk(), args.workers)))
        else:
            run = measure(lambda: _make(args.store, args.target), plan, args.samples, args.workers)
            out.update(asyncio.run(run))
        out["versions"] = _versions()
    except Exception as exc:
        import traceback

        traceback.print_exc(file=sys.stderr)
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)


def _versions() -> dict[str, str]:
    names = (
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
        "psycopg",
        "loomflow",
    )
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


# -- parent: load, measure, report ---------------------------------------------------------


@dataclass
class Run:
    """One row of the table: a store at a number of sessions."""

    store: str
    sessions: int
    result: dict[str, Any]

    @property
    def label(self) -> str:
        return self.store


def _spawn(store: str, argv: list[str]) -> dict[str, Any]:
    if store in PEER_STORES:
        cmd = [str(_peer_python()), str(REPO / "bench" / "scale.py"), "--child", *argv]
    else:
        cmd = [sys.executable, "-m", "bench.scale", "--child", *argv]
    # a child starts no process of its own: run() killing it on a timeout or an
    # interrupt leaves nothing behind
    try:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            env=_clean_env(),
            stdout=subprocess.PIPE,  # its progress (stderr) goes straight to ours
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"exit {done.returncode}, no result"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cache_key(store: str, plan: Plan) -> str:
    if store == "lf-sqlite":
        from loomflow.projections.sqlite import SCHEMA_VERSION

        version = f"schema{SCHEMA_VERSION}"
    elif store == "lg-sqlite":
        version = "lgsqlite3.1.2"
    else:
        version = "lf0.20.0"
    sizes = f"s{plan.sessions}-p{plan.per_session}-c{plan.copies}"
    if plan.long != RESUME_LONG:
        sizes += f"-l{plan.long}"
    return f"{store}-{sizes}-{version}-w{CONTENT_VERSION}"


def _sqlite_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def _schema(dsn: str, sql: str, schema: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        if sql == "size":
            size = await conn.fetchval(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'm')",
                schema,
            )
            return int(size)
        await conn.execute(sql.format(schema=schema))
        return 0
    finally:
        await conn.close()


def run_store(store: str, plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    """Load (or find cached) and measure one store; a PostgreSQL schema is dropped after."""
    common = [
        "--store",
        store,
        "--sessions",
        str(plan.sessions),
        "--per-session",
        str(plan.per_session),
        "--copies",
        str(plan.copies),
        "--long-passes",
        str(plan.long),
    ]
    out: dict[str, Any] = {"store": store, "sessions": plan.sessions, "cached": False}
    if store in PG_STORES:
        dsn = _postgres_dsn()
        schema = f"lf_bench_scale_{secrets.token_hex(4)}"
        try:
            if store == "lg-pg":
                asyncio.run(_schema(dsn, 'CREATE SCHEMA "{schema}"', schema))
            loaded = _spawn(store, ["load", "--target", schema, *common, *_workers(args)])
            out.update(loaded)
            if "error" not in loaded:
                out["bytes"] = asyncio.run(_schema(dsn, "size", schema))
                measure = ["measure", "--target", schema, *common, *_samples(args), *_workers(args)]
                measured = _spawn(store, measure)
                out.update({k: v for k, v in measured.items() if k != "phase"})
        finally:
            asyncio.run(_schema(dsn, 'DROP SCHEMA IF EXISTS "{schema}" CASCADE', schema))
        return out

    cache: Path = args.cache
    cache.mkdir(parents=True, exist_ok=True)
    key = _cache_key(store, plan)
    path, done = cache / f"{key}.db", cache / f"{key}.json"
    if args.fresh or not done.exists():
        done.unlink(missing_ok=True)
        for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            stale.unlink(missing_ok=True)
        loaded = _spawn(store, ["load", "--target", str(path), *common, *_workers(args)])
        if "error" in loaded:
            return {**out, **loaded}
        loaded["bytes"] = _sqlite_bytes(path)
        loaded["loaded_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        done.write_text(json.dumps(loaded))
    else:
        loaded = json.loads(done.read_text())
        out["cached"] = True
    out.update(loaded)
    # the resumes add a pass to their sessions: measure a copy, so the cached file stays
    # as loaded
    work = cache / f"{key}.measuring.db"
    try:
        for suffix in ("", "-wal"):
            if Path(f"{path}{suffix}").exists():
                shutil.copyfile(f"{path}{suffix}", f"{work}{suffix}")
        measure = ["measure", "--target", str(work), *common, *_samples(args), *_workers(args)]
        measured = _spawn(store, measure)
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{work}{suffix}").unlink(missing_ok=True)
    out.update({k: v for k, v in measured.items() if k != "phase"})
    return out


def _workers(args: argparse.Namespace) -> list[str]:
    return ["--workers", str(args.workers)]


def _samples(args: argparse.Namespace) -> list[str]:
    return ["--samples", str(args.samples)]


# -- the table -----------------------------------------------------------------------------


def _ms_cell(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _pair(result: dict[str, Any], short: str, long: str) -> str:
    a, b = result.get(short), result.get(long)
    if a is None or b is None:
        return "n/a"
    return f"{_ms_cell(a)} / {_ms_cell(b)} ({b / a:.2f}x)"


HEADER = (
    "store",
    "checkpoints",
    "sessions",
    "load s",
    "ckpt/s load",
    "file MB",
    "list p50/p99 ms [rows]",
    "get p50/p99 ms",
    "resume 10 / 1,000 passes ms (ratio)",
    "resume 10 / 1,000 ckpts, same transcript ms (ratio)",
    "restore alone (after the resume): 10 / 1,000 passes; 10 / 1,000 ckpts ms",
    "ok",
)


def table_row(run: dict[str, Any]) -> str:
    store = run["store"]
    if "error" in run:
        cells = [store, "", f"{run['sessions']:,}", f"could not run: {run['error']}"]
        cells += [""] * (len(HEADER) - len(cells))
        return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"
    load = f"{run['load_s']:,.0f}" + (" (cached)" if run.get("cached") else "")
    rows = "/".join(map(str, run.get("list_rows", []))) or "?"
    restore = "n/a (peers: resume = latest read)"
    if run.get("r10_restore") is not None:
        restore = (
            f"{_pair(run, 'r10_restore', 'r1000_restore')}; "
            f"{_pair(run, 'r1000c10_restore', 'r1000_restore')}"
        )
    ok = "True" if run.get("ok") else f"False: {'; '.join(run.get('problems', []))[:200]}"
    cells = [
        store,
        f"{run['checkpoints']:,}",
        f"{run['sessions']:,}",
        load,
        f"{run['ckpt_per_s']:,.0f}",
        f"{run['bytes'] / 1e6:,.0f}",
        f"{_ms_cell(run.get('list_p50'))} / {_ms_cell(run.get('list_p99'))} [{rows}]",
        f"{_ms_cell(run.get('get_p50'))} / {_ms_cell(run.get('get_p99'))}",
        _pair(run, "r10_resume", "r1000_resume"),
        _pair(run, "r1000c10_resume", "r1000_resume"),
        restore,
        ok,
    ]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def report(runs: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    versions: dict[str, str] = {}
    for run in runs:
        versions.update(run.get("versions", {}))
    out = [
        f"# scale, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; SQLite {sqlite3.sqlite_version}; "
        f"loadavg {os.getloadavg()[0]:.2f}; {wall:,.0f} s in all",
    ]
    if versions:
        out.append("# peers: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    out += [
        f"# a pass = a user message (~{USER_CHARS} chars) + an answer (~{ANSWER_CHARS}), "
        "then a checkpoint; every checkpoint kept; "
        f"list/get over {args.samples} random sessions each, resumes median of {args.copies}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    out += [table_row(run) for run in runs]
    out += [
        "",
        "checkpoints: the bulk the load wrote and timed. The resume sessions (3 kinds x copies:",
        f"{RESUME_SHORT} and {RESUME_LONG} passes, a checkpoint each pass; {RESUME_LONG} passes, "
        f"one every {RESUME_LONG // 10}) are then written",
        "into the loaded store by the measuring process (untimed; SQLite: into a copy of the",
        "file, so a cached file stays as loaded; the copy, just written, is in the OS page",
        "cache, while a PostgreSQL schema is read as the load left its buffers and the OS",
        "cache). file MB: SQLite file + WAL; PostgreSQL:",
        "pg_total_relation_size of the schema's tables, after the load. list: ours",
        "agent.list_checkpoints (metadata only); peers their list of 50. get: ours",
        "runtime.get_checkpoint(scope) in a fresh process; peers their latest-checkpoint read.",
        "resume (ours): agent.resume() of a new Agent on a new runtime, one scripted pass;",
        "restore alone: runtime.restore(scope) on another new runtime right after that resume",
        "(the session's pages in the OS cache). Peers: the latest-checkpoint read on a freshly",
        "opened store. The same-transcript column (a checkpoint every 100 passes vs every pass)",
        "is the one judged against the 1.5x target: only the number of checkpoints differs.",
    ]
    cached = [r for r in runs if r.get("cached")]
    for run in cached:
        out.append(
            f"{run['store']} ({run['sessions']:,} sessions): file loaded by an earlier run "
            f"({run.get('loaded_at', '?')}) and reused from {args.cache}; "
            "its load s and ckpt/s are that run's (--fresh reloads)"
        )
    return "\n".join(out)


def _parse_stores(text: str | None, args: argparse.Namespace) -> list[tuple[str, int]]:
    if text is None:
        chosen = ["lf-sqlite", f"lf-sqlite@{args.peer_sessions}"]
        if os.environ.get("LOOMFLOW_POSTGRES_DSN"):
            chosen += ["lf-pg", f"lf-pg@{args.peer_sessions}"]
        chosen += ["lg-sqlite", "lf020-sqlite"]
        if os.environ.get("LOOMFLOW_POSTGRES_DSN"):
            chosen.append("lg-pg")
    else:
        chosen = [s for s in text.split(",") if s]
    parsed: list[tuple[str, int]] = []
    for spec in chosen:
        name, _, count = spec.partition("@")
        if name not in (*OUR_STORES, *PEER_STORES):
            raise SystemExit(f"unknown store {name!r}: {', '.join((*OUR_STORES, *PEER_STORES))}")
        default = args.peer_sessions if name in PEER_STORES else args.sessions
        parsed.append((name, int(count) if count else default))
    return parsed


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--per-session", type=int, default=100)
    parser.add_argument(
        "--peer-sessions",
        type=int,
        default=1_000,
        help="sessions of a peer store (and of the "
        "second row of ours, for a comparison at equal size)",
    )
    parser.add_argument("--stores", help="comma-separated, each store or store@sessions")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--copies", type=int, default=7, help="sessions of each resume kind")
    parser.add_argument("--workers", type=int, default=200, help="sessions written at a time")
    parser.add_argument("--fresh", action="store_true", help="reload cached SQLite files")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where loaded files are kept")
    parser.add_argument(
        "--long-passes", type=int, default=RESUME_LONG, help="passes of the long resume sessions"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    stores = _parse_stores(args.stores, args)
    peers = sorted({s for s, _ in stores if s in PEER_STORES})
    # LangGraph's Postgres saver is a peer of this benchmark only: installed (and marked
    # as installed) by the same code as the others
    PEER_REQUIREMENTS.setdefault("lg-pg", LG_PG_REQUIREMENTS)
    broken = ensure_peers(peers)
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for store, sessions in stores:
        plan = Plan(sessions, args.per_session, args.copies, args.long_passes)
        _log(f"{store}: {sessions:,} sessions x {args.per_session} passes")
        if store in broken:
            run = {"store": store, "sessions": sessions, "error": broken[store]}
        else:
            run = run_store(store, plan, args)
        runs.append(run)
        _log(table_row(run))
    print(report(runs, args, time.perf_counter() - started))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return runs


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.argv.remove("--child")
        child(sys.argv[1:])
    else:
        main()
