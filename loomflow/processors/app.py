"""The loomflow processor as a faust-streaming app: the projector, as one task.

Run it with ``loomflow processor`` or ``faust -A loomflow.processors.app worker
--without-web``. Kafka, PostgreSQL, topics, schema and processor id come from
:class:`loomflow.settings.Settings` (the ``LOOMFLOW_*`` environment), read the same way as
by ``KafkaRuntime``, so both meet on the same topics and group with no options at all.
The projection's hot path is a batch consumer in an ``app.task`` (see projector.py, which
also publishes the snapshots); faust gives it a worker's lifecycle, signals and logging.
The consumers with faust tables have apps of their own, with their own consumer groups
(``loomflow.analytics.app``, ``loomflow analytics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import faust

from loomflow.errors import StoreError
from loomflow.log.apps import new_app
from loomflow.processors.projector import Projector, tune_gc
from loomflow.producers import Topics, ensure_topics
from loomflow.settings import Settings

__all__ = ["app", "create_app"]

logger = logging.getLogger("loomflow.processors.app")


def create_app(settings: Settings | None = None) -> faust.App:
    """Build the processor app; ``settings`` default to the LOOMFLOW_* environment."""
    settings = Settings.resolve(settings)
    topics = Topics.from_settings(settings)
    app_id = settings.processor_id
    bootstrap = settings.kafka_bootstrap

    app = new_app(app_id, settings)
    projector = Projector(settings)

    stopping = asyncio.Event()

    async def finish_round(sender: object, **kwargs: object) -> None:
        stopping.set()  # the projector ends after its current round, committed or not

    app.on_before_shutdown.connect(finish_round)  # type: ignore[arg-type]

    @app.task  # type: ignore[untyped-decorator]
    async def project() -> None:
        # Kafka or PostgreSQL down at start: say so, and keep trying until they answer
        backoff = 0.5
        while not stopping.is_set():
            try:
                await ensure_topics(bootstrap, topics, create=settings.auto_migrate)
                await projector.start()
                break
            except StoreError as exc:
                if not exc.retriable:  # e.g. a schema at another version: waiting won't help
                    logger.error("cannot start the projector: %s", exc)
                    raise
                logger.error("cannot start the projector (%s); retrying in %.0f s", exc, backoff)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), backoff)
                backoff = min(backoff * 2, 10.0)
        else:
            return
        tune_gc()  # this process projects: see tune_gc
        logger.info("projecting %s", settings.describe())
        try:
            await projector.run(stopping)
        finally:
            await projector.stop()

    app.loomflow_projector = projector  # type: ignore[attr-defined]
    return app


app = create_app()
