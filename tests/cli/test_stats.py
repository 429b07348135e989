"""``loomflow stats``: the tables' totals are the sums over the events in the log, on the
embedded journal and on Kafka (see tests.support.analytics for how the sums are taken)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from loomflow import Agent
from loomflow.analytics.app import changelog_topic, read_stats
from loomflow.analytics.tally import Stats
from loomflow.cli import main
from loomflow.errors import StoreError
from loomflow.log.reader import committed_offsets
from loomflow.models import ScriptedModel
from loomflow.runtime import ANY_USER, SqliteRuntime
from loomflow.runtime.postgres import PostgresStore
from tests.support.analytics import (
    expected_sums,
    log_events,
    lookup,
    note,
    record_runs,
    reported,
    script,
)
from tests.support.kafka_env import KafkaEnv, ProcessorProcess
from tests.support.readme import commands
from tests.support.waiting import eventually


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

    with caplog.at_level(logging.WARNING, logger="loomflow.analytics.embedded"):
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
        model = ScriptedModel(script, name="haiku-ish")
        await Agent("x", model=model, runtime=runtime, tools=[lookup, note]).run("go")
    finally:
        await runtime.close()


def test_a_period_without_runs_says_so_and_is_not_an_error(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", "--db", str(journal), "--since", "2099-01-01"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"no runs since 2099-01-01 00:00 UTC (whole hours) in journal {journal}"
    )
    assert main(["stats", "--db", str(journal), "--since", "30m"]) == 0
    assert "haiku-ish" in capsys.readouterr().out  # the runs of the last minutes
    assert main(["stats", "--db", str(tmp_path / "missing.db")]) == 1
    assert "no journal at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["stats", "--db", str(journal), "--since", "yesterday"])
    assert "is neither an ISO date" in capsys.readouterr().err


def test_since_names_the_whole_hours_the_tables_cover(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the tables are hourly: 14:56 is counted from 14:00, and the output says so
    assert main(["stats", "--db", str(journal), "--since", "2099-01-01T14:56"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"no runs since 2099-01-01 14:00 UTC (whole hours) in journal {journal}"
    )
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    when = (hour + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M")
    assert main(["stats", "--db", str(journal), "--since", when]) == 0
    title = capsys.readouterr().out.strip().splitlines()[0]
    assert title == f"per model · journal {journal} · since {hour:%Y-%m-%d %H:%M} UTC (whole hours)"
    data = stats_json(capsys, "--db", str(journal), "--since", "2099-01-01T14:56+01:00")
    assert data["since"] == "2099-01-01T13:00:00+00:00" and data["rows"] == []
    assert stats_json(capsys, "--db", str(journal))["since"] is None


def test_the_stats_database_can_live_elsewhere(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "tables" / "mine.db"
    elsewhere.parent.mkdir()
    data = stats_json(capsys, "--db", str(journal), "--stats-db", str(elsewhere))
    assert elsewhere.exists() and not (journal.parent / "journal.stats.db").exists()
    assert reported(data) == expected_sums(log_events(journal))


def _files(directory: Path) -> dict[str, bytes | None]:
    """The names in ``directory`` with the bytes of its files: a refused command changes
    none of them and adds none."""
    return {p.name: p.read_bytes() if p.is_file() else None for p in directory.iterdir()}


@pytest.mark.parametrize("kind", ["other tables", "0 bytes", "text", "directory", "missing"])
@pytest.mark.parametrize("command", ["stats", "report"])
def test_a_db_that_is_not_a_loomflow_log_is_refused_and_nothing_is_made_beside_it(
    command: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "notes.db"
    if kind == "other tables":
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("create table t(x)")
    elif kind == "0 bytes":
        db.touch()
    elif kind == "text":
        db.write_text("my notes\n")
    elif kind == "directory":
        db.mkdir()
    before = _files(tmp_path)
    page = ["--html", str(tmp_path / "page.html")] if command == "report" else []
    capsys.readouterr()
    assert main([command, "--db", str(db), *page]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"loomflow {command}: ") and str(db) in err, err
    assert _files(tmp_path) == before  # no notes.stats.db, no page, the file as it was


def test_a_stats_db_that_holds_other_tables_is_refused_before_anything_is_written(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--db", str(journal)]) == 0
    foreign = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(foreign)) as conn:
        conn.execute("create table t(x)")

    def others() -> dict[str, bytes | None]:  # opening the journal to read it may touch it
        return {k: v for k, v in _files(tmp_path).items() if not k.startswith("journal.db")}

    def tables(path: Path) -> list[str]:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            return [n for (n,) in conn.execute("SELECT name FROM sqlite_master ORDER BY name")]

    journal_tables = tables(journal)
    for target in (journal, tmp_path / "journal.audit.db", foreign):
        before = others()
        capsys.readouterr()
        assert main(["stats", "--db", str(journal), "--stats-db", str(target)]) == 1
        err = capsys.readouterr().err
        assert f"{target} is not a loomflow stats database: it holds other tables" in err, err
        assert others() == before and tables(journal) == journal_tables


def test_the_command_runs_as_a_user_runs_it(journal: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "loomflow"), "stats", "--db", str(journal)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "per model" in done.stdout and "opus-ish" in done.stdout


@pytest.mark.parametrize("command", [["stats"], ["report", "--html", "page.html"]])
def test_with_kafka_down_the_error_is_one_clear_line_without_aiokafkas_logging(
    command: list[str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    env["LOOMFLOW_KAFKA_BOOTSTRAP"] = "127.0.0.1:1"  # nothing listens there
    done = subprocess.run(
        [str(Path(sys.executable).parent / "loomflow"), *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()  # not aiokafka's "Unable connect to ..." first
    assert line.startswith(f"loomflow {command[0]}: Kafka at 127.0.0.1:1 is not reachable")
    assert not (tmp_path / "page.html").exists()


# --- at scale: `loomflow analytics` on Kafka -------------------------------------------


@pytest.fixture
async def kafka_env() -> AsyncIterator[KafkaEnv]:
    env = await KafkaEnv.create(partitions=2)
    yield env
    await env.close()
    # the environment deleted the app's own topics (its table's changelog) too
    assert changelog_topic(env.settings).startswith(f"{env.settings.analytics_group}-")


def _readme_commands() -> tuple[list[str], list[str]]:
    """``loomflow analytics`` as the README starts it (a service), and the ``loomflow
    stats`` it then runs."""
    serve, read = commands("loomflow analytics")
    assert serve.argv == ["loomflow", "analytics"] and serve.service
    assert read.argv == ["loomflow", "stats", "--by", "user"]
    return [str(Path(sys.executable).parent / "loomflow"), *serve.argv[1:]], [
        str(Path(sys.executable).parent / "loomflow"),
        *read.argv[1:],
    ]


async def _topic_events(env: KafkaEnv) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of the events topic, as (key, value)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=env.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(env.topics.events, p) for p in range(env.topics.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[tuple[bytes | None, bytes | None]] = []

        async def caught_up() -> bool:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend((r.key, r.value) for r in batch)
            return all([await consumer.position(tp) >= ends[tp] for tp in tps])

        await eventually(caught_up, what="the whole events topic to be read")
        return records
    finally:
        await consumer.stop()


@pytest.mark.kafka
async def test_the_analytics_app_on_kafka_materialises_the_sums_over_the_topic(
    kafka_env: KafkaEnv, tmp_path: Path
) -> None:
    env = kafka_env
    serve, read = _readme_commands()
    analytics = ProcessorProcess(env.variables(), argv=serve)
    try:
        await env.start_projector()  # KafkaRuntime's runs wait for their claim to be applied
        runtime = env.runtime()
        try:
            await record_runs(runtime)
        finally:
            await runtime.close()
        # a record that does not decode, one filed under another session's key, and a
        # stale writer's turn with a huge bill: none of them may count, none may stop it
        genuine = await _topic_events(env)
        bob = next(orjson.loads(v) for k, v in genuine if v and orjson.loads(v)["user_id"] == "bob")
        forged = {
            "user_id": "bob",
            "session_id": bob["session_id"],
            "run_id": "run_forged",
            "seq": 10_000,
            "epoch": 0,
            "type": "turn.appended",
            "payload": {
                "messages": [{"role": "assistant", "content": "pay me"}],
                "usage": {"input_tokens": 10**9, "cost_usd": 10_000.0},
                "model_call": True,
            },
        }
        producer = AIOKafkaProducer(bootstrap_servers=env.bootstrap)
        await producer.start()
        try:
            key = f"bob/{bob['session_id']}".encode()
            await producer.send_and_wait(env.topics.events, b"\xff not json", key=key)
            await producer.send_and_wait(env.topics.events, orjson.dumps(forged), key=b"/x")
            await producer.send_and_wait(env.topics.events, orjson.dumps(forged), key=key)
        finally:
            await producer.stop()
        # ...and a run after them
        runtime = env.runtime()
        try:
            await record_runs(runtime, users=("cy",))
        finally:
            await runtime.close()

        everything = await _topic_events(env)
        expected = expected_sums(
            (e["type"], e["payload"])
            for e in (orjson.loads(v) for k, v in everything if v and v.startswith(b"{"))
            if e.get("run_id") != "run_forged"
        )
        assert expected["runs_started"] == 11 and expected["tool_calls"] == 18

        async def materialised() -> dict[str, Any] | None:
            assert analytics.poll() is None, analytics.output()[-3000:]
            try:
                stats = await read_stats(env.settings)
            except StoreError:
                return None  # the app has not created its table yet
            got = _reported_stats(stats)
            return got if got == expected and sum(stats.skipped.values()) == 3 else None

        try:
            await eventually(materialised, within=120, what="the tables to hold the sums")
        except AssertionError as exc:
            with contextlib.suppress(StoreError):
                exc.add_note(f"{_reported_stats(await read_stats(env.settings))} != {expected}")
            exc.add_note(analytics.output()[-3000:])
            raise
        stats = await read_stats(env.settings)
        assert dict(stats.skipped) == {"undecodable": 1, "refused": 2}
        assert analytics.poll() is None, analytics.output()[-3000:]

        # its own group, beside the projector's, has counted the whole topic
        async def committed() -> bool:
            offsets = await committed_offsets(env.settings, env.settings.analytics_group)
            return sum(offsets.values()) == len(everything)

        await eventually(committed, what="the analytics group to commit the whole topic")

        # what a user runs: `loomflow stats` with no --db reads the same tables
        done = await asyncio.to_thread(
            subprocess.run,
            [str(Path(sys.executable).parent / "loomflow"), "stats", "--json", "--by", "user"],
            env=_user_env(env),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert {r["user"] for r in data["rows"]} == {"ada", "bob", "cy"}
        assert {k: v for k, v in reported(data).items() if k != "per_model_tokens"} == {
            k: v for k, v in expected.items() if k != "per_model_tokens"
        }
        # and as the README runs it: the table, a row per user
        table = await asyncio.to_thread(
            subprocess.run,
            read,
            env=dict(_user_env(env), COLUMNS="200"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert table.returncode == 0, table.stderr
        rows = {line.split()[0] for line in table.stdout.splitlines() if line.strip()}
        assert {"ada", "bob", "cy"} <= rows, table.stdout
        await _report_at_scale(env, everything, tmp_path / "report.html")
        output = analytics.output()
        assert "does not decode" in output or "invalid event" in output, output[-3000:]
        assert "is not its event's session" in output and "writer epoch 0" in output
    finally:
        output = analytics.stop()
    assert "Traceback" not in output, output[-3000:]


async def _report_at_scale(
    env: KafkaEnv, records: list[tuple[bytes | None, bytes | None]], page: Path
) -> None:
    """`loomflow report` without --db: the tables the app keeps, and the failed runs with
    their errors and transcripts from the PostgreSQL read model the projector keeps."""
    failed = [
        e
        for e in (orjson.loads(v) for _, v in records if v and v.startswith(b"{"))
        if e["type"] == "run.failed"
    ]
    assert len(failed) == 2  # bob's, then cy's
    store = PostgresStore.from_settings(env.settings, max_size=1, create=False)
    try:

        async def projected() -> bool:
            rows = await store.list_sessions(user_id=ANY_USER, status="failed")
            return len(rows) == len(failed)

        await eventually(projected, what="the projector to apply the failed runs")
    finally:
        await store.close()
    done = await asyncio.to_thread(
        subprocess.run,
        [str(Path(sys.executable).parent / "loomflow"), "report", "--html", str(page)],
        env=_user_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = await asyncio.to_thread(page.read_text)
    assert f"read model: PostgreSQL schema {env.schema}" in text
    assert env.dsn not in text  # its password with it
    table = text[text.index('<table id="failed-runs">') :]
    table = table[: table.index("</table>")]
    for event in failed:
        error = f"{event['payload']['error_type']}: {event['payload']['error']}"
        anchor = f"session/{event['user_id']}/{event['session_id']}"
        assert html.escape(error) in table and f'href="#{anchor}"' in table, event
        assert f'<section class="transcript" id="{anchor}">' in text, anchor


def _reported_stats(stats: Stats) -> dict[str, Any]:
    """``reported`` of the library's Stats, as ``stats --json`` would print them."""
    from loomflow.analytics.tally import stats_json

    return reported(stats_json(stats, "model"))


def _user_env(env: KafkaEnv) -> dict[str, str]:
    variables = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    variables.update(env.variables(), NO_COLOR="1")
    return variables
