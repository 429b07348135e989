"""Journaled steps: a tool's side effect recorded once and replayed on resume."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar, cast, overload

from loomflow.schemas import (
    StepRecorded,
)
from loomflow.schemas.codec import decode_value, encode_value, input_hash
from loomflow.schemas.events import (
    StepRecordedPayload,
)

if TYPE_CHECKING:
    from loomflow.runtime.writer import SessionWriter

__all__ = ["Journal", "Serializer", "current_journal"]

Serializer = Literal["json", "pickle"]
T = TypeVar("T")
P = ParamSpec("P")

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
        runtime = self._writer.runtime
        full_key = self._prefix + key
        digest = input_hash([list(args), kwargs])
        recorded = await runtime.store.step(self._writer.scope, full_key)
        if recorded is not None and recorded.input_hash == digest:
            return cast(T, decode_value(recorded.value, runtime.serializer))
        outcome = fn(*args, **kwargs)
        value = cast(T, await outcome) if inspect.isawaitable(outcome) else outcome
        stored = encode_value(value, runtime.serializer)
        await self._writer.emit(
            StepRecorded,
            StepRecordedPayload(
                step_key=full_key, input_hash=digest, value=stored, serializer=runtime.serializer
            ),
        )
        return value

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
