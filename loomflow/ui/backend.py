"""The store behind the console: opened from the same :class:`Source` as the command
line's, kept open while the console runs, and reopened after it was down.

Reads go to the read model (the SQLite file, or PostgreSQL); actions write as the CLI's
verbs do: into the SQLite file, into PostgreSQL for ``PostgresRuntime``'s schema, and
through the Kafka log (``KafkaRuntime``) for a read model `loomflow processor` folds a
Kafka log into, which the console finds out itself (the CLI's ``--kafka``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomflow.control.refused import Refused
from loomflow.runtime import ANY_USER

if TYPE_CHECKING:
    from loomflow.control.source import Source
    from loomflow.runtime import DatabaseStore, Runtime

__all__ = ["Backend", "ConsoleConfig", "StoreDown"]


class StoreDown(Exception):
    """The store does not answer: the page says so and offers to try again."""


@dataclass(frozen=True)
class ConsoleConfig:
    """How a console runs. ``user``: the one user whose sessions it shows (a
    user-scoped console: another user's ids read as unknown), or ``ANY_USER``.
    ``token``: asked of every request when set (a header or the cookie its one-time
    login link sets). ``agent``: module:factory of the Agents a retry runs (as `loomflow
    sessions retry --agent` takes it); None: the console cannot retry."""

    source: Source
    user: Any = ANY_USER
    read_only: bool = False
    token: str | None = None
    agent: str | None = None
    #: seconds between two looks at the store for a live page
    poll_seconds: float = 0.5
    #: where it listens, for the links it prints and the hosts it answers to
    host: str = "127.0.0.1"
    port: int = 8765
    extra: dict[str, Any] = field(default_factory=dict)


#: what a store that is down raises, below the library's own StoreUnavailableError
_DOWN: tuple[type[BaseException], ...] = (OSError, sqlite3.OperationalError, TimeoutError)


def _down_errors() -> tuple[type[BaseException], ...]:
    from loomflow.errors import StoreClosedError, StoreUnavailableError

    errors: tuple[type[BaseException], ...] = (
        *_DOWN,
        StoreUnavailableError,
        StoreClosedError,
    )
    try:
        import asyncpg

        errors += (asyncpg.PostgresConnectionError, asyncpg.InterfaceError)
    except ModuleNotFoundError:
        pass
    return errors


class Backend:
    """The open runtime the console reads through, and the one its actions write
    through; each opened on first use and again after the store was down."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self._reading: tuple[AsyncExitStack, Runtime] | None = None
        self._writing: tuple[AsyncExitStack, Runtime] | None = None
        self._lock = asyncio.Lock()
        self.down = _down_errors()
        #: (st_dev, st_ino) of the SQLite file opened
        self._file: tuple[int, int] | None = None

    @property
    def embedded(self) -> bool:
        return self.config.source.db is not None

    async def runtime(self) -> Runtime:
        """The runtime over the read model; StoreDown when it cannot be opened."""
        async with self._lock:
            if self._reading is not None and not self._same_file():
                # removed or replaced under the open store, whose reads would go on
                # showing the old file: open what the path names now, or say it is gone
                await self._drop()
            if self._reading is None:
                self._reading = await self._open("read")
                self._file = _identity(self.config.source.db)
            return self._reading[1]

    def _same_file(self) -> bool:
        """Whether the SQLite path still names the file opened (a PostgreSQL: True)."""
        return self._file == _identity(self.config.source.db)

    async def store(self) -> DatabaseStore:
        from loomflow.runtime import DatabaseStore

        store = (await self.runtime()).store
        assert isinstance(store, DatabaseStore)
        return store

    async def writer(self) -> Runtime:
        """The runtime an action writes through: the reading one for a SQLite file,
        else PostgreSQL's, or the Kafka log's when a Kafka log feeds the read model."""
        if self.embedded:
            return await self.runtime()
        store = await self.store()
        async with self._lock:
            if self._writing is None:
                from loomflow.runtime import PostgresStore

                fed = isinstance(store, PostgresStore) and bool(await store.consumed_topics())
                self._writing = await self._open("kafka" if fed else "write")
            return self._writing[1]

    async def _open(self, access: Any) -> tuple[AsyncExitStack, Runtime]:
        stack = AsyncExitStack()
        try:
            runtime = await stack.enter_async_context(self.config.source.runtime(access))
        except Refused:
            await stack.aclose()
            raise
        except self.down as exc:
            await stack.aclose()
            raise StoreDown(_said(exc)) from None
        except Exception as exc:
            await stack.aclose()
            if _missing_store(exc):
                raise StoreDown(_said(exc)) from None
            raise
        return stack, runtime

    async def forget(self) -> None:
        """Drop the open runtimes (the store went down): the next request opens them."""
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        held = [h for h in (self._reading, self._writing) if h is not None]
        self._reading = self._writing = None
        for stack, _ in held:
            with contextlib.suppress(Exception):  # closing what is down says nothing new
                await stack.aclose()

    async def close(self) -> None:
        await self.forget()


def _identity(path: Path | None) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``; None for no path, or no file there."""
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


def _said(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text


def _missing_store(exc: BaseException) -> bool:
    """A store that is not there (yet): a SQLite file or a schema not created."""
    from loomflow.errors import StoreError

    return isinstance(exc, StoreError | FileNotFoundError)
