"""Runs to count and the sums to expect: shared by the stats and report tests.

The expected sums are computed from the log itself (the SQLite rows, or the Kafka topic's
records, read as plain JSON), not with the aggregation code under test.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from loomflow import Agent, Message, Tuning
from loomflow.errors import ModelError
from loomflow.models import ScriptedModel
from loomflow.schemas import Role

TOKENS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens")


def lookup(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 709000"


def note(text: str) -> str:
    """Write a note."""
    return "noted"


def script(messages: Sequence[Message]) -> Message | str:
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
            model = ScriptedModel(script, name=name, latency=0.002 * (k + 1))
            agent = Agent("x", model=model, runtime=agent_runtime, tools=[lookup, note])
            first = await agent.run("How many people live in Oslo?", user_id=user)
        compacting = Agent(
            "x",
            model=ScriptedModel(script, name="opus-ish"),
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
    """Every row of the journal's log that decodes as JSON, as (type, payload); a large
    payload is stored as its zlib stream (a BLOB)."""
    out = []
    with sqlite3.connect(journal) as conn:
        for kind, payload in conn.execute("SELECT type, payload FROM loomflow_events"):
            try:
                text = zlib.decompress(payload) if isinstance(payload, bytes) else payload
                out.append((kind, orjson.loads(text)))
            except (orjson.JSONDecodeError, zlib.error):
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
