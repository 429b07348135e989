"""Plain Python functions as tools: their type hints and docstring give the schema."""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, cast, get_type_hints, overload

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, create_model
from typing_extensions import ParamSpec, TypeVar

from loomflow.models.base import ToolSpec

__all__ = ["Tool", "as_tool"]

# Defaults (typing_extensions until Python 3.13) keep a bare ``Tool`` valid: Tool[..., Any].
P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Description and per-argument descriptions, from a Google, NumPy, reST or Epydoc
    docstring (docstring_parser tells the style)."""
    parsed = docstring_parser.parse(doc)
    description = "\n\n".join(
        part for part in (parsed.short_description, parsed.long_description) if part
    )
    # an argument's description wrapped over lines reads as one line in the schema
    args = {
        p.arg_name.lstrip("*"): " ".join(p.description.split())
        for p in parsed.params
        if p.description
    }
    return description, args


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


@dataclass(frozen=True)
class Tool(Generic[P, R]):
    """A callable the model may invoke, with the schema the model sees.

    ``Tool[P, R]`` wraps a plain or coroutine function taking ``P`` whose (awaited)
    result is ``R``: what ``invoke`` returns.
    """

    name: str
    description: str
    fn: Callable[P, Awaitable[R]] | Callable[P, R]
    arguments: type[BaseModel]

    @functools.cached_property
    def spec(self) -> ToolSpec:
        """The schema the model sees; built once (pydantic's schema costs ~1 ms a tool)."""
        schema = _strip_titles(self.arguments.model_json_schema())
        schema.setdefault("properties", {})
        return ToolSpec(self.name, self.description, schema)

    async def invoke(self, arguments: dict[str, Any]) -> R:
        """Validate the model's arguments, then call the function (sync ones on a thread)."""
        parsed = self.arguments.model_validate(arguments)
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        # the keywords match fn's signature (the schema was built from it), which mypy
        # cannot see: call fn as a plain callable
        fn: Callable[..., Any] = self.fn
        if inspect.iscoroutinefunction(fn):
            return cast(R, await fn(**kwargs))
        result = await asyncio.to_thread(fn, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return cast(R, result)


@overload
def as_tool(fn: Tool[P, R]) -> Tool[P, R]: ...
@overload
def as_tool(fn: Callable[P, Awaitable[R]]) -> Tool[P, R]: ...
@overload
def as_tool(fn: Callable[P, R]) -> Tool[P, R]: ...


def as_tool(fn: Callable[..., Any] | Tool) -> Tool:
    """Describe a function as a tool (or decorate it as one); its parameters must be
    keyword-compatible."""
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise TypeError(f"a tool must be a function, got {type(fn).__name__}")
    name = getattr(fn, "__name__", "")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    description, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(
                f"tool {name!r}: parameter {param.name!r} must be a plain keyword parameter"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return Tool(name=name, description=description or name, fn=fn, arguments=model)
