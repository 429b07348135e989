"""A store that is down: the console answers 503 with a page that says so and tries
again (the API: a JSON error with ``retry``), keeps serving, and works again once the
store is back, without a restart. A SQLite file that is missing, removed or replaced
under the console; a PostgreSQL that refuses connections, or goes away and comes back."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from loomflow.control.source import Source
from loomflow.runtime import PostgresRuntime, SqliteRuntime
from loomflow.settings import Settings
from loomflow.ui import ConsoleConfig, create_app
from tests.support.console_app import (
    Journal,
    Stream,
    chatter,
    console,
    make_journal,
    served,
    until,
    write_journal,
)
from tests.support.services import postgres_dsn


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return make_journal(tmp_path_factory.mktemp("console") / "journal.db")


def assert_down_page(answer: object, says: str) -> None:
    """The 503 page: a banner saying what is wrong, and a retry."""
    assert getattr(answer, "status_code", None) == 503
    html = getattr(answer, "text", "")
    assert 'class="banner down"' in html and "the store does not answer" in html
    assert says in html
    assert 'id="retry"' in html and "data-retry=" in html
    assert "nothing was changed" in html


def assert_down_json(answer: object, says: str) -> None:
    assert getattr(answer, "status_code", None) == 503
    body = answer.json()  # type: ignore[attr-defined]
    assert body["retry"] is True and says in body["error"]
    assert body["error"].startswith("the store does not answer: ")


def test_a_missing_sqlite_file_is_a_503_until_it_is_there(journal: Journal, tmp_path: Path) -> None:
    assert journal.db is not None
    db = tmp_path / "later.db"
    with console(db) as client:
        for path in ("/", f"/sessions/{journal.alice[0]}?user=alice"):
            assert_down_page(client.get(path), "the file does not exist")
        assert_down_json(client.get("/api/sessions"), "the file does not exist")
        # the console keeps serving what needs no store
        assert client.get("/static/console.js").status_code == 200
        assert client.get("/api/openapi.json").status_code == 200
        shutil.copy(journal.db, db)
        listing = client.get("/api/sessions")
        assert listing.status_code == 200 and listing.json()["total_sessions"] == journal.count
        assert client.get("/").status_code == 200


def test_a_sqlite_file_removed_then_restored_under_the_console(
    journal: Journal, tmp_path: Path
) -> None:
    assert journal.db is not None
    db = tmp_path / "journal.db"
    shutil.copy(journal.db, db)
    with console(db) as client:
        assert client.get("/api/sessions").status_code == 200
        away = db.rename(tmp_path / "away.db")
        assert_down_json(client.get("/api/sessions"), "the file does not exist")
        assert_down_page(client.get(f"/sessions/{journal.alice[0]}?user=alice"), "does not exist")
        away.rename(db)
        assert client.get("/api/sessions").json()["total_sessions"] == journal.count
        # replaced by another journal: the console shows the new file, not the old one
        other = tmp_path / "other.db"

        async def write() -> None:
            async with SqliteRuntime(other) as runtime:
                await chatter(runtime).run("Hi.", session_id="only-one")

        asyncio.run(write())
        other.replace(db)
        listing = client.get("/api/sessions").json()
        assert [r["session_id"] for r in listing["sessions"]] == ["only-one"]


def test_a_live_stream_says_the_store_is_down_and_goes_on_when_it_is_back(
    journal: Journal, tmp_path: Path
) -> None:
    assert journal.db is not None
    db = tmp_path / "journal.db"
    shutil.copy(journal.db, db)
    app = create_app(ConsoleConfig(source=Source(db=db), poll_seconds=0.05))
    with served(app) as url:
        stream = Stream(f"{url}/live/sessions/{journal.alice[0]}?user=alice")
        try:
            until(lambda: any(k == "status" for k, _ in stream.events), what="the status")
            away = db.rename(tmp_path / "away.db")
            until(lambda: any(k == "down" for k, _ in stream.events), what="a down event")
            (said,) = [d for k, d in stream.events if k == "down"]
            assert "The store does not answer" in said and "does not exist" in said
            away.rename(db)
            until(
                lambda: [k for k, _ in stream.events].count("down") == 2,
                what="the banner cleared",
            )
            assert "does not answer" not in [d for k, d in stream.events if k == "down"][1]
        finally:
            stream.close()


# -- PostgreSQL ------------------------------------------------------------------------


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _at_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.postgres
def test_a_postgresql_that_refuses_connections_is_a_503_and_the_console_serves_on() -> None:
    settings = Settings(postgres_dsn=_at_port(postgres_dsn(), _closed_port()))
    with console(Source(settings=settings)) as client:
        for _ in range(3):  # every request tries again, none takes the console down
            assert_down_page(client.get("/"), "cannot connect to PostgreSQL")
            assert_down_json(client.get("/api/sessions"), "cannot connect to PostgreSQL")
            assert_down_page(client.get("/sessions/s1"), "cannot connect to PostgreSQL")
        assert "loomflow:loomflow@" not in client.get("/").text  # no password shown
        assert client.get("/static/console.css").status_code == 200


class Relay:
    """A TCP relay on a fixed loopback port to PostgreSQL: ``stop`` closes the port and
    cuts every connection (the server went away), ``start`` opens it again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = _closed_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            server = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        assert self._listener is not None
        self._listener.close()
        with self._lock:
            cut, self._open = self._open, []
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema of this test's own, with alice's and bob's sessions; dropped after."""
    name = f"lf_test_{secrets.token_hex(6)}"

    async def write() -> None:
        async with PostgresRuntime(postgres_dsn(), schema=name) as runtime:
            await write_journal(runtime, zoo=False)

    async def drop() -> None:
        conn = await asyncpg.connect(postgres_dsn())
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(write())
    yield name
    asyncio.run(drop())


@pytest.mark.postgres
def test_a_postgresql_that_goes_away_and_comes_back_is_served_again_without_a_restart(
    schema: str,
) -> None:
    real = urlsplit(postgres_dsn())
    relay = Relay((real.hostname or "127.0.0.1", real.port or 5432))
    relay.start()
    settings = Settings(postgres_dsn=_at_port(postgres_dsn(), relay.port), db_schema=schema)
    with console(Source(settings=settings)) as client:
        try:
            listing = client.get("/api/sessions")
            assert listing.status_code == 200, listing.text
            total = listing.json()["total_sessions"]
            assert total == 8  # alice's 3, 2 waiting and the hostile one; bob's 2
            relay.stop()
            assert_down_json(client.get("/api/sessions"), "")
            assert_down_page(client.get("/"), "")
            relay.start()

            def served_again() -> bool:
                return client.get("/api/sessions").status_code == 200

            until(served_again, within=30, what="the console to read PostgreSQL again")
            assert client.get("/api/sessions").json()["total_sessions"] == total
            assert client.get("/").status_code == 200
        finally:
            with contextlib.suppress(AssertionError):
                relay.stop()
