"""What a run's final answer must pass before the run ends: its stop hooks, each of which
may send the run on with a message, then its output schema, against which an answer that
does not validate is asked for again while the retries last.

Plain functions of what the loop (``loop.py``) hands them; the loop decides when they
run and records what they send the run on with.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from loomflow.agent.tuning import SessionState, StopHook
from loomflow.errors import OutputValidationError
from loomflow.runtime import Journal
from loomflow.schemas import Message, Scope

__all__ = ["ask_stop_hooks", "check_output", "parse_quietly", "schema_note"]

logger = logging.getLogger("loomflow.agent")


async def ask_stop_hooks(
    hooks: Sequence[StopHook], state: SessionState, journal: Journal
) -> Message | None:
    """The message the first of ``hooks`` that does not let the run stop at ``state``
    sends it on with (a hook's str is a user message), or None when all of them let it
    stop. Each hook runs with ``journal`` active, for its steps and signal waits."""
    for hook in hooks:
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


def schema_note(prompt: str, schema: type[BaseModel]) -> str:
    """The prompt, telling the model the JSON Schema of ``schema`` to answer in."""
    shape = orjson.dumps(schema.model_json_schema()).decode()
    return f"{prompt}\n\nAnswer with one JSON object matching this JSON Schema: {shape}"


def check_output(
    schema: type[BaseModel], output: str, retries_left: int, retries: int, scope: Scope
) -> tuple[BaseModel | None, Message | None]:
    """The final answer ``output`` validated against ``schema``, and None; or, when it does
    not validate, None and the user turn that shows the model its error, while
    ``retries_left`` (of the run's ``retries``) last; then OutputValidationError.
    ``scope`` is the run's session, for the log."""
    try:
        return schema.model_validate_json(output), None
    except ValidationError as exc:
        error = str(exc)
        if retries_left <= 0:
            raise OutputValidationError(
                f"the final answer does not match {schema.__name__} after "
                f"{retries} retries: {error}",
                output=output,
                error=error,
            ) from exc
        logger.info(
            "answer of %s does not match %s; asking again", scope.describe(), schema.__name__
        )
        return None, Message.user(
            f"Your answer is not valid {schema.__name__} JSON: {error}\n"
            "Answer again with only the JSON object."
        )


def parse_quietly(schema: type[BaseModel], output: str) -> BaseModel | None:
    """``output`` validated against ``schema``, or None when it does not validate (a run
    cut short by a turn or hook limit keeps what is valid of its answer)."""
    with contextlib.suppress(ValidationError):
        return schema.model_validate_json(output)
    return None
