"""User-turn benchmark: the spec page's code end to end, one ``agent.resume()`` per user turn.

    .venv/bin/python -m bench.turn [--variants http,scripted] [--stores ...] [--turns 200]
                                   [--sessions 1] [--reps 3] [--json out.json]

A session is what the spec page shows: one ``Agent(instructions, model=..., runtime=...,
tuning=Tuning(checkpoint=True), tools=[search_docs])``, ``agent.run(prompt,
session_id=...)`` for the first user turn, then ``agent.resume(prompt, session_id=...)``
for each of the next ones (``--turns`` in all, 200 by default). Every user turn is the
same work: the user's message (200 characters), the model's call of ``search_docs``, the
tool's result (400 characters), and the model's answer (600 characters); texts and tool
arguments are the checkpoint workload's (``bench.workload.pass_content``), so every store
and both implementations send the same bytes. A turn's figure is the wall time of that one
``run``/``resume`` call, as its caller waits for it.

``--sessions N`` (scripted only) drives N such sessions at once on the one runtime, as a
service serving N users does: their records interleave in the log (on lf-kafka, in the
partitions' order too). Each span's figure is then over the turns of all N sessions, and
the table adds their turns per second.

Variants (the model):

- ``http``: Claude through each implementation's own Anthropic adapter (ours:
  ``model="claude-opus-4-7"``; loomflow 0.20.0: the same string, which it resolves to its
  ``AnthropicModel``), both on the official ``anthropic`` SDK at the same version, pointed
  by ``ANTHROPIC_BASE_URL`` at a model server of this benchmark's own: a minimal Messages
  API (``POST /v1/messages``, JSON replies, HTTP/1.1 keep-alive) on 127.0.0.1, run in a
  thread of the parent process (not the measuring one), so the client's process pays only
  for being a client. It is not tests/support/fake_anthropic.py: that server closes the
  connection after each request (HTTP/1.0) and parses every body, which grows with the
  transcript; this one answers request ``i`` of a session by counting (even: the turn's
  ``tool_use``, odd: its answer), reads each body without parsing it, records its size,
  and parses only a session's last body once the session is done, to check it. The
  Messages API resends the whole transcript on every call, so a request's size grows with
  the session whatever the client does: the table reports the bytes the model server
  receives per turn (both requests) at turn 10 and at the last turn, so the reader can
  tell that growth from the client's own.
- ``scripted``: no HTTP. Ours: ``loomflow.models.ScriptedModel`` replying by a counter;
  0.20.0: its ``ScriptedModel`` with the same replies as a list of ``ScriptedTurn``.

Stores: ours ``lf-sqlite`` (``SqliteRuntime``, the default), ``lf-pg``
(``PostgresRuntime``) and ``lf-kafka`` (``KafkaRuntime`` with ``loomflow processor`` in its
own process) when LOOMFLOW_POSTGRES_DSN / LOOMFLOW_KAFKA_BOOTSTRAP are set, and
``lf-inproc`` (``InProcRuntime``: the loop without a store's I/O); their runtimes,
schemas, topics and processor are set up and removed as bench/checkpoints.py does (its
``LoomflowAdapter``). Peer: ``lf020-sqlite``, PyPI loomflow 0.20.0's ``SqliteRuntime`` (its
durable default), run from the peers venv (.cache/bench-peers, which this installs on first
use, with ``anthropic`` pinned to our venv's version) by path, because its import name
clashes with ours. Its agent gets ``auto_extract=False``, as by default 0.20.0 makes extra
model calls after each run (memory extraction) that ours does not make, and ``max_turns``
of two a turn, as it counts the model calls restored from a checkpoint against that limit
(50 by default) and would stop calling the model after 25 turns. Ratios "vs 0.20.0"
are every store's against ``lf020-sqlite`` on medians of the same run.

Every (store, variant, repetition) runs in a fresh process, which first makes an untimed
warm-up session of 3 turns (imports, connections, the processor's first fold) and then the
measured session. With lf-kafka chosen, one untimed lf-kafka session of
``--broker-warmup`` scripted turns (1000 by default) runs first: a Kafka broker is a JVM,
which compiles its hot paths over its first minutes of work, and a broker in service has
run long. Right after ``dev/services.sh start`` the broker took 10-12 ms of CPU a turn
against 2-4 once warm, which turned the Kafka pass from ~1.4x PostgreSQL's into ~3x
(2026-12-06). ``--broker-warmup 0`` measures a cold broker; the header says which.
Figures: the p50 of the per-turn wall times of turns 1-10 (turn 1 is
``run``), 11-20 and the last ten, then the median over ``--reps`` repetitions with
(min-max); flat = p50(last ten) / p50(turns 11-20).

**ok**: each turn's ``output`` is the scripted answer; the session's latest checkpoint
holds the whole transcript (the system message plus four messages a turn) and ends with the
last answer; for ``http`` the server got two requests a turn, nothing else, and the last
one held the whole conversation (four Messages API messages a turn, but the last answer).
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
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    # run by path with the peers venv's python: appended, so that the peers'
    # site-packages ``loomflow`` (0.20.0) wins over our source tree
    sys.path.append(str(REPO))

from bench.checkpoints import (  # noqa: E402
    DASH,
    PEER_VENV,
    SERVICE_ENV,
    _clean_env,
    _log,
    _ratio,
    ensure_peers,
    peer_versions,
    run_measurement,
    schedule,
)
from bench.workload import (  # noqa: E402
    SYSTEM_PROMPT,
    SearchDocs,
    cpu_seconds_by_command,
    cpu_seconds_of,
    pass_content,
    percentile,
)

MODEL = "claude-opus-4-7"
VARIANTS = ("http", "scripted")
OUR_STORES = ("lf-inproc", "lf-sqlite", "lf-pg", "lf-kafka")
PEER = "lf020-sqlite"
ALL_STORES = (*OUR_STORES, PEER)
DEFAULT_TURNS = 200
WARMUP_TURNS = 3
#: the untimed lf-kafka turns that warm the broker's JVM before any rep (``--broker-warmup``)
BROKER_WARMUP_TURNS = 1000
WINDOW = 10
CHILD_TIMEOUT_S = 600
#: the first (turn 1: ``run``), the second, and the last ten turns of a session
WINDOWS = ("first", "second", "last")


def _session_token(session: int) -> str:
    """A model-server path segment naming one session (its index first)."""
    return f"s{session}_{secrets.token_hex(4)}"


# -- the model server (parent side) --------------------------------------------------------


@dataclass
class _Seen:
    sizes: list[int] = field(default_factory=list)
    last: bytes = b""
    unexpected: list[str] = field(default_factory=list)


class ModelServer:
    """A Messages API on 127.0.0.1 for many sessions, each under a path prefix of its own.

    ``POST /<token>/v1/messages``: the ``i``-th request of a session (``token`` starts with
    ``s<index>_``) gets turn ``i // 2 + 1``'s ``tool_use`` when ``i`` is even, its answer
    when odd. ``GET /<token>/stats``: the session's request sizes and what its last body
    held, once (the session is forgotten then).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, _Seen] = {}
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._httpd = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def message(self, token: str, raw: bytes) -> dict[str, Any]:
        with self._lock:
            seen = self._sessions.setdefault(token, _Seen())
            index = len(seen.sizes)
            seen.sizes.append(len(raw))
            seen.last = raw
        session = int(token.split("_", 1)[0].removeprefix("s"))
        k = index // 2 + 1
        content = pass_content(session, k)
        usage = {
            "input_tokens": len(raw) // 4,
            "output_tokens": content.output_tokens,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        reply: dict[str, Any] = {
            "id": f"msg_{token}_{index}",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "stop_sequence": None,
            "usage": usage,
        }
        if index % 2 == 0:
            block = {
                "type": "tool_use",
                "id": f"toolu_{content.call_id}",
                "name": content.tool_name,
                "input": content.tool_args,
            }
            return {**reply, "content": [block], "stop_reason": "tool_use"}
        text = {"type": "text", "text": content.assistant}
        return {**reply, "content": [text], "stop_reason": "end_turn"}

    def unexpected(self, token: str, what: str) -> None:
        with self._lock:
            self._sessions.setdefault(token, _Seen()).unexpected.append(what)

    def stats(self, token: str) -> dict[str, Any]:
        with self._lock:
            seen = self._sessions.pop(token, _Seen())
        last = json.loads(seen.last) if seen.last else {}
        return {
            "sizes": seen.sizes,
            "unexpected": seen.unexpected,
            "last_messages": len(last.get("messages", [])),
        }


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # keep-alive, as the API serves: a client reuses its connection across calls
        protocol_version = "HTTP/1.1"
        # headers and body go out as separate writes: with Nagle on, the body waits for
        # the client's delayed ACK (~40 ms a request on Linux)
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("request-id", "req_bench")
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            token, _, route = self.path.lstrip("/").partition("/")
            if route.split("?", 1)[0] != "v1/messages":
                server.unexpected(token, f"POST /{route}")
                error = {"type": "not_found_error", "message": f"no route /{route}"}
                self._reply(404, {"type": "error", "error": error})
                return
            self._reply(200, server.message(token, raw))

        def do_GET(self) -> None:
            token, _, route = self.path.lstrip("/").partition("/")
            if route != "stats":
                self._reply(404, {"type": "error", "error": {"type": "not_found_error"}})
                return
            self._reply(200, server.stats(token))

    return Handler


def _server_stats(url: str, token: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/{token}/stats", timeout=30) as response:
        stats: dict[str, Any] = json.load(response)
    return stats


# -- the measured sessions (child side) -------------------------------------------------------


class Session(SearchDocs):
    """One session driven by one implementation: its agent, run, resumes and checks."""

    def __init__(self, index: int, turns: int) -> None:
        self.index = index
        self.turns = turns
        self.contents = [pass_content(index, k) for k in range(1, turns + 1)]
        self.session_id = f"bench-turn-{index}-{secrets.token_hex(4)}"
        #: the implementation's Agent, built by the subclass
        self.agent: Any = None
        self.results(self.contents)

    def answer(self, k: int) -> str:
        """The model's ~600-character answer of turn ``k``: the workload's assistant text."""
        return self.contents[k - 1].assistant

    async def first(self, prompt: str) -> str:
        """Turn 1: ``agent.run``; the result's output."""
        result = await self.agent.run(prompt, session_id=self.session_id)
        return str(result.output)

    async def next(self, prompt: str) -> str:
        """Every later turn: ``agent.resume`` with the user's message."""
        result = await self.agent.resume(prompt, session_id=self.session_id)
        return str(result.output)

    async def stored(self) -> list[Any]:
        """The transcript of the session's latest checkpoint."""
        raise NotImplementedError

    @staticmethod
    def text(message: Any) -> str:
        return str(message.content)

    async def close(self) -> None:
        await self.agent.aclose()


class Ours(Session):
    def __init__(self, index: int, turns: int, runtime: Any, variant: str) -> None:
        from loomflow import Agent, Tuning
        from loomflow.models import ScriptedModel

        super().__init__(index, turns)
        self.runtime = runtime
        self._replies = 0
        model: Any = MODEL if variant == "http" else ScriptedModel(self._reply)
        self.agent = Agent(
            SYSTEM_PROMPT,
            model=model,
            runtime=runtime,
            tuning=Tuning(checkpoint=True),
            tools=[self.search_docs],
        )

    def _reply(self, messages: Any) -> Any:
        from loomflow.schemas import Message, ToolCall

        # a counter, not a scan of the transcript: the script itself should cost nothing
        index, self._replies = self._replies, self._replies + 1
        content = self.contents[index // 2]
        if index % 2:
            return self.answer(index // 2 + 1)
        call = ToolCall(
            id=f"toolu_{content.call_id}", name=content.tool_name, arguments=content.tool_args
        )
        return Message.assistant(tool_calls=[call])

    async def stored(self) -> list[Any]:
        from loomflow.runtime import Scope

        found = await self.runtime.get_checkpoint(Scope(self.session_id))
        return [] if found is None else list(found.messages)


def _peer(module: str) -> Any:
    """A module of loomflow 0.20.0 (untyped: mypy must not check it against ours)."""
    return importlib.import_module(module)


class Peer(Session):
    """loomflow 0.20.0 through its public API: ``Agent``, ``run``, ``resume``."""

    def __init__(self, index: int, turns: int, runtime: Any, variant: str) -> None:
        lf = _peer("loomflow")
        types = _peer("loomflow.core.types")
        super().__init__(index, turns)
        self.runtime = runtime
        model: Any = MODEL
        if variant == "scripted":
            scripted = _peer("loomflow.model.scripted")
            script = []
            for k, c in enumerate(self.contents, 1):
                call = types.ToolCall(id=f"toolu_{c.call_id}", tool=c.tool_name, args=c.tool_args)
                script += [
                    scripted.ScriptedTurn(tool_calls=[call]),
                    scripted.ScriptedTurn(text=self.answer(k)),
                ]
            model = scripted.ScriptedModel(script)
        self.agent = lf.Agent(
            SYSTEM_PROMPT,
            model=model,
            runtime=runtime,
            tuning=lf.Tuning(checkpoint=True),
            tools=[self.search_docs],
            auto_extract=False,
            # 0.20.0 counts a session's restored model calls against max_turns (50 by
            # default): left at that, it stops calling the model after 25 turns
            max_turns=2 * turns + 10,
        )

    async def stored(self) -> list[Any]:
        scope = _peer("loomflow.runtime.journal").journal_scope(self.session_id, None)
        found = await self.runtime.get_latest_checkpoint(scope)
        return [] if found is None else list(found.messages)


@dataclass
class Store:
    """The runtime sessions run on, and how it is opened and released."""

    runtime: Any
    session: Callable[[int, int, Any, str], Session]
    #: facts of the store's servers (the Kafka processor), read once the session is done
    extra: Callable[[], dict[str, Any]] = dict
    #: the process id of the store's processor, whose CPU a turn costs too (None: none)
    processor: Callable[[], int | None] = lambda: None


@contextlib.asynccontextmanager
async def _open_store(store: str, tmp: Path) -> Any:
    if store == PEER:
        runtime = _peer("loomflow.runtime").SqliteRuntime(
            tmp / "lf020.db", max_checkpoints_per_session=20
        )
        try:
            yield Store(runtime, Peer)
        finally:
            await runtime.store.aclose()
        return
    from bench.checkpoints import LoomflowAdapter

    adapter = LoomflowAdapter(store, tmp)
    try:
        await adapter.open()
        try:
            yield Store(adapter.runtime, Ours, adapter.processor_facts, adapter.processor_pid)
        finally:
            await adapter.close()
    finally:
        await adapter.teardown()


async def _drive(session: Session) -> dict[str, Any]:
    """Run the session's turns one after another; per-turn ms and what went wrong."""
    ms: list[float] = []
    problems: list[str] = []
    for k in range(1, session.turns + 1):
        prompt = session.contents[k - 1].user
        t0 = time.perf_counter_ns()
        output = await (session.first(prompt) if k == 1 else session.next(prompt))
        ms.append((time.perf_counter_ns() - t0) / 1e6)
        if output != session.answer(k):
            problems.append(f"turn {k}: output {output[:40]!r} is not the scripted answer")
    stored = await session.stored()
    want = 1 + 4 * session.turns
    if len(stored) != want or not stored or session.text(stored[-1]) != session.answer(k):
        problems.append(f"latest checkpoint holds {len(stored)} messages, expected {want}")
    return {"ms": ms, "problems": problems}


async def _measure(
    store: str, variant: str, turns: int, server: str | None, sessions: int = 1
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lf-bench-turn-") as tmp:
        async with _open_store(store, Path(tmp)) as opened:
            runs: list[tuple[int, int, int]] = [(-1, WARMUP_TURNS, 1), (0, turns, sessions)]
            result: dict[str, Any] = {}
            for index, count, many in runs:
                token = _session_token(index)
                if server is not None:
                    # read by the SDK when each implementation builds its client
                    os.environ["ANTHROPIC_BASE_URL"] = f"{server}/{token}"
                    os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
                group = [
                    opened.session(index + k, count, opened.runtime, variant) for k in range(many)
                ]
                before = _cpu(opened)
                started = time.perf_counter()
                try:
                    driven = await asyncio.gather(*(_drive(session) for session in group))
                finally:
                    for session in group:
                        await session.close()
                wall = time.perf_counter() - started
                result = {
                    "per_session": [d["ms"] for d in driven],
                    "problems": [p for d in driven for p in d["problems"]],
                    "sessions": many,
                    "turns_per_s": many * count / wall,
                }
                result.update(_cpu_per_turn(before, _cpu(opened), many * count))
                if server is not None:
                    stats = await asyncio.to_thread(_server_stats, server, token)
                    result.update(_request_facts(stats, count, result["problems"]))
                if index < 0 and result["problems"]:
                    raise RuntimeError(f"warm-up session failed: {result['problems'][0]}")
            per_session = result.pop("per_session")
            return {**_windows(per_session), **result, "ms": per_session[0], **opened.extra()}


def _cpu(opened: Store) -> dict[str, float | None]:
    """CPU seconds so far of this process, the store's processor, every PostgreSQL
    process and the Kafka broker (a ``java`` process): what a turn costs the machine."""
    by_command = cpu_seconds_by_command(("postgres", "java"))
    pid = opened.processor()
    return {
        "agent": time.process_time(),
        "processor": None if pid is None else cpu_seconds_of(pid),
        "postgres": by_command["postgres"],
        "kafka": by_command["java"],
    }


def _cpu_per_turn(
    before: dict[str, float | None], after: dict[str, float | None], turns: int
) -> dict[str, float | None]:
    """ms of CPU a turn, per process: ``cpu_<name>_ms``."""
    per_turn: dict[str, float | None] = {}
    for name, start in before.items():
        end = after[name]
        per_turn[f"cpu_{name}_ms"] = (
            None if start is None or end is None else (end - start) / turns * 1e3
        )
    return per_turn


def _request_facts(stats: dict[str, Any], turns: int, problems: list[str]) -> dict[str, Any]:
    sizes: list[int] = stats["sizes"]
    if stats["unexpected"]:
        problems.append(f"model server got {stats['unexpected'][:2]}")
    if len(sizes) != 2 * turns:
        problems.append(f"model server got {len(sizes)} requests for {turns} turns")
    if stats["last_messages"] != 4 * turns - 1:
        problems.append(
            f"the last request held {stats['last_messages']} messages, expected {4 * turns - 1}"
        )

    def turn_bytes(k: int) -> int | None:
        pair = sizes[2 * (k - 1) : 2 * k]
        return sum(pair) if len(pair) == 2 else None

    return {"request_bytes_10": turn_bytes(min(10, turns)), "request_bytes_last": turn_bytes(turns)}


def _windows(per_session: list[list[float]]) -> dict[str, Any]:
    """p50 of each span's turns, the spans' turns of every session pooled."""
    n = len(per_session[0])
    spans: dict[str, list[float]] = {name: [] for name in WINDOWS}
    for ms in per_session:
        spans["first"] += ms[:WINDOW]
        spans["second"] += ms[WINDOW : 2 * WINDOW]
        spans["last"] += ms[-WINDOW:]
    p50 = {
        f"{name}_p50": percentile(values, 50) if values else None for name, values in spans.items()
    }
    second, last = p50["second_p50"], p50["last_p50"]
    return {**p50, "flat": last / second if second and last else None, "turns": n}


def _versions() -> dict[str, Any]:
    found = {}
    for name in ("loomflow", "anthropic"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def child() -> None:
    """One measurement process: prints exactly one JSON line on stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True, choices=ALL_STORES)
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--server")
    args = parser.parse_args()
    result: dict[str, Any] = {"store": args.store, "variant": args.variant}
    try:
        if args.store == PEER:
            import loomflow

            if Path(loomflow.__file__).resolve().parent == REPO / "loomflow":
                raise RuntimeError("imported our loomflow, not PyPI's 0.20.0")
        server = args.server if args.variant == "http" else None
        measured = _measure(args.store, args.variant, args.turns, server, args.sessions)
        result.update(asyncio.run(measured))
        result["ok"] = not result["problems"]
        result["problems"] = result["problems"][:3]
        result["versions"] = _versions() if args.store == PEER else {}
        result["loadavg_1m"] = os.getloadavg()[0]
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)


# -- parent: scheduling and reporting ----------------------------------------------------------


def _peer_requirements() -> dict[str, tuple[str, ...]]:
    # the same SDK as ours, so the HTTP client under both adapters is the same
    return {PEER: ("loomflow==0.20.0", f"anthropic=={metadata.version('anthropic')}")}


def run_child(
    store: str, variant: str, turns: int, server: str | None, sessions: int = 1
) -> dict[str, Any]:
    if store == PEER:
        cmd = [str(PEER_VENV / "bin" / "python"), str(REPO / "bench" / "turn.py")]
    else:
        cmd = [sys.executable, "-m", "bench.turn"]
    cmd += ["--child", "--store", store, "--variant", variant, "--turns", str(turns)]
    cmd += ["--sessions", str(sessions)]
    if server is not None:
        cmd += ["--server", server]
    # the model server's address comes with --server, never from the caller's environment
    env = {k: v for k, v in _clean_env().items() if not k.startswith("ANTHROPIC_")}
    labels = {"store": store, "variant": variant}
    return run_measurement(cmd, labels, env, CHILD_TIMEOUT_S)


def _values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def _med(runs: list[dict[str, Any]] | None, key: str) -> float | None:
    values = _values(runs or [], key)
    return statistics.median(values) if values else None


def _cell(runs: list[dict[str, Any]], key: str, fmt: Callable[[float], str]) -> str:
    values = _values(runs, key)
    if not values:
        return "n/a"
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}{DASH}{fmt(max(values))})"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


#: the processes whose CPU a turn is reported for, in the report's order
CPU_PARTS = ("agent", "processor", "postgres", "kafka")


def _cpu_cell(runs: list[dict[str, Any]], name: str) -> str:
    value = _med(runs, f"cpu_{name}_ms")
    return "—" if value is None else f"{value:.2f}"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _kb(value: float) -> str:
    return f"{value / 1000:,.1f}"


def report(
    variant: str,
    stores: list[str],
    runs: dict[str, list[dict[str, Any]]],
    turns: int,
    sessions: int = 1,
) -> str:
    last = f"{turns - WINDOW + 1}{DASH}{turns}"
    spans = (f"1{DASH}10", f"11{DASH}20", last)
    header = [
        "store",
        "n",
        *(f"turns {s} p50 ms" for s in spans),
        f"flat ({last} / 11{DASH}20)",
        *(f"vs 0.20.0 {s}" for s in spans),
    ]
    if variant == "http":
        header += ["request KB turn 10", f"request KB turn {turns}"]
    if sessions > 1:
        header.append("turns/s, all sessions")
    header += ["CPU ms a turn: agent / processor / PostgreSQL / Kafka", "ok"]
    title = {
        "http": "Claude through each one's Anthropic adapter, local Messages API over HTTP",
        "scripted": "scripted model, no HTTP",
    }[variant]
    at_once = f"; {sessions} sessions at once on one runtime" if sessions > 1 else ""
    out = [f"## {variant}: {title}; {turns} user turns per session{at_once}", ""]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    peer = [r for r in runs.get(PEER, []) if "error" not in r]
    problems: list[str] = []
    for store in stores:
        fine = [r for r in runs.get(store, []) if "error" not in r]
        errors = sorted({r["error"] for r in runs.get(store, []) if "error" in r})
        if not fine:
            why = (errors[0] if errors else "not run").replace("|", "/")
            out.append(f"| {store} | 0 | could not run: {why} |" + " |" * (len(header) - 3))
            continue
        cells = [store, str(len(fine))]
        cells += [_cell(fine, f"{w}_p50", _ms) for w in WINDOWS]
        cells.append(_cell(fine, "flat", _x))
        for w in WINDOWS:
            cells.append(
                "—" if store == PEER else _ratio(_med(fine, f"{w}_p50"), _med(peer, f"{w}_p50"))
            )
        if variant == "http":
            cells += [_cell(fine, "request_bytes_10", _kb), _cell(fine, "request_bytes_last", _kb)]
        if sessions > 1:
            cells.append(_cell(fine, "turns_per_s", lambda v: f"{v:.0f}"))
        cells.append(" / ".join(_cpu_cell(fine, name) for name in CPU_PARTS))
        oks = sum(1 for r in fine if r["ok"])
        ok = "True" if oks == len(fine) else f"False ({oks}/{len(fine)})"
        if errors:
            ok += f"; {len(runs[store]) - len(fine)} failed: {errors[0]}".replace("|", "/")
        out.append("| " + " | ".join([*cells, ok]) + " |")
        problems += [f"{store}: {p}" for r in fine for p in r.get("problems", [])]
    out.append("")
    out.append(
        f"ms: wall of one agent.run (turn 1) / agent.resume call; p50 of the ten turns of each "
        f"span in one session, then the median (min{DASH}max) over repetitions. vs 0.20.0: "
        f"the store's median over lf020-sqlite's (< 1: ours is faster)."
    )
    if sessions > 1:
        out.append(
            f"{sessions} sessions at once: each span's p50 is over the turns of every session "
            "in it; turns/s = every session's turns over the wall time of all of them; CPU "
            "ms a turn is over every session's turns."
        )
    out.append(
        "CPU ms a turn: user+system CPU of the measured session over its turns, medians: "
        "this process (the agent), `loomflow processor` (lf-kafka), every PostgreSQL "
        "process and the Kafka broker (every `java` process); on 2 cores a turn's wall "
        "time cannot be below half their sum."
    )
    if variant == "http":
        out.append(
            "request KB: the bodies the model server received in that turn (its two "
            "requests); the Messages API resends the transcript, so this grows with the "
            "session whatever the client."
        )
    out += _targets(runs, variant)
    out += [f"  verification problem: {p}" for p in sorted(set(problems))[:8]]
    kafka = [r for r in runs.get("lf-kafka", []) if "error" not in r]
    complaints = [r for r in kafka if r.get("processor_complaints")]
    if complaints:
        out.append(
            f"  lf-kafka's processor logged warnings or errors in {len(complaints)} run(s), the "
            f"last: {complaints[0].get('processor_complaint')!r}"
        )
    return "\n".join(out)


def _targets(runs: dict[str, list[dict[str, Any]]], variant: str) -> list[str]:
    ours = [r for r in runs.get("lf-sqlite", []) if "error" not in r]
    peer = [r for r in runs.get(PEER, []) if "error" not in r]
    lines: list[str] = []
    if ours and peer:
        ratios = [
            (_med(ours, f"{w}_p50") or 0) / (_med(peer, f"{w}_p50") or float("inf"))
            for w in WINDOWS
        ]
        worst = max(ratios)
        verdict = "met" if worst <= 0.5 else "MISSED"
        shown = ", ".join(f"{r:.2f}x" for r in ratios)
        lines.append(f"  target: lf-sqlite <= 0.5x 0.20.0 per turn: {shown}: {verdict}")
    for store in OUR_STORES:
        flat = _med([r for r in runs.get(store, []) if "error" not in r], "flat")
        if flat is not None:
            verdict = "met" if flat <= 1.2 else "MISSED"
            lines.append(f"  target: {store} flat <= 1.2x: {flat:.2f}x: {verdict}")
    return lines


def default_stores() -> list[str]:
    chosen: list[str] = []
    for store in ALL_STORES:
        missing = [name for name in SERVICE_ENV.get(store, ()) if not os.environ.get(name)]
        if missing:
            _log(f"skipping {store}: set {', '.join(missing)} (see dev/services.sh start)")
        else:
            chosen.append(store)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--stores", help="comma-separated; default: every configured store")
    parser.add_argument("--turns", type=int, default=DEFAULT_TURNS)
    parser.add_argument(
        "--sessions",
        type=int,
        default=1,
        help="sessions driven at once on one runtime (scripted only; default 1)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every run's raw results here")
    parser.add_argument(
        "--broker-warmup",
        type=int,
        default=BROKER_WARMUP_TURNS,
        help="untimed lf-kafka turns run first to warm the broker's JVM (0: measure it cold)",
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    stores = [s for s in args.stores.split(",") if s] if args.stores else default_stores()
    unknown = [v for v in variants if v not in VARIANTS] + [
        s for s in stores if s not in ALL_STORES
    ]
    if unknown or args.reps < 1 or args.turns < 2 * WINDOW or args.broker_warmup < 0:
        parser.error(
            f"unknown {unknown} (variants: {', '.join(VARIANTS)}; stores: "
            f"{', '.join(ALL_STORES)}), or --reps < 1, or --turns < {2 * WINDOW}, "
            "or --broker-warmup < 0"
        )
    if args.sessions < 1 or (args.sessions > 1 and "http" in variants):
        parser.error("--sessions takes a positive number, above 1 with --variants scripted")
    broken = ensure_peers(stores, _peer_requirements())
    started = time.perf_counter()
    warmed = warm_broker(args.broker_warmup) if "lf-kafka" in stores else None
    with _server_for(variants) as server:

        def run(store: str, variant: str) -> dict[str, Any]:
            served = server if variant == "http" else None
            return run_child(store, variant, args.turns, served, args.sessions)

        results = schedule(args.reps, dict.fromkeys(variants, stores), run, broken, _status)
    versions = peer_versions(results)
    print(
        f"# user turns, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; anthropic SDK {metadata.version('anthropic')}; "
        f"loadavg {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all"
    )
    if versions:
        print("# peer: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    if warmed is not None:
        print(f"# lf-kafka: {warmed}")
    print(f"# each figure: median of {args.reps} fresh-process runs (min{DASH}max)\n")
    for variant in variants:
        print(report(variant, stores, results[variant], args.turns, args.sessions) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"reps": args.reps, "results": results}, indent=1))


def warm_broker(turns: int) -> str:
    """Warm the Kafka broker's JVM with one untimed lf-kafka session of ``turns``
    scripted turns; what the report's header says of the broker."""
    if turns == 0:
        return "the broker measured as it was (--broker-warmup 0: cold if just started)"
    _log(f"warming the Kafka broker: one untimed lf-kafka session of {turns} scripted turns")
    result = run_child("lf-kafka", "scripted", turns, None)
    problems = [result["error"]] if "error" in result else result.get("problems", [])
    if problems:
        raise SystemExit(f"the broker's warm-up session failed: {problems[0]}")
    cpu = result.get("cpu_kafka_ms")
    spent = "" if cpu is None else f"; the broker's CPU over it {cpu:.2f} ms a turn"
    return f"the broker warmed first by an untimed session of {turns} scripted turns{spent}"


@contextlib.contextmanager
def _server_for(variants: list[str]) -> Iterator[str | None]:
    if "http" not in variants:
        yield None
        return
    with ModelServer() as server:
        yield server.url


def _status(run: dict[str, Any]) -> str:
    if "error" in run:
        return str(run["error"])
    cells = [f"{w} {run[f'{w}_p50']:.2f}" for w in WINDOWS if run.get(f"{w}_p50") is not None]
    return "p50 ms " + ", ".join(cells) + ("" if run.get("ok") else f"; {run.get('problems')}")


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.argv.remove("--child")
        child()
    else:
        main()
