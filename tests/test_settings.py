"""Settings: what every process reads from LOOMFLOW_*, and what it refuses up front."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from loomflow.producers import Topics
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
