"""A run's options: what ``run()`` was given, checked and with the agent's defaults
filled in, recorded in its ``run.started``, and resolved again, by name and hash, in
whatever process continues the run.

Options that are data (metadata, retries, effort) are restored as recorded. Options that
are code (extra tools, the output schema class) are recorded by name and the hash of
their schema, and a continuing process must host the same ones (``Agent(extra_tools=...,
output_schemas=...)``): a run is never finished with a tool missing or an answer
validated against another schema.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel

from loomflow.agent.context import RunContext
from loomflow.agent.streaming import Emit, Emitter
from loomflow.agent.tools import Tool, as_tool
from loomflow.errors import RunOptionsError
from loomflow.models.base import Effort
from loomflow.schemas import RunOptions, SchemaRef, Scope, ToolRef
from loomflow.schemas.codec import input_hash

if TYPE_CHECKING:
    from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "RECORDED_KEYWORDS",
    "RUN_KEYWORDS",
    "AgentDefaults",
    "Hosted",
    "ResolvedOptions",
    "check_effort",
    "check_schema",
    "continued_options",
    "given_options",
    "recorded_in",
    "resume_options",
    "schema_ref",
    "tool_ref",
    "with_tools",
]

#: the keywords of run() recorded in run.started (``context`` records its metadata)
RECORDED_KEYWORDS = (
    "metadata",
    "extra_tools",
    "output_schema",
    "output_validation_retries",
    "effort",
)

#: the keywords of run() that resume() passes on
RUN_KEYWORDS = frozenset(
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


def tool_ref(tool: Tool) -> ToolRef:
    """A tool as a run records it: its name and the hash of the input schema the model
    is shown (its description may change; what it takes may not)."""
    return ToolRef(name=tool.name, schema_hash=input_hash(tool.spec.input_schema)[:16])


@functools.cache
def schema_ref(schema: type[BaseModel]) -> SchemaRef:
    """An output schema as a run records it: the class's name, its JSON Schema and the
    schema's hash (once per class: a JSON Schema costs about a millisecond)."""
    json_schema = schema.model_json_schema()
    return SchemaRef(
        name=schema.__name__, schema_hash=input_hash(json_schema)[:16], json_schema=json_schema
    )


_T = TypeVar("_T")


@dataclass(frozen=True)
class Hosted:
    """What an Agent can give a run that asks for it by name: the extra tools and output
    schemas it hosts, besides its own tools and default schema. Several versions of one
    (the same name, other schemas) may be hosted: a run gets the one it recorded."""

    tools: tuple[Tool, ...]
    schemas: tuple[type[BaseModel], ...]

    @classmethod
    def of(
        cls,
        tools: Sequence[Callable[..., Any] | Tool] | None,
        schemas: Sequence[object] | None,
        own: dict[str, Tool],
    ) -> Hosted:
        """What ``Agent(extra_tools=tools, output_schemas=schemas)`` hosts, checked: a
        tool may not share a name with one of the agent's ``own``, nor a version of
        another hosted tool its schema."""
        for name, given in (("extra_tools", tools), ("output_schemas", schemas)):
            if given is not None and (isinstance(given, str) or not isinstance(given, Sequence)):
                raise TypeError(f"Agent({name}=...) must be a list")
        hosted: list[Tool] = []
        for fn in tools or ():
            tool = as_tool(fn)
            if tool.name in own:
                raise ValueError(
                    f"Agent(extra_tools=...): {tool.name!r} is one of the agent's own tools, "
                    "offered to every run already"
                )
            if any(tool_ref(t) == tool_ref(tool) for t in hosted):
                raise ValueError(f"Agent(extra_tools=...): {tool.name!r} is given twice")
            hosted.append(tool)
        for schema in schemas or ():
            if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
                raise TypeError(f"output_schemas holds {schema!r}, not a pydantic model class")
        return cls(tuple(hosted), tuple(schemas or ()))  # type: ignore[arg-type]

    def resolve(
        self,
        tools: Sequence[ToolRef],
        schema: SchemaRef | None,
        *,
        own_tools: dict[str, Tool],
        default_schema: type[BaseModel] | None,
        where: str,
    ) -> tuple[list[Tool], type[BaseModel] | None]:
        """The extra tools and the output schema class that a run recorded as ``tools``
        and ``schema``, from what is hosted here. A tool that is one of the agent's own
        (same schema) is offered anyway and needs no resolving.

        Raises RunOptionsError naming everything that is not hosted as recorded.
        """
        missing: list[str] = []
        found: list[Tool] = []
        for ref in tools:
            own = own_tools.get(ref.name)
            named = [own] if own is not None else [t for t in self.tools if t.name == ref.name]
            tool = _version(
                f"extra tool {ref.name!r}",
                "its input schema",
                ref.schema_hash,
                named,
                tool_ref,
                missing,
            )
            if tool is not None and own is None:
                found.append(tool)
        resolved: type[BaseModel] | None = None
        if schema is not None:
            classes = [
                s for s in (*self.schemas, default_schema) if s and s.__name__ == schema.name
            ]
            resolved = _version(
                f"output schema {schema.name!r}",
                "it",
                schema.schema_hash,
                classes,
                schema_ref,
                missing,
            )
        if missing:
            raise RunOptionsError(
                f"cannot continue {where}: its run was given {'; '.join(missing)}. Host what "
                "it was given in the process that continues the run (Agent(extra_tools=[...], "
                "output_schemas=[...])), or resume it with explicit keywords "
                "(resume(..., extra_tools=[...], output_schema=...)) that replace it",
                missing=missing,
            )
        return found, resolved


@dataclass(frozen=True)
class ResolvedOptions:
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


class AgentDefaults(Protocol):
    """What an Agent gives each of its runs: its own tools, its default output schema
    and effort, and what it hosts for runs that ask for them by name."""

    tools: dict[str, Tool]
    output_schema: type[BaseModel] | None
    effort: Effort | None
    hosted: Hosted


def given_options(
    agent: AgentDefaults,
    context: RunContext | None,
    user_id: str | None,
    session_id: str | None,
    metadata: dict[str, Any] | None,
    extra_tools: Sequence[Callable[..., Any] | Tool] | None,
    emit: Emit | None,
    output_schema: type[BaseModel] | None,
    output_validation_retries: int,
    effort: Effort | str | None,
) -> ResolvedOptions:
    """The keywords of ``agent.run()``, checked, with the agent's defaults filled in."""
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
    tools = with_tools(agent.tools, extra_tools, "extra_tools: ")
    return ResolvedOptions(
        context=merged,
        session_id=merged.session_id,
        tools=tools,
        extra=tuple(tool for name, tool in tools.items() if name not in agent.tools),
        emitter=Emitter(emit),
        output_schema=check_schema(output_schema) or agent.output_schema,
        retries=output_validation_retries,
        effort=check_effort(effort) or agent.effort,
    )


def resume_options(
    agent: AgentDefaults, kwargs: dict[str, Any], user_id: str | None, session_id: str
) -> ResolvedOptions:
    """The keywords of a resume, checked as run() checks them (the recorded options
    are laid under them later, from the session's row at the claim)."""
    return given_options(
        agent,
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


def continued_options(
    agent: AgentDefaults,
    run: tuple[dict[str, Any] | None, RunOptions | None],
    kwargs: dict[str, Any],
    given: ResolvedOptions,
    scope: Scope,
) -> ResolvedOptions:
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
    extra, schema = agent.hosted.resolve(
        () if "extra_tools" in explicit else recorded.extra_tools,
        None if "output_schema" in explicit else recorded.output_schema,
        own_tools=agent.tools,
        default_schema=agent.output_schema,
        where=scope.describe(),
    )
    if "extra_tools" not in explicit:
        options = replace(
            options, tools=with_tools(agent.tools, extra, "extra_tools: "), extra=tuple(extra)
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


def recorded_in(row: SessionRecord | None) -> tuple[dict[str, Any] | None, RunOptions | None]:
    """The metadata and options the session's latest run recorded (or the fork it
    started with): what a run that continues it is given."""
    return (None, None) if row is None else (row.run_metadata, row.run_options)


def with_tools(
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


def check_schema(schema: object) -> type[BaseModel] | None:
    """``output_schema``, checked: None or a pydantic model class."""
    if schema is None:
        return None
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise TypeError(
            f"output_schema must be a pydantic model class, not {schema!r}; "
            "define class Answer(BaseModel): ... and pass Answer"
        )
    return schema


def check_effort(effort: object) -> Effort | None:
    """``effort``, checked: None or one of the levels of Effort."""
    if effort is None:
        return None
    levels = ", ".join(e.value for e in Effort)
    if not isinstance(effort, str):  # an Effort is a str too
        raise TypeError(f"effort must be one of {levels}, not {effort!r}")
    try:
        return Effort(effort)
    except ValueError:
        raise ValueError(f"effort must be one of {levels}, not {effort!r}") from None


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


def _version(
    what: str,
    part: str,
    recorded: str,
    named: list[_T],
    ref: Callable[[_T], ToolRef | SchemaRef],
    missing: list[str],
) -> _T | None:
    """The one of ``named`` (the hosted versions of ``what``) whose schema hash is the
    ``recorded`` one; else None, with what is missing (``part`` of it that changed, when
    other versions are hosted) added to ``missing``."""
    found = next((n for n in named if ref(n).schema_hash == recorded), None)
    if found is None and not named:
        missing.append(f"{what}, which is not hosted here")
    elif found is None:
        hashes = ", ".join(ref(n).schema_hash for n in named)
        missing.append(f"{what} as it was ({part} changed: recorded {recorded}, hosted {hashes})")
    return found
