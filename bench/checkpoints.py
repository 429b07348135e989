"""Checkpoint benchmark: what a user of our runtimes pays per agent pass, beside the peers.

    .venv/bin/python -m bench.checkpoints [--variants single,conc,agent] [--stores ...]
                                          [--reps 5] [--json out.json]

Every (store, variant, repetition) runs in a fresh process that prints one JSON line;
this parent only schedules them (each in a process group of its own, killed whole if it
times out) and prints the median and (min-max) over repetitions. The default stores
include lf-pg / lf-pg-keepall when LOOMFLOW_POSTGRES_DSN is set, and lf-kafka when
LOOMFLOW_KAFKA_BOOTSTRAP is set too (``dev/services.sh start`` prints both). The peers
(LangGraph's AsyncSqliteSaver, PyPI loomflow 0.20.0) live in their own venv
(.cache/bench-peers, built here on first use) because PyPI's ``loomflow`` 0.20.0 is an
unrelated project whose name clashes with ours.

Variants: ``single`` (1 session x 200 passes) and ``conc`` (50 sessions x 40 passes under
``asyncio.gather``) time the store API for every store; ``agent`` times the whole public
API, ``Agent.run`` and ``Agent.resume``, on our stores only (the peers have no equivalent
here: they are measured at their checkpoint-store API alone).

**put** (one sample per pass; messages are built before the clock starts, the events'
payloads inside it):

- ``lf-*``: pass k as the Agent loop writes it, each append on its own:

  1. ``writer.send(TurnAppended, [user message k])``; from pass 2 on, this same append also
     carries pass k-1's staged ``CheckpointWritten`` (one transaction on SQLite/PostgreSQL,
     one send of two records on Kafka). ``send`` is what the agent uses for the prompt of
     a pass: the embedded stores commit it at once; on Kafka it returns once the records
     are handed to the producer, and the next emit waits for their acknowledgement too
     (in an agent, that acknowledgement overlaps the model call);
  2. ``writer.emit(TurnAppended, [assistant message k with its tool call], usage,
     model_call=True, step_key, input_hash)``, which returns once it (and step 1) is
     durable;
  3. ``writer.emit(TurnAppended, [tool result k], step_key, input_hash)``;
  4. ``writer.stage(CheckpointWritten, ...)`` for pass k: no I/O, it rides with the next
     emit.

  The last pass of every session also includes ``await writer.confirm()``, which sends the
  last staged checkpoint and returns once the read model holds all of the run's events
  (SQLite/PostgreSQL: at that commit; lf-kafka: once the projector has applied them). A
  session is claimed with ``open_session`` and given its system message before any timing.
  On SQLite and PostgreSQL an emit returns once committed (appends of concurrent sessions
  share commits); on lf-kafka it returns on the broker's ack (acks=all, idempotent) and only
  the confirm waits for the projector.
- peers: one checkpoint write per pass holding the whole transcript (see peer_runner.py).

**wall s / ckpt/s**: the write phase of all sessions, confirms included; passes per second.

**warm get (own cache)**: ours: ``runtime.get_checkpoint(scope)`` on the writing runtime
after the writes. SQLite and PostgreSQL serve the transcript from that runtime's cache of
what it wrote itself. lf-kafka's read side never sees its own appends (they go through
Kafka), so its first read of a session folds the transcript from PostgreSQL and the later
ones hit the cache. Peers: their latest-checkpoint read after the writes, in the same
process.

**cold read**: what a resume after a restart reads. Ours: ``await runtime.restore(scope)``
on a new runtime instance opened after the writing one was closed (lf-kafka: a new
KafkaRuntime, which reads the read model plus the session's unprojected tail of its
partition), checked equal to what was written. Peers: their latest checkpoint from a
reopened store. Connections are opened before the clock starts (ours: a restore of a
session that does not exist, which also starts lf-kafka's log reader; peers: one list50).

**list50**: newest first, up to 50 checkpoints, printed with the rows it returned. Ratios
compare only stores that returned the same number of rows (lf-sqlite keeps 20, lg-sqlite
keeps all, so list50 is compared between lf-sqlite-keepall and lg-sqlite).

**lf-kafka**: ``KafkaRuntime(settings=...)`` on a schema, a topic prefix (6 partitions)
and a processor id of this run's own. Its projector is ``loomflow processor`` in its own
process, configured by LOOMFLOW_* variables alone (LOOMFLOW_KEYRING and LOOMFLOW_SIGNATURES
too when this run has them, as a deployment that signs gives them to its projector: see
bench/signing.py); it is started before anything is timed, and the run waits until its
heartbeat row in ``<schema>.processors`` holds all 6 partitions (the sessions' claims,
untimed, then prove it projects). It is stopped with SIGTERM at the end, always; then the
schema, the topics (faust's changelog topics too) and faust's data directory are deleted.
lf-pg drops its schema the same way.

**agent**: for each of 4 sessions one after another, a new ``Agent`` (instructions = the
workload's system prompt, ``ScriptedModel`` with no latency, one ``search_docs`` tool,
``Tuning(checkpoint=True)`` and a stop hook that asks for another pass until 50) runs
``agent.run(prompt)``. A pass is the user message (the prompt, then the stop hook's), the
model's assistant message with one tool call (the workload's text and arguments), the
tool's result and the model's answer: four emits, plus the staged checkpoint. ms per
pass = wall of ``run()`` / passes; ``run()`` also holds the claim, the restore of the new
session, ``RunFinished`` and the confirm. Resume after restart: a new Agent on a fresh
runtime (opened after the writing one was closed) calls ``agent.resume(session_id=...)``:
claim (with its checkpoint lookup), restore of the 201-message transcript, one more pass, confirm.
Its restore is timed on its own too. One untimed 2-pass run warms the process first.

**ok**: every session's latest checkpoint (warm) and restored state (cold) hold exactly the
messages written and the last turn; list50 returned min(50, kept) rows; for ``agent`` the
stored, restored and model-visible transcripts equal the one built independently here, and
the call counts are those scripted. A processor that dies early makes the run fail.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import secrets
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loomflow.settings import Settings

if not __package__:
    # run as a script (python bench/checkpoints.py): make ``bench`` and ``loomflow`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import (
    LIST_LIMIT,
    LOOMFLOW_SOURCE,
    SYSTEM_PROMPT,
    VARIANTS,
    Adapter,
    Measure,
    PassContent,
    SearchDocs,
    child_main,
    loomflow_command,
    measure,
    own_env,
    pass_content,
)

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
AGENT = "agent"
ALL_VARIANTS = (*VARIANTS, AGENT)
#: the agent variant's stores when --stores is not given (keepall changes nothing there)
AGENT_STORES = ("lf-inproc", "lf-sqlite", "lf-pg", "lf-kafka")
AGENT_SESSIONS, AGENT_PASSES, AGENT_WARMUP_PASSES = 4, 50, 2
CHILD_TIMEOUT_S = 300
KAFKA_PARTITIONS = 6
PROCESSOR_READY_TIMEOUT_S = 90.0
PROCESSOR_STOP_TIMEOUT_S = 60.0
DASH = "\u2013"  # the range separator of the peers file, so tables compare line by line


# -- the servers a run owns: schema, topics, a processor process --------------------------


class Processor:
    """``loomflow processor`` as its own process, configured by LOOMFLOW_* variables alone."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.settings = settings
        self.log = workdir / "processor.log"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self.ready_s: float | None = None
        self.stop_s: float | None = None

    def environment(self, source: Path = LOOMFLOW_SOURCE) -> dict[str, str]:
        """The processor's environment: the LOOMFLOW_* variables of its settings (only
        these configure it, as they would for a user), and ``source`` first on its path
        (see ``own_env``)."""
        s = self.settings
        env = {k: v for k, v in _clean_env().items() if not k.startswith("LOOMFLOW_")}
        env = own_env(env, source)
        env.update(
            LOOMFLOW_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
            LOOMFLOW_POSTGRES_DSN=s.postgres_dsn,
            LOOMFLOW_SCHEMA=s.db_schema,
            LOOMFLOW_TOPIC_PREFIX=s.topic_prefix,
            LOOMFLOW_TOPIC_PARTITIONS=str(s.topic_partitions),
            LOOMFLOW_PROCESSOR_ID=s.processor_id,
        )
        # a deployment that signs gives its projector the keys to check, as a user would
        if s.keyring is not None:
            env["LOOMFLOW_KEYRING"] = str(s.keyring.resolve())
        if s.signatures is not None:
            env["LOOMFLOW_SIGNATURES"] = s.signatures
        return env

    def start(self) -> None:
        env = self.environment()
        command = loomflow_command()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*command, "processor", "--loglevel", "warn"],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
        self._started = time.perf_counter()

    async def wait_ready(self) -> None:
        """Return once the processor's heartbeat row holds every partition of the topic."""
        import asyncpg

        s = self.settings
        wanted = set(range(s.topic_partitions))
        deadline = time.monotonic() + PROCESSOR_READY_TIMEOUT_S
        conn = await asyncpg.connect(s.postgres_dsn)
        try:
            while True:
                self.check_alive()
                # the projector creates the schema and its table when it starts
                with contextlib.suppress(
                    asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError
                ):
                    rows = await conn.fetch(
                        f'SELECT partitions FROM "{s.db_schema}".processors '
                        "WHERE consumer = $1 AND topic = $2",
                        s.projector_group,
                        s.events_topic,
                    )
                    if {p for row in rows for p in row[0]} == wanted:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"loomflow processor held no full assignment of {s.events_topic} "
                        f"after {PROCESSOR_READY_TIMEOUT_S:.0f} s: {self.tail()}"
                    )
                await asyncio.sleep(0.1)  # a table to poll: nothing to wait on instead
        finally:
            await conn.close()
        self.ready_s = time.perf_counter() - self._started

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"loomflow processor exited with {self.proc.returncode}: {self.tail()}"
            )

    async def stop(self) -> int | None:
        """SIGTERM, then wait (SIGKILL after a minute); its exit code, None if killed."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is not None:
            return proc.returncode
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(proc.wait, PROCESSOR_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            return None
        finally:
            self.stop_s = time.perf_counter() - t0
        return code

    def complaints(self) -> list[str]:
        """Its log's warnings, errors and tracebacks (the rest is faust's start-up banner)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        marks = ("[WARNING]", "[ERROR]", "[CRITICAL]", "Traceback")
        return [line for line in text.splitlines() if any(m in line for m in marks)]

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "no log"
        kept = [line for line in text.strip().splitlines() if line.strip()]
        return " / ".join(kept[-lines:])[-400:] or "no output"


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook: the processor gets SIGTERM if the measuring process dies first.

    Covers what no ``finally`` can: a SIGKILL of the measuring process. Linux only.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return hook


class Servers:
    """What one lf-pg / lf-kafka run owns on the servers, named from one random tag."""

    def __init__(self, kafka: bool, workdir: Path, **overrides: Any) -> None:
        """``overrides``: further settings of the deployment (``keyring=``: its projector
        requires signatures)."""
        from loomflow.settings import Settings

        tag = secrets.token_hex(4)
        #: topic prefix and processor id; faust names its own topics after the latter
        self.name = f"lf-bench-ckpt-{tag}"
        self.kafka = kafka
        options: dict[str, Any] = {
            "postgres_dsn": _postgres_dsn(),
            "db_schema": f"lf_bench_ckpt_{tag}",
        }
        if kafka:
            options.update(
                kafka_bootstrap=_kafka_bootstrap(),
                topic_prefix=self.name,
                topic_partitions=KAFKA_PARTITIONS,
                processor_id=self.name,
            )
        self.settings = Settings(**{**options, **overrides})
        self.processor: Processor | None = Processor(self.settings, workdir) if kafka else None
        self.processor_exit: int | None = None
        #: what it complained of at --loglevel warn (its log goes with the temp directory)
        self.processor_complaints = 0
        self.processor_complaint = ""

    async def start_processor(self) -> None:
        assert self.processor is not None
        self.processor.start()
        await self.processor.wait_ready()

    async def remove(self) -> None:
        """Stop the processor, then drop the schema and the topics; every step is tried."""
        failures: list[str] = []
        if self.processor is not None:
            try:
                self.processor_exit = await self.processor.stop()
            except Exception as exc:
                failures.append(f"stopping the processor: {exc!r}")
            complaints = self.processor.complaints()
            self.processor_complaints = len(complaints)
            self.processor_complaint = complaints[-1][-300:] if complaints else ""
            with contextlib.suppress(OSError):
                shutil.rmtree(Path(tempfile.gettempdir()) / "loomflow-faust" / f"{self.name}-data")
        try:
            await self._drop_schema()
        except Exception as exc:
            failures.append(f"dropping schema {self.settings.db_schema}: {exc!r}")
        if self.kafka:
            try:
                await self._delete_topics()
            except Exception as exc:
                failures.append(f"deleting topics {self.name}*: {exc!r}")
        if failures:
            raise RuntimeError("cleanup failed: " + "; ".join(failures))

    async def _drop_schema(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.settings.postgres_dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self.settings.db_schema}" CASCADE')
        finally:
            await conn.close()

    async def _delete_topics(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        await admin.start()
        try:
            # ours (<name>.events ...) and faust's (<name>-...-changelog, <name>-__assignor...)
            prefixes = (f"{self.name}.", f"{self.name}-")
            mine = [t for t in await admin.list_topics() if t.startswith(prefixes)]
            if mine:
                await admin.delete_topics(mine)
        finally:
            await admin.close()


# -- our runtimes (child side) ---------------------------------------------------------


@dataclass
class _Session:
    scope: Any
    writer: Any
    messages: list[Any]
    usage: Any


@dataclass(frozen=True)
class _Pass:
    user: Any
    assistant: Any
    tool: Any
    turn_usage: Any
    cumulative: Any
    message_count: int
    model_hash: str
    tool_hash: str


class LoomflowAdapter(Adapter):
    """One of our runtimes, written to as the Agent loop writes (see the module docstring)."""

    def __init__(
        self, store: str, tmp: Path, servers: Servers | None = None, *, owner: bool = True
    ) -> None:
        import loomflow.runtime as lf  # each runtime's module is imported on first use

        path = tmp / "lf.db"
        self.store_name, self.tmp = store, tmp
        #: the writing instance owns the servers' names and the processor; a reopened one
        #: (the cold reader) shares them and leaves their removal to the owner
        self.owner = owner
        self.servers = servers
        if store.startswith(("lf-pg", "lf-kafka")) and servers is None:
            self.servers = Servers(store == "lf-kafka", tmp)
        if store == "lf-inproc":
            self.runtime: Any = lf.InProcRuntime()
        elif store == "lf-sqlite":
            self.runtime = lf.SqliteRuntime(path)
        elif store == "lf-sqlite-keepall":
            self.runtime = lf.SqliteRuntime(path, max_checkpoints_per_session=0)
        elif store in ("lf-pg", "lf-pg-keepall"):
            assert self.servers is not None
            self.runtime = lf.PostgresRuntime(
                settings=self.servers.settings,
                max_checkpoints_per_session=0 if store == "lf-pg-keepall" else 20,
            )
        elif store == "lf-kafka":
            assert self.servers is not None
            self.runtime = lf.KafkaRuntime(settings=self.servers.settings)
        else:
            raise ValueError(f"unknown store {store!r}")
        self.retain = self.runtime.max_checkpoints_per_session
        if store.startswith("lf-sqlite"):
            self.files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]

    async def open(self) -> None:
        # connections, migrations, topics and the processor before anything is timed
        if self.store_name.startswith(("lf-pg", "lf-sqlite")):
            await self.runtime.store.open()
        elif self.store_name == "lf-kafka":
            assert self.servers is not None
            if self.owner:
                await self.servers.start_processor()
            await self.runtime.store.start()

    async def seed(self, index: int) -> _Session:
        from loomflow.runtime import Scope
        from loomflow.schemas import Message, TurnAppended, Usage, new_id
        from loomflow.schemas.events import TurnAppendedPayload

        scope = Scope(new_id("sess"), None)
        writer = await self.runtime.open_session(scope, run_id=new_id("run"))
        system = Message.system(SYSTEM_PROMPT)
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[system]))
        return _Session(scope, writer, [system], Usage())

    def add(self, handle: _Session, k: int, content: PassContent) -> _Pass:
        import hashlib

        from loomflow.schemas import Message, ToolCall, Usage
        from loomflow.schemas.codec import input_hash

        call = ToolCall(id=content.call_id, name=content.tool_name, arguments=content.tool_args)
        user = Message.user(content.user)
        assistant = Message.assistant(content.assistant, [call])
        tool = Message.tool(content.call_id, content.tool_result)
        turn_usage = Usage(input_tokens=content.input_tokens, output_tokens=content.output_tokens)
        handle.usage = handle.usage + turn_usage
        handle.messages += [user, assistant, tool]
        # the loop hashes the transcript so far for a model step: a 32-hex digest either way
        model_hash = hashlib.sha256(f"{content.call_id}:{k}".encode()).hexdigest()[:32]
        tool_hash = input_hash([call.name, call.arguments])
        return _Pass(
            user,
            assistant,
            tool,
            turn_usage,
            handle.usage,
            len(handle.messages),
            model_hash,
            tool_hash,
        )

    async def put(self, handle: _Session, k: int, new: _Pass) -> None:
        from loomflow.schemas import CheckpointWritten, TurnAppended, new_id
        from loomflow.schemas.events import CheckpointWrittenPayload, TurnAppendedPayload

        writer = handle.writer
        # the pass's prompt, sent as the agent sends it (with the previous pass's staged
        # checkpoint): on Kafka its acknowledgement is awaited with the model's answer
        await writer.send(TurnAppended, TurnAppendedPayload(messages=[new.user]))
        await writer.emit(
            TurnAppended,
            TurnAppendedPayload(
                messages=[new.assistant],
                usage=new.turn_usage,
                model_call=True,
                step_key=f"model:{k}",
                input_hash=new.model_hash,
            ),
        )
        await writer.emit(
            TurnAppended,
            TurnAppendedPayload(
                messages=[new.tool],
                step_key=f"tool:{new.tool.tool_call_id}",
                input_hash=new.tool_hash,
            ),
        )
        writer.stage(
            CheckpointWritten,
            CheckpointWrittenPayload(
                checkpoint_id=new_id("ckpt"),
                turn=k,
                cumulative_usage=new.cumulative,
                cursor=f"pass:{k}",
                message_count=new.message_count,
                retain=self.runtime.max_checkpoints_per_session,
            ),
        )

    async def finish(self, handle: _Session) -> None:
        await handle.writer.confirm()

    async def get_latest(self, handle: _Session) -> tuple[list[Any], int]:
        found = await self.runtime.get_checkpoint(handle.scope)
        return ([], -1) if found is None else (found.messages, found.turn)

    async def connect(self, handle: _Session) -> None:
        from loomflow.runtime import Scope
        from loomflow.schemas import new_id

        # a session that does not exist: connections (and lf-kafka's log reader) open,
        # nothing of the session read
        await self.runtime.restore(Scope(new_id("sess"), None))

    async def cold_read(self, handle: _Session) -> tuple[list[Any], int]:
        state = await self.runtime.restore(handle.scope)
        return ([], -1) if state is None else (state.messages, state.turns)

    async def list50(self, handle: _Session) -> int:
        return len(await self.runtime.list_checkpoints(handle.scope, LIST_LIMIT))

    def written(self, handle: _Session) -> list[Any]:
        return handle.messages

    def ref(self, handle: _Session) -> str | None:
        # the embedded stores: a server-backed one is named by this process's servers
        return str(handle.scope.session_id) if self.store_name.startswith("lf-sqlite") else None

    def from_ref(self, ref: str) -> _Session:
        from loomflow.runtime import Scope

        return _Session(Scope(ref, None), None, [], None)

    def transcript_json_bytes(self, messages: list[Any]) -> int:
        import orjson

        return len(orjson.dumps([m.model_dump(mode="json") for m in messages]))

    async def close(self) -> None:
        await self.runtime.close()

    async def teardown(self) -> None:
        if self.owner and self.servers is not None:
            await self.servers.remove()

    async def disk_bytes(self) -> int | None:
        if self.servers is None:
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
                self.servers.settings.db_schema,
            )
        finally:
            await conn.close()
        return int(size)

    def reopen(self) -> LoomflowAdapter | None:
        if self.store_name == "lf-inproc":
            return None
        return LoomflowAdapter(self.store_name, self.tmp, self.servers, owner=False)

    def processor_pid(self) -> int | None:
        """The process id of ``loomflow processor`` (lf-kafka), else None."""
        servers = self.servers
        if servers is None or servers.processor is None or servers.processor.proc is None:
            return None
        return servers.processor.proc.pid

    def processor_facts(self) -> dict[str, Any]:
        servers = self.servers
        if servers is None or servers.processor is None:
            return {}
        processor = servers.processor
        return {
            "processor_ready_s": processor.ready_s,
            "processor_stop_s": processor.stop_s,
            "processor_exit": servers.processor_exit,
            "processor_complaints": servers.processor_complaints,
            "processor_complaint": servers.processor_complaint,
        }


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


# -- the agent variant (child side) --------------------------------------------------------


def _answer(k: int) -> str:
    return f"Pass {k}: the documents answer it; sources cited above."


class Research(SearchDocs):
    """A research agent on the workload's text: one ``search_docs`` call per pass.

    The model is a ``ScriptedModel`` (no latency) whose replies alternate: the pass's
    assistant message with its tool call, then a short answer. The stop hook asks for the
    next pass, with the workload's user message, until ``passes`` passes are done.
    """

    def __init__(self, session: int, passes: int, *, replies_before: int = 0) -> None:
        from loomflow.models import ScriptedModel

        self.passes = passes
        # one pass more than the run makes: the resume's
        self.contents = [pass_content(session, k) for k in range(1, passes + 2)]
        self.results(self.contents)
        self._replies = replies_before
        self.model = ScriptedModel(self._reply)

    def _reply(self, messages: Sequence[Any]) -> Any:
        from loomflow.schemas import Message, ToolCall

        # a counter, not a scan of the transcript: the script itself should cost nothing
        index, self._replies = self._replies, self._replies + 1
        content = self.contents[index // 2]
        if index % 2:
            return _answer(index // 2 + 1)
        call = ToolCall(id=content.call_id, name=content.tool_name, arguments=content.tool_args)
        return Message.assistant(content.assistant, [call])

    def more(self, state: Any) -> str | None:
        """Another pass, with the next user message, until ``passes`` are done."""
        done = state.turns // 2  # two model calls a pass
        return self.contents[done].user if done < self.passes else None

    def agent(self, runtime: Any) -> Any:
        from loomflow import Agent, Tuning

        return Agent(
            SYSTEM_PROMPT,
            model=self.model,
            runtime=runtime,
            tuning=Tuning(
                checkpoint=True, stop_hooks=[self.more], max_stop_hook_iterations=self.passes
            ),
            tools=[self.search_docs],
        )

    @property
    def prompt(self) -> str:
        return self.contents[0].user

    def transcript(self) -> list[Any]:
        """What ``passes`` passes leave in the session, built independently of the agent."""
        from loomflow.schemas import Message, ToolCall

        messages = [Message.system(SYSTEM_PROMPT)]
        for k, c in enumerate(self.contents[: self.passes], 1):
            call = ToolCall(id=c.call_id, name=c.tool_name, arguments=c.tool_args)
            messages += [
                Message.user(c.user),
                Message.assistant(c.assistant, [call]),
                Message.tool(c.call_id, c.tool_result),
                Message.assistant(_answer(k)),
            ]
        return messages


async def measure_agent(adapter: LoomflowAdapter) -> dict[str, Any]:
    try:
        return await _measure_agent(adapter)
    finally:
        await adapter.teardown()


async def _measure_agent(adapter: LoomflowAdapter) -> dict[str, Any]:
    from loomflow.agent import CONTINUATION_PROMPT
    from loomflow.runtime import Scope
    from loomflow.schemas import Message, new_id

    sessions, passes = AGENT_SESSIONS, AGENT_PASSES
    problems: list[str] = []
    await adapter.open()
    runtime = adapter.runtime
    # the first run in a process pays imports, validators and first connections: untimed
    warm = Research(-1, AGENT_WARMUP_PASSES)
    await warm.agent(runtime).run(warm.prompt)

    pass_ms: list[float] = []
    walls: list[float] = []
    done: list[tuple[int, str, list[Any]]] = []
    wanted_rows = min(LIST_LIMIT, passes if adapter.retain < 1 else min(adapter.retain, passes))
    for index in range(sessions):
        research = Research(index, passes)
        session_id = new_id("sess")
        t0 = time.perf_counter()
        result = await research.agent(runtime).run(research.prompt, session_id=session_id)
        wall = time.perf_counter() - t0
        walls.append(wall)
        pass_ms.append(wall * 1000 / passes)
        expected = research.transcript()
        if result.model_calls != 2 * passes or result.stop_reason != "completed":
            problems.append(
                f"session {index}: {result.model_calls} model calls, {result.stop_reason}"
            )
        found = await runtime.get_checkpoint(Scope(session_id))
        if found is None or found.messages != expected or found.turn != 2 * passes:
            got = "none" if found is None else f"turn {found.turn}, {len(found.messages)} messages"
            problems.append(f"session {index}: latest checkpoint {got}, wrote {len(expected)}")
        rows = len(await runtime.list_checkpoints(Scope(session_id), LIST_LIMIT))
        if rows != wanted_rows:
            problems.append(f"session {index}: listed {rows} checkpoints, expected {wanted_rows}")
        done.append((index, session_id, expected))
    await adapter.close()

    resume_ms: list[float] = []
    restore_ms: list[float] = []
    cold = adapter.reopen()
    if cold is not None:
        await cold.open()
        try:
            fresh = cold.runtime
            await fresh.restore(Scope(new_id("sess")))  # connections, as for the cold read
            restores: list[tuple[float, Any]] = []
            restore = fresh.claimed

            async def timed_restore(writer: Any) -> Any:
                t0 = time.perf_counter_ns()
                state = await restore(writer)
                restores.append(((time.perf_counter_ns() - t0) / 1e6, state))
                return state

            # the restore inside resume(), timed where the Agent calls it: the transcript
            # read after the claim (the claim's one read of the session holds the rest)
            fresh.claimed = timed_restore
            for index, session_id, expected in done:
                research = Research(index, passes, replies_before=2 * passes)
                restores.clear()
                t0 = time.perf_counter_ns()
                result = await research.agent(fresh).resume(session_id=session_id)
                resume_ms.append((time.perf_counter_ns() - t0) / 1e6)
                if len(restores) != 1 or restores[0][1] is None:
                    problems.append(f"session {index}: resume restored {len(restores)} times")
                else:
                    ms, state = restores[0]
                    restore_ms.append(ms)
                    if state.messages != expected:
                        problems.append(
                            f"session {index}: resume restored {len(state.messages)} messages "
                            f"that differ from the {len(expected)} written"
                        )
                seen = research.model.calls[0] if research.model.calls else []
                if seen != [*expected, Message.user(CONTINUATION_PROMPT)]:
                    problems.append(f"session {index}: the resumed model saw {len(seen)} messages")
                if result.restored_turns != 2 * passes or result.model_calls != 2:
                    problems.append(
                        f"session {index}: resume restored {result.restored_turns} turns and "
                        f"made {result.model_calls} model calls"
                    )
        finally:
            await cold.close()
    return {
        "pass_ms_p50": statistics.median(pass_ms),
        "run_wall_s": statistics.median(walls),
        "resume_ms_p50": statistics.median(resume_ms) if resume_ms else None,
        "restore_ms_p50": statistics.median(restore_ms) if restore_ms else None,
        "sessions": sessions,
        "passes": passes,
        "transcript_messages": len(done[0][2]),
        "ok": not problems,
        "problems": problems[:3],
        "loadavg_1m": os.getloadavg()[0],
    }


async def run_variant(adapter: Adapter, variant: str) -> dict[str, Any]:
    assert isinstance(adapter, LoomflowAdapter)
    if variant == AGENT:
        result = await measure_agent(adapter)
    else:
        result = await measure(adapter, variant)
    return {**result, **adapter.processor_facts()}


# -- peers venv --------------------------------------------------------------------------


def _peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def ensure_peers(
    stores: list[str], requirements: dict[str, tuple[str, ...]] = PEER_REQUIREMENTS
) -> dict[str, str]:
    """Build the peers venv and install what ``stores`` need (pip requirements per store,
    ``PEER_REQUIREMENTS`` unless told); store -> why it cannot run."""
    broken: dict[str, str] = {}
    wanted = [s for s in stores if s in requirements]
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
        needed = requirements[store]
        # a marker per store, so a changed pin reinstalls and a failed install is retried
        marker = PEER_VENV / f".bench-{store}.installed"
        spec = "\n".join(needed)
        if marker.exists() and marker.read_text() == spec:
            continue
        _log(f"installing {' '.join(needed)} into the peers venv")
        done = subprocess.run(
            [str(_peer_python()), "-m", "pip", "install", "-q", *needed],
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
    return run_measurement(cmd, {"store": store, "variant": variant})


def run_measurement(
    cmd: list[str],
    labels: dict[str, Any],
    env: dict[str, str] | None = None,
    timeout: float = CHILD_TIMEOUT_S,
) -> dict[str, Any]:
    """Run one measurement process; the last JSON line it printed, or ``labels`` with
    the error that kept it from printing one."""
    # its own process group: a timeout kills the child and the processor it started
    child = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_clean_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        reason = f"timed out after {timeout:.0f}s (killed; its schema and topics may remain)"
        return {**labels, "error": reason}
    except BaseException:
        _kill_group(child)
        raise
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {**labels, "error": f"exit {child.returncode}: {_tail(stderr)}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _kill_group(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.communicate()


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


def _median(runs: list[dict[str, Any]] | None, key: str) -> float | None:
    values = [r[key] for r in runs or () if r.get(key) is not None]
    return statistics.median(values) if values else None


def _rows(runs: list[dict[str, Any]]) -> int | None:
    """The rows every run's list50 returned; None unless they all agree."""
    seen = {r.get("list_rows") for r in runs}
    only = seen.pop() if len(seen) == 1 else None
    return only if isinstance(only, int) else None


def _rows_note(runs: list[dict[str, Any]]) -> str:
    seen = sorted({r["list_rows"] for r in runs if r.get("list_rows") is not None})
    return f" [{'/'.join(map(str, seen)) or '?'} rows]"


COLUMNS = (
    ("put p50 ms", "put_p50", "ms"),
    ("put p99 ms", "put_p99", "ms"),
    ("warm get (own cache) p50 ms", "warm_get_p50", "ms"),
    ("cold read p50 ms", "cold_read_p50", "ms"),
    ("list50 p50 ms [rows]", "list_p50", "ms"),
    ("wall s", "wall_s", "s"),
    ("ckpt/s", "ckpt_per_s", "rate"),
    ("disk MB", "disk_mb", "mb"),
)
RATIO_KEYS = (
    ("put p50", "put_p50"),
    ("warm get p50", "warm_get_p50"),
    ("cold read p50", "cold_read_p50"),
)
AGENT_COLUMNS = (
    ("ms per pass p50", "pass_ms_p50", "ms"),
    ("run wall s", "run_wall_s", "s"),
    ("resume after restart ms", "resume_ms_p50", "ms"),
    ("restore in resume ms", "restore_ms_p50", "ms"),
)


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or not theirs:
        return "n/a"
    value = ours / theirs
    # two significant digits below 0.1 so a 250x gap does not print as 0.00x
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def _list_ratio(
    good: dict[str, list[dict[str, Any]]], candidates: Sequence[str], other: str
) -> str:
    """list50 of the first candidate that returned as many rows as ``other``, over it."""
    rows = _rows(good[other])
    for store in candidates:
        if store in good and rows is not None and _rows(good[store]) == rows:
            ratio = _ratio(_median(good[store], "list_p50"), _median(good[other], "list_p50"))
            return f"list50 p50 {ratio} ({store} / {other}, {rows} rows each)"
    return f"list50 p50 n/a (none of {', '.join(candidates)} returned {rows} rows)"


def _table_row(
    store: str, runs: list[dict[str, Any]], columns: Sequence[tuple[str, str, str]]
) -> tuple[list[str], list[dict[str, Any]] | None]:
    """The cells of one store's row, and its good runs (None when none ran)."""
    fine = [r for r in runs if "error" not in r]
    errors = sorted({r["error"] for r in runs if "error" in r})
    if not fine:
        why = errors[0] if errors else "not run"
        cells = [store, "0", f"could not run: {why}", *[""] * (len(columns) - 1), "—"]
        return [c.replace("|", "/") for c in cells], None
    oks = sum(1 for r in fine if r["ok"])
    ok = "True" if oks == len(fine) else f"False ({oks}/{len(fine)})"
    if errors:
        ok += f"; {len(runs) - len(fine)} run(s) failed: {errors[0]}".replace("|", "/")
    cells = [store, str(len(fine))]
    for _, key, kind in columns:
        cell = _spread(fine, key, kind)
        if key == "list_p50":
            cell += _rows_note(fine)
        cells.append(cell)
    return [*cells, ok], fine


def _header(columns: Sequence[tuple[str, str, str]]) -> list[str]:
    header = ["store", "n", *(c[0] for c in columns), "ok"]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]


def good_runs(results: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {
        store: fine
        for store, runs in results.items()
        if (fine := [r for r in runs if "error" not in r])
    }


def report(variant: str, stores: list[str], results: dict[str, list[dict[str, Any]]]) -> str:
    sessions, passes = VARIANTS[variant]
    out = [f"## variant {variant}: {sessions} session(s) x {passes} passes", ""]
    out += _header(COLUMNS)
    good: dict[str, list[dict[str, Any]]] = {}
    for store in stores:
        cells, fine = _table_row(store, results.get(store, []), COLUMNS)
        out.append("| " + " | ".join(cells) + " |")
        if fine:
            good[store] = fine
    out += [
        "",
        "put (lf-*): 3 emits + a staged checkpoint per pass; the last pass of each session also",
        "confirms. warm get (own cache): ours = get_checkpoint on the writing runtime, served",
        "from the transcripts it cached; peers = their read after the writes, same process.",
        "cold read: ours = runtime.restore(scope) on a fresh runtime; peers = latest checkpoint",
        "from a reopened store.",
    ]

    base = good.get("lf-sqlite")
    peers = [s for s in stores if s in PEER_REQUIREMENTS and s in good]
    if base and peers:
        out += ["", "ratios, lf-sqlite / peer on medians (< 1: ours is lower, i.e. better);"]
        out.append("list50 only between stores that returned the same number of rows")
        for peer in peers:
            parts = [
                f"{label} {_ratio(_median(base, key), _median(good[peer], key))}"
                for label, key in RATIO_KEYS
            ]
            parts.append(_list_ratio(good, ("lf-sqlite", "lf-sqlite-keepall"), peer))
            parts.append(f"disk {_ratio(_median(base, 'disk_mb'), _median(good[peer], 'disk_mb'))}")
            out.append(f"  vs {peer:<14} " + "; ".join(parts))

    if "lf-pg" in good and "lf-kafka" in good:
        kafka, pg = good["lf-kafka"], good["lf-pg"]
        out += ["", "ratios, lf-kafka / lf-pg on medians (the same read model; Kafka in front)"]
        parts = [
            f"put p50 {_ratio(_median(kafka, 'put_p50'), _median(pg, 'put_p50'))}",
            f"put p99 {_ratio(_median(kafka, 'put_p99'), _median(pg, 'put_p99'))}",
            f"ckpt/s {_ratio(_median(kafka, 'ckpt_per_s'), _median(pg, 'ckpt_per_s'))}"
            " (> 1: lf-kafka writes more)",
        ]
        out.append("  " + "; ".join(parts))
        parts = [
            f"{label} {_ratio(_median(kafka, key), _median(pg, key))}"
            for label, key in RATIO_KEYS[1:]
        ]
        parts.append(_list_ratio(good, ("lf-kafka",), "lf-pg"))
        parts.append(f"disk {_ratio(_median(kafka, 'disk_mb'), _median(pg, 'disk_mb'))}")
        out.append("  " + "; ".join(parts))

    out += ["", "extra: put p50 over the last 20 passes (largest transcripts); the last pass of"]
    out.append("each session (its confirm included); final transcript JSON bytes (session 0,")
    out.append("in the store's own message model)")
    for store, fine in good.items():
        last = _spread(fine, "last20_put_p50", "ms")
        final = _spread(fine, "final_put_p50", "ms")
        size = _median(fine, "transcript_bytes") or 0
        out.append(
            f"  {store:<18} last20 put p50 {last} ms; last pass {final} ms; "
            f"transcript {size:,.0f} B"
        )
    fresh = {store: fine for store, fine in good.items() if _median(fine, "fresh_read_ms")}
    if fresh:
        out += ["", "a fresh process (new interpreter) reading the session's latest checkpoint:"]
        out.append("open = the store's module imported, made and opened; first read = its first")
        out.append("read, first-use costs included (validators built); process = start to exit")
        for store, fine in fresh.items():
            out.append(
                f"  {store:<18} open {_spread(fine, 'fresh_open_ms', 'ms')} ms; first read "
                f"{_spread(fine, 'fresh_read_ms', 'ms')} ms; process "
                f"{_spread(fine, 'fresh_process_ms', 'ms')} ms"
            )
    out += ["", "garbage collection during the writes (it stalls every session at once):"]
    for store, fine in good.items():
        out.append(
            f"  {store:<18} {_spread(fine, 'gc_ms', 'ms')} ms in all; longest pause "
            f"{_spread(fine, 'gc_max_ms', 'ms')} ms; full collections "
            f"{_spread(fine, 'gc_full', 'rate')}"
        )
    if sessions == 1:  # the transcript bytes are session 0's
        out += ["", "disk / transcript JSON (the store's files once closed, over the transcript)"]
    for store, fine in good.items() if sessions == 1 else ():
        disk_mb, transcript = _median(fine, "disk_mb"), _median(fine, "transcript_bytes")
        if disk_mb and transcript:
            out.append(f"  {store:<18} {disk_mb * 1e6 / transcript:.2f}x")
    out += _processor_lines(good)
    out += _problem_lines(good)
    return "\n".join(out)


def report_agent(stores: list[str], results: dict[str, list[dict[str, Any]]]) -> str:
    out = [
        f"## variant agent: Agent.run, {AGENT_SESSIONS} session(s) x {AGENT_PASSES} passes "
        "one after another (ScriptedModel, no latency)",
        "",
    ]
    out += _header(AGENT_COLUMNS)
    good: dict[str, list[dict[str, Any]]] = {}
    for store in stores:
        cells, fine = _table_row(store, results.get(store, []), AGENT_COLUMNS)
        out.append("| " + " | ".join(cells) + " |")
        if fine:
            good[store] = fine
    messages = next((r["transcript_messages"] for runs in good.values() for r in runs), "?")
    out += [
        "",
        "ms per pass = wall of Agent.run / passes (a pass: user message, assistant message with",
        "one tool call, tool result, answer = 4 emits, plus the staged checkpoint; the run's",
        "claim, restore, RunFinished and confirm included). resume after restart = a new Agent",
        f"on a fresh runtime: agent.resume() restores the {messages}-message transcript, makes",
        "one pass and confirms; restore in resume = its runtime.restore alone. The peers have no",
        "equivalent: they are measured at their checkpoint-store API only.",
    ]
    out += _processor_lines(good)
    out += _problem_lines(good)
    return "\n".join(out)


def _processor_lines(good: dict[str, list[dict[str, Any]]]) -> list[str]:
    runs = good.get("lf-kafka")
    if not runs:
        return []
    exits = sorted({str(r.get("processor_exit")) for r in runs})
    lines = [
        f"  lf-kafka's `loomflow processor`: ready {_spread(runs, 'processor_ready_s', 's')} s "
        f"after its start; stopped by SIGTERM in {_spread(runs, 'processor_stop_s', 's')} s, "
        f"exit code {'/'.join(exits)} (None: killed after {PROCESSOR_STOP_TIMEOUT_S:.0f} s)"
    ]
    logged = [r for r in runs if r.get("processor_complaints")]
    if logged:
        lines.append(
            f"  it logged warnings or errors in {len(logged)} run(s), e.g. "
            f"{logged[0]['processor_complaints']}, the last: {logged[0]['processor_complaint']!r}"
        )
    else:
        lines.append("  it logged no warning or error (--loglevel warn)")
    return lines


def _problem_lines(good: dict[str, list[dict[str, Any]]]) -> list[str]:
    problems = {
        f"{store}: {p}" for store, runs in good.items() for r in runs for p in r.get("problems", [])
    }
    return [f"  verification problem: {p}" for p in sorted(problems)[:8]]


def report_targets(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """The KafkaRuntime targets, each against the medians of this run."""
    single = good_runs(results.get("single", {}))
    conc = good_runs(results.get("conc", {}))
    k50, pg50 = _median(single.get("lf-kafka"), "put_p50"), _median(single.get("lf-pg"), "put_p50")
    k99 = _median(single.get("lf-kafka"), "put_p99")
    krate = _median(conc.get("lf-kafka"), "ckpt_per_s")
    pgrate = _median(conc.get("lf-pg"), "ckpt_per_s")
    rows = [
        _target(
            "put p50 (single) <= 0.8x lf-pg's",
            None if k50 is None or not pg50 else k50 / pg50,
            0.8,
            "x",
            f"{_fmt(k50, 'ms')} / {_fmt(pg50, 'ms')} ms",
            "needs lf-kafka and lf-pg in single",
        ),
        _target("put p50 (single) <= 2 ms", k50, 2.0, " ms", "", "needs lf-kafka in single"),
        _target("put p99 (single) <= 10 ms", k99, 10.0, " ms", "", "needs lf-kafka in single"),
        _target(
            "ckpt/s (conc 50x40) >= 2x lf-pg's",
            None if krate is None or not pgrate else krate / pgrate,
            2.0,
            "x",
            f"{_fmt(krate, 'rate')} / {_fmt(pgrate, 'rate')} ckpt/s",
            "needs lf-kafka and lf-pg in conc",
            at_least=True,
        ),
    ]
    return "\n".join(["## targets: lf-kafka (KafkaRuntime) against lf-pg (PostgresRuntime)", *rows])


def _ratio_of(
    runs: dict[str, list[dict[str, Any]]], ours: str, peer: str, key: str
) -> tuple[float | None, str]:
    mine, theirs = _median(runs.get(ours), key), _median(runs.get(peer), key)
    if mine is None or not theirs:
        return None, ""
    return mine / theirs, f"{mine:,.3f} / {theirs:,.3f}"


def report_embedded_targets(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """SqliteRuntime's targets (issue 12), each against the peers' medians of this run."""
    single = good_runs(results.get("single", {}))
    conc = good_runs(results.get("conc", {}))
    big = good_runs(results.get("big", {}))
    rows = []
    for label, runs, peer, key, limit, at_least in (
        ("put p50 (single) <= 0.2x lf020's", single, "lf020-sqlite", "put_p50", 0.2, False),
        ("put p50 (single) <= 0.5x lg's", single, "lg-sqlite", "put_p50", 0.5, False),
        ("ckpt/s (conc) >= 5x lf020's", conc, "lf020-sqlite", "ckpt_per_s", 5.0, True),
        ("put p99 (conc) <= lg's", conc, "lg-sqlite", "put_p99", 1.0, False),
        ("cold read (single) <= lg's", single, "lg-sqlite", "cold_read_p50", 1.0, False),
        ("fresh first read (single) <= lg's", single, "lg-sqlite", "fresh_read_ms", 1.0, False),
        ("fresh process (single) <= lg's", single, "lg-sqlite", "fresh_process_ms", 1.0, False),
    ):
        value, detail = _ratio_of(runs, "lf-sqlite", peer, key)
        rows.append(
            _target(
                label, value, limit, "x", detail, f"needs lf-sqlite and {peer}", at_least=at_least
            )
        )
    for variant, runs in (("single", single), ("big", big)):
        fine = runs.get("lf-sqlite-keepall")
        disk, size = _median(fine, "disk_mb"), _median(fine, "transcript_bytes")
        if not disk or not size:
            rows.append(
                _target(
                    f"disk ({variant}, keepall) <= 1.5x transcript",
                    None,
                    1.5,
                    "x",
                    "",
                    f"needs lf-sqlite-keepall in {variant}",
                )
            )
            continue
        rows.append(
            _target(
                f"disk ({variant}, keepall) <= 1.5x transcript",
                disk * 1e6 / size,
                1.5,
                "x",
                f"{disk:.2f} MB / {size / 1e6:.2f} MB",
                f"needs lf-sqlite-keepall in {variant}",
            )
        )
    return "\n".join(["## targets: lf-sqlite (SqliteRuntime) against the peers of this run", *rows])


def _target(
    label: str,
    value: float | None,
    limit: float,
    unit: str,
    detail: str,
    missing: str,
    *,
    at_least: bool = False,
) -> str:
    if value is None:
        return f"  {label:<36} not measured ({missing})"
    met = value >= limit if at_least else value <= limit
    shown = f"{value:.2f}{unit}" if unit == "x" else f"{value:.3f}{unit}"
    detail = f" ({detail})" if detail else ""
    return f"  {label:<36} measured {shown}{detail}: {'met' if met else 'MISSED'}"


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


def _status(run: dict[str, Any]) -> str:
    if "error" in run:
        return str(run["error"])
    if "pass_ms_p50" in run:
        return f"{run['pass_ms_p50']:.3f} ms per agent pass"
    return f"put p50 {run['put_p50']:.3f} ms"


Results = dict[str, dict[str, list[dict[str, Any]]]]


def schedule(
    reps: int,
    by_variant: dict[str, list[str]],
    run: Callable[[str, str], dict[str, Any]],
    broken: dict[str, str],
    status: Callable[[dict[str, Any]], str],
) -> Results:
    """Every (variant, store) ``reps`` times, each by ``run(store, variant)`` unless the
    store is ``broken``; variant -> store -> the runs' results, each logged as it ends."""
    results: Results = {v: {} for v in by_variant}
    # repetitions are the outer loop so slow drift in machine load hits every store alike
    for rep in range(1, reps + 1):
        for variant, stores in by_variant.items():
            for store in stores:
                if store in broken:
                    result = {"store": store, "variant": variant, "error": broken[store]}
                else:
                    result = run(store, variant)
                results[variant].setdefault(store, []).append(result)
                _log(f"rep {rep}/{reps} {variant:<8} {store:<18} {status(result)}")
    return results


def peer_versions(results: Results) -> dict[str, str]:
    """The package versions the runs reported (the peers')."""
    versions: dict[str, str] = {}
    for by_store in results.values():
        for runs in by_store.values():
            for run in runs:
                versions.update(run.get("versions", {}))
    return versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(ALL_VARIANTS))
    parser.add_argument(
        "--stores",
        help="comma-separated; default: every store whose services are configured",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write every run's raw results here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    stores = [s for s in args.stores.split(",") if s] if args.stores else default_stores()
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    unknown += [s for s in stores if s not in ALL_STORES]
    if unknown or args.reps < 1:
        parser.error(
            f"unknown variant/store {unknown} (variants: {', '.join(ALL_VARIANTS)}; "
            f"stores: {', '.join(ALL_STORES)})"
        )
    # the agent variant drives our Agent: our stores only
    agent_pool = OUR_STORES if args.stores else AGENT_STORES
    by_variant = {v: [s for s in stores if v != AGENT or s in agent_pool] for v in variants}

    broken = ensure_peers(stores)
    started = time.perf_counter()
    results = schedule(args.reps, by_variant, run_child, broken, _status)
    versions = peer_versions(results)
    print(
        f"# checkpoint stores, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; SQLite {sqlite3.sqlite_version}; "
        f"loadavg {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all"
    )
    if versions:
        print("# peers: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    print(f"# each figure: median of {args.reps} fresh-process runs (min{DASH}max)\n")
    for variant in variants:
        if variant == AGENT:
            print(report_agent(by_variant[variant], results[variant]) + "\n")
        else:
            print(report(variant, by_variant[variant], results[variant]) + "\n")
    if any(v in VARIANTS for v in variants):
        print(report_embedded_targets(results) + "\n")
        print(report_targets(results) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"reps": args.reps, "results": results}, indent=1))


def _child() -> None:
    make: Callable[[str, Path], Adapter] = LoomflowAdapter
    run: Measure = run_variant
    child_main(
        make,
        _our_versions,
        variants=ALL_VARIANTS,
        run=run,
        command=[sys.executable, "-m", "bench.checkpoints", "--child"],
    )


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.argv.remove("--child")
        _child()
    else:
        main()
