"""Whose data an operation touches: every read and write is scoped by (user, session)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loomflow.schemas.ids import validate_id

__all__ = ["ANY_USER", "Scope"]


class _AnyUser:
    def __repr__(self) -> str:
        return "ANY_USER"


#: Passed as ``user_id`` to store-wide operations to match every user.
ANY_USER: Any = _AnyUser()


@dataclass(frozen=True)
class Scope:
    """Whose session: every read and write is scoped by (user, session)."""

    session_id: str
    user_id: str | None = None

    def __post_init__(self) -> None:
        # a Scope is a key of the stores and of the log: one made directly (an argument
        # of Runtime.fork, say) is checked as one made by ``of``
        validate_id(self.session_id, "session_id")
        if self.user_id is not None:
            validate_id(self.user_id, "user_id")

    @classmethod
    def of(cls, session_id: object, user_id: object = None) -> Scope:
        """Validate ids supplied by a caller and return their scope."""
        sid = validate_id(session_id, "session_id")
        uid = None if user_id is None else validate_id(user_id, "user_id")
        return cls(sid, uid)

    def describe(self) -> str:
        who = "no user" if self.user_id is None else f"user {self.user_id}"
        return f"session {self.session_id} ({who})"
