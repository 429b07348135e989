"""``loomflow otel --db journal.db`` against a local OTLP/HTTP receiver: a run killed in a
model call (SIGKILL, in its own process) and resumed gives one trace holding each span the
log records once, however often and whenever the command runs; a receiver that is down
loses nothing and gets nothing twice once it is up."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from loomflow.log.reader import sqlite_reader
from loomflow.otel.state import SqliteState
from loomflow.runtime import SqliteRuntime
from tests.support.kafka_env import ROOT
from tests.support.otlp import (
    README_KEYS,
    OtlpReceiver,
    Received,
    free_port,
    log_events,
    recorded_spans,
    tree,
)
from tests.support.readme import readme_block
from tests.support.scenario import Research
from tests.support.waiting import eventually, kill_once_hanging

BIN = Path(sys.executable).parent


def _env(endpoint: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOMFLOW_", "OTEL_"))}
    return dict(env, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **more)


def _otel(cwd: Path, endpoint: str, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "loomflow"), "otel", "--db", "journal.db", *options],
        cwd=cwd,
        env=_env(endpoint, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _crash(cwd: Path) -> None:
    """The research agent's run on session s1 of journal.db, killed inside its fifth model
    call (the second pass: a checkpoint at turn 3, then a model call and a tool's result)."""
    worker = [sys.executable, "-m", "tests.support.crash_worker", str(cwd / "journal.db")]
    victim = subprocess.Popen(
        [*worker, "s1", str(cwd / "calls.log"), "--hang-at", "5", "--passes", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    asyncio.run(kill_once_hanging(victim))


def _resume(cwd: Path) -> None:
    async def resume() -> None:
        runtime = SqliteRuntime(cwd / "journal.db")
        try:
            result = await Research(passes=2).agent(runtime).resume(session_id="s1")
            assert result.stop_reason == "completed" and result.restored_turns == 4
        finally:
            await runtime.close()

    asyncio.run(resume())


def _recorded(cwd: Path) -> set[str]:
    return recorded_spans(asyncio.run(log_events(sqlite_reader(cwd / "journal.db"))))


def _position(cwd: Path) -> dict[int, int] | None:
    async def read() -> dict[int, int] | None:
        async with SqliteState(cwd / "journal.otel.db") as state:
            return await state.position()

    return asyncio.run(read())


def _masked(text: str) -> str:
    """A drawn trace with its ids, numbers and line breaks left open."""
    text = re.sub(r"\b[0-9a-f]{32}\b", "<trace>", text)
    text = re.sub(r"\b(run|sess|ckpt|evt)[0-9a-z]{20,}", r"\1<id>", text)
    return " ".join(re.sub(r"\d+", "<n>", text).split())


def _runs(spans: list[Received]) -> list[Received]:
    return sorted((s for s in spans if s.parent_id is None), key=lambda s: s.start_ns)


def test_a_crashed_and_resumed_run_is_one_trace_with_each_span_once(tmp_path: Path) -> None:
    _crash(tmp_path)
    with OtlpReceiver() as receiver:
        # the run is in flight (its process died): its calls are sent, its own span not yet
        done = _otel(tmp_path, receiver.url)
        assert done.returncode == 0, done.stderr
        assert "sent 7 spans (0 runs, 1 trace)" in done.stdout, done.stdout
        assert _runs(receiver.received()) == []
        _resume(tmp_path)
        done = _otel(tmp_path, receiver.url)
        assert done.returncode == 0, done.stderr
        assert "sent 5 spans (2 runs, 1 trace)" in done.stdout, done.stdout
        again = _otel(tmp_path, receiver.url)
        assert "sent 0 spans (0 runs, 0 traces) from 0 new records" in again.stdout, again
        spans = receiver.received()

    assert receiver.duplicates() == []
    assert {s.span_id for s in spans} == _recorded(tmp_path)  # every recorded span, once
    assert len({s.trace_id for s in spans}) == 1  # the crash and the resume: one trace
    crashed, resumed = _runs(spans)
    assert crashed.attributes["loomflow.run.outcome"] == "interrupted"
    assert crashed.status == 2  # error: it never recorded its end
    assert [e[0] for e in crashed.events] == [
        "gen_ai.agent.checkpointed",
        "loomflow.run.taken_over",
    ]
    assert crashed.end_ns == resumed.start_ns  # the take-over is the record of its end
    assert resumed.attributes["loomflow.run.outcome"] == "finished"
    assert resumed.events[0][0] == "gen_ai.agent.resumed"
    assert resumed.events[0][2]["loomflow.resumed.after"] == "interrupted"
    links = {attributes["loomflow.link.type"]: span_id for _, span_id, attributes in resumed.links}
    assert links["continues"] == crashed.span_id
    # the fourth model call was recorded after the checkpoint: replayed, not called again
    (fourth,) = [s for s in spans if s.attributes.get("loomflow.turn") == 4]
    assert links["replayed"] == fourth.span_id and fourth.parent_id == crashed.span_id
    chats = [s for s in spans if s.name == "chat scripted"]
    assert sorted(s.attributes["loomflow.turn"] for s in chats) == [1, 2, 3, 4, 5, 6]
    assert {s.parent_id for s in chats if s.attributes["loomflow.turn"] > 4} == {resumed.span_id}
    # each run's usage is its own model calls', the replayed one billed once, to the first
    for run in (crashed, resumed):
        own = [s for s in chats if s.parent_id == run.span_id]
        assert run.attributes["loomflow.run.model_calls"] == len(own)
        assert run.attributes["gen_ai.usage.output_tokens"] == sum(
            s.attributes["gen_ai.usage.output_tokens"] for s in own
        )
    tools = [s.name for s in sorted(spans, key=lambda s: s.start_ns) if s.name.startswith("exec")]
    assert [name.removeprefix("execute_tool ") for name in tools] == ["lookup", "note"] * 2
    assert {s.resource["service.name"] for s in spans} == {"loomflow"}
    # the README's example is this trace
    assert _masked(tree(spans, README_KEYS)) == _masked(readme_block("trace ", "text"))


def test_an_endpoint_that_is_down_loses_nothing_and_gets_nothing_twice(tmp_path: Path) -> None:
    _crash(tmp_path)
    _resume(tmp_path)
    port = free_port()
    down = f"http://127.0.0.1:{port}"
    failed = _otel(tmp_path, down, "--retry-for", "1", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    assert failed.returncode == 3, failed
    assert failed.stdout == "" and len(failed.stderr.splitlines()) == 1, failed.stderr
    assert (
        f"{down}/v1/traces did not accept 12 spans ([Errno 111] Connection refused)"
        in failed.stderr
    )
    assert "nothing is lost" in failed.stderr
    assert _position(tmp_path) is None  # the position did not move past what was not sent
    with OtlpReceiver(port) as receiver:
        done = _otel(tmp_path, down)
        assert done.returncode == 0 and "sent 12 spans" in done.stdout, done
        assert "sent 0 spans" in _otel(tmp_path, down).stdout
    assert receiver.duplicates() == []
    assert {s.span_id for s in receiver.received()} == _recorded(tmp_path)


def test_following_sends_what_waited_once_the_endpoint_is_up(tmp_path: Path) -> None:
    _crash(tmp_path)
    port = free_port()
    follower = subprocess.Popen(
        [str(BIN / "loomflow"), "otel", "--db", "journal.db", "--follow"],
        cwd=tmp_path,
        env=_env(f"http://127.0.0.1:{port}", OTEL_EXPORTER_OTLP_TIMEOUT="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stderr is not None
        started = follower.stderr.readline()
        assert "sending the runs of SQLite log journal.db" in started, started
        retrying = follower.stderr.readline()
        assert "did not accept 7 spans" in retrying and "sending again" in retrying, retrying
        assert _position(tmp_path) is None
        with OtlpReceiver(port) as receiver:
            _resume(tmp_path)  # appended while the follower waits to send the first spans
            expected = _recorded(tmp_path)

            def arrived() -> bool:
                return {s.span_id for s in receiver.received()} >= expected

            asyncio.run(eventually(arrived, within=60, what="every span to arrive"))
            follower.send_signal(signal.SIGINT)
            out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert "sent 12 spans (2 runs, 1 trace)" in out, out
    assert receiver.duplicates() == []
    assert {s.span_id for s in receiver.received()} == expected
    assert _position(tmp_path) is not None
