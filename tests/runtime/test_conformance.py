"""loomflow.testing's conformance suites, run against our four runtimes.

The suites live in loomflow/testing, where a third-party store or runtime subclasses
them the same way; each class here names a backend of tests/support/backends.py. What
only one backend has to prove is in its own module (test_sqlite, test_postgres,
test_kafka).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest

from loomflow.testing import (
    ListingConformance,
    RuntimeConformance,
    RuntimeFactory,
    StoreConformance,
    StoreFactory,
)
from tests.support.backends import BACKENDS, Backend


class _OnBackend:
    """The fixtures the suites ask for, opened on the backend the class names."""

    backend_name: ClassVar[str]

    @pytest.fixture
    async def backend(self, tmp_path: Path) -> AsyncIterator[Backend]:
        made = BACKENDS[self.backend_name](tmp_path)
        await made.open()
        yield made
        await made.close()

    @pytest.fixture
    def open_runtime(self, backend: Backend) -> RuntimeFactory:
        return backend.runtime

    @pytest.fixture
    def open_store(self, backend: Backend) -> StoreFactory:
        return backend.store


class TestInProcStore(_OnBackend, StoreConformance):
    backend_name = "inproc"


class TestInProcRuntime(_OnBackend, RuntimeConformance):
    backend_name = "inproc"


class TestSqliteStore(_OnBackend, StoreConformance):
    backend_name = "sqlite"


class TestSqliteRuntime(_OnBackend, RuntimeConformance):
    backend_name = "sqlite"


class TestSqliteListing(_OnBackend, ListingConformance):
    backend_name = "sqlite"


@pytest.mark.postgres
class TestPostgresStore(_OnBackend, StoreConformance):
    backend_name = "postgres"


@pytest.mark.postgres
class TestPostgresRuntime(_OnBackend, RuntimeConformance):
    backend_name = "postgres"


@pytest.mark.postgres
class TestPostgresListing(_OnBackend, ListingConformance):
    backend_name = "postgres"


@pytest.mark.kafka
@pytest.mark.postgres
class TestKafkaStore(_OnBackend, StoreConformance):
    backend_name = "kafka"
    atomic_appends = False  # the log takes a batch whole; the projector refuses from a gap on


@pytest.mark.kafka
@pytest.mark.postgres
class TestKafkaRuntime(_OnBackend, RuntimeConformance):
    backend_name = "kafka"
