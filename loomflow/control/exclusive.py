"""One process at a time: the locks an operator's command holds while it writes what only
one writer may write (the audit trail: see ``Source.trail_lock``).

Both are taken without waiting and go when their process does, however it ends (a crash, a
SIGKILL): an ``flock`` of a lock file beside a file, or a PostgreSQL advisory lock held by a
connection of its own. A command that finds one held says so and stops, rather than waiting
behind a ``--follow`` service that never lets go.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from loomflow.errors import StoreError

__all__ = ["advisory_lock", "file_lock"]


@asynccontextmanager
async def file_lock(path: Path) -> AsyncIterator[bool]:
    """Hold the lock file ``path`` while the block runs: True once this process holds it,
    False (holding nothing) while another process does. The file is made for the lock
    and removed as it is let go, so nothing is left behind. Not the file it guards: SQLite
    keeps POSIX locks of its own on a database, which closing another descriptor of the
    file would drop (and which BSDs do not keep apart from an ``flock``)."""
    try:
        fd = await asyncio.to_thread(_take, path)
    except OSError as exc:
        raise StoreError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    try:
        yield fd is not None
    finally:
        if fd is not None:
            await asyncio.to_thread(_let_go, path, fd)


def _take(path: Path) -> int | None:
    """A descriptor of ``path`` holding its exclusive flock, or None while another holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        # the holder before removed the file as it let go, after this process opened it:
        # that lock is of a file nobody else opens any more, so take the one at the path
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            return fd
        os.close(fd)


def _let_go(path: Path, fd: int) -> None:
    # removed while still held: a process that opened it meanwhile finds it gone (_take)
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


@asynccontextmanager
async def advisory_lock(
    dsn: str, name: str, *, connect_timeout: float, where: str
) -> AsyncIterator[bool]:
    """Hold PostgreSQL's session advisory lock ``name`` (in the database of ``dsn``) on a
    connection of its own while the block runs: True once this process holds it, False
    (holding nothing) while another session does. ``where`` names the server in messages,
    without the DSN's password. The lock goes with the connection: should the server
    restart meanwhile, this process no longer holds it."""
    import asyncpg

    from loomflow.projections.postgres.schema import connect_error, store_error

    try:
        conn = await asyncpg.connect(dsn, timeout=connect_timeout)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise connect_error(dsn, where, exc, "start it, or check the DSN") from exc
    try:
        try:
            held = await conn.fetchval("SELECT pg_try_advisory_lock($1)", _key(name))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise store_error(f"PostgreSQL at {where}: {exc}", exc) from exc
        yield bool(held)
    finally:
        await conn.close()


def _key(name: str) -> int:
    """A stable 64-bit advisory lock key for ``name``."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
