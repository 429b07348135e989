"""The Agents an operator's command hosts: ``module:factory`` loaded as `loomflow worker`
loads it, and the agent a session's run names, put on the command's runtime."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib import import_module
from typing import TYPE_CHECKING, Any

from loomflow.control.refused import Refused

if TYPE_CHECKING:
    from loomflow.agent import Agent
    from loomflow.runtime import Runtime
    from loomflow.schemas.sessions import SessionRecord

__all__ = ["hosting", "load_agents"]


def load_agents(target: str) -> list[Agent]:
    """The Agents that ``module:factory`` names: the attribute itself, or what calling
    it returns (one Agent or several). Raises ValueError saying what is wrong."""
    from loomflow.agent import Agent

    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{target!r} is not module:factory (e.g. myapp.agents:build)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = import_module(module_name)
    except Exception as exc:
        raise ValueError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    try:
        found: Any = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if callable(found) and not isinstance(found, Agent):
        try:
            found = found()
        except ValueError:
            raise  # the factory's own word on what it needs
        except Exception as exc:
            raise ValueError(f"calling {target} raised {type(exc).__name__}: {exc}") from exc
        if inspect.iscoroutine(found):
            found.close()  # never awaited, on purpose: say so instead of warning
            raise ValueError(f"{target} is a coroutine function; make it a plain function")
    wrong = ValueError(f"{target} must give an Agent or a list of Agents, got {found!r}")
    if isinstance(found, Agent):
        return [found]
    if isinstance(found, str | bytes) or not isinstance(found, Iterable):
        raise wrong
    agents = list(found)
    if not agents or any(not isinstance(a, Agent) for a in agents):
        raise wrong
    return agents


@asynccontextmanager
async def hosting(target: str, row: SessionRecord, runtime: Runtime) -> AsyncIterator[Agent]:
    """The Agent of ``target`` (module:factory) that the session's run names, running on
    ``runtime`` with the run options of the runtime the factory gave it (retention,
    serializer, lease, retry), as the run would have had in its program. What the
    factory made is closed after. Refused when ``target`` does not load or does not give
    the session's agent."""
    from loomflow.agent.agent import DEFAULT_AGENT_NAME

    try:
        agents = load_agents(target)
    except (ValueError, TypeError) as exc:
        raise Refused(str(exc), 2) from None
    theirs = {id(a.runtime): a.runtime for a in agents}
    try:
        named = {a.name: a for a in agents}
        wanted = row.agent or (agents[0].name if len(agents) == 1 else DEFAULT_AGENT_NAME)
        agent = named.get(wanted)
        if agent is None:
            raise Refused(
                f"the run of session {row.session_id} belongs to agent {wanted!r}, which "
                f"{target} does not give (it gives {', '.join(sorted(named))})"
            )
        own = agent.runtime
        runtime.max_checkpoints_per_session = own.max_checkpoints_per_session
        runtime.serializer = own.serializer
        runtime.lease_seconds = own.lease_seconds
        runtime.retry_seconds = own.retry_seconds
        agent.runtime = runtime
        yield agent
    finally:
        for each in agents:
            await each.aclose()
        for made in theirs.values():
            if made is not runtime:
                await made.close()
