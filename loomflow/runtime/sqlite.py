"""SqliteRuntime: the event log and read model in one SQLite file (WAL mode)."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from loomflow.errors import StoreClosedError, StoreError
from loomflow.projections import sqlite as sql
from loomflow.projections.sqlite.thread import SqliteThread
from loomflow.runtime.base import Runtime
from loomflow.runtime.group_commit import GroupCommit, Outcomes
from loomflow.runtime.store import DatabaseStore, PruneResult
from loomflow.schemas.scope import Scope

if TYPE_CHECKING:
    from loomflow.projections.fold import PruneFilter
    from loomflow.schemas import Event
    from loomflow.schemas.options import Serializer
    from loomflow.schemas.sessions import SessionRecord
    from loomflow.settings import Settings

__all__ = ["SqliteRuntime", "SqliteStore"]

T = TypeVar("T")

logger = logging.getLogger("loomflow.runtime")

#: how many events the event loop's connection commits between two WAL checkpoints on
#: the store's thread. A commit of one event writes its log row and 4-7 pages of indexes
#: and rows, so the WAL stays under ~30 MB; events committed in one round share pages.
#: Appends wait while a checkpoint runs, so rarer is better for tails (SQLite's own
#: default, every 1,000 pages, would checkpoint every ~150 events of a lone session).
CHECKPOINT_EVERY = 1000


class SqliteStore(DatabaseStore):
    """A SQLite file holding the log and its read model.

    Reads, opening, migrations, prunes and WAL checkpoints run on one thread owned by
    this store, so the event loop never waits on them. Appends are committed on the
    event loop's own thread, through a second connection: a commit in WAL mode with
    ``synchronous=NORMAL`` writes to the WAL without an fsync (tens of microseconds),
    less than handing the work to a thread and back costs. That connection never waits:
    when another connection holds the write lock (another process sharing the file, a
    prune), the round is committed on the store's thread instead, which waits its turn
    (``busy_timeout``); and it never checkpoints the WAL, the store's thread does, every
    ``CHECKPOINT_EVERY`` events. A lone writer's append is committed in its own step;
    the appends of sessions that take turns are committed together in rounds (each in
    its own savepoint, so a refused append fails alone): many concurrent sessions cost
    one commit per round instead of one each (see GroupCommit). Several stores (in one
    process or several) may share a file: WAL lets readers run beside the one writer.
    Each round first checks that the path still names the file opened: one removed or
    replaced under the store fails every write after with StoreFileReplacedError.

    ``create=False`` opens only a file that already is a loomflow store (for tools that
    inspect one): a missing file or another application's database raises StoreError
    and is left as it was. ``settings`` (by default the ``LOOMFLOW_*`` environment) give
    the busy timeout, unless ``busy_timeout_ms`` is given, and the signing key.
    """

    #: a commit on the event loop never waits; on the store's thread, for busy_timeout_ms
    appends_bounded = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int | None = None,
        create: bool = True,
        settings: Settings | None = None,
    ) -> None:
        from loomflow.settings import Settings

        self.path = Path(path)
        resolved = Settings.resolve(settings)
        if busy_timeout_ms is None:
            busy_timeout_ms = resolved.sqlite_busy_timeout_ms
        self._busy_timeout_ms = busy_timeout_ms
        self.signer, self.signing_refused = resolved.writer_key()
        self.create = create
        self._thread = SqliteThread(self._open, f"the SQLite store {self.path}")
        self._call = self._thread.call
        super().__init__()
        #: the event loop's connection for commits, opened on first use; the lock keeps
        #: it to one thread at a time (event loops of several threads may share a store)
        self._direct: sqlite3.Connection | None = None
        self._direct_lock = threading.Lock()
        self._since_checkpoint = 0
        self._checkpointing: concurrent.futures.Future[None] | None = None
        self._writes = GroupCommit(self._commit, self._cache, self._commit_now)
        #: the file opened, which each commit round checks the path still names
        self._file: sql.OpenedFile | None = None

    @functools.cached_property
    def _known(self) -> sql.KnownRows:
        """The rows of this store's own last commits (see KnownRows), made with the first
        commit on the event loop's connection: their module is the SQLite apply step's,
        which a store not yet used does not load."""
        return sql.KnownRows()

    def _open(self) -> sqlite3.Connection:
        if self.path.parent and not self.path.parent.exists():
            raise StoreError(f"directory {self.path.parent} does not exist for store {self.path}")
        conn = sql.connect(self.path, self._busy_timeout_ms, create=self.create)
        try:
            self._file = sql.OpenedFile(self.path)
        except OSError as exc:  # gone already, between the open and the stat
            conn.close()
            raise StoreError(f"the SQLite store {self.path}: cannot stat it: {exc}") from exc
        return conn

    def _verify(self) -> None:
        """Refuse a commit into a file that the path no longer names (removed or replaced
        under this store): one stat per commit round, inside its write transaction."""
        if self._file is not None:
            self._file.check()

    async def open(self) -> None:
        """Open (creating or migrating) the file now instead of on first use."""
        await self._call(_no_op)

    async def close(self) -> None:
        with self._direct_lock:
            direct, self._direct = self._direct, None
            if direct is not None:
                direct.close()  # first: the thread's connection, closed last, checkpoints
        await self._thread.close()

    # -- writes ------------------------------------------------------------------------

    async def _append(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self._thread.closed:
            raise StoreClosedError(f"the SQLite store {self.path} is closed")
        await self._writes.append(list(events))

    async def _commit(self, batches: list[list[Event]]) -> Outcomes:
        """One round of appends: on the event loop's thread when the file is free, else on
        the store's thread, which waits for it."""
        if self._direct is None:
            self._direct = await self._call(_open_direct, self.path)
        outcomes = self._commit_now(batches)
        if outcomes is None:
            outcomes = await self._call(sql.commit_round, batches, None, self._verify)
        return outcomes

    def _commit_now(self, batches: list[list[Event]]) -> Outcomes | None:
        """Commit the round on the event loop's connection; None when that cannot be done
        now (not opened yet, in use by another thread, the file busy: rolled back)."""
        if self._direct is None or self._checkpoint_lags():
            return None
        if not self._direct_lock.acquire(blocking=False):
            return None
        try:
            if self._direct is None:
                return None
            outcomes = sql.commit_round(self._direct, batches, self._known, self._verify)
        except sqlite3.OperationalError as exc:
            if sql.is_busy(exc):
                return None
            raise StoreError(f"the SQLite store {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"the SQLite store {self.path}: {exc}") from exc
        finally:
            self._direct_lock.release()
        self._after_commit(sum(len(events) for events in batches))
        return outcomes

    def _checkpoint_lags(self) -> bool:
        """Whether a WAL checkpoint was asked for half an interval ago and has not run:
        the store's thread is late (a loaded machine), and the WAL would grow by what the
        event loop's connection commits meanwhile. Rounds then commit on that thread,
        behind the checkpoint, so the WAL stays bounded (about 1.5 intervals)."""
        return self._checkpointing is not None and self._since_checkpoint >= CHECKPOINT_EVERY // 2

    def _after_commit(self, events: int) -> None:
        self._since_checkpoint += events
        if self._since_checkpoint < CHECKPOINT_EVERY or self._checkpointing is not None:
            return
        # on the store's thread, started now (a lone writer's commits never yield to the
        # event loop): appends meanwhile find the file busy and wait for it on that thread
        self._since_checkpoint = 0
        self._checkpointing = self._thread.submit(sql.checkpoint_wal)
        self._checkpointing.add_done_callback(self._checkpointed)

    def _checkpointed(self, done: concurrent.futures.Future[None]) -> None:
        # on the store's thread; the next commit on the event loop's may start another
        self._checkpointing = None
        if not done.cancelled() and done.exception() is not None:
            # the next one tries again; a store that is away says so at its next write
            logger.warning("checkpointing the WAL of %s failed: %s", self.path, done.exception())

    async def session(self, scope: Scope) -> SessionRecord | None:
        # the row of this store's own last commit, while no other connection wrote since:
        # a run's claim and a resume read it without waiting on the store's thread
        if self._direct is not None and self._direct_lock.acquire(blocking=False):
            try:
                if self._direct is not None:
                    row = self._known.current(self._direct, scope)
                    if row is not None:
                        return row
            except sqlite3.DatabaseError:
                pass  # read from the file below, which says what is wrong
            finally:
                self._direct_lock.release()
        return await super().session(scope)

    async def _prune(self, match: PruneFilter) -> PruneResult:
        self.forget()
        return PruneResult(*await self._call(sql.prune, match, self._verify))

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
        max_checkpoints_per_session: int | None = None,
        serializer: Serializer | None = None,
        lease_seconds: float | None = None,
        retry_seconds: float | None = None,
        settings: Settings | None = None,
    ) -> None:
        from loomflow.settings import Settings

        resolved = Settings.resolve(
            settings,
            max_checkpoints_per_session=max_checkpoints_per_session,
            serializer=serializer,
            lease_seconds=lease_seconds,
            retry_seconds=retry_seconds,
        )
        super().__init__(
            SqliteStore(path, settings=resolved),
            settings=resolved,
        )


def _open_direct(conn: sqlite3.Connection, path: Path) -> sqlite3.Connection:
    """Open the event loop's connection on the store's thread, once the thread's own
    connection made (or migrated) the file."""
    return sql.connect_direct(path)


def _no_op(conn: sqlite3.Connection) -> None:
    """What ``open`` runs on the store's thread: opening the connection is the point."""
