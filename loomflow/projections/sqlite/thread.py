"""A SQLite connection that lives on its own thread, for the store and the consumers of
an embedded log.

sqlite3 blocks, and a connection belongs to the thread that made it: every call goes to
one worker thread, so the event loop never waits on disk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from loomflow.errors import StoreClosedError, StoreError

__all__ = ["SqliteThread", "open_own"]

T = TypeVar("T")


class SqliteThread:
    """Runs ``fn(conn, *args)`` on one thread; ``connect`` opens the connection there on
    first use. A database error becomes a StoreError naming ``where``; a call after
    ``close`` raises StoreClosedError."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], where: str) -> None:
        self._connect = connect
        self.where = where
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loomflow-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreClosedError(f"{self.where} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._run, fn, *args))

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Start ``fn(conn, *args)`` on the thread now, whether or not the event loop runs
        before it is done (work that nobody awaits: a WAL checkpoint)."""
        if self._closed:
            raise StoreClosedError(f"{self.where} is closed")
        return self._executor.submit(self._run, fn, *args)

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            if self._conn is None:
                self._conn = self._connect()
            return fn(self._conn, *args)
        except sqlite3.DatabaseError as exc:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.rollback()
            raise StoreError(f"{self.where}: {exc}") from exc

    async def close(self) -> None:
        """Close the connection and the thread; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._disconnect)
        self._executor.shutdown(wait=False)

    @property
    def closed(self) -> bool:
        return self._closed

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the last connection to close checkpoints and removes the WAL
            self._conn = None


def open_own(path: Path, prefix: str, what: str, *, create: bool) -> sqlite3.Connection:
    """Open a SQLite file of loomflow's that holds only tables named ``prefix*`` (a trail,
    a stats database), creating it when ``create``. A file with other tables (a journal,
    another program's database) or that is not SQLite is refused before anything is
    written to it."""
    if path.exists() and not path.is_file():
        raise StoreError(f"{path} is not a file, so it cannot be a {what}")
    if not create and not path.is_file():
        raise StoreError(f"no {what} at {path}")
    target = str(path) if create else f"{path.resolve().as_uri()}?mode=rw"
    conn = sqlite3.connect(target, isolation_level=None, uri=not create)
    try:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{path} is not a {what}: {exc}") from exc
    foreign = sorted(n for n in names if not n.startswith((prefix, "sqlite_")))
    if foreign or (not create and not names):
        conn.close()
        holds = f"it holds other tables ({', '.join(foreign[:3])})" if foreign else "it is empty"
        raise StoreError(f"{path} is not a {what}: {holds}")
    return conn
