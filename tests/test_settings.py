"""Settings: what every process reads from LOOMFLOW_*, and what it refuses up front."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from loomflow.producers import Topics
from loomflow.runtime import (
    InProcRuntime,
    KafkaRuntime,
    PostgresRuntime,
    PostgresStore,
    Runtime,
    SqliteRuntime,
    SqliteStore,
)
from loomflow.settings import Settings


def test_topics_are_replicated_as_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOMFLOW_TOPIC_REPLICATION", "3")
    monkeypatch.setenv("LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS", "2")
    topics = Topics.from_settings(Settings())
    assert (topics.replication, topics.min_insync_replicas) == (3, 2)
    monkeypatch.delenv("LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS")
    assert Topics.from_settings(Settings()).min_insync_replicas is None  # the broker's default


def test_more_insync_replicas_than_replicas_is_refused_naming_both_variables() -> None:
    with pytest.raises(ValidationError, match="LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS at most"):
        Settings(topic_replication=1, topic_min_insync_replicas=2)


def test_every_runtime_takes_its_run_options_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION", "3")
    monkeypatch.setenv("LOOMFLOW_SERIALIZER", "pickle")
    monkeypatch.setenv("LOOMFLOW_LEASE_SECONDS", "7.5")
    monkeypatch.setenv("LOOMFLOW_RETRY_SECONDS", "2")
    for runtime in (
        InProcRuntime(),
        SqliteRuntime(tmp_path / "j.db"),
        PostgresRuntime(),
        KafkaRuntime(),
    ):
        got = (runtime.max_checkpoints_per_session, runtime.serializer, runtime.lease_seconds)
        assert got == (3, "pickle", 7.5), type(runtime).__name__
        assert runtime.retry_seconds == 2.0
        assert runtime.settings.max_checkpoints_per_session == 3
    given = SqliteRuntime(tmp_path / "k.db", max_checkpoints_per_session=5, serializer="json")
    assert (given.max_checkpoints_per_session, given.serializer) == (5, "json")


def test_a_bad_run_option_in_the_environment_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION", "2.5")
    with pytest.raises(ValueError, match="max_checkpoints_per_session must be a whole number"):
        SqliteRuntime(tmp_path / "j.db")
    assert not (tmp_path / "j.db").exists()  # refused before anything is written
    monkeypatch.setenv("LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION", "0")
    monkeypatch.setenv("LOOMFLOW_LEASE_SECONDS", "soon")
    with pytest.raises(ValueError, match=r"lease_seconds must be a number from 0\.5 to 86400"):
        InProcRuntime()


def test_retention_is_a_keyword_of_every_runtime() -> None:
    with pytest.raises(TypeError):
        InProcRuntime(5)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "constructor",
    [
        Runtime.__init__,
        InProcRuntime.__init__,
        SqliteRuntime.__init__,
        SqliteStore.__init__,
        PostgresRuntime.__init__,
        PostgresStore.__init__,
        KafkaRuntime.__init__,
    ],
    ids=lambda constructor: constructor.__qualname__,
)
def test_no_constructor_writes_a_default_of_its_own(constructor: Any) -> None:
    """A default is written once, in Settings: a constructor's option left out means
    "as the settings say", so the environment and every process agree."""
    own = {
        name: param.default
        for name, param in inspect.signature(constructor).parameters.items()
        if param.default is not inspect.Parameter.empty
        and param.default is not None
        and name != "create"  # whether to create a missing file: a call's intent
    }
    assert own == {}


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def test_the_readme_lists_every_setting_with_its_default() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `LOOMFLOW_") and len(cells) == 3:
            rows[cells[0].strip("`")] = cells[1]
    settings = {
        "LOOMFLOW_SCHEMA" if name == "db_schema" else f"LOOMFLOW_{name.upper()}": _shown(
            field.default
        )
        for name, field in Settings.model_fields.items()
    }
    assert rows == settings
