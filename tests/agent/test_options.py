"""What an Agent hosts for runs that ask by name: several versions of a tool or a schema,
each found by the hash a run recorded, and mistakes refused when the Agent is made."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from loomflow import Agent, RunOptionsError
from loomflow.agent.options import Hosted, schema_ref, tool_ref
from loomflow.models import ScriptedModel


def population(city: str) -> str:
    """A city's population."""
    return city


def _newer(city: str, year: int) -> str:
    """A city's population in a year."""
    return city


_newer.__name__ = "population"  # the same tool, its input changed


class City(BaseModel):
    name: str


def test_a_run_gets_the_version_of_a_tool_and_schema_it_recorded() -> None:
    class Newer(BaseModel):
        name: str
        population: int

    Newer.__name__ = "City"
    hosted = Hosted.of([population, _newer], [City, Newer], own={})
    for tool, schema in ((population, City), (_newer, Newer)):
        ref = tool_ref(hosted.tools[0] if tool is population else hosted.tools[1])
        found, resolved = hosted.resolve(
            [ref], schema_ref(schema), own_tools={}, default_schema=None, where="s1"
        )
        assert [t.fn for t in found] == [tool] and resolved is schema


def test_a_tool_not_hosted_as_recorded_is_named_with_both_hashes() -> None:
    recorded = tool_ref(Hosted.of([_newer], None, own={}).tools[0])
    hosted = Hosted.of([population], None, own={})
    with pytest.raises(RunOptionsError, match="its input schema changed") as caught:
        hosted.resolve([recorded], None, own_tools={}, default_schema=None, where="s1")
    assert recorded.schema_hash in caught.value.missing[0]


def test_an_agent_refuses_a_hosted_tool_twice_or_one_of_its_own() -> None:
    model = ScriptedModel(["x"])
    with pytest.raises(ValueError, match="'population' is given twice"):
        Agent("x", model=model, extra_tools=[population, population])
    with pytest.raises(ValueError, match="one of the agent's own tools"):
        Agent("x", model=model, tools=[population], extra_tools=[population])
    with pytest.raises(TypeError, match="must be a list"):
        Agent("x", model=model, extra_tools=population)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a pydantic model class"):
        Agent("x", model=model, output_schemas=["City"])  # type: ignore[list-item]
