"""What auditing and verifying a signed log cost, in ms per 1,000 events, as a user runs it.

    .venv/bin/python -m bench.audit [--events 100000] [--reps 3]
                                    [--kafka-events 50000] [--json out.json]

``--kafka-events 0`` leaves the Kafka + PostgreSQL log out; it needs
LOOMFLOW_KAFKA_BOOTSTRAP and LOOMFLOW_POSTGRES_DSN (``dev/services.sh start``).

**The log.** Keys as a user makes them (``loomflow keys new``): a writer's key (role
``events``) and the audit's (role ``digests``), both in one keyring. Sessions of
bench/bigjournal.py's realistic runs (a run's start, its prompt, per pass the model's turn
with a tool call and the tool's result, or the final answer, and a checkpoint; the run's
end; runs of 10 passes, 30 passes a session: ~96 events, ~1 KB each on average), made
until the log holds ``--events``. On SQLite they are appended a session per append by a
``SqliteStore`` whose settings hold the writer's key, so the store signs each event as it
appends it. On Kafka they are signed with the writer's key as a store signs them
(``Signer.sign_event``) and produced with ``EventProducer`` into a topic of this run's
own (6 partitions); no projector runs (the audit reads the log itself).

**The commands**, each a ``loomflow`` process of its own, started as a user starts it and
timed from its start to its exit (so a cold process: imports, settings, connections
included); the SQLite file was written or read just before, so its pages are in the OS
page cache (a warm cache, not a cold disk). Every process gets the LOOMFLOW_* settings of
its row alone (below, K is the keyring, D a digest directory of the repetition):

- ``audit, signatures off``: ``loomflow audit`` (``--db J --trail T1`` on SQLite; on Kafka
  a schema and audit group of its own), LOOMFLOW_KEYRING=K, LOOMFLOW_SIGNATURES=off: the
  catch-up of the whole log into a new trail, no signature checked;
- ``audit, signatures require``: the same into another new trail, LOOMFLOW_KEYRING=K
  (``require`` is then the default): every event's signature checked as it is read;
- ``audit, require + digests``: the same into a third trail, with
  LOOMFLOW_SIGNING_KEY_FILE=the audit's key and LOOMFLOW_AUDIT_DIGESTS=D: a signed digest
  every 10,000 audited records (the default), as a user who keeps digests audits;
- ``audit digest``: ``loomflow audit digest --digests D`` on that trail, now up to date:
  it finds nothing new and writes a digest now;
- ``verify, signatures off``, ``check``, ``require``: ``loomflow audit verify`` of that
  trail against the log, LOOMFLOW_SIGNATURES=off / check / (default) require;
- ``verify, require + --digests D``: the same, also against the digests written above.

A verify must exit 0 (nothing wrong, nothing pending), and an audit 0 with every record
chained (``0 rejected``). ``ms per 1,000 events`` is the command's wall over the log's
events; ``fixed`` is the same command on a log of one session (the process's start,
imports and connections, which a bigger log does not repeat). Every figure: the median of
``--reps`` (min-max); the repetitions are the outer loop, so drift hits every row alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bigjournal import _Ids, _Session, _Texts
from bench.checkpoints import REPO, _clean_env
from bench.signing import SIGNING_VARS
from bench.workload import loomflow_command, own_env

PASSES = 30  # a session's passes: three runs of bigjournal's 10
PARTITIONS = 6
COMMAND_TIMEOUT_S = 900
DASH = "\u2013"
#: row -> (the command after ``loomflow``, with {db}/{trail}/{digests} to fill, its
#: settings, the trail it works on: its own new one, or the digests row's)
ROWS: dict[str, tuple[tuple[str, ...], dict[str, str], str]] = {
    "audit, signatures off": (("audit",), {"LOOMFLOW_SIGNATURES": "off"}, "off"),
    "audit, signatures require": (("audit",), {}, "require"),
    "audit, require + digests": (("audit",), {"digests": "env"}, "digests"),
    "audit digest": (("audit", "digest", "--digests", "{digests}"), {"key": "audit"}, "digests"),
    "verify, signatures off": (("audit", "verify"), {"LOOMFLOW_SIGNATURES": "off"}, "digests"),
    "verify, signatures check": (("audit", "verify"), {"LOOMFLOW_SIGNATURES": "check"}, "digests"),
    "verify, signatures require": (("audit", "verify"), {}, "digests"),
    "verify, require + --digests": (
        ("audit", "verify", "--digests", "{digests}"),
        {},
        "digests",
    ),
}


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Keys:
    writer: Path
    audit: Path
    keyring: Path

    @classmethod
    def make(cls, directory: Path) -> Keys:
        keys = cls(directory / "writer.pem", directory / "audit.pem", directory / "keyring.json")
        for path, role in ((keys.writer, "events"), (keys.audit, "digests")):
            argv = ["keys", "new", str(path), "--keyring", str(keys.keyring), "--role", role]
            subprocess.run(
                [*loomflow_command(), *argv],
                check=True,
                capture_output=True,
                env=_base_env(),
            )
        return keys


def _base_env() -> dict[str, str]:
    return own_env({k: v for k, v in _clean_env().items() if k not in SIGNING_VARS})


def sessions_until(total: int) -> Iterator[list[Any]]:
    """Sessions' events (each session whole) until ``total`` events were given."""
    ids, texts = _Ids(1), _Texts()
    given, index = 0, 0
    while given < total:
        session = _Session(index, ids, texts)
        session.runs(PASSES)
        given += len(session.events)
        index += 1
        yield session.events


# -- the logs -----------------------------------------------------------------------------


class Log:
    """Where a log is and how its commands are told so: the part of the environment and
    the arguments that name the log and a trail."""

    name: str
    events: int = 0
    sessions: int = 0
    mean_bytes: float = 0.0

    def env(self, trail: str) -> dict[str, str]:
        return {}

    def args(self, trail: str) -> list[str]:
        return []

    async def remove(self) -> None:
        """Delete what it made on the servers."""


class SqliteLog(Log):
    def __init__(self, path: Path, name: str = "SQLite") -> None:
        self.path, self.name = path, name

    async def build(self, keys: Keys, total: int) -> None:
        from loomflow.runtime import SqliteStore
        from loomflow.settings import Settings

        settings = Settings(signing_key_file=keys.writer)
        store = SqliteStore(self.path, settings=settings)
        sizes: list[int] = []
        try:
            for events in sessions_until(total):
                await store.append(events)  # signed by the store, with the writer's key
                self.events += len(events)
                self.sessions += 1
                sizes += _sizes(events, settings)
        finally:
            await store.close()
        self.mean_bytes = statistics.fmean(sizes)

    def args(self, trail: str) -> list[str]:
        return ["--db", str(self.path), "--trail", str(self.path.parent / f"{trail}.audit.db")]

    def warm(self) -> None:
        """Read the file once, so its pages are in the page cache for every command."""
        with self.path.open("rb") as f:
            while f.read(1 << 22):
                pass


def _sizes(events: Sequence[Any], settings: Any) -> list[int]:
    """JSON bytes of every 8th event, signed as the log holds it."""
    signer = settings.signer()
    return [len(signer.sign_event(e).model_dump_json()) for e in events[::8]]


class KafkaLog(Log):
    """A topic of this run's own; each trail a PostgreSQL schema and an audit group of
    its own (LOOMFLOW_SCHEMA, LOOMFLOW_PROCESSOR_ID)."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(4)
        self.prefix = f"lf-bench-audit-{self.tag}"
        self.name = "Kafka + PostgreSQL"
        self.schemas: set[str] = set()

    def schema(self, trail: str) -> str:
        name = f"lf_bench_audit_{self.tag}_{trail.replace('-', '_')}"
        self.schemas.add(name)
        return name

    def env(self, trail: str) -> dict[str, str]:
        return {
            "LOOMFLOW_TOPIC_PREFIX": self.prefix,
            "LOOMFLOW_TOPIC_PARTITIONS": str(PARTITIONS),
            "LOOMFLOW_SCHEMA": self.schema(trail),
            "LOOMFLOW_PROCESSOR_ID": f"{self.prefix}-{trail}",
        }

    async def build(self, keys: Keys, total: int) -> None:
        from loomflow.producers import EventProducer, Topics, ensure_topics
        from loomflow.settings import Settings

        settings = Settings(
            topic_prefix=self.prefix, topic_partitions=PARTITIONS, signing_key_file=keys.writer
        )
        signer = settings.signer()
        assert signer is not None
        topics = Topics.from_settings(settings)
        await ensure_topics(settings.kafka_bootstrap, topics)
        producer = EventProducer(settings.kafka_bootstrap, topics)
        await producer.start()
        sizes: list[int] = []
        try:
            batch: list[Any] = []
            for events in sessions_until(total):
                signed = [signer.sign_event(e) for e in events]
                sizes += [len(e.model_dump_json()) for e in signed[::8]]
                batch += signed
                self.events += len(events)
                self.sessions += 1
                if len(batch) >= 2000:
                    await producer.send(batch)
                    batch = []
            if batch:
                await producer.send(batch)
        finally:
            await producer.stop()
        self.mean_bytes = statistics.fmean(sizes)

    async def remove(self) -> None:
        import asyncpg
        from aiokafka.admin import AIOKafkaAdminClient

        from loomflow.settings import Settings

        settings = Settings()
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            for schema in sorted(self.schemas):
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
        await admin.start()
        try:
            mine = [t for t in await admin.list_topics() if t.startswith(f"{self.prefix}.")]
            if mine:
                await admin.delete_topics(mine)
        finally:
            await admin.close()


# -- running the commands ----------------------------------------------------------------


def run_command(log: Log, row: str, keys: Keys, trail: str, digests: Path) -> dict[str, Any]:
    """Run one row's command as its own process; its wall seconds, exit code, last line."""
    words, settings, _ = ROWS[row]
    env = {**_base_env(), **log.env(trail), "LOOMFLOW_KEYRING": str(keys.keyring)}
    env.update({k: v for k, v in settings.items() if k.startswith("LOOMFLOW_")})
    if "digests" in settings:
        env["LOOMFLOW_AUDIT_DIGESTS"] = str(digests)
    if "digests" in settings or "key" in settings:
        env["LOOMFLOW_SIGNING_KEY_FILE"] = str(keys.audit)
    argv = [w.format(digests=digests) for w in words]
    command = [*loomflow_command(), *argv, *log.args(trail)]
    began = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {COMMAND_TIMEOUT_S} s"}
    wall = time.perf_counter() - began
    # stdout: the command's own words (stderr may add where it fell back to PostgreSQL)
    said = [line for line in done.stdout.splitlines() if line.strip()]
    said = said or [line for line in done.stderr.splitlines() if line.strip()]
    last = said[-1].strip() if said else ""
    result: dict[str, Any] = {"seconds": wall, "code": done.returncode, "last": last[:300]}
    if done.returncode != 0:
        result["problem"] = f"exit {done.returncode}: {last[:300]}"
    elif row.startswith("audit") and " 0 rejected" not in done.stdout + done.stderr:
        result["problem"] = f"records rejected: {last[:300]}"
    elif row.startswith("verify") and not last.startswith("verified"):
        result["problem"] = f"not verified: {last[:300]}"
    return result


def measure(log: Log, keys: Keys, reps: int, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """row -> each repetition's result, on ``log``."""
    out: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    for rep in range(1, reps + 1):
        digests = workdir / f"digests-{rep}"
        digests.mkdir()
        if isinstance(log, SqliteLog):
            log.warm()
        for row, (_, _, trail) in ROWS.items():
            result = run_command(log, row, keys, f"r{rep}-{trail}", digests)
            out[row].append(result)
            status = result.get("problem") or f"{result['seconds']:.2f} s"
            _log(f"{log.name:<18} rep {rep}/{reps} {row:<28} {status}")
    return out


async def _build(log: SqliteLog | KafkaLog, keys: Keys, total: int) -> float:
    began = time.perf_counter()
    await log.build(keys, total)
    return time.perf_counter() - began


def run_log(
    log: SqliteLog | KafkaLog, keys: Keys, total: int, reps: int, workdir: Path
) -> dict[str, Any]:
    """Build ``log`` with ``total`` events, time every row on it, then remove it."""
    try:
        built = asyncio.run(_build(log, keys, total))
        _log(f"{log.name}: {log.events:,} events in {log.sessions:,} sessions, {built:.0f} s")
        rows = measure(log, keys, reps, workdir)
    finally:
        asyncio.run(log.remove())
    return {
        "events": log.events,
        "sessions": log.sessions,
        "mean_bytes": log.mean_bytes,
        "build_s": built,
        "rows": rows,
    }


# -- report -------------------------------------------------------------------------------


def _spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "n/a"
    mid = statistics.median(values)
    return f"{mid:,.{digits}f} ({min(values):,.{digits}f}{DASH}{max(values):,.{digits}f})"


def _median(runs: Sequence[dict[str, Any]]) -> float | None:
    walls = [r["seconds"] for r in runs if "seconds" in r]
    return statistics.median(walls) if walls else None


def report(big: dict[str, Any], tiny: dict[str, Any], name: str, reps: int) -> list[str]:
    """The table of one log: each row's wall, per 1,000 events, and beyond the fixed cost."""
    events = big["events"]
    out = [
        f"## {name}: {events:,} events in {big['sessions']:,} sessions "
        f"({big['mean_bytes']:,.0f} B per event on average, signed), median of {reps} "
        f"(min{DASH}max)",
        "",
        "| command | wall s | ms per 1,000 events | fixed s (a log of "
        f"{tiny['events']} events) | ms per 1,000 beyond the fixed | x signatures off | ok |",
        "|---|---|---|---|---|---|---|",
    ]

    def beyond(row: str) -> float | None:
        wall, fixed = _median(big["rows"][row]), _median(tiny["rows"][row])
        return None if wall is None or fixed is None else (wall - fixed) / events * 1e6

    notes: list[str] = []
    for row, runs in big["rows"].items():
        walls = [r["seconds"] for r in runs if "seconds" in r]
        fixed = [r["seconds"] for r in tiny["rows"][row] if "seconds" in r]
        marginal = beyond(row)
        base = beyond(
            "verify, signatures off" if row.startswith("verify") else "audit, signatures off"
        )
        against = "n/a"
        if marginal is not None and base and row != "audit digest":
            against = f"{marginal / base:.2f}x"
        problems = [r.get("problem") or r.get("error") for r in runs + tiny["rows"][row]]
        problems = [p for p in problems if p]
        cells = [
            row,
            _spread(walls, 2),
            _spread([s / events * 1e6 for s in walls], 1),
            _spread(fixed, 2),
            "n/a" if marginal is None else f"{marginal:,.1f}",
            against,
            "True" if not problems and len(walls) == len(runs) else "False",
        ]
        out.append("| " + " | ".join(cells) + " |")
        notes += [f"  {row}: {p}" for p in sorted(set(problems))[:2]]
    return out + (["", *notes] if notes else [])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the bench (``argv``: its arguments, default the command line's); the raw
    results, by log."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="the SQLite log's events")
    parser.add_argument("--kafka-events", type=int, default=50_000, help="0: no Kafka log")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every raw result here")
    args = parser.parse_args(argv)
    kafka = args.kafka_events > 0
    if kafka and not (
        os.environ.get("LOOMFLOW_KAFKA_BOOTSTRAP") and os.environ.get("LOOMFLOW_POSTGRES_DSN")
    ):
        _log("leaving Kafka out: set LOOMFLOW_KAFKA_BOOTSTRAP and LOOMFLOW_POSTGRES_DSN")
        kafka = False
    for name in SIGNING_VARS:
        os.environ.pop(name, None)
    load0, started = os.getloadavg()[0], time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lf-bench-audit-") as tmp:
        work = Path(tmp)
        keys = Keys.make(work)
        plan: list[tuple[str, Any, int]] = [
            ("sqlite", lambda d: SqliteLog(d / "journal.db"), args.events),
            ("sqlite-tiny", lambda d: SqliteLog(d / "journal.db", "SQLite, one session"), 1),
        ]
        if kafka:
            plan += [
                ("kafka", lambda d: KafkaLog(), args.kafka_events),
                ("kafka-tiny", lambda d: KafkaLog(), 1),
            ]
        for key, make, total in plan:
            where = work / key
            where.mkdir()
            results[key] = run_log(make(where), keys, total, args.reps, where)
            shutil.rmtree(where, ignore_errors=True)
    print(
        f"# audit and verify, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; loadavg {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s in all"
    )
    print("# each command a process of its own (cold process, warm page cache)\n")
    print("\n".join(report(results["sqlite"], results["sqlite-tiny"], "SQLite", args.reps)))
    if kafka:
        print()
        name = "Kafka + PostgreSQL"
        print("\n".join(report(results["kafka"], results["kafka-tiny"], name, args.reps)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
