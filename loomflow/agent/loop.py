"""One run of an agent over one session, as its single writer: the loop of passes (a
model call, then the tool calls it asked for, until a final answer), the stop hooks and
the output schema that may send the run on, auto-compaction, checkpoints, waits for a
signal, and the events that record all of it.

The :class:`~loomflow.agent.agent.Agent` claims and restores the session, then hands it
to a :class:`Run`; this module does not import the Agent (it reads what it needs of it
through :class:`RunHost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from pydantic import ValidationError

from loomflow.agent import answer, compaction
from loomflow.agent.context import activate as activate_context
from loomflow.agent.context import deactivate as deactivate_context
from loomflow.agent.hashes import TranscriptHashes
from loomflow.agent.options import ResolvedOptions
from loomflow.agent.signals import Suspended
from loomflow.agent.streaming import TextDelta
from loomflow.agent.tuning import SessionState, Tuning
from loomflow.errors import (
    InvalidEventError,
    LoomflowError,
    RunBudgetExceededError,
    SerializationError,
    SignalTimeoutError,
)
from loomflow.models.base import CallOptions, Model, accepts_options
from loomflow.runtime import Journal, RestoredState, Runtime, SessionWriter
from loomflow.schemas import (
    CheckpointWritten,
    Event,
    Message,
    Role,
    RunFailed,
    RunFinished,
    RunHeartbeat,
    RunResult,
    RunStarted,
    RunWaiting,
    StopReason,
    ToolCall,
    TranscriptCompacted,
    TurnAppended,
    Usage,
    new_id,
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

__all__ = [
    "Run",
    "RunHost",
    "Take",
    "ended_unfinished",
    "opening",
    "pending_calls",
    "prompt_text",
]

logger = logging.getLogger("loomflow.agent")


class RunHost(Protocol):
    """What a run reads of the Agent it runs for."""

    instructions: str
    model: Model
    runtime: Runtime
    tuning: Tuning
    #: where the agent's runs leave their sessions' transcript hashes
    _hashes: TranscriptHashes


@dataclass(frozen=True)
class Take:
    """How a worker takes a run over: only right after ``after_seq``, as ``worker``;
    ``budget`` says (before each model call, given the calls and usage of this take)
    why the run may not spend more, or None; once ``stop`` is set the run stops at its
    next step, recording nothing, and is left for another worker."""

    after_seq: int
    worker: str
    park_on_failure: bool
    budget: Callable[[int, Usage], str | None] | None
    stop: asyncio.Event | None


def _interrupted(exc: BaseException) -> bool:
    """Whether the run was interrupted rather than failed: Ctrl-C (``asyncio.run``
    cancels its task), a cancelled task, a process exiting, a stopping worker. Such a run
    records no ``run.failed``; like a run whose process died it stays in flight, so
    ``agent.resume`` continues it and a worker takes it over once its lease lapses (a
    run.failed made a worker leave it alone). ``agent.cancel`` stops a run for good."""
    return isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit)


#: the statuses a session's latest run leaves it in when it ended without finishing
_UNFINISHED = frozenset({"failed", "stuck", "cancelled"})


def ended_unfinished(row: SessionRecord | None) -> bool:
    """Whether the session's latest run, as ``row`` (the session before a claim) has
    it, ended without finishing (it failed, was parked or was cancelled): it may have
    left its prompt unanswered."""
    return row is not None and row.status in _UNFINISHED


def opening(
    messages: Sequence[Message],
    interrupted: str | None,
    unfinished: bool,
    text: str,
    instructions: str,
    run_id: str,
) -> list[Message]:
    """What run ``run_id`` records of its prompt ``text`` before its first model call,
    the session's transcript being ``messages`` (see ``Run._open``): the instructions
    first in a new session; nothing when ``text`` is the prompt that the run before left
    unanswered (``interrupted``, that run's id, or one that ended ``unfinished``);
    otherwise, after the prompt of an interrupted run, a note of it."""
    opened: list[Message] = []
    if not messages:
        opened.append(Message.system(instructions))
    elif (interrupted is not None or unfinished) and messages[-1].role is Role.USER:
        if messages[-1].content == text:
            return []
        if interrupted is not None:
            opened.append(
                Message.assistant(
                    f"[no answer: run {interrupted} was interrupted before it answered this; "
                    f"run {run_id} took the session over with the next message]"
                )
            )
    opened.append(Message.user(text))
    return opened


def pending_calls(messages: Sequence[Message]) -> list[ToolCall]:
    """The tool calls of the transcript's last assistant message that have no result."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is Role.ASSISTANT:
            break
    else:
        return []
    answered = {m.tool_call_id for m in messages[index + 1 :] if m.role is Role.TOOL}
    return [call for call in messages[index].tool_calls if call.id not in answered]


def prompt_text(prompt: str, options: ResolvedOptions, model: Model) -> str:
    """The prompt, telling a model that takes no options the schema to answer in (one
    that takes them gets it as ``CallOptions.output_schema``)."""
    schema = options.output_schema
    if schema is None or accepts_options(model):
        return prompt
    return answer.schema_note(prompt, schema)


class _Released(BaseException):
    """Raised at a run's next step once its worker stops: the run ends unrecorded, for
    the next worker (not an Exception, so that a tool's ``except Exception`` passes it)."""


class Run:
    """One run of the loop over one session, as its single writer."""

    def __init__(
        self,
        agent: RunHost,
        writer: SessionWriter,
        restored: RestoredState | None,
        options: ResolvedOptions,
        *,
        continuing: bool = False,
        take: Take | None = None,
        unfinished: bool = False,
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
        claim = next((e for e in writer.opened if isinstance(e, RunStarted)), None)
        interrupted = claim.payload.interrupted if claim is not None else None
        self.interrupted = None if continuing else interrupted
        #: the claim wrote this run's prompt with it (see Runtime.open_session's opening)
        self.opened_prompt = any(isinstance(e, TurnAppended) for e in writer.opened)
        #: the run before this one ended without finishing (see ``ended_unfinished``): it
        #: may have left its prompt unanswered, which this run's own is not a copy of
        self.unfinished = unfinished and not continuing
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
        if self.ended_wait is not None and self._asked_again(prompt):
            # the prompt of the run that waits, sent again (its program run again): not a
            # new message, so the run goes on waiting for its signal instead of ending
            # the wait, as a resume with no prompt does
            self.waited, self.ended_wait = self.ended_wait, None
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
            elif self.waited is None and not self.opened_prompt:
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
                    # the answer is the last assistant message, which the log holds already
                    output=None if self._answered() else output,
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
            await self._record_failure(exc)
            raise
        # a refusal of any event raises here; every process's reads of its checkpoints
        # wait for them by position, so on Kafka the run need not wait for the projector
        await self.writer.confirm(visible=False)
        return self._result(output)

    async def _open(self, prompt: str) -> None:
        """Record the run's prompt (after the instructions, in a new session).

        When the run before this one recorded its prompt but never answered it (its
        process died, another resume took the session while it ran, or it failed, was
        parked or cancelled): the same prompt again (a program run again after a crash, or
        after its API key was fixed) is that prompt, now answered, not a second copy.
        Another prompt follows, after an interrupted run's, a note of the unanswered one,
        so the model and a reader of the transcript see what happened instead of two
        requests in a row (a failed run's error is in the log already).
        """
        messages = opening(
            self.messages,
            self.interrupted,
            self.unfinished,
            self._with_schema_note(prompt),
            self.agent.instructions,
            self.writer.run_id,
        )
        if messages:
            await self._append(messages, durable=False)

    def _asked_again(self, prompt: str) -> bool:
        """Whether ``prompt`` is the last one the session was given."""
        text = self._with_schema_note(prompt)
        last = next((m for m in reversed(self.messages) if m.role is Role.USER), None)
        return last is not None and last.content == text

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
        await self.writer.confirm(visible=False)
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
            ends=not response.message.tool_calls and self._ends_with_answer(),
            usage=response.usage,
            model_call=True,
            step_key=f"model:{self.turns}",
            input_hash=digest[:32],
            model=self.agent.model.name,
            latency_ms=latency_ms,
        )

    def _ends_with_answer(self) -> bool:
        """Whether a final answer is followed by nothing but the run's end: no stop hook,
        output check or compaction acts on it first. Then it goes out with the end (one
        acknowledgement on Kafka, not two; one transaction on the other stores); a crash
        before that write loses the answer as a crash before its own would."""
        return (
            not self.tuning.stop_hooks
            and self.options.output_schema is None
            and self.tuning.auto_compact_at_tokens is None
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
        for call in pending_calls(self.messages):
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

    # -- the final answer ---------------------------------------------------------------

    def _with_schema_note(self, prompt: str) -> str:
        """The prompt, telling a model that takes no options the schema to answer in
        (one that takes them gets it as ``CallOptions.output_schema``)."""
        return prompt_text(prompt, self.options, self.agent.model)

    def _check_output(self, retries: int) -> Message | None:
        """Validate the final answer against the output schema. None when it holds (or
        there is none); else the user turn that shows the model its error, while retries
        last; then OutputValidationError."""
        schema = self.options.output_schema
        if schema is None:
            return None
        parsed, retry = answer.check_output(
            schema, self._output(), retries, self.options.retries, self.writer.scope
        )
        if retry is None:
            self.parsed = parsed
        return retry

    def _parse_quietly(self) -> None:
        """A run cut short (turn or hook limit) keeps ``parsed`` if the answer is valid."""
        schema = self.options.output_schema
        if schema is not None:
            parsed = answer.parse_quietly(schema, self._output())
            if parsed is not None:
                self.parsed = parsed

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
        return await answer.ask_stop_hooks(self.tuning.stop_hooks, state, journal)

    # -- compaction and checkpoints -----------------------------------------------------

    def _estimated_tokens(self) -> int:
        if self._context_tokens is not None:
            return self._context_tokens
        return compaction.estimated_tokens(self.messages)

    async def _maybe_compact(self) -> None:
        threshold = self.tuning.auto_compact_at_tokens
        if threshold is None or self._estimated_tokens() < threshold:
            return
        self._next_step()
        self._within_budget()
        lead, cut = compaction.split(self.messages, self.tuning.compact_keep_messages)
        head = self.messages[lead:cut]
        if not head:
            return
        started = time.perf_counter()
        response = await self.agent.model.complete(compaction.summary_request(head), [])
        latency_ms = _elapsed_ms(started)
        self.model_calls += 1
        self.usage = self.usage + response.usage
        self.spent = self.spent + response.usage
        compacted = compaction.compacted(self.messages, lead, cut, response.message.content)
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
        self, messages: list[Message], *, durable: bool = True, ends: bool = False, **fields: Any
    ) -> None:
        """Record messages. A model's answer and a tool's result must be durable before the
        run acts on them; the prompt of a pass (``durable=False``) is ours to send again,
        so on Kafka its acknowledgement overlaps the model call and the answer waits. A
        final answer nothing acts on (``ends``) goes out with the run's end."""
        payload = TurnAppendedPayload(messages=messages, **fields)
        if ends:
            await self.writer.hold(TurnAppended, payload)
        elif durable:
            await self.writer.emit(TurnAppended, payload)
        else:
            await self.writer.send(TurnAppended, payload)
        self._transcript.extend(messages)

    async def _record_failure(self, exc: BaseException) -> None:
        if isinstance(exc, InvalidEventError):
            return  # the session is no longer ours to write to
        if _interrupted(exc):
            self._left(exc)
            return
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

    def _left(self, exc: BaseException) -> None:
        """Log a run interrupted in this process (see ``_interrupted``), which records
        nothing more: it is left as a crash leaves it."""
        why = "its worker stops" if self._stopping() else type(exc).__name__
        logger.info(
            "%s: run %s interrupted (%s); left as a crash leaves it, for a resume or a worker",
            self.writer.scope.describe(),
            self.writer.run_id,
            why,
        )

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

    def _answered(self) -> bool:
        return any(message.role is Role.ASSISTANT for message in self.messages)

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
