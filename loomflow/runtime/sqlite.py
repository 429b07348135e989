"""SqliteRuntime: the event log and read model in one SQLite file (WAL mode)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from loomflow.errors import StoreClosedError, StoreError
from loomflow.projections import sqlite as sql
from loomflow.projections.fold import PruneFilter
from loomflow.projections.sqlite_thread import SqliteThread
from loomflow.runtime.base import Runtime
from loomflow.runtime.group_commit import GroupCommit
from loomflow.runtime.journal import Serializer
from loomflow.runtime.scope import PruneResult
from loomflow.runtime.store import DatabaseStore
from loomflow.runtime.writer import DEFAULT_RETRY_SECONDS
from loomflow.schemas import Event
from loomflow.schemas.events import DEFAULT_LEASE_SECONDS

__all__ = ["SqliteRuntime", "SqliteStore"]

T = TypeVar("T")


class SqliteStore(DatabaseStore):
    """A SQLite file holding the log and its read model.

    All SQLite work runs on one thread owned by this store, so the event loop never
    blocks on disk. Appends that arrive while the thread is busy are committed together
    in one transaction (each in its own savepoint, so a refused append fails alone):
    many concurrent sessions cost one commit per round instead of one each. Several
    stores (in one process or several) may share a file: WAL lets readers run beside
    the one writer, and each commit is a ``BEGIN IMMEDIATE`` transaction that waits its
    turn (``busy_timeout``).

    ``create=False`` opens only a file that already is a loomflow store (for tools that
    inspect one): a missing file or another application's database raises StoreError
    and is left as it was.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 30_000,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = busy_timeout_ms
        self.create = create
        self._thread = SqliteThread(self._open, f"the SQLite store {self.path}")
        self._call = self._thread.call
        super().__init__()
        self._writes = GroupCommit(
            lambda batches: self._call(sql.commit_round, batches), self._cache
        )

    def _open(self) -> sqlite3.Connection:
        if self.path.parent and not self.path.parent.exists():
            raise StoreError(f"directory {self.path.parent} does not exist for store {self.path}")
        return sql.connect(self.path, self._busy_timeout_ms, create=self.create)

    async def open(self) -> None:
        """Open (creating or migrating) the file now instead of on first use."""
        await self._call(_no_op)

    async def close(self) -> None:
        await self._thread.close()

    # -- writes ------------------------------------------------------------------------

    async def append(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self._thread.closed:
            raise StoreClosedError(f"the SQLite store {self.path} is closed")
        await self._writes.append(list(events))

    async def _prune(self, match: PruneFilter) -> PruneResult:
        self.forget()
        return PruneResult(*await self._call(sql.prune, match))

    # -- reads -------------------------------------------------------------------------

    queries: ClassVar[Any] = sql

    async def _query(self, query: Callable[..., Any], *args: Any) -> Any:
        return await self._call(query, *args)


class SqliteRuntime(Runtime):
    """Durable runs in one local SQLite file: nothing to install, the same semantics."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_checkpoints_per_session: int = 20,
        serializer: Serializer = "json",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> None:
        super().__init__(
            SqliteStore(path),
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
        )


def _no_op(conn: sqlite3.Connection) -> None:
    """What ``open`` runs on the store's thread: opening the connection is the point."""
