"""Who a run is for, readable from anything the run calls: tools, stop hooks, journal steps."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from loomflow.errors import SerializationError
from loomflow.schemas import validate_id
from loomflow.schemas.codec import dumps_plain

__all__ = ["RunContext", "get_run_context"]


@dataclass(frozen=True)
class RunContext:
    """The user, session and run a tool is running for, and the run's metadata.

    A caller may build one and pass it as ``run(..., context=...)``; the run fills in
    what it decides itself (the session id of a new session, the run id) and the keywords
    given to ``run`` override the context's fields. Immutable: ``metadata`` is a read-only
    mapping. It is written into the run's log as JSON, so it must be plain JSON (str
    keys; no NaN, dates or sets): anything else is a SerializationError before the run
    starts.
    """

    user_id: str | None = None
    session_id: str | None = None
    run_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.user_id is not None:
            validate_id(self.user_id, "RunContext.user_id")
        if self.session_id is not None:
            validate_id(self.session_id, "RunContext.session_id")
        if not isinstance(self.metadata, Mapping):
            raise TypeError("RunContext.metadata must be a mapping")
        metadata = dict(self.metadata)
        try:  # checked here, before a run writes it into its run.started
            dumps_plain(metadata)
        except SerializationError as exc:
            raise SerializationError(f"RunContext.metadata: {exc}") from None
        object.__setattr__(self, "metadata", MappingProxyType(metadata))

    def merged(
        self,
        *,
        user_id: str | None,
        session_id: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> RunContext:
        """This context with the keywords of a ``run`` call laid over it.

        A ``user_id`` that names another user than the context's is refused: checkpoints
        and sessions are scoped by user, and a run must not write one user's session
        under another's context.
        """
        if user_id is not None and self.user_id is not None and user_id != self.user_id:
            raise ValueError(
                f"context is for user {self.user_id!r} but user_id={user_id!r} was given; "
                "pass one of them, or the same user in both"
            )
        return replace(
            self,
            user_id=self.user_id if user_id is None else user_id,
            session_id=self.session_id if session_id is None else session_id,
            metadata={**self.metadata, **(metadata or {})},
        )


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "loomflow_run_context", default=None
)


def get_run_context() -> RunContext:
    """The context of the run in progress in this task (tools, stop hooks, journal steps).

    Each run sets its own in a context variable, so concurrent runs never see each
    other's. Raises LookupError outside a run.
    """
    context = _current.get()
    if context is None:
        raise LookupError("get_run_context() was called outside an agent run")
    return context


def activate(context: RunContext) -> contextvars.Token[RunContext | None]:
    """Make ``context`` the current run's until ``deactivate``."""
    return _current.set(context)


def deactivate(token: contextvars.Token[RunContext | None]) -> None:
    _current.reset(token)
