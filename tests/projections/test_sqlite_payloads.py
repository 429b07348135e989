"""The SQLite log stores a large payload compressed, and reads every row it ever stored."""

from __future__ import annotations

import sqlite3
import zlib
from contextlib import closing
from pathlib import Path

import pytest

from loomflow.errors import CorruptRecordError
from loomflow.log import sqlite_reader
from loomflow.projections import sqlite as sql
from loomflow.projections.sqlite import tables
from loomflow.projections.sqlite.tables import COMPRESS_FROM, payload_text, stored_payload
from loomflow.runtime import Scope, SqliteRuntime
from loomflow.schemas import Message, TurnAppended, new_id
from loomflow.schemas.events import MAX_EVENT_BYTES, TurnAppendedPayload

LONG = "the writer appends a turn and the reader folds it back " * 40  # ~2 KB


async def _write(db: Path, *texts: str) -> list[TurnAppended]:
    runtime = SqliteRuntime(db)
    writer = await runtime.open_session(Scope("s1"), run_id=new_id("run"))
    events = [
        writer.make(TurnAppended, TurnAppendedPayload(messages=[Message.user(text)]))
        for text in texts
    ]
    for event in events:
        await writer.emit(TurnAppended, event.payload)
    await runtime.close()
    return events


def _stored(db: Path) -> list[tuple[str, object]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT type, payload FROM loomflow_events WHERE type = 'turn.appended' ORDER BY seq"
        ).fetchall()


async def test_a_large_payload_is_stored_compressed_and_reads_back_the_same(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    await _write(db, "short", LONG)
    (_, short), (_, long) = _stored(db)
    assert isinstance(short, str)  # what compression barely shrinks stays text
    assert isinstance(long, bytes) and len(long) < len(LONG) // 2
    runtime = SqliteRuntime(db)
    state = await runtime.restore(Scope("s1"))
    assert state is not None and [m.content for m in state.messages] == ["short", LONG]
    events = await runtime.store.read_events(Scope("s1"))
    turns = [e for e in events if isinstance(e, TurnAppended)]
    assert [t.payload.messages[0].content for t in turns] == ["short", LONG]
    await runtime.close()
    async with sqlite_reader(db) as reader:  # the log's reader: audit, stats, tail
        records = await reader.read(wait=0, max_records=100)
    read = [r.event for r in records if isinstance(r.event, TurnAppended)]
    assert [t.payload.messages[0].content for t in read] == ["short", LONG]


async def test_a_large_payload_stored_as_text_by_an_older_version_reads_the_same(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    await _write(db, LONG, LONG + "!")
    with closing(sqlite3.connect(db)) as conn, conn:
        rows = conn.execute("SELECT position, payload FROM loomflow_events").fetchall()
        for position, payload in rows:  # as the version before compression wrote them
            conn.execute(
                "UPDATE loomflow_events SET payload = ? WHERE position = ?",
                (payload_text(payload, "test"), position),
            )
    assert all(isinstance(p, str) for _, p in _stored(db))
    runtime = SqliteRuntime(db)
    state = await runtime.restore(Scope("s1"))
    assert state is not None and [m.content for m in state.messages] == [LONG, LONG + "!"]
    await runtime.close()


def _refused(blob: bytes) -> str:
    with pytest.raises(CorruptRecordError) as caught:
        payload_text(blob, "log row 9")
    return str(caught.value)


def test_a_blob_that_is_no_payload_is_refused_with_the_row_named() -> None:
    assert "log row 9 does not decode" in _refused(b'{"messages": []}')  # not zlib
    assert "no whole zlib stream" in _refused(zlib.compress(b'{"a": 1}')[:-3])  # cut short
    assert "no whole zlib stream" in _refused(zlib.compress(b"{}") + b"tail")
    assert "does not decode" in _refused(zlib.compress(b"\xff\xfe"))  # not UTF-8


def test_a_payload_that_inflates_past_the_event_limit_is_refused_without_inflating_it() -> None:
    bomb = zlib.compress(b" " * (MAX_EVENT_BYTES + 1), 9)
    assert len(bomb) < 20_000
    assert f"inflates past {MAX_EVENT_BYTES} bytes" in _refused(bomb)
    exactly = zlib.compress(b" " * MAX_EVENT_BYTES, 9)
    assert len(payload_text(exactly, "log row 9")) == MAX_EVENT_BYTES


def test_payloads_from_the_threshold_on_are_compressed_where_that_is_smaller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert stored_payload("x" * (COMPRESS_FROM - 1)) == "x" * (COMPRESS_FROM - 1)
    assert isinstance(stored_payload("x" * COMPRESS_FROM), bytes)
    # level 0 stores without compressing: the stream is longer than the text
    monkeypatch.setattr(tables, "_LEVEL", 0)
    assert stored_payload("x" * COMPRESS_FROM) == "x" * COMPRESS_FROM


def test_the_journal_says_its_payloads_may_be_compressed(tmp_path: Path) -> None:
    with closing(sql.connect(tmp_path / "journal.db", 1000)) as conn:
        codec = conn.execute("SELECT value FROM loomflow_meta WHERE key = 'payload_codec'")
        assert codec.fetchone() == ("zlib",)
