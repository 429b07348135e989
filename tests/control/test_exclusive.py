"""The locks one writer at a time holds: taken without waiting, refused while another
holds them, and gone with their holder, leaving no file behind."""

from __future__ import annotations

import secrets
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from loomflow.control.exclusive import advisory_lock, file_lock
from loomflow.errors import StoreError
from tests.support.services import postgres_dsn


async def test_a_file_lock_is_refused_while_held_and_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "journal.audit.db-lock"
    async with file_lock(path) as first:
        assert first and path.exists()
        async with file_lock(path) as second:  # as another process would find it
            assert not second
        assert path.exists()  # the refused one let go of nothing
    assert not path.exists()
    async with file_lock(path) as again:
        assert again


async def test_a_file_lock_that_cannot_be_made_says_where(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"cannot lock {tmp_path / 'none' / 'x-lock'}: No such"):
        async with file_lock(tmp_path / "none" / "x-lock"):
            pass


@pytest.mark.postgres
async def test_an_advisory_lock_is_refused_while_another_session_holds_it() -> None:
    name = f"loomflow.test:{secrets.token_hex(6)}"

    def lock() -> AbstractAsyncContextManager[bool]:
        return advisory_lock(postgres_dsn(), name, connect_timeout=10, where="the test's")

    async with lock() as first:
        assert first
        async with lock() as second:  # another connection: as another process would find it
            assert not second
    async with lock() as again:  # it went with its connection
        assert again
