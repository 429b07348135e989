"""bench/signing.py on the embedded stores at a tiny size: the signed rounds hold events
whose signatures the keyring accepts, the unsigned ones events with none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import signing

pytestmark = pytest.mark.slow


def test_signed_and_unsigned_rounds_hold_what_they_say(tmp_path: Path) -> None:
    keys = signing.Keys.make(tmp_path)
    results = asyncio.run(signing.store_level(keys, ["inproc", "sqlite"], 20, 2))
    for key in ("inproc", "sqlite"):
        result = results[key]
        assert "error" not in result and result["problems"] == [], result
        assert len(result["unsigned"]) == len(result["signed"]) == 2
    table = "\n".join(signing.report_appends(results, 20, 2))
    assert "| InProcStore |" in table and "| SqliteStore |" in table


def test_the_signed_environment_names_the_key_and_the_keyring(tmp_path: Path) -> None:
    keys = signing.Keys(tmp_path / "writer.pem", tmp_path / "keyring.json")
    signed, unsigned = keys.env(True), keys.env(False)
    assert signed["LOOMFLOW_SIGNING_KEY_FILE"] == str(keys.writer)
    assert signed["LOOMFLOW_KEYRING"] == str(keys.keyring)
    assert not any(name in unsigned for name in signing.SIGNING_VARS)
