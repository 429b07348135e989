from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.backends import BACKENDS, Backend

#: the services each backend needs, as pytest markers (``-m "not kafka and not postgres"``
#: runs the offline suite alone)
_NEEDS = {"kafka": (pytest.mark.kafka, pytest.mark.postgres), "postgres": (pytest.mark.postgres,)}


@pytest.fixture(
    params=[pytest.param(name, marks=_NEEDS.get(name, ())) for name in sorted(BACKENDS)]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = BACKENDS[request.param](tmp_path)
    if made.setup is not None:
        await made.setup()
    yield made
    await made.close()
