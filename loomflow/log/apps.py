"""How every loomflow faust app is configured: the processor's and the analytics'."""

from __future__ import annotations

import tempfile
from pathlib import Path

import faust

from loomflow.producers import Topics
from loomflow.settings import Settings

__all__ = ["new_app"]


def new_app(app_id: str, settings: Settings) -> faust.App:
    """A faust app named ``app_id`` (its consumer group) on the settings' broker, with
    raw keys and values, memory tables, and no web server."""
    topics = Topics.from_settings(settings)
    # faust writes a data directory even for memory tables: never into the caller's cwd,
    # and not under <tmp>/loomflow, which Python started in <tmp> imports as loomflow
    datadir = Path(tempfile.gettempdir()) / "loomflow-faust" / f"{app_id}-data"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    return faust.App(
        app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        datadir=str(datadir),
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        web_bind="127.0.0.1",  # never 0.0.0.0, even when someone turns the web server on
        topic_partitions=topics.partitions,
        topic_replication_factor=topics.replication,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
    )
