from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.backends import BACKENDS, Backend


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = BACKENDS[request.param](tmp_path)
    if made.setup is not None:
        await made.setup()
    yield made
    await made.close()
