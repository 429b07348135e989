"""A big SQLite journal, built in minutes and cached, and what the store's reads of it cost.

    .venv/bin/python -m bench.bigjournal [--sessions 10000] [--checkpoints 1000000]
                                         [--samples 20] [--fresh] [--cache DIR]

``build(path, sessions=..., checkpoints=...)`` puts at ``path`` the file that
``SqliteRuntime(path)`` holds once ``sessions`` sessions wrote ``checkpoints`` checkpoints
in all (every one kept), for the benchmarks and tests of what reads a big store (the
session list of ``loomflow ui``: issue 23 asks for 10k sessions / 1M checkpoints).

**What it holds.** Sessions of five users (one of them no user: ``None``) and three agents,
their checkpoints spread evenly (100 each by default). A session is runs of up to
``RUN_PASSES`` passes; a run is a ``run.started`` (its agent, model and lease), the prompt
(the first run's with the system message), then per pass the assistant's turn (a model
call with its usage, step key and input hash) with a tool call and the tool's result, or
the final answer on the last pass, then the pass's ``checkpoint.written``; then
``run.finished``. The last run of one session in 25 fails, of one in 25 waits for a
signal, and of one in 50 is still running (abandoned: its lease ran out long ago). One
session in 40 is a fork of the session of its user before it, at that one's 10th
checkpoint, and runs on from there. Sessions start 4 minutes apart from ``START`` on, a
pass takes seconds and a session's runs are an hour apart, so the newest activity
interleaves sessions as a real store's does.

**How it is built.** The events are the real event types, made with validation as the
writer makes them (ids time-sortable, as ``new_id``'s), and appended through the store's
own write path: ``projections.sqlite.commit_round``, the fold and the apply step every
commit of a ``SqliteStore`` runs, the whole logs of ``TXN_SESSIONS`` sessions in one
transaction (on a connection ``projections.sqlite.connect`` opened and migrated, with
``synchronous=OFF`` and a large page cache while it builds). The forks start from what the
real ``runtime.fork_origin`` reads of their parents, through a ``SqliteRuntime`` on the
file. So every row of the read model (sessions, checkpoints, the log) is one the real
code wrote. No ANALYZE is run: the runtime never runs one, so the query plans measured are
a user's.

**Cache.** The file is kept under ``.cache/bigjournal/`` keyed by its parameters and
``CONTENT_VERSION`` (bump it when what a build writes changes) and copied to ``path``; a
file of an older schema version is migrated when a store opens it, as a user's is.

**Timings** (``main``): on a copy of the file, a ``SqliteRuntime`` opened (and its thread
warmed) first, each read ``--samples`` times, median and max in ms: ``list_sessions`` of
every user, its first page of 50, a page after a cursor half-way down the list, with a
status filter (``failed``: one session in 25; ``stuck``: none, so every row is
read) and of one user; ``session_totals`` of every
user; then of one session (a different finished one each sample, so no cache of ours
helps): ``store.session(scope)``, ``runtime.restore(scope)`` (its whole transcript, ~300
messages) and ``list_checkpoints(scope, 50)``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import multiprocessing
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.workload import _text

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "bigjournal"
#: bump when what a build writes changes, so cached files are not reused
CONTENT_VERSION = 1
USERS: tuple[str | None, ...] = ("ada", "bob", "carol", "dan", None)
AGENTS = ("researcher", "writer", "triage")
MODEL = "claude-sonnet-4-5"
RUN_PASSES = 10
TXN_SESSIONS = 40
WORKERS = min(2, os.cpu_count() or 1)
FORK_EVERY, FORK_AT = 40, 10
START = datetime(2026, 9, 1, tzinfo=UTC)
SESSION_GAP = timedelta(minutes=4)
PAGE = 50
POOL = 997
SYSTEM_PROMPT = (
    "You are a careful research assistant. Use the search_docs tool to look things up, "
    "cite what you find and say so when the documents do not answer the question."
)


@dataclass(frozen=True)
class Shape:
    """What a build makes: the parameters its cache is keyed by."""

    sessions: int
    checkpoints: int

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.checkpoints < self.sessions:
            raise ValueError(
                f"need at least one session and a checkpoint each, not {self.sessions} "
                f"sessions and {self.checkpoints} checkpoints"
            )

    def passes(self, index: int) -> int:
        """Checkpoints (one a pass) of session ``index``: spread evenly, the first
        sessions taking the remainder."""
        each, extra = divmod(self.checkpoints, self.sessions)
        return each + (index < extra)

    def key(self) -> str:
        """The name of its cached file. Not the schema version: an older file is migrated
        when a store opens it, as a user's is (bump CONTENT_VERSION when what a build
        writes changes)."""
        text = f"v{CONTENT_VERSION}:{self.sessions}:{self.checkpoints}"
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        return f"{self.sessions}s-{self.checkpoints}c-{digest}"


def session_id(index: int) -> str:
    return f"sess-{index:06d}"


def user_of(index: int) -> str | None:
    return USERS[index % len(USERS)]


def is_fork(index: int) -> bool:
    """Session ``index`` is a fork of ``parent_of(index)``."""
    return index % FORK_EVERY == FORK_EVERY - 1


def parent_of(index: int) -> int:
    """The session a fork forks: the one before it of the same user."""
    return index - len(USERS)


def ending(index: int) -> str:
    """How the last run of session ``index`` ends: its status."""
    if index % 50 == 17:
        return "running"
    return {5: "failed", 10: "waiting"}.get(index % 25, "finished")


# -- events -------------------------------------------------------------------------------


class _Ids:
    """Ids as long as new_id's (a prefix, then 26 characters: the milliseconds, then a
    counter), time-sortable, made without its lock and random bytes; ``salt`` keeps the
    ids of each building process apart."""

    def __init__(self, salt: int) -> None:
        self._n = salt << 52

    def __call__(self, prefix: str, at: datetime) -> str:
        self._n += 1
        return f"{prefix}{int(at.timestamp() * 1000):011x}{self._n:015x}"


class _Texts:
    """What passes pick from, the same in every build: texts, the messages made of those
    that no pass names (prompts, answers) and usages (a model instance is not validated
    again where a payload takes it, as the loop's own are not)."""

    def __init__(self) -> None:
        from loomflow.schemas import Message, Usage

        rng = random.Random(23)
        self.prompts = [Message.user(_text(rng, 90)) for _ in range(POOL)]
        self.answers = [Message.assistant(_text(rng, 400)) for _ in range(POOL)]
        self.queries = [_text(rng, 30) for _ in range(POOL)]
        self.results = [_text(rng, 500) for _ in range(POOL)]
        self.usages = [
            Usage(
                input_tokens=900 + 140 * (n % 40),
                cached_input_tokens=600 + 120 * (n % 40),
                output_tokens=60 + n * 13 % 240,
                cost_usd=round(0.0009 + 0.00001 * (n % 97), 6),
            )
            for n in range(POOL)
        ]


class _Session:
    """One session's events, made in order as its writer makes them."""

    def __init__(self, index: int, ids: _Ids, texts: _Texts) -> None:
        from loomflow.schemas import Usage

        self.index = index
        self.ids, self.texts = ids, texts
        self.user_id = user_of(index)
        self.session_id = session_id(index)
        self.agent = AGENTS[index % len(AGENTS)]
        self.at = START + index * SESSION_GAP
        self.seq = self.epoch = self.turns = self.message_count = self.calls = 0
        self.usage = Usage()
        self.run_id = ""
        self.events: list[Any] = []

    def _add(self, cls: Any, payload: Any, *, claim: bool = False, gap_ms: int = 900) -> None:
        self.seq += 1
        if claim:
            self.epoch += 1
            self.run_id = self.ids("run", self.at)
        self.at += timedelta(milliseconds=gap_ms + (self.seq * 7919 + self.index) % 600)
        self.events.append(
            cls(
                event_id=self.ids("evt", self.at),
                user_id=self.user_id,
                session_id=self.session_id,
                run_id=self.run_id,
                seq=self.seq,
                epoch=self.epoch,
                at=self.at,
                payload=payload,
            )
        )

    def forked(self, origin: Any) -> None:
        """The first event: a fork from ``origin`` (the parent's checkpoint)."""
        from loomflow.schemas import SessionForked

        self.run_id = self.ids("run", self.at)
        self.turns, self.usage = origin.turn, origin.cumulative_usage
        self.message_count = len(origin.messages)
        self._add(SessionForked, origin, claim=True)

    def run(self, passes: int, end: str, first: bool) -> None:
        """A run of ``passes`` passes, a checkpoint each, ending as ``end`` says."""
        from loomflow.schemas import (
            CheckpointWritten,
            Message,
            RunFailed,
            RunFinished,
            RunStarted,
            RunWaiting,
            ToolCall,
            TurnAppended,
        )
        from loomflow.schemas.events import (
            CheckpointWrittenPayload,
            RunFailedPayload,
            RunFinishedPayload,
            RunStartedPayload,
            RunWaitingPayload,
            TurnAppendedPayload,
        )

        texts, i = self.texts, self.index
        mode = "run" if first and not self.seq else "resume"
        started = RunStartedPayload(mode=mode, agent=self.agent, model=MODEL, lease_seconds=30.0)
        self._add(RunStarted, started, claim=True, gap_ms=3_600_000 if self.seq else 0)
        prompt = [texts.prompts[(i * 31 + self.calls) % POOL]]
        if first and not self.message_count:
            prompt.insert(0, Message.system(SYSTEM_PROMPT))
        self._add(TurnAppended, TurnAppendedPayload(messages=prompt))
        self.message_count += len(prompt)
        answer = ""
        for k in range(passes):
            self.calls += 1
            n = self.calls
            usage = texts.usages[(i * 7 + n) % POOL]
            digest = hashlib.blake2b(f"{self.session_id}:{n}".encode(), digest_size=16)
            call = {
                "usage": usage,
                "model_call": True,
                "step_key": f"model:{n}",
                "input_hash": digest.hexdigest(),
                "model": MODEL,
                "latency_ms": float(400 + (n * 37) % 900),
            }
            if k < passes - 1:
                call_id = f"toolu_{i:06d}_{n:05d}"
                tool = ToolCall(
                    id=call_id,
                    name="search_docs",
                    arguments={"query": texts.queries[(i + n) % POOL], "limit": 5},
                )
                said = Message.assistant("", [tool])
                self._add(TurnAppended, TurnAppendedPayload(messages=[said], **call))
                result = Message.tool(call_id, texts.results[(i * 7 + n) % POOL])
                self._add(
                    TurnAppended,
                    TurnAppendedPayload(
                        messages=[result], step_key=f"tool:{call_id}", input_hash=digest.hexdigest()
                    ),
                )
                self.message_count += 2
            else:
                said = texts.answers[(i * 17 + n) % POOL]
                answer = said.content if isinstance(said.content, str) else ""
                self._add(TurnAppended, TurnAppendedPayload(messages=[said], **call))
                self.message_count += 1
            self.turns += 1
            self.usage = self.usage + usage
            checkpoint = CheckpointWrittenPayload(
                checkpoint_id=self.ids("ckpt", self.at),
                turn=self.turns,
                cumulative_usage=self.usage,
                cursor=f"pass:{n}",
                message_count=self.message_count,
                retain=0,
            )
            self._add(CheckpointWritten, checkpoint, gap_ms=5)
        if end == "finished":
            payload: Any = RunFinishedPayload(
                output=answer, turns=passes, usage=self.usage, model=MODEL
            )
            self._add(RunFinished, payload)
        elif end == "failed":
            payload = RunFailedPayload(
                error_type="RateLimitError", error="429: rate limited, retries used up"
            )
            self._add(RunFailed, payload)
        elif end == "waiting":
            payload = RunWaitingPayload(signal="approval", step_key=f"wait:{self.calls}")
            self._add(RunWaiting, payload)

    def runs(self, passes: int) -> None:
        """Every run of the session: ``passes`` passes in runs of RUN_PASSES."""
        first = True
        while passes > 0:
            now = min(passes, RUN_PASSES)
            passes -= now
            self.run(now, "finished" if passes else ending(self.index), first)
            first = False


# -- the build ----------------------------------------------------------------------------


def build(
    path: str | os.PathLike[str],
    *,
    sessions: int = 10_000,
    checkpoints: int = 1_000_000,
    cache: Path = CACHE,
    fresh: bool = False,
    workers: int = WORKERS,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Put at ``path`` a SQLite journal of ``sessions`` sessions holding ``checkpoints``
    checkpoints in all (see the module's docstring), from ``cache`` when a build of
    these parameters is there (``fresh``: build it again, in ``workers`` processes);
    return ``path``."""
    shape = Shape(sessions, checkpoints)
    cached = cache / f"{shape.key()}.db"
    if fresh or not cached.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            building = Path(tmp) / "journal.db"
            started = time.perf_counter()
            _build(building, shape, max(1, workers), log or (lambda text: None))
            took = Path(tmp) / "built-s"
            took.write_text(f"{time.perf_counter() - started:.1f}")
            os.replace(took, cached.with_suffix(".built-s"))
            os.replace(building, cached)  # whole or not at all: a killed build leaves none
    target = Path(path)
    if target.resolve() != cached.resolve():
        for leftover in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
            leftover.unlink(missing_ok=True)
        shutil.copyfile(cached, target)
    return target


def built_seconds(cache: Path, sessions: int, checkpoints: int) -> float | None:
    """How long the cached build of these parameters took, when there is one."""
    try:
        return float(cache.joinpath(f"{Shape(sessions, checkpoints).key()}.built-s").read_text())
    except (OSError, ValueError):
        return None


def _build(path: Path, shape: Shape, workers: int, log: Callable[[str], None]) -> None:
    """The sessions that are no forks, their chunks of TXN_SESSIONS taken in turn by
    ``workers`` processes that share the file (as a store's processes may: while one
    commits, the others make their next chunk's events), then the forks."""
    from loomflow.projections import sqlite as sql

    sql.connect(path, 30_000).close()  # created and migrated once, before they open it
    chunks = [
        [i for i in range(start, min(start + TXN_SESSIONS, shape.sessions)) if not is_fork(i)]
        for start in range(0, shape.sessions, TXN_SESSIONS)
    ]
    started, events = time.perf_counter(), 0
    if workers == 1:
        events = _write_chunks(path, shape, chunks, 1)
    else:
        spawn = multiprocessing.get_context("spawn")  # no threads of ours forked
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
            done = [
                pool.submit(_write_chunks, path, shape, chunks[w::workers], w + 1)
                for w in range(workers)
            ]
            events = sum(f.result() for f in done)
    took = time.perf_counter() - started
    log(f"  {events:,} events of the sessions that are no forks in {took:.0f} s")
    forks = [i for i in range(shape.sessions) if is_fork(i)]
    events += asyncio.run(_forks(path, shape, forks, _Ids(workers + 1), _Texts()))
    log(f"  {events:,} events with the forks in {time.perf_counter() - started:.0f} s")


def _write_chunks(path: Path, shape: Shape, chunks: list[list[int]], salt: int) -> int:
    """Append the sessions of each chunk in one transaction (one round of the store's
    own write path); the events appended."""
    from loomflow.projections import sqlite as sql

    ids, texts = _Ids(salt), _Texts()
    conn = sql.connect(path, 600_000)
    conn.execute("PRAGMA synchronous = OFF")  # a crash loses the build, never a user's runs
    conn.execute("PRAGMA cache_size = -500000")
    events = 0
    try:
        for chunk in chunks:
            batch: list[Any] = []
            for index in chunk:
                session = _Session(index, ids, texts)
                session.runs(shape.passes(index))
                batch += session.events
            if batch:
                (refused,) = sql.commit_round(conn, [batch])
                if refused is not None:
                    raise refused
                events += len(batch)
    finally:
        conn.close()
    return events


async def _forks(path: Path, shape: Shape, forks: list[int], ids: _Ids, texts: _Texts) -> int:
    """Write the forks: each from its parent's checkpoint as ``runtime.fork_origin`` reads
    it, then its runs, through the runtime's store."""
    from loomflow.runtime import Scope, SqliteRuntime

    runtime = SqliteRuntime(path, max_checkpoints_per_session=0)
    events = 0
    try:
        store = runtime.store
        for index in forks:
            parent = Scope(session_id(parent_of(index)), user_of(index))
            (checkpoint,) = [
                c
                for c in await store.list_checkpoints(parent, 10**9)
                if c.turn == min(FORK_AT, shape.passes(parent_of(index)))
            ]
            origin = await runtime.fork_origin(parent, checkpoint.checkpoint_id)
            session = _Session(index, ids, texts)
            session.at = checkpoint.created_at + timedelta(days=2)
            session.forked(origin)
            session.runs(shape.passes(index))
            await store.append(session.events)
            events += len(session.events)
    finally:
        await runtime.close()
    return events


# -- the timings --------------------------------------------------------------------------


async def _time(samples: int, read: Callable[[int], Awaitable[Any]]) -> list[float]:
    """ms of ``read(k)`` for k in range(samples), after one untimed call."""
    await read(samples)
    times = []
    for k in range(samples):
        t0 = time.perf_counter_ns()
        await read(k)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


async def measure(path: Path, shape: Shape, samples: int) -> dict[str, list[float]]:
    """ms of each read (see the module's docstring), ``samples`` times each."""
    from loomflow.runtime import ANY_USER, DatabaseStore, Scope, SqliteRuntime
    from loomflow.schemas import SessionCursor

    runtime = SqliteRuntime(path)
    store = runtime.store
    assert isinstance(store, DatabaseStore)
    try:
        everyone = await store.list_sessions(user_id=ANY_USER, limit=shape.sessions)
        assert len(everyone) == shape.sessions, len(everyone)
        middle = SessionCursor.of(everyone[len(everyone) // 2])
        deep = everyone[len(everyone) // 2 + 1 : len(everyone) // 2 + 1 + PAGE]
        rng = random.Random(5)
        finished = [r for r in everyone if r.status == "finished" and r.parent_session_id is None]
        picked = rng.sample(finished, samples + 1)
        scopes = [Scope(r.session_id, r.user_id) for r in picked]
        messages = [r.message_count for r in picked]

        async def first_page(k: int) -> None:
            rows = await store.list_sessions(user_id=ANY_USER, limit=PAGE)
            assert rows == everyone[:PAGE]

        async def deep_page(k: int) -> None:
            rows = await store.list_sessions(user_id=ANY_USER, limit=PAGE, after=middle)
            assert rows == deep

        failed_rows = [r for r in everyone if r.status == "failed"][:PAGE]
        carol_rows = [r for r in everyone if r.user_id == "carol"][:PAGE]

        async def failed(k: int) -> None:
            rows = await store.list_sessions(user_id=ANY_USER, limit=PAGE, status="failed")
            assert rows == failed_rows

        async def rare(k: int) -> None:
            assert await store.list_sessions(user_id=ANY_USER, limit=PAGE, status="stuck") == []

        async def one_user(k: int) -> None:
            assert await store.list_sessions(user_id="carol", limit=PAGE) == carol_rows

        async def totals(k: int) -> None:
            counted = await store.session_totals(user_id=ANY_USER)
            assert counted.sessions == shape.sessions

        async def session(k: int) -> None:
            assert await store.session(scopes[k]) is not None

        async def restore(k: int) -> None:
            state = await runtime.restore(scopes[k])
            assert state is not None and len(state.messages) == messages[k]

        async def checkpoints(k: int) -> None:
            listed = await store.list_checkpoints(scopes[k], PAGE)
            assert len(listed) == min(PAGE, picked[k].turns)

        reads: dict[str, Callable[[int], Awaitable[None]]] = {
            f"list_sessions, first page ({PAGE})": first_page,
            "list_sessions, page after a cursor half-way": deep_page,
            "list_sessions, status=failed": failed,
            "list_sessions, status=stuck (none is)": rare,
            "list_sessions, one user": one_user,
            "session_totals, every user": totals,
            "store.session(scope)": session,
            "runtime.restore(scope)": restore,
            f"list_checkpoints(scope, {PAGE})": checkpoints,
        }
        return {name: await _time(samples, read) for name, read in reads.items()}
    finally:
        await runtime.close()


def counts(path: Path) -> dict[str, int]:
    """Rows of the journal's sessions, checkpoints and events (the log) tables."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return {
            table: int(conn.execute(f"SELECT count(*) FROM loomflow_{table}").fetchone()[0])
            for table in ("sessions", "checkpoints", "events")
        }
    finally:
        conn.close()


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(prog="python -m bench.bigjournal", description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--checkpoints", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--fresh", action="store_true", help="build again, not from the cache")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--workers", type=int, default=WORKERS, help="processes that build")
    args = parser.parse_args(argv)
    shape = Shape(args.sessions, args.checkpoints)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.db"
        was_cached = not args.fresh and (args.cache / f"{shape.key()}.db").exists()
        if not was_cached:
            _log(f"building {shape.sessions:,} sessions, {shape.checkpoints:,} checkpoints")
        build(
            path,
            sessions=shape.sessions,
            checkpoints=shape.checkpoints,
            cache=args.cache,
            fresh=args.fresh,
            log=_log,
        )
        built = built_seconds(args.cache, shape.sessions, shape.checkpoints)
        rows = counts(path)
        sessions, checkpoints, events = rows["sessions"], rows["checkpoints"], rows["events"]
        assert (sessions, checkpoints) == (shape.sessions, shape.checkpoints), rows
        size = path.stat().st_size
        results = asyncio.run(measure(path, shape, args.samples))
    how = "cached" if was_cached else "built now"
    print(
        f"bigjournal: {sessions:,} sessions, {checkpoints:,} checkpoints, {events:,} events, "
        f"{size / 1e9:.2f} GB ({how}; the build took {built or 0:.0f} s)"
    )
    width = max(len(name) for name in results)
    print(f"{'read':<{width}}  median ms  max ms  (of {args.samples})")
    for name, times in results.items():
        print(f"{name:<{width}}  {statistics.median(times):9.2f}  {max(times):6.2f}")
    return results


if __name__ == "__main__":
    main()
