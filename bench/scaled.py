"""Issue 25 in one run: the scaled path's and the embedded default's targets, side by side.

    .venv/bin/python -m bench.scaled [--only pass,peers,projector,storage,import,http,cold]
                                     [--reps 3] [--turns 30] [--passes 100] [--events 100000]
                                     [--lag-seconds 20] [--import-runs 20] [--json out.json]

Needs LOOMFLOW_POSTGRES_DSN and LOOMFLOW_KAFKA_BOOTSTRAP (``dev/services.sh start``). Each part
is one of the benches, run as a subprocess with its ``--json`` output, its own table printed
as it ends; then one table holds every target of the issue's "Done when", its figure (the
medians of this run) and met / MISSED:

- ``pass``: ``bench.turn --variants scripted`` on lf-inproc, lf-sqlite, lf-pg and lf-kafka
  (README defaults; lf-kafka's ``loomflow processor`` in its own process). Target: lf-kafka's
  turn (an agent pass: resume, tool call, tool result, answer, checkpoint) p50 over turns
  11-20 <= 1.0x lf-pg's.
- ``peers``: ``bench.pg_peers`` (PostgresRuntime, LangGraph's AsyncPostgresSaver and DBOS on
  the same PostgreSQL, per turn and per put). Target: ours per turn <= 0.5x the best peer's.
- ``projector``: ``bench.processor --cases throughput,ceiling,lag --workers 1,2``. Targets:
  one worker >= 20,000 events/s and >= 0.6x the raw consume-and-COPY ceiling; lag p99 <= 25
  ms at 1,000 events/s.
- ``storage``: ``bench.storage --page-sizes 4096`` (SQLite's default page, which loomflow
  keeps): a SqliteRuntime session keeping every checkpoint, its files over the final
  transcript's JSON, on 100 passes of ~2 KB messages and on the 200-pass workload, each
  written through the Agent (``agent-big``, ``agent-single``: what a user's session
  takes) and through the store API as bench.checkpoints writes it (``big``, ``single``).
  Target: <= 1.5x on each.
- ``import``: ``--import-runs`` fresh ``python -c`` processes of ``import loomflow; from
  loomflow import SqliteRuntime; SqliteRuntime(path)`` and as many of ``python -c pass``,
  alternated; the figure is the difference of their median walls, the compiled modules
  cached (in a cache of this run's own, written by one untimed run first) as an installed
  package has them, whether or not the environment sets PYTHONDONTWRITEBYTECODE. A third
  process, alternated with those, imports only the libraries that code cannot do without
  (``FLOOR_CODE``: sqlite3, asyncio, pydantic and pydantic-settings): its wall over the
  bare one is the libraries' floor, the rest loomflow's own share, so a miss says which
  bounds it. One more process reports which of ``HEAVY`` that code left in
  ``sys.modules``. Targets: <= 150 ms, none loaded.
- ``http``: ``bench.turn --variants http --stores lf-sqlite,lf020-sqlite`` (the spec's code,
  each implementation's Anthropic adapter against the bench's local Messages API; 0.20.0
  from the peers venv) over ``--turns`` user turns. Target: lf-sqlite per turn <= 0.5x
  0.20.0's, on the p50 of each span of ten turns (1-10, 11-20, the last ten), the worst
  span judged, as bench.turn judges it.
- ``cold``: ``bench.checkpoints --variants single --stores lf-sqlite,lg-sqlite``: the cold
  read of a 200-pass session, what a resume after a restart reads (ours: ``restore`` on a
  new SqliteRuntime; LangGraph's AsyncSqliteSaver: its latest checkpoint from a reopened
  store). Target: <= 1.0x LangGraph's. (The issue's get at a million checkpoints is
  bench.scale's, whose load of a million takes ~20 minutes: not part of this run.)

A part that fails (a missing service, a bench's error) leaves its targets "not measured"
with the reason; a target whose runs were not ``ok`` is MISSED whatever its figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import pg_peers, turn
from bench.workload import VARIANTS as STORE_WORKLOADS

REPO = Path(__file__).resolve().parent.parent
PARTS = ("pass", "peers", "projector", "storage", "import", "http", "cold")
PASS_STORES = ("lf-inproc", "lf-sqlite", "lf-pg", "lf-kafka")
HTTP_STORES = ("lf-sqlite", turn.PEER)
COLD_STORES = ("lf-sqlite", "lg-sqlite")
#: modules the lean import must not load
#: (pydantic-settings is not among them: it is the one reader of configuration every
#: process uses, a runtime's constructor included; its cost is in FLOOR_CODE's)
HEAVY = ("aiokafka", "asyncpg", "anthropic", "opentelemetry", "faust", "httpx", "cryptography")
IMPORT_CODE = (
    "import loomflow\nfrom loomflow import SqliteRuntime\nSqliteRuntime({path!r})\n{probe}"
)
#: the libraries IMPORT_CODE cannot do without, imported alone: the import's floor (the
#: file is opened by sqlite3, the event loop is asyncio's, every record and the settings
#: are pydantic models, the settings read by pydantic-settings)
FLOOR_CODE = (
    "import sqlite3, asyncio\nfrom pydantic import BaseModel, TypeAdapter\n"
    "from pydantic_settings import BaseSettings"
)
PROBE = "import sys\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
PART_TIMEOUT_S = 3 * 3600
DASH = "\u2013"


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the targets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One target of the issue, as this run measured it."""

    name: str
    figure: str
    #: None: not measured
    met: bool | None

    @property
    def verdict(self) -> str:
        return "not measured" if self.met is None else ("met" if self.met else "MISSED")


def _fine(runs: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [r for r in runs or () if "error" not in r]


def _median(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _judged(
    name: str, figure: str, within: bool, *groups: Sequence[dict[str, Any]] | None
) -> Target:
    """The verdict on runs ``groups`` (each as its bench wrote it, failures included): a
    figure within the target is met only if every run that finished was ok; the runs that
    failed are named in the figure."""
    runs = [r for group in groups for r in group or ()]
    errors = [str(r["error"]) for r in runs if "error" in r]
    if errors:
        figure += f"; {len(errors)} of {len(runs)} runs failed ({errors[0][:80]})"
    if not all(r.get("ok", True) for r in runs if "error" not in r):
        return Target(name, f"{figure}; a run's results were not ok", False)
    return Target(name, figure, within)


def _missing(name: str, why: str) -> Target:
    return Target(name, f"not measured: {why}", None)


def pass_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """lf-kafka's agent pass against lf-pg's (bench.turn's JSON)."""
    name = "Kafka pass <= 1.0x PostgreSQL's"
    if data is None:
        return [_missing(name, why)]
    by_store = data.get("results", {}).get("scripted", {})
    kafka, pg = _fine(by_store.get("lf-kafka")), _fine(by_store.get("lf-pg"))
    k, p = _median(kafka, "second_p50"), _median(pg, "second_p50")
    if k is None or not p:
        return [_missing(name, "needs lf-kafka and lf-pg runs")]
    ratio = k / p
    figure = f"{ratio:.2f}x ({k:.2f} / {p:.2f} ms, turns 11{DASH}20 p50)"
    raw = (by_store.get("lf-kafka"), by_store.get("lf-pg"))
    return [_judged(name, figure, ratio <= 1.0, *raw)]


def peers_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """PostgresRuntime per turn against the best of LangGraph and DBOS (bench.pg_peers)."""
    name = "PostgresRuntime per turn <= 0.5x the best peer"
    if data is None:
        return [_missing(name, why)]
    results = data.get("results", {})
    target = pg_peers.turn_target(results)
    if target["ratio"] is None:
        return [_missing(name, "needs ours and a peer's turn runs")]
    turns = results.get("turn", {})
    figure = (
        f"{target['ratio']:.2f}x ({target['ours']:.2f} ms / {target['peer']}'s "
        f"{target['peer_value']:.2f} ms)"
    )
    raw = (turns.get("ours"), turns.get(target["peer"]))
    return [_judged(name, figure, bool(target["met"]), *raw)]


def projector_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """The projector per worker, against the raw ceiling, and its lag (bench.processor)."""
    names = (
        "projector >= 20,000 events/s per worker",
        "projector >= 0.6x the raw ceiling",
        "lag p99 <= 25 ms at 1,000 events/s",
    )
    if data is None:
        return [_missing(n, why) for n in names]
    results = data.get("results", {})
    one, two = _fine(results.get("throughput:1")), _fine(results.get("throughput:2"))
    ceiling, lag = _fine(results.get("ceiling")), _fine(results.get("lag"))
    rate, raw = _median(one, "events_per_s"), _median(ceiling, "events_per_s")
    pair = _median(two, "events_per_s")
    out: list[Target] = []
    if rate is None:
        out.append(_missing(names[0], "needs a 1-worker throughput run"))
    else:
        extra = f"; 2 workers: {pair / 2:,.0f} per worker" if pair else ""
        figure = f"{rate:,.0f} events/s (1 worker){extra}"
        out.append(_judged(names[0], figure, rate >= 20_000, results.get("throughput:1")))
    if rate is None or not raw:
        out.append(_missing(names[1], "needs a 1-worker throughput run and the ceiling"))
    else:
        figure = f"{rate / raw:.2f}x ({rate:,.0f} / {raw:,.0f} events/s)"
        used = (results.get("throughput:1"), results.get("ceiling"))
        out.append(_judged(names[1], figure, rate / raw >= 0.6, *used))
    p99 = _median(lag, "lag_p99")
    if p99 is None:
        out.append(_missing(names[2], "needs a lag run"))
    else:
        out.append(_judged(names[2], f"{p99:.1f} ms", p99 <= 25, results.get("lag")))
    return out


STORAGE_WORKLOADS = {
    "agent-big": "Agent, 100 passes of ~2 KB",
    "agent-single": "Agent, 200 passes",
    "big": "store, 100 passes of ~2 KB",
    "single": "store, 200 passes",
}


def storage_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """SqliteRuntime's files over the transcript on both workloads (bench.storage)."""
    out: list[Target] = []
    rows = (data or {}).get("rows", [])
    for workload, label in STORAGE_WORKLOADS.items():
        name = f"storage ({label}) <= 1.5x the transcript"
        found = [r for r in rows if r["workload"] == workload and r["page"] == 4096]
        if data is None or not found:
            out.append(_missing(name, why if data is None else "no row at page 4096"))
            continue
        row = found[0]
        ratio = row["disk"] / row["transcript"]
        figure = f"{ratio:.2f}x ({row['disk'] / 1000:,.0f} KB / {row['transcript'] / 1000:,.0f} KB)"
        out.append(Target(name, figure, ratio <= 1.5))
    return out


def import_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """The lean import's cost over a bare interpreter, and the heavy modules it loaded."""
    names = ("import loomflow + SqliteRuntime <= 150 ms", "the lean import loads no heavy module")
    if data is None:
        return [_missing(n, why) for n in names]
    ms = data["import_ms"]
    figure = f"{ms:.0f} ms ({data['lean_ms']:.0f} - {data['bare_ms']:.0f} ms, {data['runs']} runs)"
    if data.get("floor_ms") is not None:  # older JSON has no floor
        figure += (
            f"; the libraries alone {data['libraries_ms']:.0f} ms, loomflow's own "
            f"{data['own_ms']:.0f} ms"
        )
    heavy = data["heavy"]
    return [
        Target(names[0], figure, ms <= 150),
        Target(names[1], ", ".join(heavy) if heavy else "none of " + ", ".join(HEAVY), not heavy),
    ]


def http_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """lf-sqlite's user turn over HTTP against loomflow 0.20.0's, span by span (bench.turn)."""
    name = "HTTP user turn (lf-sqlite) <= 0.5x loomflow 0.20.0's"
    if data is None:
        return [_missing(name, why)]
    by_store = data.get("results", {}).get("http", {})
    ours, peer = by_store.get("lf-sqlite"), by_store.get(turn.PEER)
    spans: list[tuple[str, float, float]] = []
    for window in turn.WINDOWS:
        mine, theirs = _median(_fine(ours), f"{window}_p50"), _median(_fine(peer), f"{window}_p50")
        if mine is not None and theirs:
            spans.append((window, mine, theirs))
    if len(spans) < len(turn.WINDOWS):
        return [_missing(name, f"needs lf-sqlite and {turn.PEER} runs")]
    ratios = [mine / theirs for _, mine, theirs in spans]
    worst = max(range(len(spans)), key=lambda i: ratios[i])
    window, mine, theirs = spans[worst]
    figure = (
        ", ".join(f"{r:.2f}x" for r in ratios)
        + f" (turns 1{DASH}10, 11{DASH}20, last ten; worst: {window}, {mine:.2f} / "
        + f"{theirs:.2f} ms)"
    )
    return [_judged(name, figure, ratios[worst] <= 0.5, ours, peer)]


def cold_targets(data: dict[str, Any] | None, why: str = "not run") -> list[Target]:
    """lf-sqlite's cold read of a session against LangGraph's (bench.checkpoints, single)."""
    name = "cold read (lf-sqlite) <= LangGraph's (AsyncSqliteSaver)"
    if data is None:
        return [_missing(name, why)]
    by_store = data.get("results", {}).get("single", {})
    ours, peer = by_store.get("lf-sqlite"), by_store.get("lg-sqlite")
    mine, theirs = _median(_fine(ours), "cold_read_p50"), _median(_fine(peer), "cold_read_p50")
    if mine is None or not theirs:
        return [_missing(name, "needs lf-sqlite and lg-sqlite runs")]
    ratio = mine / theirs
    passes = STORE_WORKLOADS["single"][1]
    figure = f"{ratio:.2f}x ({mine:.2f} / {theirs:.2f} ms, a {passes}-pass session)"
    return [_judged(name, figure, ratio <= 1.0, ours, peer)]


TARGETS: dict[str, Callable[..., list[Target]]] = {
    "pass": pass_targets,
    "peers": peers_targets,
    "projector": projector_targets,
    "storage": storage_targets,
    "import": import_targets,
    "http": http_targets,
    "cold": cold_targets,
}


def targets(parts: dict[str, dict[str, Any]]) -> list[Target]:
    """Every target, from the parts' JSON (``{"error": ...}`` for a part that failed)."""
    out: list[Target] = []
    for part, judge in TARGETS.items():
        data = parts.get(part)
        if data is None:
            out += judge(None, "not run (--only)")
        elif "error" in data:
            out += judge(None, str(data["error"]))
        else:
            out += judge(data)
    return out


def targets_table(found: Sequence[Target]) -> str:
    out = ["## issue 25's targets (medians of this run)", "", "| target | figure | verdict |"]
    out.append("|---|---|---|")
    for t in found:
        out.append(f"| {t.name} | {t.figure.replace('|', '/')} | {t.verdict} |")
    return "\n".join(out)


# -- the import -----------------------------------------------------------------------------------


def _wall_ms(code: str, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, env=env)
    return (time.perf_counter_ns() - t0) / 1e6


def _bytecode_env(cache: Path) -> dict[str, str]:
    """The environment of a timed process: Python writes and reads the compiled modules in
    ``cache``, as an installed package has loomflow's (pip compiles them at install),
    whether or not this environment sets PYTHONDONTWRITEBYTECODE."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def _run_probe(code: str) -> list[str]:
    """The words ``code`` printed, run in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.split()


def heavy_modules(code: str) -> list[str]:
    """Which of ``HEAVY`` are in ``sys.modules`` after ``code`` ran in a fresh process."""
    return _run_probe(code + "\n" + PROBE.format(heavy=HEAVY))


def measure_import(runs: int) -> dict[str, Any]:
    """The lean import's wall over a bare interpreter's, and the libraries' floor
    (``FLOOR_CODE``) between them: medians of ``runs`` of each, the compiled modules
    cached as an installed package has them."""
    with tempfile.TemporaryDirectory(prefix="lf-bench-import-") as tmp:
        code = IMPORT_CODE.format(path=str(Path(tmp) / "lf.db"), probe="")
        env = _bytecode_env(Path(tmp) / "pycache")
        _wall_ms(code, env)  # writes the cache, untimed
        bare: list[float] = []
        floor: list[float] = []
        lean: list[float] = []
        for _ in range(runs):  # alternated, so drifting load hits all alike
            bare.append(_wall_ms("pass", env))
            floor.append(_wall_ms(FLOOR_CODE, env))
            lean.append(_wall_ms(code, env))
        heavy = heavy_modules(code)
    bare_ms, lean_ms = statistics.median(bare), statistics.median(lean)
    floor_ms = statistics.median(floor)
    return {
        "runs": runs,
        "bare_ms": bare_ms,
        "lean_ms": lean_ms,
        "import_ms": lean_ms - bare_ms,
        "floor_ms": floor_ms,
        "libraries_ms": floor_ms - bare_ms,
        "own_ms": lean_ms - floor_ms,
        "heavy": heavy,
        "bytecode": "cached",
        "loadavg_1m": os.getloadavg()[0],
    }


# -- the parts ------------------------------------------------------------------------------------


def commands(args: argparse.Namespace, out: Path) -> dict[str, list[str]]:
    """Each bench part's command, writing its JSON into ``out``."""
    py, reps = sys.executable, str(args.reps)
    return {
        "pass": [
            *(py, "-m", "bench.turn", "--variants", "scripted"),
            *("--stores", ",".join(PASS_STORES), "--turns", str(args.turns), "--reps", reps),
            *("--json", str(out / "pass.json")),
        ],
        "peers": [
            *(py, "-m", "bench.pg_peers", "--turns", str(args.turns)),
            *("--passes", str(args.passes), "--reps", reps, "--json", str(out / "peers.json")),
        ],
        "projector": [
            *(py, "-m", "bench.processor", "--cases", "throughput,ceiling,lag"),
            *("--workers", "1,2", "--reps", reps, "--events", str(args.events)),
            *("--lag-seconds", str(args.lag_seconds), "--json", str(out / "projector.json")),
        ],
        "storage": [
            *(py, "-m", "bench.storage", "--page-sizes", "4096"),
            *("--json", str(out / "storage.json")),
        ],
        "http": [
            *(py, "-m", "bench.turn", "--variants", "http", "--stores", ",".join(HTTP_STORES)),
            *("--turns", str(args.turns), "--reps", reps, "--json", str(out / "http.json")),
        ],
        "cold": [
            *(py, "-m", "bench.checkpoints", "--variants", "single"),
            *("--stores", ",".join(COLD_STORES), "--reps", reps),
            *("--json", str(out / "cold.json")),
        ],
    }


def run_part(part: str, command: list[str], out: Path) -> dict[str, Any]:
    """Run one bench; its JSON, or ``{"error": ...}``. Its table goes to stdout."""
    _log(f"== {part}: {' '.join(command[1:])}")
    try:
        done = subprocess.run(
            command, cwd=REPO, stdout=subprocess.PIPE, text=True, timeout=PART_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {PART_TIMEOUT_S} s"}
    print(f"## part {part}: {' '.join(command[1:])}\n\n{done.stdout.strip()}\n", flush=True)
    path = out / f"{part}.json"
    if done.returncode != 0 or not path.exists():
        return {"error": f"exit {done.returncode}, no JSON written"}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--passes", type=int, default=100)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--lag-seconds", type=float, default=20.0)
    parser.add_argument("--import-runs", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write every part's JSON and the targets here")
    args = parser.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or args.reps < 1 or args.turns < 20 or args.import_runs < 1:
        parser.error(
            f"unknown part {unknown} (parts: {', '.join(PARTS)}), or --reps < 1, "
            "--turns < 20, --import-runs < 1"
        )
    started = time.perf_counter()
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="lf-bench-scaled-") as tmp:
        out = Path(tmp)
        planned = commands(args, out)
        for part in parts:
            if part == "import":
                _log(f"== import: {args.import_runs} runs of each")
                try:
                    found[part] = measure_import(args.import_runs)
                except subprocess.CalledProcessError as exc:
                    found[part] = {"error": f"the import failed: {exc.stderr!r:.300}"}
                continue
            found[part] = run_part(part, planned[part], out)
    verdicts = targets(found)
    print(
        f"# issue 25 in one run, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} "
        f"cores; Python {platform.python_version()}; loadavg {os.getloadavg()[0]:.2f}; "
        f"{time.perf_counter() - started:.0f} s in all; --reps {args.reps}\n"
    )
    print(targets_table(verdicts))
    result = {"parts": found, "targets": [{**asdict(t), "verdict": t.verdict} for t in verdicts]}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
