"""Durable signals: a run stops to wait for a named message and is resumed when it comes."""

from __future__ import annotations

from typing import Any

from loomflow.runtime import current_journal
from loomflow.runtime.journal import Suspended

__all__ = ["Suspended", "wait_for_signal"]


# ``timeout`` is a durable deadline recorded in the log, not an in-process wait that
# asyncio.timeout could bound: the run may be resumed by another process after it
async def wait_for_signal(name: str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
    """The payload of the next signal ``name`` sent to this run's session.

    Call it inside a tool or a stop hook. When the signal is already in the session's
    inbox, it is received at once (and recorded, so a replay returns the same payload).
    Otherwise the run records that it waits and ends with ``stop_reason="waiting"``; its
    process may exit. Once the signal is sent (``agent.signal`` or ``loomflow signal``),
    a worker (or ``agent.resume``) resumes the run, and this call returns the payload at
    the point where it waited. ``timeout`` (seconds, from the first wait) bounds the
    wait: after it, the resumed call raises SignalTimeoutError. A signal whose
    ``signal.sent`` the log recorded at or after that deadline does not answer the wait;
    it stays in the inbox for a later wait of that name in the same run.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValueError(f"a signal name must be a non-empty string of <= 200 characters: {name!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
    journal = current_journal()
    if journal is None:
        raise RuntimeError("wait_for_signal() works inside a tool or a stop hook of an agent run")
    return await journal.wait_for_signal(name, timeout=timeout)
