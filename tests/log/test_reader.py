"""What only the reader of an embedded log has to prove: prune notes as rows, bad rows,
positions no row holds, files and migrations. Order, positions, resuming, drain, erase
and prune are loomflow.testing's reader suite, run in test_conformance.py."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loomflow.errors import StoreError
from loomflow.log.reader import (
    LogRecord,
    PruneNote,
    _note_record,
    drain,
    require_log,
    sqlite_reader,
)
from loomflow.projections import sqlite as sql
from loomflow.projections.sqlite import schema as sqlite_schema
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import RunStarted
from loomflow.testing import SqliteLog
from tests.support.scenario import Research


async def _run(db: Path, session_id: str) -> None:
    runtime = SqliteRuntime(db)
    try:
        await Research(passes=1).agent(runtime).run("go", session_id=session_id)
    finally:
        await runtime.close()


async def _all(db: Path) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    async with sqlite_reader(db) as reader:
        async for batch in drain(reader, max_records=3):
            for r in batch:
                kind = r.event.type if r.event else "note" if r.note else "bad"
                session = r.event.session_id if r.event else r.note.session_id if r.note else "?"
                out.append((kind, session, r.offset))
    return out


_NOTE = (7, "", "s", "[1, 2]", 3, "2026-01-01T00:00:00+00:00")  # as prune writes it


def test_a_note_as_prune_writes_it_decodes() -> None:
    record = _note_record(_NOTE)
    assert record.error is None and record.note == PruneNote(
        None, "s", (1, 2), 3, datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert _note_record((7, "", "s", None, 3, _NOTE[5])).note is not None


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (4, b""),  # the soak's example: the audit raised TypeError chaining it, and stopped
        (4, "3"),
        (4, 2.5),
        (4, True),
        (3, '"ab"'),  # seqs ('a', 'b')
        (3, '{"a": 1}'),
        (3, '[1, "x"]'),
        (2, b"s"),
        (1, 5),
        (5, "2026-01-01T00:00:00"),  # no zone: `loomflow tail` could not order it
    ],
)
def test_a_note_holding_what_prune_never_writes_does_not_decode(column: int, value: object) -> None:
    """Another program's row in the notes table, or a damaged one, is a record that does
    not decode, kept with its reason, as a log row is (found by the soak of
    tests/faults/test_fuzz_log.py)."""
    row = list(_NOTE)
    row[column] = value
    record = _note_record(row)
    assert record.note is None and record.event is None
    assert record.error and record.error.startswith("prune note 7 does not decode")


async def test_a_row_of_an_unknown_type_is_returned_with_a_reason_naming_it(
    tmp_path: Path,
) -> None:
    log = SqliteLog(tmp_path / "journal.db")
    await _run(log.path, "a")
    await log.write_undecodable(Scope("a"))
    async with sqlite_reader(log.path) as reader:
        (bad,) = [r async for batch in drain(reader) for r in batch if r.event is None]
    assert bad.error is not None and "no.such.type" in bad.error, bad.error


async def test_a_position_no_row_holds_does_not_keep_a_reader_waiting(tmp_path: Path) -> None:
    """Another program's insert that was ignored (or its delete of the newest rows)
    leaves the log's sequence past its last row: the reader is at the end all the same
    (it waited forever, and so did the audit and the stats; found by fuzzing)."""
    db = tmp_path / "journal.db"
    await _run(db, "a")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT OR IGNORE INTO loomflow_events (user_id) VALUES (NULL)")
    async with sqlite_reader(db) as reader:

        async def read_all() -> list[LogRecord]:
            return [r async for batch in drain(reader) for r in batch]

        records = await asyncio.wait_for(read_all(), 10)
    assert records and all(r.event is not None for r in records)


async def test_a_missing_file_is_an_error_not_an_empty_log(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no loomflow log"):
        async with sqlite_reader(tmp_path / "nope.db"):
            pass
    assert not (tmp_path / "nope.db").exists()


async def test_a_log_written_by_the_first_schema_is_migrated_with_its_positions(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(sqlite_schema.JOURNAL.steps[0])
    conn.execute("CREATE TABLE loomflow_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO loomflow_meta VALUES ('schema_version', '1')")
    old_row = RunStarted(session_id="old", run_id="r", seq=1, epoch=1)  # as version 1 wrote it
    conn.execute(
        "INSERT INTO loomflow_events (user_id, session_id, seq, type, event_id, run_id, epoch, "
        "v, at, payload) VALUES ('', 'old', 1, 'run.started', ?, 'r', 1, 1, ?, '{}')",
        (old_row.event_id, sql.ts(old_row.at)),
    )
    conn.close()
    await _run(db, "a")  # opened at version 2 from here on
    old = await _all(db)
    assert old[0] == ("run.started", "old", 1) and {s for _, s, _ in old[1:]} == {"a"}
    with sqlite3.connect(db) as c:
        version = c.execute(
            "SELECT value FROM loomflow_meta WHERE key = 'schema_version'"
        ).fetchone()[0]
        autoincrement = c.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'loomflow_events'"
        ).fetchone()
    assert version == str(sql.SCHEMA_VERSION) and autoincrement == (old[-1][2],)


async def test_reading_a_log_writes_nothing_to_it(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await _run(db, "a")
    before = db.read_bytes()
    await require_log(db)
    assert await _all(db)
    assert db.read_bytes() == before
