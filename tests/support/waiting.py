"""Waiting on a condition with a timeout, never on a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    condition: Callable[[], Any | Awaitable[Any]], *, within: float = 30.0, what: str = ""
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what or condition}")
        await asyncio.sleep(0.02)  # the poll interval of the condition, not a wait for an event


async def kill_once_hanging(victim: subprocess.Popen[str]) -> None:
    """SIGKILL a worker once it printed ``HANGING`` (it is stuck where the test wants
    it); fail with its stderr when it printed anything else or ended first."""
    try:
        assert victim.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(victim.stdout.readline), 60)
        assert line.strip() == "HANGING", victim.stderr.read() if victim.stderr else ""
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL
