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
from typing import Any, TypeVar

from loomflow.errors import StoreClosedError, StoreError

__all__ = ["SqliteThread"]

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
