"""Where a command's store is when it is given no ``--db``: the scaled path's PostgreSQL,
said on stderr in one line (which, and why), never on stdout, never when the user named
the store (``--db`` or ``--dsn``)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from loomflow.cli import main
from loomflow.control.source import Source
from loomflow.runtime import PostgresRuntime, SqliteRuntime
from loomflow.settings import Settings
from tests.support.readme import BIN, README, user_env
from tests.support.scenario import Research
from tests.support.services import postgres_dsn


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOOMFLOW_POSTGRES_DSN", "LOOMFLOW_SCHEMA", "LOOMFLOW_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)


def _scaled(db: Path | None = None, **options: str) -> Source:
    source = Source.of(db, **options)
    assert source is not None
    return source


def test_with_no_store_named_the_default_postgresql_is_said_once_on_stderr(
    no_settings: None, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _scaled()
    for _ in range(2):  # what the command opens again is not said again
        source._runtime("read")
    out, err = capsys.readouterr()
    assert out == ""
    default = Settings.model_construct()
    assert default.postgres_dsn == "postgresql://loomflow:loomflow@127.0.0.1:5432/loomflow"
    assert err.splitlines() == [
        "loomflow: reading the PostgreSQL read model at 127.0.0.1:5432/loomflow, schema "
        "loomflow (no --db given; the default DSN)"
    ]
    # the line the README quotes is the one printed
    quoted = " ".join(err.removeprefix("loomflow: ").split())
    assert quoted in " ".join(README.split())


def test_the_note_says_what_the_command_does_there_and_never_shows_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOMFLOW_POSTGRES_DSN", "postgresql://ops:s3cret@db.internal:6543/agents")
    monkeypatch.setenv("LOOMFLOW_SCHEMA", "prod")
    monkeypatch.setenv("LOOMFLOW_KAFKA_BOOTSTRAP", "kafka.internal:9092")
    where = "db.internal:6543/agents, schema prod (no --db given; LOOMFLOW_POSTGRES_DSN)"
    _scaled()._runtime("write")
    _scaled()._runtime("kafka")
    _scaled().trail()
    _scaled(schema="other")._runtime("read")  # --schema alone: the DSN is still the fallback
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"loomflow: writing to the PostgreSQL read model at {where}",
        "loomflow: appending through the Kafka log at kafka.internal:9092 to the PostgreSQL "
        f"read model at {where}",
        f"loomflow: the audit trail in PostgreSQL at {where}",
        "loomflow: reading the PostgreSQL read model at db.internal:6543/agents, schema other "
        "(no --db given; LOOMFLOW_POSTGRES_DSN)",
    ]
    assert "s3cret" not in err and "ops" not in err


def test_a_store_is_named_by_its_file_or_its_address_and_schema_never_its_password(
    no_settings: None, tmp_path: Path
) -> None:
    """What the console's first line says it serves (``loomflow ui``), as the notes above
    name a PostgreSQL: host, port, database and schema, whether the DSN came from --dsn or
    the settings."""
    named = _scaled(dsn="postgresql://ops:s3cret@db.internal:6543/agents", schema="prod")
    assert named.name == "the PostgreSQL read model at db.internal:6543/agents, schema prod"
    default = _scaled().name
    assert default == "the PostgreSQL read model at 127.0.0.1:5432/loomflow, schema loomflow"
    assert f"({default})" in README  # as the README's console section quotes it
    assert _scaled(tmp_path / "journal.db").name == f"SQLite {tmp_path / 'journal.db'}"


def test_a_store_the_user_named_is_not_announced(
    no_settings: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _scaled(dsn="postgresql://u:p@elsewhere:5432/x")._runtime("read")
    assert capsys.readouterr() == ("", "")

    db = tmp_path / "journal.db"

    async def record() -> None:
        async with SqliteRuntime(db) as runtime:
            await Research(passes=1).agent(runtime).run("go", session_id="s1")

    asyncio.run(record())
    assert main(["sessions", "ls", "--db", str(db), "--all-users"]) == 0
    out, err = capsys.readouterr()
    assert "s1" in out and err == ""


# --- a user's shell on PostgreSQL -----------------------------------------------------------


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"lf_note_{secrets.token_hex(6)}"
    yield name

    async def drop() -> None:
        conn = await asyncpg.connect(postgres_dsn())
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.mark.postgres
def test_sessions_ls_without_db_says_where_it_reads_and_keeps_stdout_to_the_rows(
    schema: str, tmp_path: Path
) -> None:
    settings = Settings(postgres_dsn=postgres_dsn(), db_schema=schema)

    async def record() -> None:
        async with PostgresRuntime(settings=settings) as runtime:
            await Research(passes=1).agent(runtime).run("go", session_id="noted")

    asyncio.run(record())
    env = user_env(LOOMFLOW_POSTGRES_DSN=postgres_dsn(), LOOMFLOW_SCHEMA=schema, COLUMNS="200")

    def ls(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "loomflow"), "sessions", "ls", "--all-users", *options],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = ls()
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert rows[0] == "session" and rows[-1] == "noted", done.stdout  # the table alone
    assert "no --db given" not in done.stdout
    (note,) = done.stderr.splitlines()
    assert note.startswith("loomflow: reading the PostgreSQL read model at ")
    assert note.endswith(f", schema {schema} (no --db given; LOOMFLOW_POSTGRES_DSN)")

    named = ls("--dsn", postgres_dsn())  # the user said which: nothing to say
    assert named.returncode == 0 and named.stdout == done.stdout and named.stderr == ""
