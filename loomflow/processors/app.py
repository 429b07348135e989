"""The loomflow processor as a faust-streaming app: its topics, tables and agents.

Run it with ``loomflow processor`` or ``faust -A loomflow.processors.app worker
--without-web``. Configuration comes from LOOMFLOW_KAFKA_BOOTSTRAP, LOOMFLOW_POSTGRES_DSN,
LOOMFLOW_SCHEMA, LOOMFLOW_TOPIC_PREFIX, LOOMFLOW_TOPIC_PARTITIONS and LOOMFLOW_PROCESSOR_ID.
The projection's hot path is a batch consumer in
an ``app.task`` (see projector.py); faust's agents do what they are good at: tables.
"""

from __future__ import annotations

import asyncio
import os

import faust

from loomflow.processors.analytics import run_transition, usage_delta
from loomflow.processors.projector import Projector
from loomflow.producers import Topics, ensure_topics

__all__ = ["app", "create_app"]


def create_app(
    bootstrap: str | None = None,
    dsn: str | None = None,
    *,
    topics: Topics | None = None,
    schema: str | None = None,
    app_id: str | None = None,
) -> faust.App:
    """Build the processor app; arguments default to the LOOMFLOW_* environment."""
    bootstrap = bootstrap or os.environ.get("LOOMFLOW_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    dsn = dsn or os.environ.get(
        "LOOMFLOW_POSTGRES_DSN", "postgresql://loomflow:loomflow@127.0.0.1:5432/loomflow"
    )
    if topics is None:
        prefix = os.environ.get("LOOMFLOW_TOPIC_PREFIX")
        partitions = int(os.environ.get("LOOMFLOW_TOPIC_PARTITIONS", Topics.partitions))
        topics = (
            Topics.prefixed(prefix, partitions=partitions)
            if prefix
            else Topics(partitions=partitions)
        )
    schema = schema or os.environ.get("LOOMFLOW_SCHEMA", "loomflow")
    app_id = app_id or os.environ.get("LOOMFLOW_PROCESSOR_ID", "loomflow-processor")

    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
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
    events = app.topic(topics.events, key_type=bytes, value_type=bytes)
    # keyed like the log (by session scope), so each worker updates the keys it owns
    usage = app.Table("usage-by-session", default=float, partitions=topics.partitions)
    running = app.Table("runs-in-flight", default=bool, partitions=topics.partitions)
    projector = Projector(
        bootstrap, dsn, topics=topics, schema=schema, group_id=f"{app_id}-projector"
    )

    stopping = asyncio.Event()

    async def finish_round(sender: object, **kwargs: object) -> None:
        stopping.set()  # the projector ends after its current round, committed or not

    app.on_before_shutdown.connect(finish_round)  # type: ignore[arg-type]

    @app.task  # type: ignore[untyped-decorator]
    async def project() -> None:
        await ensure_topics(bootstrap, topics)
        await projector.start()
        try:
            await projector.run(stopping)
        finally:
            await projector.stop()

    @app.agent(events)
    async def analytics(stream: faust.StreamT[bytes]) -> None:
        async for raw in stream:
            delta = usage_delta(raw)
            if delta is not None:
                usage[delta.scope] += delta.cost_usd

    @app.agent(events)
    async def crash_watch(stream: faust.StreamT[bytes]) -> None:
        # a session whose run started and never finished, failed or was erased is a
        # candidate for event-driven resume after a crash
        async for raw in stream:
            transition = run_transition(raw)
            if transition is not None:
                running[transition.scope] = transition.running

    app.loomflow_projector = projector  # type: ignore[attr-defined]
    return app


app = create_app()
