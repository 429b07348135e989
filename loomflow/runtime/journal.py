"""Journaled steps: a tool's side effect recorded once and replayed on resume."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

from loomflow.errors import SignalTimeoutError
from loomflow.schemas import (
    StepRecorded,
)
from loomflow.schemas.clock import utcnow
from loomflow.schemas.codec import decode_value, encode_value, input_hash
from loomflow.schemas.events import (
    RunWaitingPayload,
    StepRecordedPayload,
)

if TYPE_CHECKING:
    from loomflow.runtime.writer import SessionWriter

__all__ = ["Journal", "Suspended", "current_journal"]

T = TypeVar("T")
P = ParamSpec("P")


class Suspended(BaseException):
    """Raised through a tool or stop hook to end the run as waiting (not an Exception,
    so that a tool's ``except Exception`` does not swallow it)."""

    def __init__(self, waiting: RunWaitingPayload) -> None:
        super().__init__(f"waiting for signal {waiting.signal!r}")
        self.waiting = waiting


_current_journal: contextvars.ContextVar[Journal | None] = contextvars.ContextVar(
    "loomflow_journal", default=None
)


def current_journal() -> Journal | None:
    """The journal of the tool call running now, or None outside an agent run."""
    return _current_journal.get()


class Journal:
    """Journaled steps: same key and same inputs return the recorded result.

    A step whose key was recorded with different inputs runs again and its new result
    is recorded. A step that ran but whose record was not written before a crash runs
    again on resume: delivery is at least once, so steps should be idempotent.
    """

    def __init__(self, writer: SessionWriter, prefix: str = "") -> None:
        self._writer = writer
        self._prefix = prefix
        self._keys: dict[str, int] = {}

    @property
    def writer(self) -> SessionWriter:
        return self._writer

    @property
    def prefix(self) -> str:
        return self._prefix

    def next_key(self, base: str) -> str:
        """``base`` under this journal's prefix, numbered by how often it was asked for:
        the same code replayed asks in the same order, so it gets the same keys."""
        count = self._keys[base] = self._keys.get(base, 0) + 1
        return f"{self._prefix}{base}#{count}"

    def scoped(self, prefix: str) -> Journal:
        return Journal(self._writer, self._prefix + prefix)

    # Two overloads, because ``Callable[..., T | Awaitable[T]]`` cannot be solved for a
    # coroutine function: mypy refused ``await journal.step("k", async_fn, x)``. The async
    # one comes first so that a coroutine function's T is its awaited result.
    @overload
    async def step(
        self, key: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    @overload
    async def step(
        self, key: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    async def step(
        self, key: str, fn: Callable[P, T | Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once per (key, inputs); replay its recorded value.

        ``fn`` may be a plain or a coroutine function; the step returns its (awaited) result.
        """
        if not isinstance(key, str) or not key or not _storable(key):
            raise ValueError(
                "a step key must be a non-empty string without NUL or lone surrogates "
                f"(every store keeps it as text), not {key!r}"
            )
        writer = self._writer
        serializer = writer.policy.serializer
        full_key = self._prefix + key
        digest = input_hash([list(args), kwargs])
        recorded = await writer.store.step(writer.scope, full_key)
        if recorded is not None and recorded.input_hash == digest:
            return cast(T, decode_value(recorded.value, serializer))
        outcome = fn(*args, **kwargs)
        value = cast(T, await outcome) if inspect.isawaitable(outcome) else outcome
        stored = encode_value(value, serializer)
        await writer.emit(
            StepRecorded,
            StepRecordedPayload(
                step_key=full_key, input_hash=digest, value=stored, serializer=serializer
            ),
        )
        return value

    # ``timeout`` is a durable deadline recorded in the log, not an in-process wait
    async def wait_for_signal(self, name: str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """The payload of the next signal ``name`` in the session's inbox, received and
        recorded as a step (a replay returns the same payload); else Suspended, after
        recording the wait's deadline ``timeout`` seconds from its first wait. The
        agent's ``wait_for_signal`` says what a caller sees."""
        writer = self._writer
        store = writer.store
        key = self.next_key(f"signal:{name}")
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
                where = "stop_hook" if self._prefix.startswith("stop:") else "tool"
                raise Suspended(
                    RunWaitingPayload(signal=name, step_key=key, until=until, where=where)
                )
            value, signal_seq = {"timeout": True}, None
        await writer.emit(
            StepRecorded,
            StepRecordedPayload(
                step_key=key, input_hash=digest, value=value, signal_seq=signal_seq
            ),
        )
        return _outcome(name, value)

    def activate(self) -> contextvars.Token[Journal | None]:
        return _current_journal.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token[Journal | None]) -> None:
        _current_journal.reset(token)


def _storable(key: str) -> bool:
    """Whether every store keeps ``key`` as it is: PostgreSQL's text refuses NUL, and no
    JSON holds a lone surrogate."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in key


def _outcome(name: str, value: Any) -> Any:
    if isinstance(value, dict) and value.get("timeout"):
        raise SignalTimeoutError(f"no signal {name!r} came before the wait's timeout")
    return value["data"] if isinstance(value, dict) else None
