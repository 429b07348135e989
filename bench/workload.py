"""The checkpoint workload and the harness that times one store on it.

Standard library only: the peer runners import this module from a separate venv in which
our ``loomflow`` is absent (and an unrelated PyPI project of the same name is installed).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: clock ticks per second of /proc's CPU times
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu_seconds(stat: str) -> float:
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def cpu_seconds_by_command(names: Sequence[str] = ("postgres", "java")) -> dict[str, float]:
    """user+system CPU seconds of every live process named ``names`` (from /proc)."""
    totals = dict.fromkeys(names, 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if comm in totals:
            totals[comm] += _stat_cpu_seconds(stat)
    return totals


def cpu_seconds_of(pid: int) -> float | None:
    """user+system CPU seconds of process ``pid`` so far (None: it is gone)."""
    try:
        return _stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


#: variant -> (sessions, passes per session)
VARIANTS: dict[str, tuple[int, int]] = {"single": (1, 200), "conc": (50, 40), "big": (1, 100)}
USER_CHARS, ASSISTANT_CHARS, TOOL_CHARS = 200, 600, 400
#: variant -> characters of a pass's user message, assistant answer and tool result, where
#: they are not the defaults above: "big" is the storage case of messages of ~2 KB
SIZES: dict[str, tuple[int, int, int]] = {"big": (2000, 2000, 2000)}
LIST_LIMIT = 50
#: Latest-checkpoint and list reads per session after the writes; enough samples for a
#: median in "single", one per session in "conc" (50 sessions already give 50 samples).
READ_SAMPLES = 10
LAST_N = 20

SYSTEM_PROMPT = (
    "You are a careful research assistant. Use the search_docs tool to look things up, "
    "cite what you find and say so when the documents do not answer the question."
)

_WORD_TEXT = (
    "checkpoint session transcript latency tool result query index cache durable log "
    "event replay resume fork retention writer epoch sequence usage token model agent "
    "store commit page journal snapshot schema field value record batch window budget "
    "the a of to and in is for with on that by this from as at be it are was or"
)
_WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class PassContent:
    """What pass ``k`` of one session adds; identical for every store."""

    user: str
    assistant: str
    call_id: str
    tool_name: str
    tool_args: dict[str, Any]
    tool_result: str
    input_tokens: int
    output_tokens: int


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def pass_content(
    session: int, k: int, sizes: tuple[int, int, int] = (USER_CHARS, ASSISTANT_CHARS, TOOL_CHARS)
) -> PassContent:
    # seeded per (session, pass) so every store, in every process, writes the same bytes
    rng = random.Random(session * 1_000_003 + k)
    user_chars, assistant_chars, tool_chars = sizes
    return PassContent(
        user=_text(rng, user_chars),
        assistant=_text(rng, assistant_chars),
        call_id=f"call_{session:03d}_{k:04d}",
        tool_name="search_docs",
        tool_args={"query": _text(rng, 40), "limit": 5, "filters": {"lang": "en", "year": 2026}},
        tool_result=_text(rng, tool_chars),
        input_tokens=1_000 + 300 * k,
        output_tokens=150 + rng.randrange(100),
    )


class SearchDocs:
    """The workload's one tool: ``search_docs`` answers each pass's query with its result."""

    _results: dict[str, str]

    def results(self, contents: Sequence[PassContent]) -> None:
        """Answer the queries of these passes."""
        self._results = {c.tool_args["query"]: c.tool_result for c in contents}

    def search_docs(self, query: str, limit: int = 5, filters: dict[str, Any] | None = None) -> str:
        """Search the documentation.

        Args:
            query: what to look for
            limit: how many hits to return
            filters: field values the hits must have
        """
        return self._results[query]


class Adapter(ABC):
    """One store under test. A handle is the adapter's own per-session state."""

    #: newest checkpoints the store keeps per session; < 1 keeps all
    retain: int = 0
    #: files whose size is the store's disk footprint, read after close
    files: Sequence[Path] = ()

    async def open(self) -> None:  # noqa: B027 - most stores need no async setup
        pass

    @abstractmethod
    async def seed(self, index: int) -> Any:
        """Start session ``index`` with the system message; return its handle."""

    @abstractmethod
    def add(self, handle: Any, k: int, content: PassContent) -> Any:
        """Build pass ``k``'s messages and usage in the store's own types (not timed)."""

    @abstractmethod
    async def put(self, handle: Any, k: int, new: Any) -> None:
        """Write what the store writes for one pass (timed).

        The pass's checkpoint is written here, or staged to go out with the store's next
        write (the next put, or ``finish`` after the last pass).
        """

    @abstractmethod
    async def get_latest(self, handle: Any) -> tuple[list[Any], int]:
        """The latest checkpoint's full transcript and its turn."""

    @abstractmethod
    async def list50(self, handle: Any) -> int:
        """How many checkpoints a newest-first listing of up to 50 returned."""

    @abstractmethod
    def written(self, handle: Any) -> list[Any]:
        """Every message written to the session so far, seed included."""

    @abstractmethod
    def transcript_json_bytes(self, messages: list[Any]) -> int:
        """Size of the transcript as compact JSON in the store's message model."""

    async def finish(self, handle: Any) -> None:  # noqa: B027 - the peers end with their put
        """What a session's writer does after its last pass (timed with that pass)."""

    async def connect(self, handle: Any) -> None:
        """Open a fresh instance's connections before its cold read is timed."""
        await self.list50(handle)

    async def cold_read(self, handle: Any) -> tuple[list[Any], int]:
        """What a resume reads on a fresh instance: the transcript and its turn."""
        return await self.get_latest(handle)

    async def close(self) -> None:  # noqa: B027
        pass

    async def teardown(self) -> None:  # noqa: B027 - most stores leave nothing behind
        """Release what outlives close (servers' schemas, topics, processes); always runs."""

    async def disk_bytes(self) -> int | None:
        """The store's footprint once closed: its files' sizes, None when it has none."""
        if not self.files:
            return None
        return sum(p.stat().st_size for p in self.files if p.exists())

    def reopen(self) -> Adapter | None:
        """A fresh instance on the same files, as a restarted process would open them."""
        return None

    def ref(self, handle: Any) -> str | None:
        """What names the session to another process (for its first read in a fresh
        process); None: this store is not measured that way."""
        return None

    def from_ref(self, ref: str) -> Any:
        """The handle of the session ``ref`` names, for ``cold_read`` in a fresh process."""
        raise NotImplementedError


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (``q`` in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def measure(adapter: Adapter, variant: str) -> dict[str, Any]:
    """Time one store on ``variant``; whatever happens, ``adapter.teardown()`` runs."""
    try:
        return await _measure(adapter, variant)
    finally:
        await adapter.teardown()


async def _measure(adapter: Adapter, variant: str) -> dict[str, Any]:
    sessions, passes = VARIANTS[variant]
    sizes = SIZES.get(variant, (USER_CHARS, ASSISTANT_CHARS, TOOL_CHARS))
    await adapter.open()
    handles = [await adapter.seed(i) for i in range(sessions)]
    puts: list[tuple[int, float]] = []

    async def drive(index: int, handle: Any) -> None:
        for k in range(1, passes + 1):
            new = adapter.add(handle, k, pass_content(index, k, sizes))
            t0 = time.perf_counter_ns()
            await adapter.put(handle, k, new)
            if k == passes:
                # the writer's end of run (our confirm) is part of what the last pass costs
                await adapter.finish(handle)
            puts.append((k, (time.perf_counter_ns() - t0) / 1e6))

    pauses = _GcPauses()
    gc.callbacks.append(pauses.observe)
    started = time.perf_counter()
    try:
        await asyncio.gather(*(drive(i, h) for i, h in enumerate(handles)))
    finally:
        gc.callbacks.remove(pauses.observe)
    wall = time.perf_counter() - started

    reads = max(1, READ_SAMPLES // sessions)
    expected_listed = min(LIST_LIMIT, passes if adapter.retain < 1 else min(adapter.retain, passes))
    gets: list[float] = []
    lists: list[float] = []
    list_rows: int | None = None
    problems: list[str] = []
    for index, handle in enumerate(handles):
        for r in range(reads):
            t0 = time.perf_counter_ns()
            messages, turn = await adapter.get_latest(handle)
            gets.append((time.perf_counter_ns() - t0) / 1e6)
            if r == 0 and (turn != passes or messages != adapter.written(handle)):
                problems.append(
                    f"session {index}: latest checkpoint has turn {turn} and "
                    f"{len(messages)} messages, wrote {passes} / {len(adapter.written(handle))}"
                )
        for r in range(reads):
            t0 = time.perf_counter_ns()
            listed = await adapter.list50(handle)
            lists.append((time.perf_counter_ns() - t0) / 1e6)
            if r == 0:
                list_rows = listed if list_rows is None else list_rows
                if listed != expected_listed:
                    problems.append(f"session {index}: listed {listed}, expected {expected_listed}")

    transcript_bytes = adapter.transcript_json_bytes(adapter.written(handles[0]))
    await adapter.close()
    disk = await adapter.disk_bytes()

    # a resume after a restart reads with nothing in memory: time that read on a fresh
    # instance whose connections are open
    cold_reads: list[float] = []
    cold = adapter.reopen()
    if cold is not None:
        await cold.open()
        try:
            for index, handle in enumerate(handles[:READ_SAMPLES]):
                await cold.connect(handle)
                t0 = time.perf_counter_ns()
                messages, turn = await cold.cold_read(handle)
                cold_reads.append((time.perf_counter_ns() - t0) / 1e6)
                if turn != passes or messages != adapter.written(handle):
                    problems.append(
                        f"session {index}: a fresh instance read turn {turn} and "
                        f"{len(messages)} messages, wrote {passes} / {len(adapter.written(handle))}"
                    )
        finally:
            await cold.close()
    put_ms = [ms for _, ms in puts]
    return {
        "put_p50": percentile(put_ms, 50),
        "put_p99": percentile(put_ms, 99),
        "warm_get_p50": percentile(gets, 50),
        "cold_read_p50": percentile(cold_reads, 50) if cold_reads else None,
        "list_p50": percentile(lists, 50),
        "list_rows": list_rows,
        "wall_s": wall,
        "ckpt_per_s": len(puts) / wall,
        "disk_mb": None if disk is None else disk / 1e6,
        "ok": not problems,
        "problems": problems[:3],
        "last20_put_p50": percentile([ms for k, ms in puts if k > passes - LAST_N], 50),
        "final_put_p50": percentile([ms for k, ms in puts if k == passes], 50),
        "transcript_bytes": transcript_bytes,
        "checkpoints": len(puts),
        "loadavg_1m": os.getloadavg()[0],
        # the garbage collector's pauses during the writes: every session waits through one
        "gc_ms": pauses.total_ms,
        "gc_max_ms": pauses.max_ms,
        "gc_full": pauses.full,
        # what a process started after these writes reads first (see fresh_read)
        "fresh_ref": adapter.ref(handles[0]),
        "fresh_expect": [len(adapter.written(handles[0])), passes],
    }


class _GcPauses:
    """The collector's pauses, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total_ms = self.max_ms = 0.0
        self.full = 0
        self._started = 0

    def observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
            return
        pause = (time.perf_counter_ns() - self._started) / 1e6
        self.total_ms += pause
        self.max_ms = max(self.max_ms, pause)
        self.full += info["generation"] == 2


async def fresh_read(
    make: Callable[[str, Path], Adapter], store: str, directory: Path, ref: str
) -> dict[str, Any]:
    """The first read of a session in a process that has done nothing else: make and open
    the store (the library's imports, the connection), then read the latest checkpoint,
    first-use costs included (validators built, caches empty)."""
    t0 = time.perf_counter_ns()
    adapter = make(store, directory)
    await adapter.open()
    t1 = time.perf_counter_ns()
    messages, turn = await adapter.cold_read(adapter.from_ref(ref))
    t2 = time.perf_counter_ns()
    await adapter.close()
    return {
        "fresh_open_ms": (t1 - t0) / 1e6,
        "fresh_read_ms": (t2 - t1) / 1e6,
        "fresh_got": [len(messages), turn],
    }


def _fresh_child(
    command: Sequence[str], store: str, directory: Path, result: dict[str, Any]
) -> None:
    """Run ``fresh_read`` in a new process on what this one wrote; merge its figures."""
    started = time.perf_counter_ns()
    done = subprocess.run(
        [
            *command,
            "--store",
            store,
            "--variant",
            result["variant"],
            "--fresh-read",
            result["fresh_ref"],
            "--dir",
            str(directory),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        result.setdefault("problems", []).append(f"fresh read: {done.stderr[-300:]}")
        result["ok"] = False
        return
    fresh = json.loads(lines[-1])
    fresh["fresh_process_ms"] = (time.perf_counter_ns() - started) / 1e6
    if fresh.pop("fresh_got") != result["fresh_expect"]:
        result.setdefault("problems", []).append("fresh read: not what was written")
        result["ok"] = False
    result.update(fresh)


Measure = Callable[[Adapter, str], Coroutine[Any, Any, dict[str, Any]]]


def child_main(
    make: Callable[[str, Path], Adapter],
    extra: Callable[[], dict[str, Any]],
    *,
    variants: Sequence[str] = tuple(VARIANTS),
    run: Measure = measure,
    command: Sequence[str] = (),
) -> None:
    """Entry point of one measurement process: print exactly one JSON line on stdout.

    ``command`` starts this entry point again (for the first read in a fresh process)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--variant", required=True, choices=sorted(variants))
    parser.add_argument("--fresh-read", help="read this session of --dir's store, only")
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    if args.fresh_read is not None:
        figures = asyncio.run(fresh_read(make, args.store, args.dir, args.fresh_read))
        print(json.dumps(figures), flush=True)
        return
    result: dict[str, Any] = {"store": args.store, "variant": args.variant}
    try:
        with tempfile.TemporaryDirectory(prefix="lf-bench-") as tmp:
            adapter = make(args.store, Path(tmp))
            result.update(asyncio.run(run(adapter, args.variant)))
            if command and result.get("fresh_ref") is not None:
                _fresh_child(command, args.store, Path(tmp), result)
        result.update(extra())
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)


#: the directory holding the loomflow package this benchmark runs (its checkout)
LOOMFLOW_SOURCE = Path(__file__).resolve().parent.parent


def loomflow_command() -> list[str]:
    """How a benchmark starts ``loomflow`` as a user does: the virtualenv's script (the
    module where there is none). Run it with ``own_env``."""
    script = Path(sys.executable).parent / "loomflow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "loomflow.cli"]


def own_env(env: dict[str, str], source: Path = LOOMFLOW_SOURCE) -> dict[str, str]:
    """``env`` for a ``loomflow`` process of ours, with ``source`` (the directory holding
    the loomflow package this benchmark imported) first on its path.

    The ``loomflow`` script imports whatever the virtualenv installed, which for an
    editable install is the checkout it was installed from: a benchmark run from another
    checkout (a worktree of an older commit, to compare) measured its own agent beside
    that checkout's processor. Peers' processes never get this: ``_clean_env`` leaves
    PYTHONPATH out so that their venv's packages win."""
    return {**env, "PYTHONPATH": str(source)}
