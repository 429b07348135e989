"""What an operator does to a store, written once for the command line and the web
console: find a session (another user's reads as missing), list sessions by the statuses
a person reads, fork, signal, cancel, erase, resume and retry.

Each verb takes the open runtime and a :class:`~loomflow.runtime.Scope`, does what the
library's API does (``runtime.fork``, ``runtime.signal``, ``runtime.cancel``,
``runtime.store.erase``, ``agent.resume``, ``agent.take_over``), so each is recorded in the
log as the API records it, and turns what cannot be done into :class:`Refused` with what
to do instead. How the answer is shown is the caller's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from loomflow.control.agents import hosting
from loomflow.control.refused import Missing, Refused
from loomflow.control.status import STORED, status

if TYPE_CHECKING:
    from loomflow.runtime import DatabaseStore, Runtime, Scope
    from loomflow.schemas import RunResult
    from loomflow.schemas.sessions import SessionCursor, SessionRecord

__all__ = [
    "cancel",
    "erase",
    "erase_plan",
    "fork",
    "matching",
    "outcome",
    "parse_payload",
    "resume",
    "retry",
    "session",
    "signal",
]


async def session(runtime: Runtime, scope: Scope) -> SessionRecord:
    """The row of ``scope``; another user's session, or a missing one, is Refused as "not
    found" alike, and so is an erased one."""
    row = await runtime.store.session(scope)
    if row is None:
        raise Missing(
            f"no {scope.describe()}; list them with `loomflow sessions ls` (a user's "
            "sessions need --user U)"
        )
    if row.status == "erased":
        raise Missing(f"{scope.describe()} was erased")
    return row


async def matching(
    store: DatabaseStore,
    *,
    user_id: Any,
    statuses: Sequence[str] = (),
    since: datetime | None = None,
    agent: str | None = None,
    limit: int,
    after: SessionCursor | None = None,
) -> list[SessionRecord]:
    """Up to ``limit`` sessions that pass every filter, the most recently active first,
    after the cursor ``after``: the store's query filters by user, stored status, time and
    agent; the statuses a person reads off the clock (abandoned) or the lineage (forked)
    are kept after reading, with more read until ``limit`` rows passed or none is
    left."""
    stored = {STORED.get(name, name) for name in statuses}
    query = None if None in stored else sorted(s for s in stored if s is not None) or None
    fetch = limit
    while True:
        rows = await store.list_sessions(
            user_id=user_id, limit=fetch, status=query, since=since, agent=agent, after=after
        )
        kept = [row for row in rows if not statuses or status(row) in statuses]
        if len(kept) >= limit or len(rows) < fetch:
            return kept[:limit]
        fetch *= 4


async def fork(
    runtime: Runtime, scope: Scope, checkpoint_id: str, *, new_id: str | None = None
) -> str:
    """Fork ``scope`` from its checkpoint ``checkpoint_id`` (``runtime.fork``, recorded as
    ``session.forked``); the new session's id. Refused: no such session or checkpoint, or
    ``new_id`` taken."""
    from loomflow.errors import CheckpointNotFoundError, InvalidIdError
    from loomflow.schemas.ids import validate_id

    if new_id is not None:
        try:
            validate_id(new_id, "new session id")
        except InvalidIdError as exc:  # a bad argument, not a refusal of a good one
            raise Refused(str(exc), 2) from None
    await session(runtime, scope)
    try:
        child = await runtime.fork(scope, checkpoint_id, session_id=new_id)
    except CheckpointNotFoundError:
        raise Missing(
            f"no checkpoint {checkpoint_id} for {scope.describe()}; list them with "
            f"`loomflow checkpoints ls {scope.session_id}`"
        ) from None
    except InvalidIdError as exc:  # the new id is taken, or not an id
        raise Refused(f"{exc}; choose another id", 1) from None
    return child.session_id


def parse_payload(text: str, *, what: str = "the payload") -> Any:
    """A signal's payload from its JSON text; Refused (code 2) saying where ``what`` is
    not JSON."""
    import orjson

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise Refused(f"{what} is not JSON: {exc}", 2) from None


async def signal(runtime: Runtime, scope: Scope, name: str, data: Any) -> int:
    """Send the signal ``name`` with ``data`` to ``scope`` (``runtime.signal``, recorded as
    ``signal.sent``); its seq. Refused: no such session, or a bad name."""
    from loomflow.errors import SessionNotFoundError

    try:
        return await runtime.signal(scope, name, data)
    except SessionNotFoundError:
        raise Missing(f"no {scope.describe()}; list them with `loomflow sessions ls`") from None
    except ValueError as exc:  # the name, or a payload that is not JSON-only
        raise Refused(str(exc), 2) from None


def erase_plan(row: SessionRecord, scope: Scope) -> str:
    """What erasing ``row`` removes, as a person confirms it."""
    events = f"{row.last_seq} event" + ("" if row.last_seq == 1 else "s")
    return (
        f"{scope.describe()}: its {events}, transcript, checkpoints and journal, from the "
        "log and every projection (a tombstone keeps the id from being used again)"
    )


async def erase(runtime: Runtime, scope: Scope) -> None:
    """Erase ``scope`` (``store.erase``, recorded as ``session.erased``). Refused: not
    there, or erased meanwhile."""
    if not await runtime.store.erase(scope.session_id, user_id=scope.user_id):
        raise Missing(f"no {scope.describe()}: it was erased meanwhile")


async def cancel(runtime: Runtime, scope: Scope, reason: str) -> tuple[SessionRecord, int]:
    """Cancel the run of ``scope`` (``runtime.cancel``, recorded as ``run.cancelled``):
    the session's row before, and the event's seq."""
    from loomflow.errors import SessionNotFoundError

    row = await session(runtime, scope)
    try:
        seq = await runtime.cancel(scope, reason)
    except SessionNotFoundError:
        raise Missing(f"no {scope.describe()}: it was erased meanwhile") from None
    except ValueError as exc:  # the reason
        raise Refused(str(exc), 2) from None
    return row, seq


async def resume(runtime: Runtime, scope: Scope, target: str, prompt: str | None) -> RunResult:
    """Continue ``scope`` as ``agent.resume`` does, with the agent of ``target``
    (module:factory) in this process. Refused: its run is live, or it fails."""
    from datetime import UTC

    from loomflow.runtime.base import abandoned

    row = await session(runtime, scope)
    if row.status == "running" and row.last_run_id and not abandoned(row, runtime.lease_seconds):
        raise Refused(
            f"run {row.last_run_id} of {scope.describe()} is running (its last event "
            f"{row.updated_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC): cancel it first "
            f"(`loomflow sessions cancel {scope.session_id}`), or let it end"
        )
    async with hosting(target, row, runtime) as agent:
        return await outcome(
            scope,
            agent.resume(prompt, session_id=scope.session_id, user_id=scope.user_id),
            failed="the run failed",
        )


async def retry(runtime: Runtime, scope: Scope, target: str, *, by: str) -> RunResult:
    """Run the parked (stuck) run of ``scope`` once more, as a worker's take-over would
    (``agent.take_over``: no prompt; a failure parks it again), with the agent of
    ``target`` in this process; ``by`` names who retries it in the log. Refused: it is not
    stuck, another retry or resume came first, or it fails."""
    row = await session(runtime, scope)
    if row.status != "stuck":
        raise Refused(
            f"{scope.describe()} is not stuck (it is {status(row)}): retry takes over a run "
            f"a worker parked; `loomflow sessions resume {scope.session_id}` continues others"
        )
    async with hosting(target, row, runtime) as agent:
        return await outcome(
            scope,
            agent.take_over(
                scope.session_id,
                user_id=scope.user_id,
                after_seq=row.last_seq,  # another retry or resume first: RunTakenError
                worker=f"{by}@{socket.gethostname()}:{os.getpid()}",
                last_attempt=True,  # a failure parks it again, for a person
            ),
            failed="the retry failed (as a last attempt: it parks the run again)",
        )


async def outcome(scope: Scope, run: Awaitable[RunResult], *, failed: str) -> RunResult:
    """The run's result; Refused saying why it did not run or how it failed."""
    from loomflow.errors import RunCancelledError, RunOptionsError, RunTakenError

    try:
        return await run
    except (RunOptionsError, RunTakenError, RunCancelledError) as exc:
        raise Refused(str(exc)) from None
    except Exception as exc:
        raise Refused(
            f"{failed}: {type(exc).__name__}: {exc}; see `loomflow sessions show "
            f"{scope.session_id}`"
        ) from None
