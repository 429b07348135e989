"""The one error an operator's request is turned down with, by a command or a page."""

from __future__ import annotations

__all__ = ["Missing", "Refused"]


class Refused(Exception):
    """A request turned down, with what to do instead in its message, and the exit code
    a command gives it (2: the request is malformed, 1: what it names is not there or
    not in a state to do it). The web console answers 400 and 404 (or 409) for them."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Missing(Refused):
    """What a request names is not there (or is another user's, which reads the same):
    exit code 1, and 404 in the console."""
