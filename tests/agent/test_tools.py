from __future__ import annotations

from typing import Literal

import pytest
from pydantic import ValidationError

from loomflow.agent import as_tool


def search(query: str, limit: int = 5, mode: Literal["fast", "deep"] = "fast") -> list[str]:
    """Search the knowledge base.

    Returns the best matches first.

    Args:
        query: what to look for
        limit: how many results
            at most
        mode: how hard to look
    """
    return [query] * limit


async def fetch(url: str) -> str:
    """Fetch a page."""
    return url


def test_schema_comes_from_hints_and_docstring() -> None:
    spec = as_tool(search).spec
    assert spec.name == "search"
    assert spec.description == "Search the knowledge base.\n\nReturns the best matches first."
    schema = spec.input_schema
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"] == {"type": "string", "description": "what to look for"}
    assert schema["properties"]["limit"]["description"] == "how many results at most"
    assert schema["properties"]["limit"]["default"] == 5
    assert schema["properties"]["mode"]["enum"] == ["fast", "deep"]
    assert schema["additionalProperties"] is False


async def test_invoke_validates_and_calls_sync_and_async_functions() -> None:
    assert await as_tool(search).invoke({"query": "q", "limit": "2"}) == ["q", "q"]
    assert await as_tool(fetch).invoke({"url": "u"}) == "u"
    with pytest.raises(ValidationError):
        await as_tool(search).invoke({"limit": 1})
    with pytest.raises(ValidationError):
        await as_tool(search).invoke({"query": "q", "surprise": 1})


def test_unusable_functions_are_refused() -> None:
    def star(*args: int) -> None:
        """Nope."""

    with pytest.raises(TypeError, match="keyword"):
        as_tool(star)
    with pytest.raises(ValueError, match="tool name"):
        as_tool(lambda: None)
    with pytest.raises(TypeError):
        as_tool("search")  # type: ignore[call-overload]


def numpy_style(city: str, year: int) -> str:
    """Population of a city.

    Parameters
    ----------
    city : str
        the city's name
    year : int
        the census year
    """
    return city


def test_numpy_style_docstrings_describe_arguments_too() -> None:
    spec = as_tool(numpy_style).spec
    assert spec.description == "Population of a city."
    properties = spec.input_schema["properties"]
    assert properties["city"]["description"] == "the city's name"
    assert properties["year"]["description"] == "the census year"
