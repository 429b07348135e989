"""Debian's Chromium, driven by playwright, for the tests that open a page: the report's
HTML file and the web console.

``dev/chromium.sh`` installs it (``make test`` and CI run it first); playwright drives it
through ``executable_path``, as it cannot download a browser of its own here. A machine
without it fails the test that needs it, saying how to install it: never a skip.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, sync_playwright

__all__ = ["CHROMIUM_FLAGS", "chromium", "launched"]

CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # no calls home: the machine has no network, and the page must need none
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """The path of the system's Chromium; the test fails without one."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Chromium is not installed: run dev/chromium.sh (Debian's chromium package)")
    return found


@contextmanager
def launched() -> Iterator[Browser]:
    """A headless Chromium, closed after."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()
