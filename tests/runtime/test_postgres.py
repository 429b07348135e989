"""What only PostgreSQL has to prove: migrations, its own schema, racing pools, bad rows."""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from loomflow import Message
from loomflow.audit.auditor import Auditor, link_of
from loomflow.errors import (
    CorruptRecordError,
    InvalidEventError,
    SequenceConflictError,
    SessionErasedError,
    StaleWriterError,
    StoreError,
    StoreUnavailableError,
)
from loomflow.log.reader import sqlite_reader
from loomflow.projections import postgres as pg
from loomflow.projections.audit import PostgresTrail
from loomflow.projections.chain import chain
from loomflow.projections.fold import fold
from loomflow.projections.migrations import Migrations
from loomflow.projections.trail import entry_values
from loomflow.runtime import (
    ANY_USER,
    PostgresRuntime,
    PostgresStore,
    Scope,
    SessionWriter,
    SqliteStore,
)
from loomflow.runtime.writer import WritePolicy
from loomflow.schemas import (
    CheckpointsPruned,
    CheckpointWritten,
    Event,
    RunStarted,
    SessionCursor,
    SessionErased,
    StepRecorded,
    TurnAppended,
    Usage,
    new_id,
)
from loomflow.schemas.events import (
    CheckpointsPrunedPayload,
    CheckpointWrittenPayload,
    SessionErasedPayload,
    StepRecordedPayload,
    TurnAppendedPayload,
)
from loomflow.settings import Settings
from loomflow.testing import SessionLog, SqliteLog
from loomflow.testing._support import commit
from loomflow.testing.log import read_all
from tests.support.scenario import Research
from tests.support.services import postgres_dsn

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn() -> str:
    return postgres_dsn()


@pytest.fixture
async def schema(dsn: str) -> AsyncIterator[str]:
    name = f"lf_test_{secrets.token_hex(6)}"
    yield name
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


def _turn(writer: SessionWriter, text: str, offset: int = 0) -> TurnAppended:
    return writer.make(
        TurnAppended, TurnAppendedPayload(messages=[Message.user(text)]), offset=offset
    )


# --- migrations and the schema ---------------------------------------------------------


async def test_two_processes_migrating_at_once_both_succeed(dsn: str, schema: str) -> None:
    conns = [await asyncpg.connect(dsn) for _ in range(4)]
    try:
        await asyncio.gather(*(pg.migrate(conn, schema) for conn in conns))
        versions = await conns[0].fetch(f'SELECT version FROM "{schema}".schema_migrations')
        tables = await conns[0].fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
        )
    finally:
        for conn in conns:
            await conn.close()
    assert sorted(r["version"] for r in versions) == list(range(1, pg.SCHEMA_VERSION + 1))
    assert {r["table_name"] for r in tables} == {
        "events",
        "sessions",
        "checkpoints",
        "steps",
        "positions",
        "dead_letters",
        "processors",
        "schema_migrations",
        "audit_entries",
        "audit_rejects",
        "audit_sessions",
        "audit_digests",
        "otel_sessions",
    }


async def test_a_schema_from_a_newer_loomflow_is_refused(dsn: str, schema: str) -> None:
    runtime = await PostgresRuntime.connect(dsn, schema=schema)
    await runtime.close()
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'INSERT INTO "{schema}".schema_migrations (version) VALUES (99)')
    await conn.close()
    with pytest.raises(StoreError, match="upgrade loomflow"):
        await PostgresRuntime.connect(dsn, schema=schema)
    conn = await asyncpg.connect(dsn)
    try:  # a process that does not migrate (LOOMFLOW_AUTO_MIGRATE=false) says the same
        with pytest.raises(StoreError, match="upgrade loomflow"):
            await pg.check_version(conn, schema)
    finally:
        await conn.close()


async def test_a_schema_at_an_older_version_is_migrated_on_open(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        older = Migrations(pg.READ_MODEL.meta, pg.READ_MODEL.steps[:4])
        await pg.migrate(conn, schema, older)
        assert await pg.schema_version(conn, schema) == 4
        runtime = await PostgresRuntime.connect(dsn, schema=schema)
        await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
        await runtime.close()
        assert await pg.schema_version(conn, schema) == pg.SCHEMA_VERSION == 9
        control = await conn.fetchval(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = $1 "
            "AND table_name = 'sessions' AND column_name = 'control'",
            schema,
        )
        assert control == "json"  # step 5 ran
    finally:
        await conn.close()


async def _session_indexes(conn: asyncpg.Connection, schema: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'sessions'",
        schema,
    )
    return {r["indexname"] for r in rows}


async def test_a_schema_at_version_6_gets_the_listing_indexes_and_pages_its_sessions(
    dsn: str, schema: str
) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await pg.migrate(conn, schema, Migrations(pg.READ_MODEL.meta, pg.READ_MODEL.steps[:6]))
        old = {"sessions_updated", "sessions_user_updated"}
        assert old <= await _session_indexes(conn, schema)
        # sessions of two users written at version 6, two of them last active at one moment
        # (their rows only: the log's table has columns of later versions since)
        at = datetime(2026, 5, 6, 7, 8, 9, 654321, tzinfo=UTC)
        for user, session_id in (("ada", "s1"), (None, "s2"), ("ada", "s3")):
            claim = RunStarted(
                user_id=user, session_id=session_id, run_id="r", seq=1, epoch=1, at=at
            )
            row, _ = fold(None, claim)
            await pg.save_sessions(conn, schema, [row])
            at -= timedelta(microseconds=1) if session_id == "s2" else timedelta(0)
        runtime = await PostgresRuntime.connect(dsn, schema=schema)  # migrates it
        try:
            assert await pg.schema_version(conn, schema) == pg.SCHEMA_VERSION == 9
            indexes = await _session_indexes(conn, schema)
            assert {"sessions_listing", "sessions_user_listing"} <= indexes
            assert not old & indexes
            store = runtime.store
            assert isinstance(store, PostgresStore)
            everyone = await store.list_sessions(user_id=ANY_USER)
            ids = [(r.user_id, r.session_id) for r in everyone]
            assert ids == [(None, "s2"), ("ada", "s1"), ("ada", "s3")]
            for k in range(len(everyone)):
                after = SessionCursor.of(everyone[k])
                assert await store.list_sessions(user_id=ANY_USER, after=after) == everyone[k + 1 :]
            assert (await store.session_totals(user_id="ada")).sessions == 2
        finally:
            await runtime.close()
    finally:
        await conn.close()


async def test_a_runtime_refuses_to_write_into_a_read_model_that_kafka_feeds(
    dsn: str, schema: str
) -> None:
    """PostgresRuntime and ``loomflow processor`` share their default schema: a
    PostgresRuntime run beside a Kafka deployment wrote sessions that no log held (a
    rebuild, ``tail`` and the audit never saw them) and exited 0. A schema the projector
    records positions in is refused before the first write, so no model is called."""
    async with PostgresRuntime(dsn, schema=schema) as runtime:
        await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    settings = Settings(postgres_dsn=dsn, db_schema=schema)
    conn = await asyncpg.connect(dsn)
    try:  # as the projector of the default settings records what it consumed
        await pg.save_positions(
            conn, schema, settings.projector_group, settings.events_topic, {0: 42}
        )
    finally:
        await conn.close()
    research = Research(passes=1)
    async with PostgresRuntime(dsn, schema=schema) as runtime:
        with pytest.raises(StoreError, match=rf"schema '{schema}' .* read model of a Kafka log"):
            await research.agent(runtime).run("Research.", session_id="s2")
        assert research.models[0].calls == 0 and not research.tool_runs
        with pytest.raises(StoreError, match="write through the log with KafkaRuntime"):
            await runtime.store.prune(session_id="s1")
        assert await runtime.store.session(Scope("s1")) is not None  # reads still served
        assert await runtime.store.session(Scope("s2")) is None


async def test_a_schema_a_processor_reports_to_is_refused_before_it_applied_anything(
    dsn: str, schema: str
) -> None:
    """A processor that has started on a schema and applied nothing yet records no
    positions, but reports itself running: that schema is a Kafka log's read model too
    (a new user's trial wrote a PostgresRuntime session into it, exit 0)."""
    async with PostgresRuntime(dsn, schema=schema) as runtime:
        await runtime.store.setup()
    settings = Settings(postgres_dsn=dsn, db_schema=schema)
    conn = await asyncpg.connect(dsn)
    try:  # as `loomflow processor` reports itself once it has its partitions
        await pg.report_processor(
            conn, schema, settings.projector_group, settings.events_topic, "w1", [0, 1]
        )
    finally:
        await conn.close()
    async with PostgresRuntime(dsn, schema=schema) as runtime:
        with pytest.raises(StoreError, match=rf"consumers {settings.projector_group} of "):
            await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
        assert await runtime.store.session(Scope("s1")) is None


async def test_a_store_opened_only_to_inspect_never_creates_a_schema(dsn: str, schema: str) -> None:
    with pytest.raises(StoreError, match=f"no loomflow schema '{schema}'"):
        async with PostgresStore(dsn, schema=schema, create=False):
            pass
    conn = await asyncpg.connect(dsn)
    try:
        assert await pg.schema_version(conn, schema) == 0
        assert not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
    finally:
        await conn.close()
    async with PostgresRuntime(dsn, schema=schema) as runtime:
        await Research(passes=1).agent(runtime).run("Research.", session_id="s1")
    async with PostgresStore(dsn, schema=schema, create=False) as store:  # now it exists
        row = await store.session(Scope("s1"))
        assert row is not None and row.status == "finished"
        assert await store.consumed_topics() == []  # its own log, no Kafka consumer


@pytest.mark.parametrize("bad", ["", "Loomflow", "lf-test", "1lf", 'lf"; drop', "pg_lf", "x" * 49])
def test_schema_names_must_be_plain_identifiers(bad: str) -> None:
    with pytest.raises(ValueError, match="schema"):
        PostgresRuntime("postgresql://u@127.0.0.1/db", schema=bad)


async def test_everything_lives_in_its_own_schema_beside_other_tools(dsn: str) -> None:
    # a database of our own, so that "nothing in public" is about us alone
    database = f"lf_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(dsn)
    # template0: nobody connects to it, so creating from it never meets "being accessed"
    await admin.execute(f'CREATE DATABASE "{database}" TEMPLATE template0')
    own_dsn = urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))
    try:
        other = await asyncpg.connect(own_dsn)
        # what LangGraph's saver creates in public
        await other.execute(
            "CREATE TABLE public.checkpoints (thread_id text, checkpoint_ns text, "
            "checkpoint_id text, checkpoint jsonb, "
            "PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id))"
        )
        await other.execute("INSERT INTO public.checkpoints VALUES ('t1', '', 'c1', '{\"v\": 1}')")

        runtime = await PostgresRuntime.connect(own_dsn, max_checkpoints_per_session=50)
        agent = Research(passes=2).agent(runtime)
        await agent.run("Research.", session_id="s1")
        assert len(await agent.list_checkpoints("s1")) == 2
        await runtime.close()

        relations = await other.fetch(
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
        )
        theirs = await other.fetch("SELECT * FROM public.checkpoints")
        await other.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()
    assert {r["relname"] for r in relations if r["nspname"] == "public"} == {
        "checkpoints",
        "checkpoints_pkey",
    }
    ours = {r["relname"] for r in relations if r["nspname"] == "loomflow"}
    assert {"events", "sessions", "checkpoints", "steps", "schema_migrations"} <= ours
    assert {r["nspname"] for r in relations} == {"public", "loomflow"}
    assert [tuple(r.values()) for r in theirs] == [("t1", "", "c1", '{"v": 1}')]


# --- connecting ----------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_unreachable_server_is_a_clear_error_without_the_password() -> None:
    port = _closed_port()
    dsn = f"postgresql://loomflow:s3cret-pw@127.0.0.1:{port}/loomflow"
    with pytest.raises(StoreError) as raised:
        await PostgresRuntime.connect(dsn)
    message = str(raised.value)
    assert f"postgresql://loomflow@127.0.0.1:{port}/loomflow" in message
    assert "dev/postgres.sh start" in message
    assert "s3cret-pw" not in message

    lazy = PostgresRuntime(dsn)  # constructing does no I/O: the first use connects
    with pytest.raises(StoreError, match=r"dev/postgres\.sh start"):
        await lazy.list_checkpoints(Scope("s1"))
    await lazy.close()
    with pytest.raises(StoreError, match="closed"):
        await lazy.list_checkpoints(Scope("s1"))


def test_a_driver_reason_that_quotes_the_dsn_is_told_without_its_password() -> None:
    """What a connection that failed says (the store's, the audit's lock's): the
    driver's reason, with a password it quoted masked, retriable when the server is away."""
    dsn = "postgresql://loomflow:s3cret-pw@db.internal:5432/loomflow"
    exc = OSError(f"could not reach {dsn}")
    error = pg.connect_error(dsn, "db.internal:5432/loomflow", exc, "start it")
    assert str(error) == (
        "cannot connect to PostgreSQL at db.internal:5432/loomflow (OSError: could not reach "
        "postgresql://loomflow:***@db.internal:5432/loomflow); start it"
    )
    assert isinstance(error, StoreUnavailableError)


# --- concurrent writers --------------------------------------------------------------------


async def test_two_pools_racing_for_each_seq_lose_nothing(dsn: str, schema: str) -> None:
    first, second = (PostgresRuntime(dsn, schema=schema) for _ in range(2))
    scope = Scope("s1", "alice")
    run_id = new_id("run")
    # the same epoch in both: only the seq decides, as for two writers of one run
    writers = [
        SessionWriter(
            rt.store,
            scope,
            run_id=run_id,
            epoch=1,
            next_seq=1,
            policy=WritePolicy(rt.retry_seconds, rt.serializer),
        )
        for rt in (first, second)
    ]
    acknowledged: list[Event] = []
    for round_ in range(30):
        row = await first.store.session(scope)
        seq = (row.last_seq if row else 0) + 1
        racing: list[Event] = []
        for n, writer in enumerate(writers):
            writer.next_seq = seq
            if seq == 1:  # nobody has a session row to lock yet: the log's key decides
                racing.append(writer.make(RunStarted, {}))
            else:
                racing.append(_turn(writer, f"round {round_} writer {n}"))
        outcomes = await asyncio.gather(
            first.store.append([racing[0]]),
            second.store.append([racing[1]]),
            return_exceptions=True,
        )
        winners = [event for event, out in zip(racing, outcomes, strict=True) if out is None]
        losers = [out for out in outcomes if out is not None]
        assert len(winners) == 1, outcomes
        assert len(losers) == 1 and isinstance(losers[0], SequenceConflictError), outcomes
        acknowledged += winners

    # a third runtime takes the session over: the old epoch is fenced off
    third = PostgresRuntime(dsn, schema=schema)
    taken = await third.open_session(scope, run_id=new_id("run"))
    assert taken.epoch == 2
    writers[0].next_seq = taken.next_seq
    with pytest.raises(StaleWriterError):
        await writers[0].emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("late")]))

    reader = PostgresRuntime(dsn, schema=schema)
    stored = await reader.store.read_events(scope)
    assert [e.seq for e in stored] == list(range(1, 32))
    assert stored[:30] == acknowledged  # every acknowledged event, exactly once, in order
    state = await reader.restore(scope)
    assert state is not None and len(state.messages) == 29
    for runtime in (first, second, third, reader):
        await runtime.close()


async def test_a_seq_taken_by_a_writer_not_yet_committed_is_a_conflict(
    dsn: str, schema: str
) -> None:
    mine, theirs = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    await pg.migrate(mine, schema)
    started = [
        RunStarted(session_id="fresh", run_id=new_id("run"), seq=1, epoch=1) for _ in range(2)
    ]
    try:
        transaction = mine.transaction()
        await transaction.start()
        await pg.apply_events(mine, schema, [started[0]])

        async def second_writer() -> None:
            async with theirs.transaction():
                await pg.apply_events(theirs, schema, [started[1]])

        racing = asyncio.create_task(second_writer())
        pid = theirs.get_server_pid()

        async with asyncio.timeout(10):  # until it waits for our uncommitted seq 1
            while True:
                waiting = await mine.fetchval(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
                )
                if waiting == "Lock":
                    break
                await asyncio.sleep(0.01)
        await transaction.commit()
        with pytest.raises(SequenceConflictError):
            await racing
    finally:
        await mine.close()
        await theirs.close()


# --- the projection function the Kafka projector shares ------------------------------------


def _mixed_batch() -> list[Event]:
    """Sessions interleaved, a redelivered event, retention, pruning, a step, an erasure."""
    run = new_id("run")
    usage = Usage(input_tokens=3, output_tokens=2)

    def turn(sid: str, seq: int, text: str) -> TurnAppended:
        return TurnAppended(
            session_id=sid,
            run_id=run,
            seq=seq,
            epoch=1,
            payload=TurnAppendedPayload(messages=[Message.user(text)], usage=usage),
        )

    def checkpoint(sid: str, seq: int, count: int) -> CheckpointWritten:
        return CheckpointWritten(
            session_id=sid,
            run_id=run,
            seq=seq,
            epoch=1,
            payload=CheckpointWrittenPayload(
                checkpoint_id=new_id("ckpt"),
                turn=count,
                cumulative_usage=usage,
                message_count=count,
                retain=2,
            ),
        )

    batch: list[Event] = [RunStarted(session_id=sid, run_id=run, seq=1, epoch=1) for sid in "abc"]
    for n in range(3):  # a and c checkpoint side by side: their changes share statements
        for sid in "ac":
            batch += [turn(sid, 2 + 2 * n, f"{sid} {n}"), checkpoint(sid, 3 + 2 * n, n + 1)]
    newest_c = batch[-1]
    assert isinstance(newest_c, CheckpointWritten)
    b2 = turn("b", 2, "b one")
    batch += [
        batch[3],  # a's first turn, redelivered within the batch: stored once
        CheckpointsPruned(
            session_id="c",
            run_id=run,
            seq=8,
            epoch=1,
            payload=CheckpointsPrunedPayload(checkpoint_ids=[newest_c.payload.checkpoint_id]),
        ),
        b2,
        StepRecorded(
            session_id="b",
            run_id=run,
            seq=3,
            epoch=1,
            payload=StepRecordedPayload(step_key="k", input_hash="h", value={"z": 1, "a": 2}),
        ),
        SessionErased(session_id="b", run_id=run, seq=4, epoch=1, payload=SessionErasedPayload()),
        b2,  # redelivered after the erasure: refused, the tombstone stays
    ]
    return batch


async def test_one_batch_of_many_sessions_folds_like_one_event_at_a_time(
    dsn: str, schema: str
) -> None:
    batch = _mixed_batch()
    conn = await asyncpg.connect(dsn)
    other = f"{schema}_x"
    try:
        await pg.migrate(conn, schema)
        await pg.migrate(conn, other)
        with pytest.raises(SessionErasedError):  # b2 after the erasure, in one batch
            async with conn.transaction():
                await pg.apply_events(conn, schema, batch)
        async with conn.transaction():
            await pg.apply_events(conn, schema, batch[:-1])
            # redelivered: a no-op for what is stored (b's events went with its erasure)
            await pg.apply_events(conn, schema, [e for e in batch if e.session_id != "b"])
        for event in batch[:-1]:
            async with conn.transaction():
                await pg.apply_events(conn, other, [event])

        async def model(target: str) -> list[object]:
            seen: list[object] = []
            for sid in ("a", "b", "c"):
                seen.append(await pg.load_session(conn, target, None, sid))
                seen.append(await pg.list_checkpoints(conn, target, None, sid, 50))
                seen.append(await pg.read_events(conn, target, None, sid, 1, 100))
                seen.append(await pg.get_step(conn, target, None, sid, "k"))
            return seen

        batched, one_by_one = await model(schema), await model(other)
        checkpoints_a = await pg.list_checkpoints(conn, schema, None, "a", 50)
        checkpoints_c = await pg.list_checkpoints(conn, schema, None, "c", 50)
        transcript_a = await pg.read_transcript(conn, schema, None, "a", 0, 100)
        events_b = await pg.read_events(conn, schema, None, "b", 1, 100)
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')
        await conn.close()
    assert batched == one_by_one
    assert [c.seq for c in checkpoints_a] == [7, 5]
    assert [c.seq for c in checkpoints_c] == [5]  # retention kept 7 and 5; 7 was pruned
    assert [m.content for m in transcript_a] == ["a 0", "a 1", "a 2"]
    assert [e.type for e in events_b] == ["session.erased"]


# --- bad rows ------------------------------------------------------------------------------


async def test_a_corrupted_row_is_reported_and_listing_still_works(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = PostgresRuntime(dsn, schema=schema)
    await Research(passes=2).agent(runtime).run("Research.", session_id="broken")
    await Research(passes=2).agent(runtime).run("Research.", session_id="fine")
    await runtime.close()
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        f'UPDATE "{schema}".events SET payload = \'{{"messages": 7}}\' '
        "WHERE session_id = 'broken' AND seq = 4"
    )
    rows_before = len(await conn.fetch(f'SELECT 1 FROM "{schema}".events'))

    runtime = PostgresRuntime(dsn, schema=schema)
    with pytest.raises(CorruptRecordError, match=r"session 'broken', seq 4"):
        await runtime.restore(Scope("broken"))
    fine = await runtime.restore(Scope("fine"))
    assert fine is not None and fine.turns == 6
    assert len(await runtime.list_checkpoints(Scope("broken"))) == 2
    with caplog.at_level(logging.WARNING, logger="loomflow"):
        events = await runtime.store.read_events(Scope("broken"))
    assert 4 not in {e.seq for e in events} and len(events) == events[-1].seq - 1
    assert sum("skipping a log row" in r.getMessage() for r in caplog.records) == 1
    await runtime.close()
    assert len(await conn.fetch(f'SELECT 1 FROM "{schema}".events')) == rows_before
    await conn.close()


async def test_a_trail_audited_at_version_7_gets_each_sessions_standing(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """A trail written before the audit kept the rule of validity's standings: each
    session's is read off its newest entry (its epoch, whatever the entry's bytes hold),
    so the audit refuses what the read model refuses from the first record after the
    upgrade, and chains a session's next run as before."""
    db = tmp_path / "journal.db"
    s1, s2 = SessionLog("s1"), SessionLog("s2", "ada")
    async with SqliteStore(db) as store:
        await commit(store, [*s1.run(1), *s2.run(1), s2.finish()])
    conn = await asyncpg.connect(dsn)
    try:
        await pg.migrate(conn, schema, Migrations(pg.READ_MODEL.meta, pg.READ_MODEL.steps[:7]))
        # the entries as the audit of version 7 wrote them
        async with sqlite_reader(db) as reader:
            links = [link_of(r) for r in await read_all(reader)]
        entries = chain([link for link in links if link is not None], {}).entries
        params = ", ".join(f"${k}" for k in range(1, 13))
        await conn.executemany(
            f'INSERT INTO "{schema}".audit_entries VALUES ({params})',
            [entry_values(e, e.at) for e in entries],
        )
        # one entry whose bytes are not JSON any more (the migration reads them anyway)
        await conn.execute(
            f"UPDATE \"{schema}\".audit_entries SET body = '\\xff'::bytea "
            "WHERE session_id = 's1' AND n = 4"
        )
        await pg.migrate(conn, schema)
        rows = await conn.fetch(
            f"SELECT user_id, session_id, epoch, last_seq, cancelled, erased, gapped "
            f'FROM "{schema}".audit_sessions ORDER BY session_id'
        )
        assert [tuple(r) for r in rows] == [
            ("", "s1", 0, 4, False, False, True),
            ("ada", "s2", 1, 5, False, False, True),
        ]
        trail = PostgresTrail(lambda fn, *args: fn(conn, schema, *args), "the trail")
        async with SqliteStore(db) as store:
            forged = s1.turn("forged", epoch=s1.epoch + 1)  # no claim: refused
            await commit(store, [*s2.run(1)])
        await SqliteLog(db).forge(forged)
        async with sqlite_reader(db, start={0: len(links) + 1}) as reader:
            done = await Auditor(reader, trail).catch_up()
        assert (done.entries, done.rejected) == (4, 1)
        (reject,) = await trail.rejects()
        assert "only run.started or session.forked claims a new epoch" in reject.reason
    finally:
        await conn.close()


async def test_a_claims_read_is_the_row_its_newest_checkpoint_and_the_partitions_position(
    dsn: str, schema: str
) -> None:
    """``head_at``: what a claim reads (a KafkaRuntime's with the projector's position
    in the session's partition), one statement; a session with no row reads as none."""
    async with PostgresRuntime(dsn, schema=schema) as runtime:
        await Research(passes=2).agent(runtime).run("Research.", session_id="s1")
        store = runtime.store
        newest = (await runtime.list_checkpoints(Scope("s1"), 1))[0].checkpoint_id
        async with (await store._ready()).acquire() as conn, conn.transaction():
            await pg.save_positions(conn, schema, "group", "events", {0: 17, 1: 40})
        row, latest, since = await store.head_at(
            Scope("s1"), checkpoint=True, position=("group", "events", 1)
        )
        assert row == await store.session(Scope("s1")) and row is not None
        assert (latest, since) == (newest, 40)
        assert (await store.head_at(Scope("s1"), position=("group", "events", 0)))[1:] == (None, 17)
        assert await store.head(Scope("s1"), checkpoint=True) == (row, newest)
        # no position stored for the partition, the group or the topic: from the start
        for position in (("group", "events", 2), ("other", "events", 1), ("group", "x", 1)):
            assert (await store.head_at(Scope("s1"), position=position))[2] == 0
        assert await store.head_at(
            Scope("s1", "someone-else"), checkpoint=True, position=("group", "events", 1)
        ) == (None, None, 40)


async def test_an_append_from_remembered_rows_is_one_statement_and_never_outlives_a_prune(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store folds a lone append from the session row of its own last commit and writes
    it in one guarded statement; once another store pruned the session, that row is
    stale: the append is refused as it is without the row, and no session comes back."""
    mine, other = PostgresRuntime(dsn, schema=schema), PostgresRuntime(dsn, schema=schema)
    scope = Scope("s1", "alice")
    writer = await mine.open_session(scope, run_id=new_id("run"))
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("first")]))

    statements: list[str] = []
    for name in ("execute", "fetch", "fetchrow", "fetchval"):
        method = getattr(asyncpg.Connection, name)

        async def counted(self: Any, query: str, *args: Any, _method: Any = method) -> Any:
            statements.append(query.split(None, 1)[0])
            return await _method(self, query, *args)

        monkeypatch.setattr(asyncpg.Connection, name, counted)
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("second")]))
    assert statements == ["WITH"]  # no BEGIN, no read of the row, no COMMIT
    # a checkpoint and its retention go in the same one statement
    writer.stage(
        CheckpointWritten,
        CheckpointWrittenPayload(
            checkpoint_id=new_id("ckpt"),
            turn=0,
            cumulative_usage=Usage(),
            cursor="pass:1",
            message_count=2,
            retain=1,
        ),
    )
    await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("third")]))
    assert statements == ["WITH", "WITH"]
    monkeypatch.undo()
    assert len(await mine.list_checkpoints(scope)) == 1

    assert (await other.store.prune(session_id="s1", user_id="alice")).sessions == 1
    with pytest.raises(InvalidEventError):
        await writer.emit(TurnAppended, TurnAppendedPayload(messages=[Message.user("fourth")]))
    assert await other.store.session(scope) is None
    assert await other.store.read_events(scope) == []
    for runtime in (mine, other):
        await runtime.close()


def _heads(runtime: PostgresRuntime) -> list[str]:
    """Note each read of a session's head by ``runtime``'s store (one round trip each)."""
    seen: list[str] = []
    store = runtime.store
    head = store.head

    async def counted(scope: Scope, *, checkpoint: bool = False) -> Any:
        seen.append("head")
        return await head(scope, checkpoint=checkpoint)

    store.head = counted  # type: ignore[method-assign]
    return seen


async def _last_start(runtime: PostgresRuntime, scope: Scope) -> RunStarted:
    """The session's last run.started."""
    starts = [e for e in await runtime.store.read_events(scope) if isinstance(e, RunStarted)]
    return starts[-1]


async def test_a_run_where_the_session_was_left_claims_it_without_reading_it(
    dsn: str, schema: str
) -> None:
    """The process whose commit left the session last claims it from that row, no round
    trip first, for a run (a resume reads: it names the newest checkpoint, which a prune
    deletes without moving the session on). Once another process wrote to the session,
    that row is stale: the claim is refused, the session read, and claimed again."""
    async with (
        PostgresRuntime(dsn, schema=schema) as mine,
        PostgresRuntime(dsn, schema=schema) as other,
    ):
        await Research(passes=1).agent(mine).run("Research.", session_id="s1")
        reads = _heads(mine)
        result = await Research(passes=2).agent(mine).run("Go on.", session_id="s1")
        assert result.restored_turns == 3 and result.turns == 6
        assert reads == []
        await Research(passes=3).agent(mine).resume(session_id="s1")
        assert reads == ["head"]

        await Research(passes=4).agent(other).resume(session_id="s1")
        reads.clear()
        result = await Research(passes=5).agent(mine).run("Again.", session_id="s1")
        assert result.restored_turns == 12 and result.turns == 15
        assert reads == ["head"]  # after its claim from the stale row was refused


async def test_a_claim_of_a_row_two_epochs_stale_is_made_again(dsn: str, schema: str) -> None:
    """Another process claimed the session twice since this one's last commit (or claimed
    and cancelled it): the claim made of the row this one kept is refused as a stale
    writer's, or as a cancelled run's (the epoch is judged before the seq); it reads the
    session and claims again instead of failing the run. (Found by review.)"""
    scope = Scope("s1")
    async with (
        PostgresRuntime(dsn, schema=schema) as mine,
        PostgresRuntime(dsn, schema=schema) as other,
    ):
        await Research(passes=1).agent(mine).run("Research.", session_id="s1")
        await Research(passes=2).agent(other).run("Go on.", session_id="s1")
        await Research(passes=3).agent(other).run("Go on.", session_id="s1")
        result = await Research(passes=4).agent(mine).run("Again.", session_id="s1")
        assert result.restored_turns == 9 and result.turns == 12

        theirs = await other.open_session(scope, run_id=new_id("run"))
        await other.cancel(scope, "stop it")
        result = await Research(passes=5).agent(mine).run("Again.", session_id="s1")
        assert result.restored_turns == 12 and result.turns == 15
        assert (await _last_start(mine, scope)).epoch == theirs.epoch + 2


async def test_a_resume_after_another_process_pruned_its_checkpoints_names_none(
    dsn: str, schema: str
) -> None:
    """A prune deletes a live session's older checkpoints, its newest among them, without
    moving the session on: the resume that follows, in the process that wrote them,
    reads the session and continues from no checkpoint. (Found by review.)"""
    scope = Scope("s1")
    async with (
        PostgresRuntime(dsn, schema=schema) as mine,
        PostgresRuntime(dsn, schema=schema) as other,
    ):
        await Research(passes=1).agent(mine).run("Research.", session_id="s1")
        (newest,) = await mine.list_checkpoints(scope, 1)
        await Research(passes=2).agent(mine, checkpoint=False).run("Go on.", session_id="s1")
        pruned = await other.store.prune(before=newest.created_at + timedelta(microseconds=1))
        assert pruned.checkpoints == 1 and pruned.sessions == 0
        assert await other.list_checkpoints(scope) == []
        await Research(passes=3).agent(mine).resume(session_id="s1")
        started = await _last_start(mine, scope)
        assert (started.payload.mode, started.payload.from_checkpoint) == ("run", None)
