"""What signing costs a user: per append on each store, per agent pass, and per event.

    .venv/bin/python -m bench.signing [--stores inproc,sqlite,pg,kafka] [--events 2000]
                                      [--rounds 7] [--agent-reps 9] [--json out.json]

PostgreSQL and Kafka need LOOMFLOW_POSTGRES_DSN and LOOMFLOW_KAFKA_BOOTSTRAP
(``dev/services.sh start``); without them those stores are left out, and said so.

**Keys**, as a user makes them: ``loomflow keys new writer.pem --keyring keyring.json``
in a temporary directory. *Signed* is a store or a runtime whose settings hold
LOOMFLOW_SIGNING_KEY_FILE=writer.pem (the stores read the key from their settings, once,
when built); *unsigned* is the same without it. The signing settings of the calling
environment (LOOMFLOW_SIGNING_KEY[_FILE], LOOMFLOW_KEYRING, LOOMFLOW_SIGNATURES) are
ignored: this bench sets them itself.

**per append** (the store level, in this process): one session's events appended one
append at a time (a run's turns of ~1.3 KB of messages each), ``--rounds`` rounds of
``--events``, unsigned and signed taking turns, on a new store each round: InProcStore,
SqliteStore (a new file each round), PostgresStore (a schema of this run's own) and
KafkaStore (an append returns on Kafka's acknowledgement, acks=all). On Kafka each mode
is a deployment of its own (topics, schema and ``loomflow processor`` in its own process,
as bench/checkpoints.py runs lf-kafka, whose machinery this uses); the signed one's
projector is given LOOMFLOW_KEYRING, so it requires every signature, as a deployment that
signs would. Each store's first append (which opens it) is not timed. After each round,
untimed: on Kafka ``store.confirm`` waits until the projector has applied the round (a
refused signature would fail it); then the session's events are read back from the store,
and each must carry a signature that holds (signed) or none (unsigned).

**agent pass**: bench/checkpoints.py's ``agent`` variant (``Agent.run`` with a scripted
model, 4 sessions x 50 passes, then ``Agent.resume`` on a fresh runtime), each run in a
fresh process, ``--agent-reps`` times per store and mode, unsigned and signed taking
turns. The signed processes have LOOMFLOW_SIGNING_KEY_FILE and LOOMFLOW_KEYRING in their
environment (lf-kafka's processor the keyring). A pass makes five events: the prompt, the
model's turn, the tool's result, the answer, the checkpoint.

**per event**: signing one event and checking it (what every reader of the log pays per
event with LOOMFLOW_SIGNATURES on), and their parts: the signed bytes alone, Ed25519 alone;
then checking 4,000 events one after another and over a pool of 2 threads, to see whether
Ed25519 verification runs outside the GIL (process CPU over wall > 1 when it does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.checkpoints import AGENT, REPO, Servers, _clean_env, run_measurement
from bench.workload import loomflow_command, own_env
from loomflow.runtime import EventStore, InProcStore, Scope, SqliteStore
from loomflow.schemas import Event, Message, RunStarted, TurnAppended, Usage
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.schemas.signing import Keyring, signed_bytes
from loomflow.settings import Settings

_TEXT = "The findings so far, restated in full for the reader. " * 24
#: the settings this bench sets itself; the caller's are dropped
SIGNING_VARS = (
    "LOOMFLOW_SIGNING_KEY_FILE",
    "LOOMFLOW_SIGNING_KEY",
    "LOOMFLOW_KEYRING",
    "LOOMFLOW_SIGNATURES",
)
STORES = {
    "inproc": "InProcStore",
    "sqlite": "SqliteStore",
    "pg": "PostgresStore",
    "kafka": "KafkaStore",
}
#: store -> bench/checkpoints.py's name of its runtime
AGENT_STORES = {"inproc": "lf-inproc", "sqlite": "lf-sqlite", "pg": "lf-pg", "kafka": "lf-kafka"}
#: store -> the environment variables it needs
NEEDS: dict[str, tuple[str, ...]] = {
    "pg": ("LOOMFLOW_POSTGRES_DSN",),
    "kafka": ("LOOMFLOW_POSTGRES_DSN", "LOOMFLOW_KAFKA_BOOTSTRAP"),
}
POOL_EVENTS = 4000
DASH = "\u2013"
MODES = ("unsigned", "signed")


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Keys:
    """A writer's key and the keyring that trusts it, made by ``loomflow keys new``."""

    writer: Path
    keyring: Path

    @classmethod
    def make(cls, directory: Path) -> Keys:
        import subprocess

        writer, keyring = directory / "writer.pem", directory / "keyring.json"
        subprocess.run(
            [
                *loomflow_command(),
                *("keys", "new", str(writer), "--keyring", str(keyring), "--role", "events"),
            ],
            check=True,
            capture_output=True,
            env=own_env(_clean_env()),
        )
        return cls(writer, keyring)

    def env(self, signed: bool) -> dict[str, str]:
        """The environment of a process of ``signed`` mode: the caller's, but for the
        signing settings, which are this bench's."""
        env = {k: v for k, v in _clean_env().items() if k not in SIGNING_VARS}
        if signed:
            env["LOOMFLOW_SIGNING_KEY_FILE"] = str(self.writer)
            env["LOOMFLOW_KEYRING"] = str(self.keyring)
        return env


def _events(session_id: str, count: int) -> list[Event]:
    events: list[Event] = [RunStarted(session_id=session_id, run_id="run_b", seq=1, epoch=1)]
    for seq in range(2, count + 1):
        payload = TurnAppendedPayload(
            messages=[Message.assistant(_TEXT)],
            usage=Usage(input_tokens=900, output_tokens=300),
            model_call=True,
        )
        events.append(
            TurnAppended(session_id=session_id, run_id="run_b", seq=seq, epoch=1, payload=payload)
        )
    return events


# -- per append ---------------------------------------------------------------------------


class Target:
    """One kind of store: made afresh for each round, in either mode."""

    def __init__(self, key: str, keys: Keys, tmp: Path) -> None:
        self.key, self.name, self.keys, self.tmp = key, STORES[key], keys, tmp
        self.files = iter(range(10**6))
        #: mode -> the servers of that mode's deployment (PostgreSQL, Kafka)
        self.servers: dict[bool, Servers] = {}

    def settings(self, signed: bool) -> Settings:
        """The store's settings: its deployment's, with the writer's key when signed."""
        base = self.servers.get(signed)
        key = self.keys.writer if signed else None
        if base is None:
            return Settings(signing_key_file=key)
        return Settings.resolve(base.settings, signing_key_file=key)

    async def start(self) -> None:
        if self.key == "pg":
            self.servers[False] = self.servers[True] = Servers(False, self.tmp)
        elif self.key == "kafka":
            for signed in (False, True):
                workdir = self.tmp / ("signed" if signed else "unsigned")
                workdir.mkdir()
                options = {"keyring": self.keys.keyring} if signed else {}
                self.servers[signed] = Servers(True, workdir, **options)
                await self.servers[signed].start_processor()

    def store(self, signed: bool) -> EventStore:
        from loomflow.runtime.kafka import KafkaStore
        from loomflow.runtime.postgres import PostgresStore

        settings = self.settings(signed)
        if self.key == "inproc":
            return InProcStore(settings=settings)
        if self.key == "sqlite":
            return SqliteStore(self.tmp / f"{next(self.files)}.db", settings=settings)
        if self.key == "pg":
            return PostgresStore.from_settings(settings)
        return KafkaStore(settings=settings)

    async def stop(self) -> list[str]:
        """Remove the servers' schema, topics and processors; what the processors logged."""
        said: list[str] = []
        for servers in {id(s): s for s in self.servers.values()}.values():
            await servers.remove()
            if servers.processor_complaints:
                said.append(f"{servers.processor_complaints} line(s), the last: ")
                said[-1] += servers.processor_complaint
        return said


async def per_append(
    target: Target, signed: bool, count: int, label: str, keyring: Keyring
) -> tuple[float, str | None]:
    """µs per append of ``count`` events, one append each, on a new store; and what is
    wrong with what it then holds (None: nothing)."""
    store = target.store(signed)
    session_id = f"sess-{label}"
    events = _events(session_id, count)
    try:
        await store.append(events[:1])  # opened before the clock starts
        began = time.perf_counter()
        for event in events[1:]:
            await store.append([event])
        took = (time.perf_counter() - began) / (count - 1) * 1e6
        scope = Scope(session_id)
        await store.confirm(scope)  # Kafka: applied by the projector (the others: at once)
        held = await store.read_events(scope)
    finally:
        await store.close()
    if len(held) != count:
        return took, f"{len(held)} events read back of {count} appended"
    if signed:
        problems = [p for e in held if (p := keyring.event_problem(e)) is not None]
        return took, problems[0] if problems else None
    signed_anyway = sum(e.sig is not None for e in held)
    return took, f"{signed_anyway} unsigned events came back signed" if signed_anyway else None


async def store_level(
    keys: Keys, stores: Sequence[str], count: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """store -> {unsigned: [µs], signed: [µs], problems: [...], processor: [...]}."""
    keyring = Keyring.load(keys.keyring)
    out: dict[str, dict[str, Any]] = {}
    for key in stores:
        with tempfile.TemporaryDirectory(prefix="lf-bench-sign-") as tmp:
            target = Target(key, keys, Path(tmp))
            result: dict[str, Any] = {"unsigned": [], "signed": [], "problems": []}
            out[key] = result
            try:
                await target.start()
                for n in range(rounds):  # taking turns, so drift hits both alike
                    for signed in (False, True):
                        mode = MODES[signed]
                        took, problem = await per_append(
                            target, signed, count, f"r{n}-{mode}", keyring
                        )
                        result[mode].append(took)
                        if problem is not None:
                            result["problems"].append(f"{mode}: {problem}")
                        _log(f"per append  {target.name:<13} round {n + 1} {mode:<8} {took:.1f} µs")
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
                _log(f"per append  {target.name}: {result['error']}")
            finally:
                result["processor"] = await target.stop()
    return out


# -- agent pass ---------------------------------------------------------------------------


def agent_passes(keys: Keys, stores: Sequence[str], reps: int) -> dict[str, dict[str, list[Any]]]:
    """store -> mode -> the runs of bench/checkpoints.py's agent variant."""
    out: dict[str, dict[str, list[Any]]] = {key: {m: [] for m in MODES} for key in stores}
    for rep in range(1, reps + 1):
        for key in stores:
            store = AGENT_STORES[key]
            for signed in (False, True):
                mode = MODES[signed]
                command = [sys.executable, "-m", "bench.checkpoints", "--child"]
                command += ["--store", store, "--variant", AGENT]
                labels = {"store": store, "variant": AGENT, "mode": mode}
                run = run_measurement(command, labels, env=keys.env(signed))
                out[key][mode].append(run)
                status = run.get("error") or f"{run['pass_ms_p50']:.3f} ms per pass"
                _log(f"agent pass  rep {rep}/{reps} {store:<10} {mode:<8} {status}")
    return out


# -- per event ----------------------------------------------------------------------------


def _per_call(call: Callable[[], object], count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - began) / count * 1e6


def _pooled(work: Callable[[int, int], None], total: int) -> dict[str, float]:
    """``work(lo, hi)`` over ``total`` items in one thread, then split over 2 threads:
    µs per item each way, and the process's CPU seconds over wall seconds with 2."""
    began = time.perf_counter()
    work(0, total)
    one = time.perf_counter() - began
    half = total // 2
    with ThreadPoolExecutor(2) as pool:
        cpu, began = time.process_time(), time.perf_counter()
        list(pool.map(lambda span: work(*span), [(0, half), (half, total)]))
        two, two_cpu = time.perf_counter() - began, time.process_time() - cpu
    return {
        "one_us": one / total * 1e6,
        "two_us": two / total * 1e6,
        "speedup": one / two,
        "cpu_per_wall": two_cpu / two,
    }


def per_event(keys: Keys, count: int, repeat: int = 3) -> dict[str, Any]:
    """µs of signing and checking one event, and of their parts; checking in a pool."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signer = Settings(signing_key_file=keys.writer).signer()
    assert signer is not None
    keyring = Keyring.load(keys.keyring)
    event = _events("sess-one", 2)[1]
    signed = signer.sign_event(event)
    data = signed_bytes(event)
    raw = Ed25519PrivateKey.generate()
    raw_sig = raw.sign(data)
    public = raw.public_key()

    def best(call: Callable[[], object]) -> float:
        return statistics.median(_per_call(call, count) for _ in range(repeat))

    figures: dict[str, Any] = {
        "sign_event": best(lambda: signer.sign_event(event)),
        "signed_bytes": best(lambda: signed_bytes(event)),
        "ed25519_sign": best(lambda: raw.sign(data)),
        "check_event": best(lambda: keyring.event_problem(signed)),
        "ed25519_verify": best(lambda: public.verify(raw_sig, data)),
        "signed_bytes_len": len(data),
    }
    many = [signer.sign_event(e) for e in _events("sess-pool", POOL_EVENTS)]
    datas = [signed_bytes(e) for e in many]
    sigs = [raw.sign(d) for d in datas]

    def check(lo: int, hi: int) -> None:
        for e in many[lo:hi]:
            assert keyring.event_problem(e) is None

    def verify(lo: int, hi: int) -> None:
        for d, s in zip(datas[lo:hi], sigs[lo:hi], strict=True):
            public.verify(s, d)

    for name, work in (("pool_check", check), ("pool_verify", verify)):
        runs = [_pooled(work, len(many)) for _ in range(repeat)]
        figures[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return figures


# -- report -------------------------------------------------------------------------------


def _spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "n/a"
    mid = statistics.median(values)
    return f"{mid:,.{digits}f} ({min(values):,.{digits}f}{DASH}{max(values):,.{digits}f})"


def _added(unsigned: Sequence[float], signed: Sequence[float], digits: int) -> tuple[str, str]:
    if not unsigned or not signed:
        return "n/a", "n/a"
    a, b = statistics.median(unsigned), statistics.median(signed)
    return f"{b - a:+,.{digits}f}", f"{(b - a) / a * 100:+.0f} %"


def report_appends(results: dict[str, dict[str, Any]], count: int, rounds: int) -> list[str]:
    out = [
        f"## per append: µs, one event (~1.3 KB) per append, median of {rounds} rounds of "
        f"{count:,} (min{DASH}max)",
        "",
        "| store | unsigned µs | signed µs | signing adds µs | adds % | ok |",
        "|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for key, result in results.items():
        name = STORES[key]
        if "error" in result and not result["signed"]:
            out.append(f"| {name} | could not run: {result['error']} | | | | — |")
            continue
        unsigned, signed = result["unsigned"], result["signed"]
        added, pct = _added(unsigned, signed, 1)
        problems = result["problems"]
        ok = "True" if not problems and "error" not in result else "False"
        cells = [name, _spread(unsigned, 1), _spread(signed, 1), added, pct, ok]
        out.append("| " + " | ".join(cells) + " |")
        notes += [f"  {name}: {p}" for p in sorted(set(problems))[:3]]
        if "error" in result:
            notes.append(f"  {name}: {result['error']}")
        notes += [f"  {name}'s processor logged {line}" for line in result.get("processor", [])]
    return out + (["", *notes] if notes else [])


def report_agent(results: dict[str, dict[str, list[Any]]], reps: int) -> list[str]:
    out = [
        f"## agent pass: Agent.run, 4 sessions x 50 passes (5 events a pass), median of {reps} "
        f"fresh-process runs (min{DASH}max)",
        "",
        "| store | unsigned ms/pass | signed ms/pass | signing adds ms | adds % "
        "| resume unsigned ms | resume signed ms | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for key, modes in results.items():
        store = AGENT_STORES[key]
        fine = {m: [r for r in modes[m] if "error" not in r] for m in MODES}
        errors = sorted({r["error"] for m in MODES for r in modes[m] if "error" in r})
        passes = {m: [r["pass_ms_p50"] for r in fine[m]] for m in MODES}
        resumes = {
            m: [r["resume_ms_p50"] for r in fine[m] if r.get("resume_ms_p50")] for m in MODES
        }
        added, pct = _added(passes["unsigned"], passes["signed"], 3)
        runs = fine["unsigned"] + fine["signed"]
        ok = "True" if runs and all(r["ok"] for r in runs) and not errors else "False"
        cells = [
            store,
            _spread(passes["unsigned"], 3),
            _spread(passes["signed"], 3),
            added,
            pct,
            _spread(resumes["unsigned"], 1),
            _spread(resumes["signed"], 1),
            ok,
        ]
        out.append("| " + " | ".join(cells) + " |")
        notes += [f"  {store}: {e}" for e in errors[:2]]
        notes += [f"  {store}: {p}" for r in runs for p in r.get("problems", [])][:3]
        complaints = [r for r in runs if r.get("processor_complaints")]
        if complaints:
            notes.append(
                f"  {store}'s processor logged warnings in {len(complaints)} run(s), the last: "
                f"{complaints[-1]['processor_complaint']!r}"
            )
    loads = [
        r["loadavg_1m"]
        for m in results.values()
        for rs in m.values()
        for r in rs
        if "loadavg_1m" in r
    ]
    if loads:
        notes.append(f"  load average (1 min) at the end of each run: {_spread(loads, 2)}")
    return out + (["", *notes] if notes else [])


def report_events(figures: dict[str, Any]) -> list[str]:
    check, verify = figures["pool_check"], figures["pool_verify"]
    return [
        f"## per event (the turn above: {figures['signed_bytes_len']:,} signed bytes), µs",
        "",
        f"- sign one event: {figures['sign_event']:.1f} (its signed bytes "
        f"{figures['signed_bytes']:.1f}, Ed25519 sign alone {figures['ed25519_sign']:.1f})",
        f"- check one event: {figures['check_event']:.1f} (its signed bytes "
        f"{figures['signed_bytes']:.1f}, Ed25519 verify alone {figures['ed25519_verify']:.1f})",
        f"- checking {POOL_EVENTS:,} events, Keyring.event_problem each: "
        f"{check['one_us']:.1f} per event in one thread, {check['two_us']:.1f} over 2 threads "
        f"({check['speedup']:.2f}x; process CPU / wall {check['cpu_per_wall']:.2f})",
        f"- Ed25519 verify alone, the same: {verify['one_us']:.1f} in one thread, "
        f"{verify['two_us']:.1f} over 2 threads ({verify['speedup']:.2f}x; process CPU / wall "
        f"{verify['cpu_per_wall']:.2f})",
    ]


def _available(stores: Sequence[str]) -> list[str]:
    chosen = []
    for key in stores:
        missing = [name for name in NEEDS.get(key, ()) if not os.environ.get(name)]
        if missing:
            _log(f"leaving out {STORES[key]}: set {' and '.join(missing)}")
        else:
            chosen.append(key)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--events", type=int, default=2000, help="appends per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--agent-reps", type=int, default=9, help="0: no agent pass")
    parser.add_argument("--json", type=Path, help="write every raw result here")
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    unknown = [s for s in stores if s not in STORES]
    if unknown or args.rounds < 1 or args.events < 2:
        parser.error(f"unknown store {unknown} (stores: {', '.join(STORES)})")
    for name in SIGNING_VARS:
        os.environ.pop(name, None)  # the Servers' settings read the environment too
    stores = _available(stores)
    load0, started = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lf-bench-keys-") as tmp:
        keys = Keys.make(Path(tmp))
        appends = asyncio.run(store_level(keys, stores, args.events, args.rounds))
        agent = agent_passes(keys, stores, args.agent_reps) if args.agent_reps > 0 else {}
        events = per_event(keys, args.events)
    print(
        f"# signing, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python "
        f"{platform.python_version()}; loadavg {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - started:.0f} s in all\n"
    )
    print("\n".join(report_appends(appends, args.events, args.rounds)) + "\n")
    if agent:
        print("\n".join(report_agent(agent, args.agent_reps)) + "\n")
    print("\n".join(report_events(events)))
    if args.json:
        raw = {"appends": appends, "agent": agent, "events": events, "repo": str(REPO)}
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
