"""What the log says of a session: its status, its run's wait, inbox, options and budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from loomflow.schemas.events import RunOptions
from loomflow.schemas.messages import Usage

__all__ = ["PendingSignal", "SessionRecord", "SessionStatus", "Waiting"]

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
