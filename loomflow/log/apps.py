"""How every loomflow faust app is configured: the processor's and the analytics'."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import faust

from loomflow.producers import Topics
from loomflow.settings import Settings

__all__ = ["Worker", "new_app"]


class Worker(faust.Worker):
    """faust's worker, logging at the level it is given and no lower.

    faust's own worker, at ``--loglevel warn`` or above, turns a terminal spinner with
    every log record: it sets the root logger to DEBUG and adds a handler of its own,
    for the whole life of the process. Every debug call of aiokafka and asyncpg then
    made a record that nothing printed (aiokafka writes several a fetch): 8% of
    ``loomflow processor``'s CPU in a Kafka pass (py-spy, 2026-12-06). The spinner only
    shows while the worker starts, so it goes; the level the operator chose stays.
    """

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None


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
        Worker=Worker,
    )
