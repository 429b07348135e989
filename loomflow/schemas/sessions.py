"""What the log says of a session: its status, its run's wait, inbox, options and budget."""

# No ``from __future__ import annotations`` here: pydantic would then compile and
# evaluate every field's annotation from its string when the models are made, at import
# (~a quarter of the package's own import time, most of the embedded import's share).

import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from loomflow.schemas.events import RunOptions
from loomflow.schemas.ids import validate_id
from loomflow.schemas.messages import Usage

__all__ = [
    "PendingSignal",
    "SessionCursor",
    "SessionRecord",
    "SessionStatus",
    "SessionTotals",
    "Waiting",
]

#: running: a writer holds it (or held it, and went silent: abandoned, which readers derive
#: from the lease and the clock, see ``runtime.base.abandoned``); waiting: its run stopped
#: to wait for a signal; signalled: the signal it waits for came (a worker resumes it);
#: stuck: a worker gave up on it; cancelled: a person stopped its run (no worker resumes
#: it; ``agent.resume`` continues it)
SessionStatus = Literal[
    "running", "waiting", "signalled", "finished", "failed", "stuck", "cancelled", "erased"
]


@dataclass(frozen=True)
class Waiting:
    """What a session's run stopped to wait for (``run.waiting``)."""

    signal: str
    step_key: str
    until: datetime | None
    where: Literal["tool", "stop_hook"]


@dataclass(frozen=True)
class PendingSignal:
    """A signal in the session's inbox: sent, not yet received by a wait."""

    seq: int
    name: str
    data: Any
    at: datetime


@dataclass(frozen=True)
class SessionRecord:
    """A session as its log makes it: the fold of its events so far (what a read
    model's sessions row holds, and what a runtime reports of a session)."""

    user_id: str | None
    session_id: str
    created_at: datetime
    updated_at: datetime
    last_seq: int = 0
    epoch: int = 0
    status: SessionStatus = "running"
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    message_count: int = 0
    base_seq: int = 0
    parent_session_id: str | None = None
    parent_checkpoint_id: str | None = None
    last_run_id: str | None = None
    #: the agent of the latest run, and the silence after which that run is abandoned
    agent: str | None = None
    lease_seconds: float | None = None
    #: what the session's run waits for (status "waiting"), and signals not received yet
    waiting: Waiting | None = None
    inbox: tuple[PendingSignal, ...] = ()
    #: runs a worker started since the session last finished or waited, and the error
    #: of the last failed run (or why its run was cancelled): a worker's bounded retries,
    #: kept across processes
    attempts: int = 0
    last_error: str | None = None
    #: the metadata and options the latest run recorded in its run.started: what a run
    #: that continues it is given (None: recorded before options were kept)
    run_metadata: dict[str, Any] | None = None
    run_options: RunOptions | None = None
    #: a run's budget, kept across processes: the take-overs by workers since a caller
    #: started the run or it last waited, and the model calls and usage since a caller
    #: started it (``Worker`` parks a run past its limits)
    takes: int = 0
    spent_calls: int = 0
    spent: Usage = field(default_factory=Usage)


#: the format of a cursor's token (its first element), so a later one can be told apart
_CURSOR_FORMAT = 1
#: a token is ~100 characters for ids of ~30; ids are at most 200 characters each
_MAX_TOKEN = 1024


@dataclass(frozen=True)
class SessionCursor:
    """Where a page of ``list_sessions`` ended: ``list_sessions(after=cursor)`` lists the
    sessions strictly after this one in the listing's order (``updated_at`` newest first,
    then user id, then session id), so a session is listed once across pages while the
    sessions are not active; one active meanwhile moves to the first page.

    ``encode`` makes it an opaque URL-safe token (for a page's "next" link) and
    ``decode`` reads one back.
    """

    updated_at: datetime
    user_id: str | None
    session_id: str

    def __post_init__(self) -> None:
        if not isinstance(self.updated_at, datetime) or self.updated_at.tzinfo is None:
            raise ValueError(
                f"a session cursor needs an aware datetime, not {self.updated_at!r}: "
                "make it with SessionCursor.of(row)"
            )
        if self.user_id is not None:
            validate_id(self.user_id, "user_id")
        validate_id(self.session_id, "session_id")

    @classmethod
    def of(cls, row: "SessionRecord") -> "SessionCursor":
        """The cursor right after ``row``: the last row of a page gives the next page's."""
        return cls(row.updated_at, row.user_id, row.session_id)

    def encode(self) -> str:
        """This cursor as an opaque token of URL-safe characters (base64url, no padding)."""
        moment = self.updated_at.astimezone(UTC).isoformat(timespec="microseconds")
        body = orjson.dumps([_CURSOR_FORMAT, moment, self.user_id, self.session_id])
        return base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, text: str) -> "SessionCursor":
        """The cursor of a token ``encode`` made; ValueError when ``text`` is not one."""
        if not isinstance(text, str):
            raise ValueError(f"a session cursor token is a string, not {type(text).__name__}")
        try:
            if not text or len(text) > _MAX_TOKEN or not text.isascii():
                raise ValueError("it is empty, too long or not URL-safe text")
            body = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            parts = orjson.loads(body)
            if not (isinstance(parts, list) and len(parts) == 4 and parts[0] == _CURSOR_FORMAT):
                raise ValueError("it does not hold a cursor")
            _, moment, user_id, session_id = parts
            if not isinstance(moment, str) or not isinstance(session_id, str):
                raise ValueError("it does not hold a cursor")
            if user_id is not None and not isinstance(user_id, str):
                raise ValueError("it does not hold a cursor")
            return cls(datetime.fromisoformat(moment), user_id, session_id)
        except (ValueError, binascii.Error) as exc:
            raise ValueError(
                f"not a session cursor token: {text[:60]!r} ({exc}); pass the token of a "
                "page of list_sessions (SessionCursor.of(last_row).encode()) unchanged"
            ) from exc


@dataclass(frozen=True)
class SessionTotals:
    """What ``session_totals`` counts of the sessions a listing's filters select: how many
    there are and their usage summed (tokens and cost of every model call)."""

    sessions: int = 0
    usage: Usage = field(default_factory=Usage)
