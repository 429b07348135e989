"""Every error loomflow raises on purpose, in one small hierarchy."""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "CancelRefusedError",
    "CheckpointNotFoundError",
    "CorruptRecordError",
    "InvalidEventError",
    "InvalidIdError",
    "LoomflowError",
    "ModelError",
    "OutputValidationError",
    "ProjectionTimeoutError",
    "RunBudgetExceededError",
    "RunCancelledError",
    "RunOptionsError",
    "RunTakenError",
    "SequenceConflictError",
    "SerializationError",
    "SessionBusyError",
    "SessionErasedError",
    "SessionNotFoundError",
    "SignalRefusedError",
    "SignalTimeoutError",
    "SignatureError",
    "SigningKeyError",
    "StaleWriterError",
    "StoreClosedError",
    "StoreError",
    "StoreFileReplacedError",
    "StoreUnavailableError",
    "UnsafeDeserializationError",
]


class LoomflowError(Exception):
    """Base class of every error loomflow raises on purpose.

    ``retriable`` says whether the same call may succeed later unchanged (a server that
    is down, a read model that lags); the others need something fixed first.
    """

    retriable: ClassVar[bool] = False


class InvalidIdError(LoomflowError, ValueError):
    """A session, user or checkpoint id that cannot be stored safely."""


class CheckpointNotFoundError(LoomflowError, LookupError):
    """The checkpoint asked for does not exist in this (session, user) scope."""


class SerializationError(LoomflowError, TypeError):
    """A value that must be stored as JSON is not JSON-serialisable."""


class ModelError(LoomflowError):
    """The model adapter could not produce a response."""


class OutputValidationError(LoomflowError, ValueError):
    """The final answer did not match the run's ``output_schema``, also after the retries.

    ``output`` is the model's last answer as text; ``error`` what validation said of it.
    The run is recorded as failed; its transcript is kept, so it can be resumed.
    """

    def __init__(self, message: str, *, output: str, error: str) -> None:
        super().__init__(message)
        self.output = output
        self.error = error


class InvalidEventError(LoomflowError, ValueError):
    """An event that the fold refuses: malformed, out of order, stale or erased."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StaleWriterError(InvalidEventError):
    """A writer whose epoch was superseded tried to append to a resumed session."""


class RunCancelledError(StaleWriterError):
    """The run was cancelled (``loomflow sessions cancel``, ``runtime.cancel``) while it
    ran: its writer is fenced, so nothing it does from its next step on is recorded. The
    session stays cancelled (no worker resumes it) until someone continues it on purpose
    with ``agent.resume`` or ``loomflow sessions resume``."""

    @classmethod
    def of(cls, run_id: str, where: str) -> RunCancelledError:
        """The error of run ``run_id`` of ``where`` (a session, described)."""
        return cls(
            f"run {run_id} of {where} was cancelled (runtime.cancel, `loomflow sessions "
            "cancel`): nothing more of it is recorded; continue the session with "
            "agent.resume(session_id=...) or `loomflow sessions resume`, if it should go on"
        )


class SequenceConflictError(InvalidEventError):
    """Another writer appended to the session first (seq already taken or a gap)."""


class SessionErasedError(InvalidEventError):
    """The session was erased; nothing can be appended to it again."""


class SignatureError(InvalidEventError):
    """An event (or an audit digest) that is unsigned where signatures are required, or
    whose signature does not verify: made by a key the keyring does not hold, by a
    retired key after its retirement, or over other bytes than the event's."""


class SigningKeyError(LoomflowError, ValueError):
    """A signing key or keyring that cannot be used: missing, unreadable or malformed.
    The message names the setting or file, never the key's secret."""


class SessionNotFoundError(LoomflowError, LookupError):
    """No session of that id exists for this user (or it was erased)."""


class SessionBusyError(LoomflowError):
    """A live run holds the session, so it cannot be signalled or taken now. Retriable:
    once the run waits, ends or goes silent past its lease, the same call succeeds."""

    retriable = True


class SignalRefusedError(LoomflowError):
    """The session has no run in flight to receive a signal (it finished, failed or was
    parked): a signal kept there would answer some later run's wait that never asked.
    Also raised when the run's wait for that signal timed out: it answers nothing."""


class CancelRefusedError(LoomflowError):
    """The session has no run in flight to cancel: it finished or failed (nothing runs,
    and no worker resumes it), was cancelled already, or has had no run yet (a fork)."""


class RunTakenError(LoomflowError):
    """Another process claimed the session first (a worker, a resume, a signal): the
    run this call meant to take over is someone else's now. Nothing was written."""


class RunOptionsError(LoomflowError, LookupError):
    """A run's recorded option (an extra tool, an output schema) that the process
    continuing it cannot provide as recorded: not hosted, or changed since the run
    started. The run is not continued (nothing is written); resume it where the option
    is hosted, or with explicit keywords that replace the recorded ones.

    ``missing`` says of each option what could not be provided, e.g. ``extra tool
    'tenant', which is not hosted here``.
    """

    def __init__(self, message: str, *, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class RunBudgetExceededError(LoomflowError):
    """A worker's take-over of a run would pass the run's budget (take-overs, model calls,
    tokens or cost): the run is parked as stuck for a person instead."""


class SignalTimeoutError(LoomflowError, TimeoutError):
    """``wait_for_signal`` passed its timeout with no signal of that name."""


class StoreError(LoomflowError):
    """The store cannot be opened, read or written."""


class StoreUnavailableError(StoreError):
    """The store's server could not be reached, or did not answer in time. Retriable:
    nothing acknowledged was lost; the same call may succeed once it is back."""

    retriable = True


class StoreClosedError(StoreError):
    """The store (its runtime) was closed: open a new one."""


class ProjectionTimeoutError(StoreError):
    """The read model did not catch up with the log in time (is the processor running?).

    Retriable: what was appended is durable in the log; try the read again later.
    """

    retriable = True


class StoreFileReplacedError(StoreError):
    """The SQLite file a store opened was removed or replaced under it (by a person, a
    cleanup job, a restore): what the store would write goes to a file nobody will read
    again, so it writes nothing more. Not retriable: every later write fails the same
    way; restore the file, or open a new store on what is at the path now."""


class CorruptRecordError(StoreError):
    """A stored record does not decode as what loomflow wrote there."""


class UnsafeDeserializationError(StoreError):
    """A pickled value was found in a store that only accepts JSON."""
