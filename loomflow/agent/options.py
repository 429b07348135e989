"""A run's options in the log: what ``run()`` was given, recorded in its ``run.started``,
and resolved again, by name and hash, in whatever process continues the run.

Options that are data (metadata, retries, effort) are restored as recorded. Options that
are code (extra tools, the output schema class) are recorded by name and the hash of
their schema, and a continuing process must host the same ones (``Agent(extra_tools=...,
output_schemas=...)``): a run is never finished with a tool missing or an answer
validated against another schema.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from loomflow.agent.tools import Tool, as_tool
from loomflow.errors import RunOptionsError
from loomflow.schemas import SchemaRef, ToolRef
from loomflow.schemas.codec import input_hash

__all__ = ["RECORDED_KEYWORDS", "Hosted", "schema_ref", "tool_ref"]

#: the keywords of run() recorded in run.started (``context`` records its metadata)
RECORDED_KEYWORDS = (
    "metadata",
    "extra_tools",
    "output_schema",
    "output_validation_retries",
    "effort",
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
