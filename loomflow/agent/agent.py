"""The Agent: what a program builds and calls. It checks a run's keywords, claims and
restores the session through its runtime (a new run, a resume from the latest
checkpoint, a fork from an older one, a worker's take-over), and hands it to the loop
(``loop.py``) that runs it; it also lists a session's checkpoints and sends signals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import BaseModel

from loomflow.agent.context import RunContext
from loomflow.agent.hashes import TranscriptHashes
from loomflow.agent.loop import (
    Run,
    Take,
    ended_unfinished,
    opening,
    pending_calls,
    prompt_text,
)
from loomflow.agent.options import (
    RUN_KEYWORDS,
    Hosted,
    ResolvedOptions,
    check_effort,
    check_schema,
    continued_options,
    given_options,
    recorded_in,
    resume_options,
    with_tools,
)
from loomflow.agent.streaming import Emit, RunItem, stream_of
from loomflow.agent.tools import Tool
from loomflow.agent.tuning import Tuning
from loomflow.models.base import Effort, Model
from loomflow.runtime import InProcRuntime, Runtime, Scope
from loomflow.schemas import CheckpointMeta, RunOptions, RunResult, Usage, new_id, validate_id

if TYPE_CHECKING:
    from loomflow.schemas import Message
    from loomflow.schemas.sessions import SessionRecord

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
        self.tools: dict[str, Tool] = with_tools({}, tools, "")
        #: defaults of every run; a run's own keywords override them
        self.output_schema = check_schema(output_schema)
        self.effort = check_effort(effort)
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
        options = given_options(
            self,
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
        options_for: Callable[[SessionRecord | None], ResolvedOptions],
        prompt: str,
        *,
        mode: Literal["run", "resume"],
        continuing: bool = False,
        take: Take | None = None,
    ) -> RunResult:
        """Claim the session, restore it and run the loop on it, with the options that
        ``options_for`` makes of the session's row at the claim (a resume's: what the
        latest run recorded, and the explicit keywords); raising there claims nothing.
        A ``mode="resume"`` run continues from the newest checkpoint the claim finds."""
        chosen: list[ResolvedOptions] = []
        before: list[SessionRecord | None] = [None]

        def prepare(row: SessionRecord | None) -> tuple[dict[str, Any], RunOptions]:
            chosen[:] = [options_for(row)]
            before[0] = row  # the session as the claim found it
            return dict(chosen[0].context.metadata), chosen[0].recorded()

        run_id = new_id("run")

        def prompted(row: SessionRecord | None, messages: list[Message]) -> list[Message] | None:
            """The run's prompt as the run would record it, when nothing comes before it
            (the end of a wait, pending tool calls): it goes with the claim."""
            if (row is not None and row.waiting is not None) or pending_calls(messages):
                return None
            interrupted = row.last_run_id if row is not None and row.status == "running" else None
            return opening(
                messages,
                interrupted,
                ended_unfinished(row),
                prompt_text(prompt, chosen[0], self.model),
                self.instructions,
                run_id,
            )

        writer = await self.runtime.open_session(
            scope,
            run_id=run_id,
            mode=mode,
            prepare=prepare,
            model=self.model.name,
            agent=self.name,
            claim_after=None if take is None else take.after_seq,
            worker=None if take is None else take.worker,
            opening=None if continuing or take is not None else prompted,
        )
        restored = await self.runtime.claimed(writer)  # no second read of the session
        if mode == "resume" and restored.checkpoint_id is None:
            logger.info("no checkpoint for %s; resuming by replaying its log", scope.describe())
        run = Run(
            self,
            writer,
            restored,
            chosen[0],
            continuing=continuing,
            take=take,
            unfinished=ended_unfinished(before[0]),
        )
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
        unknown = sorted(set(run_kwargs) - RUN_KEYWORDS)
        if unknown:
            raise TypeError(
                f"resume() got unexpected keyword arguments {unknown}; it takes run()'s: "
                f"{', '.join(sorted(RUN_KEYWORDS))}"
            )
        text = self.tuning.continuation_prompt if prompt is None else _check_prompt(prompt)
        if not self.runtime.supports_checkpoints:
            return await self.run(text, session_id=session_id, user_id=user_id, **run_kwargs)
        if not isinstance(from_checkpoint, str):
            raise TypeError("from_checkpoint must be 'latest' or a checkpoint id")
        given = resume_options(self, run_kwargs, user_id, session_id)
        scope = Scope.of(session_id, given.context.user_id)
        if from_checkpoint != "latest":
            validate_id(from_checkpoint, "checkpoint id")
            newest = await self.runtime.list_checkpoints(scope, 1)
            if not newest or newest[0].checkpoint_id != from_checkpoint:
                # an older checkpoint (or none of this session's: the fork raises)
                return await self._fork(scope, from_checkpoint, text, run_kwargs, given)
        return await self._drive(
            scope,
            lambda row: continued_options(self, recorded_in(row), run_kwargs, given, scope),
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

    async def cancel(
        self, session_id: str, *, user_id: str | None = None, reason: str = ""
    ) -> None:
        """Cancel the session's run, from any process (``loomflow sessions cancel``).

        A live run stops at its next step and raises RunCancelledError; no worker resumes
        the session, and it refuses signals, until ``resume(session_id=...)`` continues it
        on purpose. Raises SessionNotFoundError for a session this user does not have,
        CancelRefusedError when no run is in flight (it finished, failed, or was cancelled
        already). See ``Runtime.cancel``.
        """
        validate_id(session_id, "session_id")
        await self.runtime.cancel(Scope.of(session_id, user_id), reason)

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
        given = resume_options(self, kwargs, user_id, session_id)
        scope = Scope.of(session_id, user_id)
        return await self._drive(
            scope,
            lambda row: continued_options(self, recorded_in(row), kwargs, given, scope),
            self.tuning.continuation_prompt,
            mode="resume",
            continuing=True,
            take=Take(after_seq, worker, last_attempt, budget, stop),
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

    async def _fork(
        self,
        parent: Scope,
        checkpoint_id: str,
        prompt: str,
        kwargs: dict[str, Any],
        given: ResolvedOptions,
    ) -> RunResult:
        """Fork ``parent`` at ``checkpoint_id`` into a new session and run it there, with
        the options of the parent's latest run (replaced by the keywords given)."""
        origin = await self.runtime.fork_origin(parent, checkpoint_id)  # raises if pruned
        child = Scope(new_id("sess"), parent.user_id)
        options = continued_options(self, (origin.metadata, origin.options), kwargs, given, parent)
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
        return await Run(self, writer, restored, options).drive(prompt)

    async def list_checkpoints(
        self, session_id: str, limit: int = 50, *, user_id: str | None = None
    ) -> list[CheckpointMeta]:
        """Checkpoints of the session for this user, newest first, without messages."""
        scope = Scope.of(session_id, user_id)
        if not self.runtime.supports_checkpoints:
            return []
        return await self.runtime.list_checkpoints(scope, limit)
