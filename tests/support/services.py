"""Where the tests find Kafka and PostgreSQL.

1. ``LOOMFLOW_KAFKA_BOOTSTRAP`` / ``LOOMFLOW_POSTGRES_DSN`` when set (CI sets them after
   starting the services with ``dev/services.sh start``);
2. else, when a Docker engine answers, containers started with testcontainers;
3. else the test fails with a message naming the script to run. Never a skip: a test that
   needs a service and cannot reach one has not passed.
"""

from __future__ import annotations

import atexit
import os
from contextlib import suppress
from typing import Any

import pytest

_started: dict[str, Any] = {}


def _docker_answers() -> bool:
    with suppress(Exception):
        import docker

        docker.from_env(timeout=3).ping()
        return True
    return False


def _stop_all() -> None:
    for container in _started.values():
        with suppress(Exception):
            container.stop()


def postgres_dsn() -> str:
    """A DSN of a PostgreSQL the tests may create schemas in."""
    dsn = os.environ.get("LOOMFLOW_POSTGRES_DSN")
    if dsn:
        return dsn
    if "postgres" not in _started and _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16", driver=None)
        container.start()
        atexit.register(_stop_all)
        _started["postgres"] = container
    if "postgres" in _started:
        return str(_started["postgres"].get_connection_url())
    pytest.fail(
        "this test needs PostgreSQL: run `dev/postgres.sh start` and export the "
        "LOOMFLOW_POSTGRES_DSN it prints (or start a Docker engine for testcontainers)",
        pytrace=False,
    )


def kafka_bootstrap() -> str:
    """host:port of a Kafka broker the tests may create topics on."""
    bootstrap = os.environ.get("LOOMFLOW_KAFKA_BOOTSTRAP")
    if bootstrap:
        return bootstrap
    if "kafka" not in _started and _docker_answers():
        from testcontainers.kafka import KafkaContainer

        container = KafkaContainer().with_kraft()
        container.start()
        atexit.register(_stop_all)
        _started["kafka"] = container
    if "kafka" in _started:
        return str(_started["kafka"].get_bootstrap_server())
    pytest.fail(
        "this test needs Kafka: run `dev/kafka.sh start` and export the "
        "LOOMFLOW_KAFKA_BOOTSTRAP it prints (or start a Docker engine for testcontainers)",
        pytrace=False,
    )
