"""The readers of the log apply the one rule of signatures: with ``require`` an event
whose signature does not hold comes back refused, as a record that does not decode does
(its reason naming key, session and seq; its bytes kept), with ``check`` it comes back
marked; and the consumers that read through them (stats, otel, tail), and the Kafka
analytics that decode the topic themselves, count or show what the rule found. Commands
read with the settings' rule unless told otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from loomflow.analytics import embedded
from loomflow.analytics.app import count_record
from loomflow.analytics.tally import Tally
from loomflow.control.source import Source
from loomflow.log import LogReader, LogRecord, kafka_reader, sqlite_reader
from loomflow.otel import Span, SqliteState, TraceExporter
from loomflow.producers import EventProducer, scope_key
from loomflow.runtime import SqliteStore
from loomflow.schemas import Event
from loomflow.schemas.signing import NO_SIGNATURES, Keyring, SignatureMode, Signatures, Signer
from loomflow.settings import Settings
from loomflow.testing import SessionLog
from loomflow.testing.log import read_all
from tests.support.cli import Cli, runner
from tests.support.kafka_env import KafkaEnv

WRITER, STRANGER = Signer.generate(), Signer.generate()
TRUSTED = Keyring.of(WRITER.trusted())


def _session() -> list[Event]:
    """A session of four events: signed by the writer, unsigned, signed by a key the
    keyring does not hold, and signed by the writer but altered after."""
    log = SessionLog("s1", "ada")
    genuine = WRITER.sign_event(log.claim())
    unsigned = log.turn("written by no key")
    foreign = STRANGER.sign_event(log.turn("signed by a stranger"))
    altered = WRITER.sign_event(log.turn("as it was signed")).model_copy(
        update={"run_id": "run_altered"}
    )
    return [genuine, unsigned, foreign, altered]


async def _sqlite(tmp_path: Path) -> Callable[[Signatures], LogReader]:
    db = tmp_path / "journal.db"
    store = SqliteStore(db, settings=Settings(signing_key=None))  # keeps what it is given
    try:
        await store.append(_session())
    finally:
        await store.close()
    return lambda signatures: sqlite_reader(db, signatures=signatures)


@pytest.fixture(
    params=["sqlite", pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.postgres])]
)
async def log(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[Signatures], LogReader]]:
    """A reader, with the rule given, of a log holding ``_session()``."""
    if request.param == "sqlite":
        yield await _sqlite(tmp_path)
        return
    env = await KafkaEnv.create(partitions=1)
    producer = EventProducer(env.bootstrap, env.topics)
    try:
        await producer.send(_session())
    finally:
        await producer.stop()
    yield lambda signatures: kafka_reader(
        env.settings, group=None, start="beginning", signatures=signatures
    )
    await env.close()


async def _read(reader: LogReader) -> list[LogRecord]:
    async with reader:
        return await read_all(reader)


async def test_required_signatures_refuse_what_does_not_hold_with_its_reason_and_bytes(
    log: Callable[[Signatures], LogReader],
) -> None:
    genuine, *_ = _session()
    records = await _read(log(Signatures("require", TRUSTED)))
    assert len(records) == 4
    first, *refused = records
    assert first.event is not None and first.event.type == genuine.type
    assert first.signature_problem is None
    assert [r.event for r in refused] == [None, None, None]
    reasons = [r.error or "" for r in refused]
    assert "is not signed" in reasons[0]
    assert f"signed by key {STRANGER.key_id}, which the keyring does not hold" in reasons[1]
    assert f"does not match its signature by key {WRITER.key_id}" in reasons[2]
    for seq, record in enumerate(refused, start=2):
        assert "session 's1'" in (record.error or "") and f"seq {seq}" in (record.error or "")
        assert record.signature_problem == record.error
    texts = (b"written by no key", b"signed by a stranger", b"run_altered")
    assert [text in (r.raw or b"") for r, text in zip(refused, texts, strict=True)] == [True] * 3


async def test_checked_signatures_return_every_event_marked(
    log: Callable[[Signatures], LogReader],
) -> None:
    records = await _read(log(Signatures("check", TRUSTED)))
    assert all(r.event is not None and r.error is None for r in records)
    problems = [r.signature_problem for r in records]
    assert problems[0] is None and all(problems[1:])
    unchecked = await _read(log(NO_SIGNATURES))
    assert all(r.event is not None and r.signature_problem is None for r in unchecked)


async def test_a_command_reads_with_the_settings_rule_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = await _sqlite(tmp_path)
    source = Source(db=tmp_path / "journal.db")
    monkeypatch.setenv("LOOMFLOW_SIGNING_KEY", WRITER.pem().decode())  # require, its own key
    assert [r.event is not None for r in await _read(source.reader())] == [True] + [False] * 3
    raw = await _read(source.reader(signatures=NO_SIGNATURES))
    assert all(r.event is not None for r in raw)
    monkeypatch.setenv("LOOMFLOW_SIGNATURES", "check")
    marked = await _read(source.reader())
    assert [r.signature_problem is not None for r in marked] == [False, True, True, True]
    assert len(await _read(reader(NO_SIGNATURES))) == 4


async def test_stats_count_what_the_rule_refuses_or_marks(tmp_path: Path) -> None:
    await _sqlite(tmp_path)
    db = tmp_path / "journal.db"
    checked = await embedded.update(
        db, tmp_path / "checked.db", signatures=Signatures("check", TRUSTED)
    )
    assert (checked.counted, checked.skipped, checked.unverified) == (4, 0, 3)
    required = await embedded.update(
        db, tmp_path / "required.db", signatures=Signatures("require", TRUSTED)
    )
    assert (required.counted, required.skipped, required.unverified) == (1, 3, 0)
    stats = embedded.load(tmp_path / "required.db")
    assert stats.skipped == {"unverified": 3}
    # what a reader's settings refused, not the records: the line says how to count again
    assert stats.not_counted is not None
    assert stats.not_counted.startswith("records not counted: 3 unverified (unverified: ")
    assert "LOOMFLOW_KEYRING" in stats.not_counted and "--stats-db NEW" in stats.not_counted


def test_tail_shows_a_refused_event_as_invalid_and_a_checked_one_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_sqlite(tmp_path))
    cli: Cli = runner(capsys)
    monkeypatch.setenv("LOOMFLOW_SIGNING_KEY", WRITER.pem().decode())
    ran = cli("tail", "--db", str(tmp_path / "journal.db"), "--no-follow")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    refused = [line for line in lines if "invalid record" in line]
    assert len(lines) == 4 and len(refused) == 3
    # in the log's order: a record without a time is not shown ahead of the ones before it
    assert "run.started" in lines[0] and lines[1:] == refused
    assert [line.split()[0] for line in refused] == ["2", "3", "4"]
    monkeypatch.setenv("LOOMFLOW_SIGNATURES", "check")
    ran = cli("tail", "--db", str(tmp_path / "journal.db"), "--no-follow")
    marked = [line for line in ran.out.splitlines() if "[signature does not hold]" in line]
    assert ran.code == 0 and len(marked) == 3


class _Kept:
    """A sink that keeps the spans it is sent."""

    where = "memory"

    def __init__(self) -> None:
        self.spans: list[Span] = []

    async def send(self, spans: Sequence[Span]) -> None:
        self.spans.extend(spans)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("mode", ["check", "require"])
async def test_otel_counts_what_the_rule_refuses_or_marks(
    tmp_path: Path, mode: SignatureMode
) -> None:
    read = await _sqlite(tmp_path)
    async with SqliteState(tmp_path / "otel.db") as state, read(Signatures(mode, TRUSTED)) as log:
        done = await TraceExporter(log, state, _Kept()).catch_up()
    assert done.records == 4
    assert (done.unverified, done.refused) == ((3, 0) if mode == "check" else (0, 3))


@pytest.mark.parametrize("mode", ["check", "require"])
def test_kafka_analytics_skip_what_the_rule_refuses(mode: SignatureMode) -> None:
    ledgers: dict[bytes, bytes] = {}
    for n, event in enumerate(_session()):
        key = scope_key(event.user_id, event.session_id)
        raw = event.model_dump_json().encode()
        count_record(ledgers, key, raw, f"0:{n}", Signatures(mode, TRUSTED))
    skips = Tally.from_ledger(ledgers.get(b"!partition/0")).skipped
    assert dict(skips) == ({} if mode == "check" else {"unverified": 3})
