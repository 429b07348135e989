"""``loomflow stats``: the tables' totals are the sums over the events in the log.

The expected sums are computed here from the log itself (the SQLite rows, or the Kafka
topic's records, read as plain JSON), not with the aggregation code under test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from loomflow import Agent, Message, Tuning
from loomflow.cli import main
from loomflow.errors import ModelError
from loomflow.models import ScriptedModel
from loomflow.runtime import SqliteRuntime
from loomflow.schemas import Role

TOKENS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens")


def lookup(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 709000"


def note(text: str) -> str:
    """Write a note."""
    return "noted"


def _script(messages: Sequence[Message]) -> Message | str:
    """Call lookup, then note, then answer: two tool calls per prompt."""
    last = messages[-1]
    if last.role is Role.USER:
        return ScriptedModel.tool_call("lookup", city="Oslo")
    if last.role is Role.TOOL and messages[-2].tool_calls[0].name == "lookup":
        return ScriptedModel.tool_call("note", text="Oslo is large")
    return "Oslo has 709000 people."


async def record_runs(agent_runtime: Any, *, users: Iterable[str] = ("ada", "bob")) -> None:
    """Runs of two models for two users with tool calls, a resumed session that compacts,
    and a run that fails."""
    for k, user in enumerate(users):
        for name in ("haiku-ish", "opus-ish"):
            model = ScriptedModel(_script, name=name, latency=0.002 * (k + 1))
            agent = Agent("x", model=model, runtime=agent_runtime, tools=[lookup, note])
            first = await agent.run("How many people live in Oslo?", user_id=user)
        compacting = Agent(
            "x",
            model=ScriptedModel(_script, name="opus-ish"),
            runtime=agent_runtime,
            tools=[lookup, note],
            tuning=Tuning(checkpoint=True, auto_compact_at_tokens=1, compact_keep_messages=2),
        )
        await compacting.run("And Bergen?", session_id=first.session_id, user_id=user)
    broken = Agent("x", model=ScriptedModel([], name="haiku-ish"), runtime=agent_runtime)
    with pytest.raises(ModelError):
        await broken.run("go", user_id="bob")


def expected_sums(events: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Totals straight from (type, payload JSON) pairs: what stats must report."""
    sums: Counter[str] = Counter()
    cost = 0.0
    per_model: Counter[str] = Counter()
    for kind, payload in events:
        if kind in ("run.started", "run.finished", "run.failed"):
            sums[{"started": "runs_started", "finished": "runs_finished"}.get(
                kind.split(".")[1], "runs_failed")] += 1  # fmt: skip
        if kind not in ("turn.appended", "transcript.compacted"):
            continue
        usage = payload.get("usage", {})
        for field in TOKENS:
            sums[field] += usage.get(field, 0)
            per_model[payload.get("model", "(unknown)")] += usage.get(field, 0)
        cost += usage.get("cost_usd", 0.0)
        if kind == "transcript.compacted" or payload.get("model_call"):
            sums["model_calls"] += 1
        if payload.get("model_call"):
            sums["turns"] += 1
        # a compaction's messages are the transcript again, not new calls
        for message in payload.get("messages", []) if kind == "turn.appended" else []:
            if message["role"] == "assistant":
                sums["tool_calls"] += len(message.get("tool_calls", []))
    return {
        **{k: v for k, v in sums.items() if v},
        "cost_usd": round(cost, 10),
        "per_model_tokens": {k: v for k, v in per_model.items() if v},
    }


def log_events(journal: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every row of the journal's log that decodes as JSON, as (type, payload)."""
    out = []
    with sqlite3.connect(journal) as conn:
        for kind, payload in conn.execute("SELECT type, payload FROM loomflow_events"):
            try:
                out.append((kind, orjson.loads(payload)))
            except orjson.JSONDecodeError:
                continue
    return out


def reported(data: dict[str, Any]) -> dict[str, Any]:
    """The same figures from ``loomflow stats --json``."""
    totals = data["totals"]
    keys = ("runs_started", "runs_finished", "runs_failed", "turns", "model_calls", *TOKENS)
    return {
        **{k: totals[k] for k in (*keys, "tool_calls") if totals[k]},
        "cost_usd": round(totals["cost_usd"], 10),
        "per_model_tokens": {
            row["model"]: sum(row[t] for t in TOKENS) for row in data["rows"] if "model" in row
        },
    }


def stats_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["stats", "--json", *args]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Path]:
    path = tmp_path / "journal.db"
    runtime = SqliteRuntime(path)
    try:
        await record_runs(runtime)
    finally:
        await runtime.close()
    yield path


def test_stats_totals_are_the_sums_over_the_journals_events(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = expected_sums(log_events(journal))
    # the runs really did what the totals are checked on
    assert expected["runs_failed"] == 1 and expected["tool_calls"] == 12
    assert expected["model_calls"] > expected["turns"]  # two compactions
    data = stats_json(capsys, "--db", str(journal))
    assert reported(data) == expected
    assert (journal.parent / "journal.stats.db").exists()

    by_user = stats_json(capsys, "--db", str(journal), "--by", "user")
    assert {row["user"] for row in by_user["rows"]} == {"ada", "bob"}
    assert by_user["totals"] == data["totals"]
    assert all(row["latency_p95_ms"] > 0 for row in by_user["rows"])
    assert data["totals"]["tools"] == {"lookup": 6, "note": 6}

    # again: nothing new in the log, nothing added
    assert stats_json(capsys, "--db", str(journal))["totals"] == data["totals"]

    # the table a person reads: one row per model, and the totals
    assert main(["stats", "--db", str(journal)]) == 0
    out = capsys.readouterr().out
    assert "haiku-ish" in out and "opus-ish" in out and "lookup" in out
    total_line = next(line for line in out.splitlines() if line.strip().startswith("total"))
    assert f"{expected['cost_usd']:,.6f}" in total_line


def test_new_runs_are_added_to_the_tables_incrementally(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = stats_json(capsys, "--db", str(journal))
    asyncio.run(_more_runs(journal))
    data = stats_json(capsys, "--db", str(journal))
    assert reported(data) == expected_sums(log_events(journal))
    assert data["totals"]["runs_started"] > before["totals"]["runs_started"]


async def _more_runs(journal: Path) -> None:
    runtime = SqliteRuntime(journal)
    try:
        await record_runs(runtime, users=("cy",))
    finally:
        await runtime.close()


def _insert_row(journal: Path, kind: str, payload: str, **envelope: Any) -> int:
    """Put a row into the log behind the store's back; return its position."""
    row = {
        "user_id": "ada",
        "session_id": "forged",
        "seq": 1,
        "event_id": "evt_forged",
        "run_id": "run_forged",
        "epoch": 1,
        "v": 1,
        "at": "2026-12-01T09:00:00+00:00",
        **envelope,
    }
    with sqlite3.connect(journal) as conn:
        cursor = conn.execute(
            "INSERT INTO loomflow_events (user_id, session_id, seq, type, event_id, run_id, "
            "epoch, v, at, payload) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (*(row[k] for k in ("user_id", "session_id", "seq")), kind,
             *(row[k] for k in ("event_id", "run_id", "epoch", "v", "at")), payload),
        )  # fmt: skip
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def test_a_row_that_does_not_decode_and_a_forged_event_are_skipped_with_their_reasons(
    journal: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    genuine = expected_sums(log_events(journal))
    garbled = _insert_row(journal, "turn.appended", "{not json", session_id="garbled")
    # a writer that lost the session (epoch 0 < 1) reporting a huge bill
    with sqlite3.connect(journal) as conn:
        session, seq = conn.execute(
            "SELECT session_id, max(seq) FROM loomflow_events WHERE user_id = 'bob' "
            "GROUP BY session_id LIMIT 1"
        ).fetchone()
    forged = {
        "messages": [{"role": "assistant", "content": "pay me"}],
        "usage": {"input_tokens": 10**9, "cost_usd": 10_000.0},
        "model_call": True,
        "model": "opus-ish",
    }
    stale = _insert_row(
        journal,
        "turn.appended",
        json.dumps(forged),
        user_id="bob",
        session_id=session,
        seq=seq + 1,
        epoch=0,
    )
    # and a run after them, so the bad rows sit in the middle of the log
    asyncio.run(_one_more_run(journal))

    with caplog.at_level(logging.WARNING, logger="loomflow.processors.stats_db"):
        data = stats_json(capsys, "--db", str(journal))
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"log record {garbled} skipped: " in m for m in messages), messages
    assert (
        f"stats: log record {stale} skipped: session {session!r} (user 'bob') seq {seq + 1}: "
        "writer epoch 0 is older than 1" in messages
    )
    assert data["skipped"] == {"undecodable": 1, "refused": 1}
    everything = log_events(journal)
    genuine_now = expected_sums(e for e in everything if e[1] != forged)
    assert reported(data) == genuine_now
    assert genuine_now["runs_started"] == genuine["runs_started"] + 1  # the later run counted

    # the next update neither counts them again nor stops at them
    assert stats_json(capsys, "--db", str(journal))["skipped"] == data["skipped"]
    assert main(["stats", "--db", str(journal)]) == 0
    assert "records not counted: 1 refused, 1 undecodable" in capsys.readouterr().out


async def _one_more_run(journal: Path) -> None:
    runtime = SqliteRuntime(journal)
    try:
        model = ScriptedModel(_script, name="haiku-ish")
        await Agent("x", model=model, runtime=runtime, tools=[lookup, note]).run("go")
    finally:
        await runtime.close()


def test_a_period_without_runs_says_so_and_is_not_an_error(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", "--db", str(journal), "--since", "2099-01-01"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"no runs since 2099-01-01T00:00+00:00 in journal {journal}"
    )
    assert main(["stats", "--db", str(journal), "--since", "30m"]) == 0
    assert "haiku-ish" in capsys.readouterr().out  # the runs of the last minutes
    assert main(["stats", "--db", str(tmp_path / "missing.db")]) == 1
    assert "no journal at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["stats", "--db", str(journal), "--since", "yesterday"])
    assert "neither a date or time" in capsys.readouterr().err


def test_the_stats_database_can_live_elsewhere(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "tables" / "mine.db"
    elsewhere.parent.mkdir()
    data = stats_json(capsys, "--db", str(journal), "--stats-db", str(elsewhere))
    assert elsewhere.exists() and not (journal.parent / "journal.stats.db").exists()
    assert reported(data) == expected_sums(log_events(journal))


def test_the_command_runs_as_a_user_runs_it(journal: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "loomflow"), "stats", "--db", str(journal)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "per model" in done.stdout and "opus-ish" in done.stdout
