"""The Agent and its loop: passes of model call -> tool calls until a final answer."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Self

import orjson
from pydantic import BaseModel, ValidationError

from loomflow.agent.context import RunContext
from loomflow.agent.context import activate as activate_context
from loomflow.agent.context import deactivate as deactivate_context
from loomflow.agent.hashes import TranscriptHashes
from loomflow.agent.options import RECORDED_KEYWORDS, Hosted, schema_ref, tool_ref
from loomflow.agent.signals import Suspended
from loomflow.agent.streaming import Emit, Emitter, RunItem, TextDelta, stream_of
from loomflow.agent.tools import Tool, as_tool
from loomflow.agent.tuning import SessionState, Tuning
from loomflow.errors import (
    InvalidEventError,
    LoomflowError,
    OutputValidationError,
    RunBudgetExceededError,
    RunOptionsError,
    SerializationError,
    SignalTimeoutError,
)
from loomflow.models.base import (
    COMPACTION_INSTRUCTIONS,
    CallOptions,
    Effort,
    Model,
    accepts_options,
)
from loomflow.runtime import InProcRuntime, Journal, RestoredState, Runtime, Scope, SessionWriter
from loomflow.schemas import (
    CheckpointMeta,
    CheckpointWritten,
    Event,
    Message,
    Role,
    RunFailed,
    RunFinished,
    RunHeartbeat,
    RunOptions,
    RunResult,
    RunStarted,
    RunWaiting,
    StopReason,
    ToolCall,
    TranscriptCompacted,
    TurnAppended,
    Usage,
    new_id,
    validate_id,
)
from loomflow.schemas.codec import dumps, input_hash
from loomflow.schemas.events import (
    CheckpointWrittenPayload,
    RunFailedPayload,
    RunFinishedPayload,
    RunWaitingPayload,
    TranscriptCompactedPayload,
    TurnAppendedPayload,
)

if TYPE_CHECKING:
    from loomflow.schemas.sessions import SessionRecord, Waiting

__all__ = ["DEFAULT_AGENT_NAME", "Agent"]

#: the name of an Agent not given one: a process that hosts a single agent resumes its
#: runs without naming it
DEFAULT_AGENT_NAME = "agent"

logger = logging.getLogger("loomflow.agent")


def _resolve_model(model: Model | str) -> Model:
    if isinstance(model, str):
        from loomflow.models.anthropic import AnthropicModel

        return AnthropicModel(model)
    if not hasattr(model, "complete"):
        raise TypeError(f"model must be a Claude model name or a Model, got {type(model).__name__}")
    return model


def _check_prompt(prompt: object) -> str:
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, not {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError("prompt is empty; pass prompt=None to resume() for the continuation nudge")
    return prompt


#: the keywords of run() that resume() passes on
_RUN_KEYWORDS = frozenset(
    {
        "metadata",
        "context",
        "extra_tools",
        "emit",
        "output_schema",
        "output_validation_retries",
        "effort",
    }
)


def _tools(
    into: dict[str, Tool], more: Sequence[Callable[..., Any] | Tool] | None, where: str
) -> dict[str, Tool]:
    """``into`` plus the tools of ``more``; a name given twice is refused."""
    if more is not None and (isinstance(more, str) or not isinstance(more, Sequence)):
        raise TypeError(f"{where}tools must be a list of functions or Tools")
    tools = dict(into)
    for fn in more or ():
        tool = as_tool(fn)
        if tool.name in tools:
            raise ValueError(f"{where}two tools are named {tool.name!r}")
        tools[tool.name] = tool
    return tools


def _check_schema(schema: object) -> type[BaseModel] | None:
    if schema is None:
        return None
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise TypeError(
            f"output_schema must be a pydantic model class, not {schema!r}; "
            "define class Answer(BaseModel): ... and pass Answer"
        )
    return schema


def _recorded(row: SessionRecord | None) -> tuple[dict[str, Any] | None, RunOptions | None]:
    """The metadata and options the session's latest run recorded (or the fork it
    started with): what a run that continues it is given."""
    return (None, None) if row is None else (row.run_metadata, row.run_options)


def _recorded_effort(effort: str | None, scope: Scope) -> Effort | None:
    """The effort a run recorded, as this version knows it."""
    try:
        return None if effort is None else Effort(effort)
    except ValueError:
        missing = f"effort {effort!r}, which this version of loomflow does not know"
        raise RunOptionsError(
            f"cannot continue {scope.describe()}: its run was given {missing}; resume it "
            "with an explicit effort= that replaces it",
            missing=[missing],
        ) from None


def _check_effort(effort: object) -> Effort | None:
    if effort is None:
        return None
    levels = ", ".join(e.value for e in Effort)
    if not isinstance(effort, str):  # an Effort is a str too
        raise TypeError(f"effort must be one of {levels}, not {effort!r}")
    try:
        return Effort(effort)
    except ValueError:
        raise ValueError(f"effort must be one of {levels}, not {effort!r}") from None


@dataclass(frozen=True)
class _RunOptions:
    """A run's keywords, checked, with the agent's defaults filled in."""

    context: RunContext
    session_id: str | None
    tools: dict[str, Tool]
    #: the tools of ``tools`` given to this run only (recorded by name and schema hash)
    extra: tuple[Tool, ...]
    emitter: Emitter
    output_schema: type[BaseModel] | None
    retries: int
    effort: Effort | None
    #: the keywords of a resume() that replaced what its predecessor recorded
    replaced: tuple[str, ...] = ()

    def recorded(self) -> RunOptions:
        """These options as run.started records them."""
        return RunOptions(
            extra_tools=tuple(tool_ref(tool) for tool in self.extra),
            output_schema=None if self.output_schema is None else schema_ref(self.output_schema),
            output_validation_retries=self.retries,
            effort=None if self.effort is None else self.effort.value,
            replaced=self.replaced,
        )


@dataclass(frozen=True)
class _Take:
    """How a worker takes a run over: only right after ``after_seq``, as ``worker``;
    ``budget`` says (before each model call, given the calls and usage of this take)
    why the run may not spend more, or None; once ``stop`` is set the run stops at its
    next step, recording nothing, and is left for another worker."""

    after_seq: int
    worker: str
    park_on_failure: bool
    budget: Callable[[int, Usage], str | None] | None
    stop: asyncio.Event | None


class _Released(BaseException):
    """Raised at a run's next step once its worker stops: the run ends unrecorded, for
    the next worker (not an Exception, so that a tool's ``except Exception`` passes it)."""


class Agent:
    """An agent whose runs are journaled by its runtime and can be resumed or forked."""

    def __init__(
        self,
        instructions: str,
        *,
        model: Model | str,
        runtime: Runtime | None = None,
        tuning: Tuning | None = None,
        tools: Sequence[Callable[..., Any] | Tool] | None = None,
        output_schema: type[BaseModel] | None = None,
        effort: Effort | str | None = None,
        name: str = DEFAULT_AGENT_NAME,
        extra_tools: Sequence[Callable[..., Any] | Tool] | None = None,
        output_schemas: Sequence[type[BaseModel]] | None = None,
    ) -> None:
        if not isinstance(instructions, str):
            raise TypeError("instructions must be a string")
        self.instructions = instructions
        # recorded in each run's run.started: what a process must host to resume the run
        self.name = validate_id(name, "agent name")
        self.model = _resolve_model(model)
        self.runtime = runtime if runtime is not None else InProcRuntime()
        # what the agent made itself it also closes: a Claude model's HTTP client, the
        # default in-process runtime; what the caller passed in stays the caller's
        self._owned: list[Any] = [self.model] if isinstance(model, str) else []
        if runtime is None:
            self._owned.append(self.runtime)
        self.tuning = tuning or Tuning()
        self.tools: dict[str, Tool] = _tools({}, tools, "")
        #: defaults of every run; a run's own keywords override them
        self.output_schema = _check_schema(output_schema)
        self.effort = _check_effort(effort)
        #: what a run may be given by name: a run that continues one recorded with these
        #: extra tools or output schemas (in another process: a worker's) finds them here
        self.hosted = Hosted.of(extra_tools, output_schemas, self.tools)
        #: where this agent's runs left their sessions' transcript hashes
        self._hashes = TranscriptHashes()

    async def aclose(self) -> None:
        """Close what this agent created (a model client, its default runtime)."""
        owned, self._owned = self._owned, []
        for resource in owned:
            closing = getattr(resource, "aclose", None) or getattr(resource, "close", None)
            if closing is not None:
                await closing()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(
        self,
        prompt: str,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        context: RunContext | None = None,
        extra_tools: Sequence[Callable[..., Any] | Tool] | None = None,
        emit: Emit | None = None,
        output_schema: type[BaseModel] | None = None,
        output_validation_retries: int = 1,
        effort: Effort | str | None = None,
    ) -> RunResult:
        """Run the agent on ``prompt``; an existing session_id continues its conversation.

        On a session that already has events (a crashed or finished run), the
        conversation is rebuilt from the log first: recorded model and tool calls are
        restored, never executed again.

        ``context`` (a :class:`RunContext`) is what tools read with ``get_run_context()``;
        ``user_id``, ``session_id`` and ``metadata`` override its fields. ``extra_tools``
        are offered next to the agent's own, for this run. ``emit`` is awaited with each
        event of the run as it is appended and with text deltas as the model streams
        (see :meth:`stream`). ``output_schema`` (a pydantic model) is the shape of the
        final answer: ``RunResult.parsed`` holds it validated, after up to
        ``output_validation_retries`` turns that show the model its validation error.
        ``effort`` (low, medium, high, max) is passed to the model.
        """
        _check_prompt(prompt)
        options = self._options(
            context,
            user_id,
            session_id,
            metadata,
            extra_tools,
            emit,
            output_schema,
            output_validation_retries,
            effort,
        )
        scope = Scope.of(
            new_id("sess") if options.session_id is None else options.session_id,
            options.context.user_id,
        )
        return await self._drive(scope, lambda row: options, prompt, mode="run")

    async def _drive(
        self,
        scope: Scope,
        options_for: Callable[[SessionRecord | None], _RunOptions],
        prompt: str,
        *,
        mode: Literal["run", "resume"],
        continuing: bool = False,
        take: _Take | None = None,
    ) -> RunResult:
        """Claim the session, restore it and run the loop on it, with the options that
        ``options_for`` makes of the session's row at the claim (a resume's: what the
        latest run recorded, and the explicit keywords); raising there claims nothing.
        A ``mode="resume"`` run continues from the newest checkpoint the claim finds."""
        chosen: list[_RunOptions] = []

        def prepare(row: SessionRecord | None) -> tuple[dict[str, Any], RunOptions]:
            chosen[:] = [options_for(row)]
            return dict(chosen[0].context.metadata), chosen[0].recorded()

        writer = await self.runtime.open_session(
            scope,
            run_id=new_id("run"),
            mode=mode,
            prepare=prepare,
            model=self.model.name,
            agent=self.name,
            claim_after=None if take is None else take.after_seq,
            worker=None if take is None else take.worker,
        )
        restored = await self.runtime.claimed(writer)  # no second read of the session
        if mode == "resume" and restored.checkpoint_id is None:
            logger.info("no checkpoint for %s; resuming by replaying its log", scope.describe())
        run = _Run(self, writer, restored, chosen[0], continuing=continuing, take=take)
        return await run.drive(prompt)

    async def resume(
        self,
        prompt: str | None = None,
        *,
        session_id: str,
        from_checkpoint: str = "latest",
        user_id: str | None = None,
        **run_kwargs: Any,
    ) -> RunResult:
        """Continue a session from its latest checkpoint, or fork it from an older one.

        ``from_checkpoint="latest"`` (or the latest id) continues in place, replaying the
        events recorded after the checkpoint. Any older id forks into a new ``sess…``
        session. Without any checkpoint this falls back to ``run`` on the same session.

        The resumed run is given the options the session's latest run recorded (its
        metadata, extra_tools, output_schema, output_validation_retries, effort); the
        tools and schema are found by name among this agent's own and what it hosts
        (``Agent(extra_tools=..., output_schemas=...)``), and RunOptionsError says which
        one is missing, before anything is written. A keyword of ``run`` given here
        (``context`` with metadata counts as metadata) replaces the recorded one, and
        the new run.started records that it did. ``emit`` is this call's own.
        """
        unknown = sorted(set(run_kwargs) - _RUN_KEYWORDS)
        if unknown:
            raise TypeError(
                f"resume() got unexpected keyword arguments {unknown}; it takes run()'s: "
                f"{', '.join(sorted(_RUN_KEYWORDS))}"
            )
        text = self.tuning.continuation_prompt if prompt is None else _check_prompt(prompt)
        if not self.runtime.supports_checkpoints:
            return await self.run(text, session_id=session_id, user_id=user_id, **run_kwargs)
        if not isinstance(from_checkpoint, str):
            raise TypeError("from_checkpoint must be 'latest' or a checkpoint id")
        given = self._given(run_kwargs, user_id, session_id)
        scope = Scope.of(session_id, given.context.user_id)
        if from_checkpoint != "latest":
            validate_id(from_checkpoint, "checkpoint id")
            newest = await self.runtime.list_checkpoints(scope, 1)
            if not newest or newest[0].checkpoint_id != from_checkpoint:
                # an older checkpoint (or none of this session's: the fork raises)
                return await self._fork(scope, from_checkpoint, text, run_kwargs, given)
        return await self._drive(
            scope,
            lambda row: self._continued(_recorded(row), run_kwargs, given, scope),
            text,
            mode="resume",
            continuing=prompt is None,
        )

    async def signal(
        self, session_id: str, name: str, payload: Any = None, *, user_id: str | None = None
    ) -> None:
        """Send the signal ``name`` with ``payload`` (JSON, at most 64 KiB) to a session.

        From any process. The signal is kept in the session's inbox until its run's
        ``wait_for_signal(name)`` receives it: a run that waits for it now is resumed by
        a worker that hosts this agent (or call ``resume(session_id=...)``); a run that
        waits for it later receives it then. Raises SessionNotFoundError for a session
        this user does not have, SessionBusyError while a live run holds the session
        (retriable), SerializationError for a payload that is not JSON or too large.
        """
        validate_id(session_id, "session_id")
        await self.runtime.signal(Scope.of(session_id, user_id), name, payload)

    async def take_over(
        self,
        session_id: str,
        *,
        user_id: str | None,
        after_seq: int,
        worker: str,
        last_attempt: bool = False,
        emit: Emit | None = None,
        budget: Callable[[int, Usage], str | None] | None = None,
        stop: asyncio.Event | None = None,
    ) -> RunResult:
        """Resume a run on behalf of a worker (``prompt=None``), only if its session
        still ends at ``after_seq``: of several workers that saw the same abandoned or
        signalled run, exactly one takes it; the others get RunTakenError. The run is
        given the options its predecessor recorded (RunOptionsError, before anything is
        written, when one is not hosted here). On the ``last_attempt``, a failure parks
        the session (``loomflow sessions ls --stuck``); so does passing the ``budget``
        (called before each model call with this take's calls and usage, it returns
        why the run may not go on, or None). Once ``stop`` is set, the run stops at its
        next step with nothing recorded (left for another worker) and this raises
        asyncio.CancelledError.
        """
        kwargs = {"emit": emit}
        given = self._given(kwargs, user_id, session_id)
        scope = Scope.of(session_id, user_id)
        return await self._drive(
            scope,
            lambda row: self._continued(_recorded(row), kwargs, given, scope),
            self.tuning.continuation_prompt,
            mode="resume",
            continuing=True,
            take=_Take(after_seq, worker, last_attempt, budget, stop),
        )

    async def stream(self, prompt: str, **run_kwargs: Any) -> AsyncIterator[RunItem | RunResult]:
        """Run as ``run`` does and yield what ``emit`` would receive, then the RunResult.

        Items are the run's events as they are appended (``TurnAppended`` with model
        answers, tool calls and results, ``CheckpointWritten``, ``RunFinished`` or
        ``RunFailed``) and :class:`TextDelta` pieces of answers as the model streams
        them. A run that fails raises after the items before its failure; leaving the
        loop early cancels the run (which stays resumable).
        """
        if "emit" in run_kwargs:
            raise TypeError("stream() delivers what emit would: pass no emit")
        async for item in stream_of(lambda emit: self.run(prompt, emit=emit, **run_kwargs)):
            yield item

    async def stream_resume(
        self, prompt: str | None = None, **resume_kwargs: Any
    ) -> AsyncIterator[RunItem | RunResult]:
        """Resume as ``resume`` does (same keywords) and yield what ``emit`` would
        receive, then the RunResult, as ``stream`` does for ``run``."""
        if "emit" in resume_kwargs:
            raise TypeError("stream_resume() delivers what emit would: pass no emit")
        async for item in stream_of(lambda emit: self.resume(prompt, emit=emit, **resume_kwargs)):
            yield item

    def _given(self, kwargs: dict[str, Any], user_id: str | None, session_id: str) -> _RunOptions:
        """The keywords of a resume, checked as run() checks them (the recorded options
        are laid under them later, from the session's row at the claim)."""
        return self._options(
            kwargs.get("context"),
            user_id,
            session_id,
            kwargs.get("metadata"),
            kwargs.get("extra_tools"),
            kwargs.get("emit"),
            kwargs.get("output_schema"),
            kwargs.get("output_validation_retries", 1),
            kwargs.get("effort"),
        )

    def _continued(
        self,
        run: tuple[dict[str, Any] | None, RunOptions | None],
        kwargs: dict[str, Any],
        given: _RunOptions,
        scope: Scope,
    ) -> _RunOptions:
        """The options of a run that continues another: the metadata and options that
        one recorded (``run``; None for what was not recorded), each replaced by the
        keyword given for it (``given``, checked, from ``kwargs``).

        Raises RunOptionsError when a recorded tool or schema is not hosted here as it
        was recorded; nothing has been written then.
        """
        metadata, recorded = run
        explicit = {k for k in RECORDED_KEYWORDS if kwargs.get(k) is not None}
        context = kwargs.get("context")
        if isinstance(context, RunContext) and context.metadata:
            explicit.add("metadata")
        options = given
        if "metadata" not in explicit and metadata:
            context = options.context.merged(user_id=None, session_id=None, metadata=metadata)
            options = replace(options, context=context)
        if recorded is None:  # a new session, or a run recorded before options were kept
            return options
        extra, schema = self.hosted.resolve(
            () if "extra_tools" in explicit else recorded.extra_tools,
            None if "output_schema" in explicit else recorded.output_schema,
            own_tools=self.tools,
            default_schema=self.output_schema,
            where=scope.describe(),
        )
        if "extra_tools" not in explicit:
            options = replace(
                options, tools=_tools(self.tools, extra, "extra_tools: "), extra=tuple(extra)
            )
        if "output_schema" not in explicit:
            options = replace(options, output_schema=schema)
        if "output_validation_retries" not in explicit:
            options = replace(options, retries=recorded.output_validation_retries)
        if "effort" not in explicit:
            options = replace(options, effort=_recorded_effort(recorded.effort, scope))
        now = options.recorded()
        changed = tuple(
            keyword
            for keyword, before, after in (
                ("metadata", metadata, dict(options.context.metadata)),
                ("extra_tools", recorded.extra_tools, now.extra_tools),
                ("output_schema", recorded.output_schema, now.output_schema),
                (
                    "output_validation_retries",
                    recorded.output_validation_retries,
                    now.output_validation_retries,
                ),
                ("effort", recorded.effort, now.effort),
            )
            if keyword in explicit and before != after
        )
        return replace(options, replaced=changed)

    def _options(
        self,
        context: RunContext | None,
        user_id: str | None,
        session_id: str | None,
        metadata: dict[str, Any] | None,
        extra_tools: Sequence[Callable[..., Any] | Tool] | None,
        emit: Emit | None,
        output_schema: type[BaseModel] | None,
        output_validation_retries: int,
        effort: Effort | str | None,
    ) -> _RunOptions:
        if context is not None and not isinstance(context, RunContext):
            raise TypeError(f"context must be a RunContext, not {type(context).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
        if (
            isinstance(output_validation_retries, bool)
            or not isinstance(output_validation_retries, int)
            or output_validation_retries < 0
        ):
            raise ValueError("output_validation_retries must be an int >= 0")
        merged = (context or RunContext()).merged(
            user_id=user_id, session_id=session_id, metadata=metadata
        )
        tools = _tools(self.tools, extra_tools, "extra_tools: ")
        return _RunOptions(
            context=merged,
            session_id=merged.session_id,
            tools=tools,
            extra=tuple(tool for name, tool in tools.items() if name not in self.tools),
            emitter=Emitter(emit),
            output_schema=_check_schema(output_schema) or self.output_schema,
            retries=output_validation_retries,
            effort=_check_effort(effort) or self.effort,
        )

    async def _fork(
        self,
        parent: Scope,
        checkpoint_id: str,
        prompt: str,
        kwargs: dict[str, Any],
        given: _RunOptions,
    ) -> RunResult:
        """Fork ``parent`` at ``checkpoint_id`` into a new session and run it there, with
        the options of the parent's latest run (replaced by the keywords given)."""
        origin = await self.runtime.fork_origin(parent, checkpoint_id)  # raises if pruned
        child = Scope(new_id("sess"), parent.user_id)
        options = self._continued((origin.metadata, origin.options), kwargs, given, parent)
        writer = await self.runtime.open_session(
            child,
            run_id=new_id("run"),
            mode="fork",
            from_checkpoint=checkpoint_id,
            prepare=lambda row: (dict(options.context.metadata), options.recorded()),
            model=self.model.name,
            agent=self.name,
            fork=origin,
        )
        restored = await self.runtime.claimed(writer)
        return await _Run(self, writer, restored, options).drive(prompt)

    async def list_checkpoints(
        self, session_id: str, limit: int = 50, *, user_id: str | None = None
    ) -> list[CheckpointMeta]:
        """Checkpoints of the session for this user, newest first, without messages."""
        scope = Scope.of(session_id, user_id)
        if not self.runtime.supports_checkpoints:
            return []
        return await self.runtime.list_checkpoints(scope, limit)


class _Run:
    """One run of the loop over one session, as its single writer."""

    def __init__(
        self,
        agent: Agent,
        writer: SessionWriter,
        restored: RestoredState | None,
        options: _RunOptions,
        *,
        continuing: bool = False,
        take: _Take | None = None,
    ) -> None:
        self.agent = agent
        #: where the run this one continues stopped to wait for a signal (resume with no
        #: prompt): it goes on from there, without the continuation nudge
        waiting = restored.session.waiting if restored is not None else None
        self.waited = waiting if continuing else None
        #: the wait a new prompt ends instead (resume or run with a prompt)
        self.ended_wait = None if continuing else waiting
        #: the run this one took the session from while it ran, when this one brings a
        #: prompt of its own (a continuation goes on with the interrupted run's work)
        claim = writer.opened[-1] if writer.opened else None
        interrupted = claim.payload.interrupted if isinstance(claim, RunStarted) else None
        self.interrupted = None if continuing else interrupted
        #: how a worker took the run over (None: a caller's run)
        self.take = take
        #: what this run's own model calls cost (a worker's budget counts them)
        self.spent = Usage()
        self.tuning = agent.tuning
        self.writer = writer
        self.options = options
        self.tools = options.tools
        self.parsed: Any = None
        self.context = replace(
            options.context,
            session_id=writer.scope.session_id,
            user_id=writer.scope.user_id,
            run_id=writer.run_id,
        )
        self._emit = options.emitter
        if self._emit:
            writer.observer = self._observe
        self._calls_with_options = accepts_options(agent.model)
        self._per_call = self._call_options()
        #: the transcript and its hash, which a model call's step records
        self._transcript = agent._hashes.start(
            (writer.scope.user_id, writer.scope.session_id),
            list(restored.messages) if restored else [],
        )
        #: the run this one continues was interrupted right after the model's final
        #: answer, before its end was recorded: this one goes on from its stop hooks, with
        #: no nudge and no model call, as the interrupted run would have
        last = self.messages[-1] if self.messages else None
        self.answered = (
            continuing
            and interrupted is not None
            and last is not None
            and last.role is Role.ASSISTANT
            and not last.tool_calls
        )
        self.turns = restored.turns if restored else 0
        self.usage = restored.usage if restored else Usage()
        self.restored_turns = self.turns
        self.session = restored.session if restored else None
        self.model_calls = 0
        self.passes = 0
        self.stop_reason: StopReason = "completed"
        self._context_tokens: int | None = None

    @property
    def messages(self) -> list[Message]:
        """The session's transcript as this run has it (grown by ``_append`` only)."""
        return self._transcript.messages

    # -- the loop ---------------------------------------------------------------------

    async def drive(self, prompt: str) -> RunResult:
        token = activate_context(self.context)
        try:
            return await self._drive(prompt)
        finally:
            deactivate_context(token)
            scope = self.writer.scope
            self.agent._hashes.keep((scope.user_id, scope.session_id), self._transcript)

    async def _observe(self, events: list[Event]) -> None:
        for event in events:
            if not isinstance(event, RunHeartbeat):
                await self._emit(event)

    async def _drive(self, prompt: str) -> RunResult:
        beat = asyncio.create_task(self.writer.keep_alive(self.agent.runtime.lease_seconds / 3))
        try:
            return await self._drive_alive(prompt)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _drive_alive(self, prompt: str) -> RunResult:
        for event in self.writer.opened:
            await self._emit(event)
        retries = self.options.retries
        # a run that stopped in a stop hook to wait goes back into its stop hooks first
        # and one interrupted after its final answer goes on from there too
        in_hooks = self.answered or (self.waited is not None and self.waited.where == "stop_hook")
        try:
            if self.ended_wait is not None and self.ended_wait.where == "tool":
                await self._end_wait(self.ended_wait)
            if not in_hooks:
                await self._finish_pending_tools()
            if self.answered:
                if self.tuning.checkpoint:  # it was staged for the end that never came
                    await self._checkpoint()
            elif self.waited is None:
                await self._open(prompt)
            hook_iterations = 0
            while True:
                if in_hooks:
                    in_hooks = False
                else:
                    await self._pass()
                    await self._maybe_compact()
                    self.passes += 1
                    if self.tuning.checkpoint:
                        await self._checkpoint()
                if self.stop_reason == "max_turns":
                    self._parse_quietly()
                    break
                injected = await self._stop_hooks() if self.tuning.stop_hooks else None
                if injected is not None:
                    if hook_iterations >= self.tuning.max_stop_hook_iterations:
                        self.stop_reason = "stop_hook_limit"
                        self._parse_quietly()
                        break
                    hook_iterations += 1
                    await self._append([injected], durable=False)
                    continue
                retry = self._check_output(retries)
                if retry is None:
                    break
                retries -= 1
                await self._append([retry], durable=False)
            output = self._output()
            await self.writer.emit(
                RunFinished,
                RunFinishedPayload(
                    output=output,
                    turns=self.turns,
                    usage=self.usage,
                    stop_reason=self.stop_reason,
                    model=self.agent.model.name,
                ),
            )
        except Suspended as suspended:
            return await self._wait(suspended.waiting)
        except _Released:
            logger.info("%s stops with its worker; left for another", self.writer.scope.describe())
            raise asyncio.CancelledError() from None
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and self._stopping():
                raise  # the worker stops past its grace: the run is left as a crash leaves it
            await self._record_failure(exc)
            raise
        # once the run returns, every process reads its checkpoints (on Kafka: the one
        # wait for the projector at the end of a run); a refusal of any event raises here
        await self.writer.confirm()
        return self._result(output)

    async def _open(self, prompt: str) -> None:
        """Record the run's prompt (after the instructions, in a new session).

        When this run took the session from a run that had recorded its prompt but never
        answered it (its process died, or another resume took the session while it ran):
        the same prompt again (a program run again after a crash) is that prompt, now
        answered, not a second copy; another prompt follows a note of the unanswered one,
        so the model and a reader of the transcript see what happened instead of two
        requests in a row.
        """
        text = self._with_schema_note(prompt)
        opening: list[Message] = []
        if not self.messages:
            opening.append(Message.system(self.agent.instructions))
        elif self.interrupted is not None and self.messages[-1].role is Role.USER:
            if self.messages[-1].content == text:
                return
            opening.append(
                Message.assistant(
                    f"[no answer: run {self.interrupted} was interrupted before it answered "
                    f"this; run {self.writer.run_id} took the session over with the next message]"
                )
            )
        opening.append(Message.user(text))
        await self._append(opening, durable=False)

    async def _end_wait(self, waiting: Waiting) -> None:
        """A new prompt for a run that waits in a tool ends the wait: the tool call gets
        an error result saying so (the model sees it), and the prompt follows it."""
        call_id = waiting.step_key.split("/", 1)[0].removeprefix("tool:")
        answered = {m.tool_call_id for m in self.messages if m.role is Role.TOOL}
        if call_id in answered:
            return
        note = (
            f"the wait for signal {waiting.signal!r} ended without it: the user sent a new "
            "message instead"
        )
        await self._append(
            [Message.tool(call_id, note, is_error=True)],
            step_key=f"tool:{call_id}",
            input_hash=input_hash(["wait ended", waiting.step_key]),
        )

    async def _wait(self, waiting: RunWaitingPayload) -> RunResult:
        """End the run as waiting for a signal: recorded, so a worker resumes it."""
        try:
            await self.writer.emit(RunWaiting, waiting)
        except BaseException as exc:
            await self._record_failure(exc)
            raise
        await self.writer.confirm()
        logger.info("%s waits for signal %r", self.writer.scope.describe(), waiting.signal)
        self.stop_reason = "waiting"
        return self._result(self._output(), waiting_for=waiting.signal)

    async def _pass(self) -> None:
        calls = 0
        while True:
            await self._finish_pending_tools()
            last = self.messages[-1]
            if last.role is Role.ASSISTANT and not last.tool_calls:
                return
            if calls >= self.tuning.max_turns:
                self.stop_reason = "max_turns"
                return
            await self._model_turn()
            calls += 1

    def _stopping(self) -> bool:
        """Whether this is a worker's run and its worker is stopping."""
        take = self.take
        return take is not None and take.stop is not None and take.stop.is_set()

    def _next_step(self) -> None:
        """Where a worker's run stops once its worker does (before a model call, a tool
        call, a stop hook): nothing more is recorded, and the run is left for the next
        worker."""
        if self._stopping():
            raise _Released()

    def _within_budget(self) -> None:
        """Before a model call of a worker's run: raise RunBudgetExceededError (which
        parks the run) once the run's budget is spent."""
        take = self.take
        if take is not None and take.budget is not None:
            reason = take.budget(self.model_calls, self.spent)
            if reason is not None:
                raise RunBudgetExceededError(reason)

    async def _model_turn(self) -> None:
        self._next_step()
        self._within_budget()
        tools = [tool.spec for tool in self.tools.values()]
        digest = self._transcript.hexdigest(
            orjson.dumps([self.agent.model.name, [t.name for t in tools]])
        )
        options = self._per_call
        started = time.perf_counter()
        if options:
            complete: Any = self.agent.model.complete  # an adapter that takes options
            response = await complete(list(self.messages), tools, options=options)
        else:
            response = await self.agent.model.complete(list(self.messages), tools)
        latency_ms = _elapsed_ms(started)
        self.turns += 1
        self.model_calls += 1
        self.usage = self.usage + response.usage
        self.spent = self.spent + response.usage
        self._context_tokens = response.usage.total_tokens
        await self._append(
            [response.message],
            usage=response.usage,
            model_call=True,
            step_key=f"model:{self.turns}",
            input_hash=digest[:32],
            model=self.agent.model.name,
            latency_ms=latency_ms,
        )

    def _call_options(self) -> CallOptions | None:
        """What every model call of this run is asked beyond the transcript: the same for
        all of them, so built once (a pydantic JSON Schema costs about a millisecond)."""
        schema = self.options.output_schema
        options = CallOptions(
            effort=self.options.effort,
            output_schema=None if schema is None else schema.model_json_schema(),
            output_name=schema.__name__ if schema is not None else "output",
            on_delta=self._delta if self._emit else None,
        )
        if not options:
            return None
        if not self._calls_with_options:
            if options.effort is not None:
                logger.warning(
                    "model %s takes no options: effort=%s is not applied",
                    self.agent.model.name,
                    options.effort.value,
                )
            return None
        return options

    async def _delta(self, text: str) -> None:
        await self._emit(TextDelta(text=text, turn=self.turns + 1))

    async def _finish_pending_tools(self) -> None:
        """Run the tool calls of the last assistant message that have no result yet."""
        for index in range(len(self.messages) - 1, -1, -1):
            if self.messages[index].role is Role.ASSISTANT:
                break
        else:
            return
        calls = self.messages[index].tool_calls
        answered = {m.tool_call_id for m in self.messages[index + 1 :] if m.role is Role.TOOL}
        for call in calls:
            if call.id not in answered:
                await self._call_tool(call)

    async def _call_tool(self, call: ToolCall) -> None:
        self._next_step()
        tool = self.tools.get(call.name)
        is_error = False
        if tool is None:
            offered = ", ".join(sorted(self.tools)) or "none"
            content, is_error = (
                f"tool {call.name!r} is not offered in this run (offered: {offered})",
                True,
            )
            logger.warning(
                "%s: the model called tool %r, which this run does not offer; the call gets "
                "a tool error (a run resumed without the extra_tools it had?)",
                self.writer.scope.describe(),
                call.name,
            )
        else:
            journal = Journal(self.writer, prefix=f"tool:{call.id}/")
            token = journal.activate()
            try:
                value = await tool.invoke(call.arguments)
            except ValidationError as exc:
                content, is_error = f"invalid arguments for {call.name}: {exc}", True
            except SignalTimeoutError as exc:  # the model decides what a missed answer means
                content, is_error = f"SignalTimeoutError: {exc}", True
            except LoomflowError:
                raise
            except Exception as exc:
                logger.info("tool %s raised %s: %s", call.name, type(exc).__name__, exc)
                content, is_error = f"{type(exc).__name__}: {exc}", True
            else:
                content, is_error = self._tool_content(call.name, value)
            finally:
                Journal.deactivate(token)
        await self._append(
            [Message.tool(call.id, content, is_error=is_error)],
            step_key=f"tool:{call.id}",
            input_hash=input_hash([call.name, call.arguments]),
        )

    @staticmethod
    def _tool_content(name: str, value: Any) -> tuple[str, bool]:
        """A tool's value as the text of its result, and whether it is an error. A value
        JSON cannot hold is the tool's error, recorded like any other: raised instead,
        it would fail the run before the result is recorded, and every resume would run
        the tool's side effect again and fail again."""
        if isinstance(value, str):
            return value, False
        try:
            return dumps(value).decode(), False
        except SerializationError as exc:
            logger.warning("tool %s returned what JSON cannot hold: %s", name, exc)
            return (
                f"SerializationError: tool {name!r} returned a {type(value).__name__}, which "
                f"is not JSON ({exc}); return str, numbers, bool, None, lists or dicts",
                True,
            )

    # -- structured output --------------------------------------------------------------

    def _with_schema_note(self, prompt: str) -> str:
        """The prompt, telling a model that takes no options the schema to answer in
        (one that takes them gets it as ``CallOptions.output_schema``)."""
        schema = self.options.output_schema
        if schema is None or self._calls_with_options:
            return prompt
        shape = orjson.dumps(schema.model_json_schema()).decode()
        return f"{prompt}\n\nAnswer with one JSON object matching this JSON Schema: {shape}"

    def _check_output(self, retries: int) -> Message | None:
        """Validate the final answer against the output schema. None when it holds (or
        there is none); else the user turn that shows the model its error, while retries
        last; then OutputValidationError."""
        schema = self.options.output_schema
        if schema is None:
            return None
        output = self._output()
        try:
            self.parsed = schema.model_validate_json(output)
        except ValidationError as exc:
            error = str(exc)
            if retries <= 0:
                raise OutputValidationError(
                    f"the final answer does not match {schema.__name__} after "
                    f"{self.options.retries} retries: {error}",
                    output=output,
                    error=error,
                ) from exc
            logger.info(
                "answer of %s does not match %s; asking again",
                self.writer.scope.describe(),
                schema.__name__,
            )
            return Message.user(
                f"Your answer is not valid {schema.__name__} JSON: {error}\n"
                "Answer again with only the JSON object."
            )
        return None

    def _parse_quietly(self) -> None:
        """A run cut short (turn or hook limit) keeps ``parsed`` if the answer is valid."""
        schema = self.options.output_schema
        if schema is not None:
            with contextlib.suppress(ValidationError):
                self.parsed = schema.model_validate_json(self._output())

    async def _stop_hooks(self) -> Message | None:
        self._next_step()
        state = SessionState(
            session_id=self.writer.scope.session_id,
            user_id=self.writer.scope.user_id,
            run_id=self.writer.run_id,
            messages=tuple(self.messages),
            turns=self.turns,
            usage=self.usage,
            passes=self.passes,
            output=self._output(),
        )
        # a hook's journal steps and signal waits are keyed by the turn they follow
        journal = Journal(self.writer, prefix=f"stop:{self.turns}/")
        for hook in self.tuning.stop_hooks:
            token = journal.activate()
            try:
                outcome: Any = hook(state)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
            finally:
                Journal.deactivate(token)
            if outcome is None:
                continue
            if isinstance(outcome, str):
                return Message.user(outcome)
            if isinstance(outcome, Message):
                return outcome
            raise TypeError(
                f"stop hook {hook!r} returned {type(outcome).__name__}; return str, Message or None"
            )
        return None

    # -- compaction and checkpoints -----------------------------------------------------

    def _estimated_tokens(self) -> int:
        if self._context_tokens is not None:
            return self._context_tokens
        return sum(len(m.content) + len(str(m.tool_calls)) for m in self.messages) // 4

    async def _maybe_compact(self) -> None:
        threshold = self.tuning.auto_compact_at_tokens
        if threshold is None or self._estimated_tokens() < threshold:
            return
        self._next_step()
        self._within_budget()
        lead = 0
        while lead < len(self.messages) and self.messages[lead].role is Role.SYSTEM:
            lead += 1
        # the kept tail starts at a user message so no tool result loses its tool call
        cut = max(lead, len(self.messages) - self.tuning.compact_keep_messages)
        while cut > lead and self.messages[cut].role is not Role.USER:
            cut -= 1
        head = self.messages[lead:cut]
        if not head:
            return
        transcript = "\n\n".join(_render(m) for m in head)
        started = time.perf_counter()
        response = await self.agent.model.complete(
            [Message.system(COMPACTION_INSTRUCTIONS), Message.user(transcript)], []
        )
        latency_ms = _elapsed_ms(started)
        self.model_calls += 1
        self.usage = self.usage + response.usage
        self.spent = self.spent + response.usage
        compacted = [
            *self.messages[:lead],
            Message.user(f"Summary of the earlier conversation:\n{response.message.content}"),
            *self.messages[cut:],
        ]
        await self.writer.emit(
            TranscriptCompacted,
            TranscriptCompactedPayload(
                messages=compacted,
                usage=response.usage,
                replaced_messages=len(head),
                model=self.agent.model.name,
                latency_ms=latency_ms,
            ),
        )
        self._transcript.replace(compacted)
        self._context_tokens = None
        logger.info("compacted %d messages of %s", len(head), self.writer.scope.describe())

    async def _checkpoint(self) -> None:
        """Stage this pass's checkpoint: it goes out with the run's next event (the next
        pass's message or the run's end), which follows with no model or tool call
        between. A checkpoint that fails to be written is a warning (see SessionWriter)."""
        self.writer.stage(
            CheckpointWritten,
            CheckpointWrittenPayload(
                checkpoint_id=new_id("ckpt"),
                turn=self.turns,
                cumulative_usage=self.usage,
                cursor=f"pass:{self.passes}",
                message_count=len(self.messages),
                retain=self.agent.runtime.max_checkpoints_per_session,
            ),
        )

    # -- events and results -------------------------------------------------------------

    async def _append(
        self, messages: list[Message], *, durable: bool = True, **fields: Any
    ) -> None:
        """Record messages. A model's answer and a tool's result must be durable before the
        run acts on them; the prompt of a pass (``durable=False``) is ours to send again,
        so on Kafka its acknowledgement overlaps the model call and the answer waits."""
        payload = TurnAppendedPayload(messages=messages, **fields)
        if durable:
            await self.writer.emit(TurnAppended, payload)
        else:
            await self.writer.send(TurnAppended, payload)
        self._transcript.extend(messages)

    async def _record_failure(self, exc: BaseException) -> None:
        if isinstance(exc, InvalidEventError):
            return  # the session is no longer ours to write to
        try:
            await self.writer.emit(
                RunFailed,
                RunFailedPayload(
                    error_type=type(exc).__name__,
                    error=str(exc)[:2000],
                    model=self.agent.model.name,
                    parked=True if self._parks(exc) else None,
                ),
            )
        except BaseException as again:  # the store may be what failed
            logger.warning("could not record the failure of run %s: %s", self.writer.run_id, again)

    def _parks(self, exc: BaseException) -> bool:
        """Whether a failure parks the session for a person (``sessions ls --stuck``): a
        worker's last attempt, or a run past its budget."""
        last = self.take is not None and self.take.park_on_failure
        return last or isinstance(exc, RunBudgetExceededError)

    def _output(self) -> str:
        for message in reversed(self.messages):
            if message.role is Role.ASSISTANT:
                return message.content
        return ""

    def _result(self, output: str, *, waiting_for: str | None = None) -> RunResult:
        parent = self.session
        return RunResult(
            parsed=self.parsed,
            session_id=self.writer.scope.session_id,
            output=output,
            turns=self.turns,
            tokens_in=self.usage.input_tokens,
            cached_tokens_in=self.usage.cached_input_tokens,
            tokens_out=self.usage.output_tokens,
            cost_usd=self.usage.cost_usd,
            usage=self.usage,
            run_id=self.writer.run_id,
            restored_turns=self.restored_turns,
            model_calls=self.model_calls,
            stop_reason=self.stop_reason,
            parent_session_id=parent.parent_session_id if parent else None,
            parent_checkpoint_id=parent.parent_checkpoint_id if parent else None,
            waiting_for=waiting_for,
        )


def _elapsed_ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``perf_counter`` reading), to the microsecond."""
    return round((time.perf_counter() - started) * 1000, 3)


def _render(message: Message) -> str:
    text = f"[{message.role.value}] {message.content}"
    for call in message.tool_calls:
        text += f"\n(called {call.name} with {orjson.dumps(call.arguments).decode()})"
    return text
