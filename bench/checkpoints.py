"""Checkpoint benchmark: our runtimes against LangGraph and loomflow 0.20.0, side by side.

    .venv/bin/python -m bench.checkpoints [--variants single,conc] [--stores ...] [--reps 5]
                                          [--json out.json]

Every (store, variant, repetition) runs in a fresh process that prints one JSON line;
this parent only schedules them and prints the median and (min-max) over repetitions.
The default stores include lf-pg / lf-pg-keepall when LOOMFLOW_POSTGRES_DSN is set, and
lf-kafka (KafkaRuntime with its projector as a task in the measuring process) when
LOOMFLOW_KAFKA_BOOTSTRAP is set too (``dev/services.sh start`` prints both).
The peers live in their own venv (.cache/bench-peers, built here on first use) because
PyPI's ``loomflow`` 0.20.0 is an unrelated project whose name clashes with ours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:
    # run as a script (python bench/checkpoints.py): make ``bench`` and ``loomflow`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import SYSTEM_PROMPT, VARIANTS, Adapter, PassContent, child_main

REPO = Path(__file__).resolve().parent.parent
PEER_VENV = REPO / ".cache" / "bench-peers"
PEER_RUNNER = REPO / "bench" / "peer_runner.py"
OUR_STORES = (
    "lf-inproc",
    "lf-sqlite",
    "lf-sqlite-keepall",
    "lf-pg",
    "lf-pg-keepall",
    "lf-kafka",
)
#: store -> the environment variables it needs (the services it talks to)
SERVICE_ENV: dict[str, tuple[str, ...]] = {
    "lf-pg": ("LOOMFLOW_POSTGRES_DSN",),
    "lf-pg-keepall": ("LOOMFLOW_POSTGRES_DSN",),
    "lf-kafka": ("LOOMFLOW_POSTGRES_DSN", "LOOMFLOW_KAFKA_BOOTSTRAP"),
}
#: peer store -> the pip requirements it needs in the peers venv
PEER_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "lg-sqlite": ("langgraph-checkpoint-sqlite==3.1.2", "aiosqlite"),
    "lf020-sqlite": ("loomflow==0.20.0",),
}
ALL_STORES = (*OUR_STORES, *PEER_REQUIREMENTS)
CHILD_TIMEOUT_S = 300
DASH = "\u2013"  # the range separator of the peers file, so tables compare line by line


# -- our runtimes (child side) ---------------------------------------------------------


@dataclass
class _Session:
    scope: Any
    writer: Any
    messages: list[Any]
    usage: Any


class LoomflowAdapter(Adapter):
    """A pass as the agent writes it: two ``turn.appended`` events, then a checkpoint.

    The checkpoint event carries no messages; ``get_checkpoint`` materialises the
    transcript from the log, which is what a resume reads.

    ``lf-kafka`` runs its projector as a task in this same process, on topics and a
    schema of its own; each append returns once that projector has applied it.
    """

    def __init__(self, store: str, tmp: Path, schema: str | None = None) -> None:
        from loomflow.runtime import InProcRuntime, KafkaRuntime, PostgresRuntime, SqliteRuntime

        path = tmp / "lf.db"
        self.store_name, self.tmp = store, tmp
        # PostgreSQL: a fresh schema per run; the reopened (cold) instance drops it at close
        self.schema = schema or f"lf_bench_{os.getpid()}_{time.time_ns() % 10**9}"
        self.drops_schema = schema is not None
        if store == "lf-inproc":
            self.runtime: Any = InProcRuntime()
        elif store == "lf-sqlite":
            self.runtime = SqliteRuntime(path)
        elif store == "lf-sqlite-keepall":
            self.runtime = SqliteRuntime(path, max_checkpoints_per_session=0)
        elif store in ("lf-pg", "lf-pg-keepall"):
            self.runtime = PostgresRuntime(
                _postgres_dsn(),
                schema=self.schema,
                max_checkpoints_per_session=0 if store == "lf-pg-keepall" else 20,
            )
        elif store == "lf-kafka":
            from loomflow.producers import Topics

            # topic names allow the schema's characters: one name ties topics, schema, group
            self.topics = Topics.prefixed(self.schema, partitions=KAFKA_PARTITIONS)
            self.group = f"{self.schema}-projector"
            self.runtime = KafkaRuntime(
                _kafka_bootstrap(),
                _postgres_dsn(),
                topics=self.topics,
                schema=self.schema,
                group_id=self.group,
            )
            self._projecting: tuple[Any, asyncio.Event, asyncio.Task[None]] | None = None
        else:
            raise ValueError(f"unknown store {store!r}")
        self.retain = self.runtime.max_checkpoints_per_session
        if store.startswith("lf-sqlite"):
            self.files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]

    async def open(self) -> None:
        if self.store_name.startswith("lf-pg"):
            await self.runtime.store.open()  # connect and migrate before anything is timed
        elif self.store_name == "lf-kafka":
            # topics, producer, migration and listener first, then the projector: nothing
            # of the setup is timed, and the first put does not wait for a group join
            await self.runtime.store.start()
            if not self.drops_schema:  # the writing instance; a reopened one only reads
                self._projecting = await _start_projector(self.topics, self.schema, self.group)

    async def seed(self, index: int) -> _Session:
        from loomflow.runtime import Scope
        from loomflow.schemas import Message, TurnAppended, Usage, new_id
        from loomflow.schemas.events import TurnAppendedPayload

        scope = Scope(new_id("sess"), None)
        writer = await self.runtime.open_session(scope, run_id=new_id("run"))
        system = Message.system(SYSTEM_PROMPT)
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[system]))
        return _Session(scope, writer, [system], Usage())

    def add(self, handle: _Session, k: int, content: PassContent) -> tuple[Any, ...]:
        from loomflow.schemas import Message, ToolCall, Usage

        call = ToolCall(id=content.call_id, name=content.tool_name, arguments=content.tool_args)
        user = Message.user(content.user)
        assistant = Message.assistant(content.assistant, [call])
        tool = Message.tool(content.call_id, content.tool_result)
        turn_usage = Usage(input_tokens=content.input_tokens, output_tokens=content.output_tokens)
        handle.usage = handle.usage + turn_usage
        handle.messages += [user, assistant, tool]
        return user, assistant, tool, turn_usage, handle.usage, len(handle.messages)

    async def put(self, handle: _Session, k: int, new: tuple[Any, ...]) -> None:
        from loomflow.schemas import CheckpointWritten, TurnAppended, new_id
        from loomflow.schemas.events import CheckpointWrittenPayload, TurnAppendedPayload

        user, assistant, tool, turn_usage, cumulative, count = new
        writer = handle.writer
        await writer.emit(
            TurnAppended,
            TurnAppendedPayload(messages=[user, assistant], usage=turn_usage, model_call=True),
        )
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[tool]))
        await writer.emit(
            CheckpointWritten,
            CheckpointWrittenPayload(
                checkpoint_id=new_id("ckpt"),
                turn=k,
                cumulative_usage=cumulative,
                cursor=f"pass:{k}",
                message_count=count,
                retain=self.runtime.max_checkpoints_per_session,
            ),
        )

    async def get_latest(self, handle: _Session) -> tuple[list[Any], int]:
        found = await self.runtime.get_checkpoint(handle.scope)
        return ([], -1) if found is None else (found.messages, found.turn)

    async def list50(self, handle: _Session) -> int:
        return len(await self.runtime.list_checkpoints(handle.scope, 50))

    def written(self, handle: _Session) -> list[Any]:
        return handle.messages

    def transcript_json_bytes(self, messages: list[Any]) -> int:
        import orjson

        return len(orjson.dumps([m.model_dump(mode="json") for m in messages]))

    async def close(self) -> None:
        await self.runtime.close()
        if self.store_name == "lf-kafka" and self._projecting is not None:
            projector, stop, task = self._projecting
            stop.set()
            await task
            await projector.stop()
            self._projecting = None
        if self.store_name.startswith(("lf-pg", "lf-kafka")) and self.drops_schema:
            import asyncpg

            conn = await asyncpg.connect(_postgres_dsn())
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            finally:
                await conn.close()
        if self.store_name == "lf-kafka" and self.drops_schema:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=_kafka_bootstrap())
            await admin.start()
            try:
                topics = self.topics
                await admin.delete_topics([topics.events, topics.snapshots, topics.dlq])
            finally:
                await admin.close()

    async def disk_bytes(self) -> int | None:
        if not self.store_name.startswith(("lf-pg", "lf-kafka")):
            return await super().disk_bytes()
        import asyncpg

        # the read model only: tables with their indexes and TOAST (lf-kafka's log in
        # Kafka is not counted)
        conn = await asyncpg.connect(_postgres_dsn())
        try:
            size = await conn.fetchval(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'm')",
                self.schema,
            )
        finally:
            await conn.close()
        return int(size)

    def reopen(self) -> Adapter | None:
        if self.store_name == "lf-inproc":
            return None
        return type(self)(self.store_name, self.tmp, self.schema)


KAFKA_PARTITIONS = 6
ASSIGNMENT_TIMEOUT_S = 60.0


async def _start_projector(
    topics: Any, schema: str, group: str
) -> tuple[Any, asyncio.Event, asyncio.Task[None]]:
    """A projector task in this process, with the defaults of ``loomflow processor``.

    Returns once the projector holds every partition, so no put waits for the join.
    """
    from loomflow.processors import Projector

    projector = Projector(
        _kafka_bootstrap(), _postgres_dsn(), topics=topics, schema=schema, group_id=group
    )
    await projector.start()
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    deadline = time.monotonic() + ASSIGNMENT_TIMEOUT_S
    while projector.assignment() != set(range(topics.partitions)):
        if time.monotonic() > deadline or task.done():
            stop.set()
            await task
            await projector.stop()
            raise RuntimeError(f"the projector got no full assignment of {topics.events}")
        await asyncio.sleep(0.02)
    return projector, stop, task


def _kafka_bootstrap() -> str:
    bootstrap = os.environ.get("LOOMFLOW_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise RuntimeError(
            "lf-kafka needs LOOMFLOW_KAFKA_BOOTSTRAP (and LOOMFLOW_POSTGRES_DSN): run "
            "`dev/services.sh start` and export what it prints"
        )
    return bootstrap


def _postgres_dsn() -> str:
    dsn = os.environ.get("LOOMFLOW_POSTGRES_DSN")
    if not dsn:
        raise RuntimeError(
            "lf-pg needs LOOMFLOW_POSTGRES_DSN: run `dev/postgres.sh start` and export "
            "what it prints"
        )
    return dsn


def _our_versions() -> dict[str, Any]:
    return {"measured_at": datetime.now(UTC).isoformat(timespec="seconds")}


# -- peers venv --------------------------------------------------------------------------


def _peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def ensure_peers(stores: list[str]) -> dict[str, str]:
    """Build the peers venv and install what ``stores`` need; store -> why it cannot run."""
    broken: dict[str, str] = {}
    wanted = [s for s in stores if s in PEER_REQUIREMENTS]
    if not wanted:
        return broken
    if not _peer_python().exists():
        _log(f"creating {PEER_VENV.relative_to(REPO)} (first use)")
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(PEER_VENV)], capture_output=True, text=True
        )
        if made.returncode != 0:
            reason = f"venv creation failed: {_tail(made.stderr)}"
            return dict.fromkeys(wanted, reason)
    for store in wanted:
        requirements = PEER_REQUIREMENTS[store]
        # a marker per store, so a changed pin reinstalls and a failed install is retried
        marker = PEER_VENV / f".bench-{store}.installed"
        spec = "\n".join(requirements)
        if marker.exists() and marker.read_text() == spec:
            continue
        _log(f"installing {' '.join(requirements)} into the peers venv")
        done = subprocess.run(
            [str(_peer_python()), "-m", "pip", "install", "-q", *requirements],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            broken[store] = f"pip install failed: {_tail(done.stderr)}"
        else:
            marker.write_text(spec)
    return broken


# -- parent: scheduling and reporting -----------------------------------------------------


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _tail(text: str, limit: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:limit]


def _clean_env() -> dict[str, str]:
    # a PYTHONPATH from the caller could put our source tree ahead of the peers' packages
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def run_child(store: str, variant: str) -> dict[str, Any]:
    if store in PEER_REQUIREMENTS:
        cmd = [str(_peer_python()), str(PEER_RUNNER)]
    else:
        cmd = [sys.executable, "-m", "bench.checkpoints", "--child"]
    cmd += ["--store", store, "--variant", variant]
    try:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"store": store, "variant": variant, "error": f"timed out after {CHILD_TIMEOUT_S}s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        reason = f"exit {done.returncode}: {_tail(done.stderr)}"
        return {"store": store, "variant": variant, "error": reason}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "ms":
        return f"{value:,.0f}" if value >= 1000 else f"{value:.3f}"
    if kind == "rate":
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _spread(runs: list[dict[str, Any]], key: str, kind: str) -> str:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "n/a"
    mid = statistics.median(values)
    return f"{_fmt(mid, kind)} ({_fmt(min(values), kind)}{DASH}{_fmt(max(values), kind)})"


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


COLUMNS = (
    ("put p50 ms", "put_p50", "ms"),
    ("put p99 ms", "put_p99", "ms"),
    ("get-latest p50 ms", "get_p50", "ms"),
    ("cold get p50 ms", "cold_get_p50", "ms"),
    ("list50 p50 ms", "list_p50", "ms"),
    ("wall s", "wall_s", "s"),
    ("ckpt/s", "ckpt_per_s", "rate"),
    ("disk MB", "disk_mb", "mb"),
)
RATIO_KEYS = (
    ("put p50", "put_p50"),
    ("get-latest p50", "get_p50"),
    ("cold get p50", "cold_get_p50"),
    ("list50 p50", "list_p50"),
)


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or not theirs:
        return "n/a"
    value = ours / theirs
    # two significant digits below 0.1 so a 250x gap does not print as 0.00x
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def report(variant: str, stores: list[str], results: dict[str, list[dict[str, Any]]]) -> str:
    sessions, passes = VARIANTS[variant]
    out = [f"## variant {variant}: {sessions} session(s) x {passes} passes", ""]
    header = ["store", "n", *(c[0] for c in COLUMNS), "ok"]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    good: dict[str, list[dict[str, Any]]] = {}
    for store in stores:
        runs = results.get(store, [])
        fine = [r for r in runs if "error" not in r]
        errors = sorted({r["error"] for r in runs if "error" in r})
        if not fine:
            why = errors[0] if errors else "not run"
            cells = [store, "0", f"could not run: {why}", *[""] * (len(COLUMNS) - 1), "—"]
            out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
            continue
        good[store] = fine
        oks = sum(1 for r in fine if r["ok"])
        ok = "True" if oks == len(fine) else f"False ({oks}/{len(fine)})"
        if errors:
            ok += f"; {len(runs) - len(fine)} run(s) failed: {errors[0]}"
        cells = [store, str(len(fine)), *(_spread(fine, key, kind) for _, key, kind in COLUMNS), ok]
        out.append("| " + " | ".join(cells) + " |")

    base = good.get("lf-sqlite")
    peers = [s for s in stores if s in PEER_REQUIREMENTS and s in good]
    if base and peers:
        out += ["", "ratios, lf-sqlite / peer on medians (< 1: lf-sqlite is lower, i.e. better)"]
        for peer in peers:
            parts = []
            for label, key in (*RATIO_KEYS, ("disk", "disk_mb")):
                ours, theirs = _median(base, key), _median(good[peer], key)
                ratio = _ratio(ours, theirs)
                parts.append(f"{label} {ratio}")
            out.append(f"  vs {peer:<14} " + "; ".join(parts))

    if "lf-pg" in good and "lf-kafka" in good:
        out += ["", "ratios, lf-kafka / lf-pg on medians (the same read model, fed by Kafka)"]
        parts = []
        for label, key in (*RATIO_KEYS, ("disk", "disk_mb")):
            parts.append(
                f"{label} {_ratio(_median(good['lf-kafka'], key), _median(good['lf-pg'], key))}"
            )
        out.append("  " + "; ".join(parts))

    out += ["", "extra: put p50 over the last 20 passes (largest transcripts); final transcript"]
    out.append("JSON bytes (session 0, in the store's own message model)")
    for store, fine in good.items():
        last = _spread(fine, "last20_put_p50", "ms")
        size = _median(fine, "transcript_bytes")
        out.append(f"  {store:<18} last20 put p50 {last} ms; transcript {size:,.0f} B")
    problems = {p for runs in good.values() for r in runs for p in r.get("problems", [])}
    for problem in sorted(problems)[:5]:
        out.append(f"  verification problem: {problem}")
    return "\n".join(out)


def default_stores() -> list[str]:
    """Every store whose services are configured; the others are named on stderr."""
    chosen: list[str] = []
    skipped: list[str] = []
    for store in ALL_STORES:
        missing = [name for name in SERVICE_ENV.get(store, ()) if not os.environ.get(name)]
        (skipped if missing else chosen).append(store)
    if skipped:
        _log(
            f"skipping {', '.join(skipped)}: set LOOMFLOW_POSTGRES_DSN (and "
            "LOOMFLOW_KAFKA_BOOTSTRAP for lf-kafka), e.g. from `dev/services.sh start`"
        )
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="single,conc")
    parser.add_argument(
        "--stores",
        help="comma-separated; default: every store whose services are configured",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write every run's raw results here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    stores = [s for s in args.stores.split(",") if s] if args.stores else default_stores()
    unknown = [v for v in variants if v not in VARIANTS]
    unknown += [s for s in stores if s not in ALL_STORES]
    if unknown or args.reps < 1:
        parser.error(f"unknown variant/store {unknown} (stores: {', '.join(ALL_STORES)})")

    broken = ensure_peers(stores)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {v: {} for v in variants}
    started = time.perf_counter()
    # repetitions are the outer loop so slow drift in machine load hits every store alike
    for rep in range(1, args.reps + 1):
        for variant in variants:
            for store in stores:
                if store in broken:
                    run = {"store": store, "variant": variant, "error": broken[store]}
                else:
                    run = run_child(store, variant)
                results[variant].setdefault(store, []).append(run)
                status = run.get("error") or f"put p50 {run['put_p50']:.3f} ms"
                _log(f"rep {rep}/{args.reps} {variant:<6} {store:<18} {status}")

    versions: dict[str, str] = {}
    for by_store in results.values():
        for runs in by_store.values():
            for run in runs:
                versions.update(run.get("versions", {}))
    print(
        f"# checkpoint stores, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; SQLite {sqlite3.sqlite_version}; "
        f"loadavg {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all"
    )
    if versions:
        print("# peers: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"# each figure: median of {args.reps} fresh-process runs (min{DASH}max)\n")
    for variant in variants:
        print(report(variant, stores, results[variant]) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"reps": args.reps, "results": results}, indent=1))


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.argv.remove("--child")
        child_main(LoomflowAdapter, _our_versions)
    else:
        main()
