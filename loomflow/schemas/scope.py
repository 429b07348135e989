"""Whose data an operation touches: every read and write is scoped by (user, session)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from loomflow.schemas.ids import validate_id

__all__ = ["ANY_USER", "Scope", "Scoped", "scope_of"]


class _AnyUser:
    def __repr__(self) -> str:
        return "ANY_USER"


#: Passed as ``user_id`` to store-wide operations to match every user.
ANY_USER: Any = _AnyUser()


@dataclass(frozen=True, eq=False)
class Scope:
    """Whose session: every read and write is scoped by (user, session)."""

    session_id: str
    user_id: str | None = None

    # what a dataclass would generate, in fewer steps: stores look their sessions up by
    # scope (a third less per lookup than the generated pair, which build tuples)
    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self.__dict__ == other.__dict__
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.session_id)

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


class Scoped(Protocol):
    """Anything that belongs to one session: an event, a session's row."""

    @property
    def session_id(self) -> str: ...

    @property
    def user_id(self) -> str | None: ...


def scope_of(item: Scoped) -> Scope:
    """The scope of an event or a session's row, whose ids were checked when it was made.

    Stores key their rows by scope and make one for every event they append or consume,
    so this one is cheap: the ids are not checked again, and a session's scope is made
    once and then handed out again (up to ``_MAX_KNOWN`` sessions): a dict lookup keyed
    by the same object never calls ``__eq__``.
    """
    key = (item.user_id, item.session_id)
    scope = _known.get(key)
    if scope is None:
        if len(_known) >= _MAX_KNOWN:
            _known.clear()  # the sessions still in use are made again as they come
        scope = object.__new__(Scope)
        fields = scope.__dict__
        fields["session_id"] = item.session_id
        fields["user_id"] = item.user_id
        _known[key] = scope
    return scope


#: how many sessions' scopes ``scope_of`` keeps (a few MB at most: ids are short)
_MAX_KNOWN = 4096
_known: dict[tuple[str | None, str], Scope] = {}
