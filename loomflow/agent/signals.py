"""Durable signals: a run stops to wait for a named message and is resumed when it comes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from loomflow.errors import SignalTimeoutError
from loomflow.runtime import current_journal
from loomflow.schemas import StepRecorded
from loomflow.schemas.clock import utcnow
from loomflow.schemas.codec import input_hash
from loomflow.schemas.events import RunWaitingPayload, StepRecordedPayload

__all__ = ["Suspended", "wait_for_signal"]


class Suspended(BaseException):
    """Raised through a tool or stop hook to end the run as waiting (not an Exception,
    so that a tool's ``except Exception`` does not swallow it)."""

    def __init__(self, waiting: RunWaitingPayload) -> None:
        super().__init__(f"waiting for signal {waiting.signal!r}")
        self.waiting = waiting


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
    writer = journal.writer
    store = writer.runtime.store
    key = journal.next_key(f"signal:{name}")
    digest = input_hash([name])
    recorded = await store.step(writer.scope, key)
    if recorded is not None:
        return _outcome(name, recorded.value)
    deadline_key = f"{key}@until"
    until_step = await store.step(writer.scope, deadline_key)
    until: datetime | None = None
    if until_step is not None:  # a wait resumed: its deadline was set the first time
        until = datetime.fromisoformat(until_step.value["until"])
    row = await store.session(writer.scope)
    # the log decides: a signal recorded at or after the deadline does not answer this
    # wait; it stays in the inbox, for a later wait of that name in the run
    pending = (
        next((s for s in row.inbox if s.name == name and (until is None or s.at < until)), None)
        if row
        else None
    )
    if pending is not None:
        value = {"data": pending.data}
        signal_seq: int | None = pending.seq
    else:
        if until is None and timeout is not None:
            until = utcnow() + timedelta(seconds=timeout)
            await writer.emit(
                StepRecorded,
                StepRecordedPayload(
                    step_key=deadline_key, input_hash=digest, value={"until": until.isoformat()}
                ),
            )
        if until is None or utcnow() < until:
            where = "stop_hook" if journal.prefix.startswith("stop:") else "tool"
            raise Suspended(RunWaitingPayload(signal=name, step_key=key, until=until, where=where))
        value, signal_seq = {"timeout": True}, None
    await writer.emit(
        StepRecorded,
        StepRecordedPayload(step_key=key, input_hash=digest, value=value, signal_seq=signal_seq),
    )
    return _outcome(name, value)


def _outcome(name: str, value: Any) -> Any:
    if isinstance(value, dict) and value.get("timeout"):
        raise SignalTimeoutError(f"no signal {name!r} came before the wait's timeout")
    return value["data"] if isinstance(value, dict) else None
