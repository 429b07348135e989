"""The web console's journal in tests, made by real agent runs on the scripted model, and
the processes that act on it while a page is open.

- :func:`make_journal`: a SQLite journal with a finished session (a tool call, two
  checkpoints), a failed one, one whose tool raised, two waiting for the signal
  "approve", a fork, and one whose transcript is hostile (a script tag, a very long
  line, control characters), of the users ada and bob.
- ``python -m tests.support.console DB SESSION USER``: a run of the clerk whose tool
  prints ``HOLDING`` and waits for a line on stdin; then it ends and prints
  ``FINISHED``, or ``CANCELLED`` when the session was cancelled meanwhile.
- ``loomflow worker tests.support.console:payers`` (``CONSOLE_DB``): the payer, on that
  journal, whose runs wait for "approve".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loomflow import Agent, Tuning, wait_for_signal
from loomflow.errors import ModelError, RunCancelledError
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope, SqliteRuntime

__all__ = ["CONTROL", "HOSTILE", "LONG_LINE", "Journal", "clerk", "make_journal", "payers"]

#: what a model may write to a page that shows it
HOSTILE = "<script>alert(1)</script>"
#: one line of about 12,000 characters, no space a browser could break it at
LONG_LINE = "x" * 12_000
#: bell, escape (a terminal colour) and two other C0 controls, between words
CONTROL = "ring\x07 red\x1b[31m start\x01 end\x02"


@dataclass(frozen=True)
class Journal:
    """A journal's file and its sessions: (session id, user id) by what each is."""

    db: Path
    finished: tuple[str, str] = ("oslo", "ada")
    failed: tuple[str, str] = ("oslo-failed", "ada")
    tool_error: tuple[str, str] = ("forecast", "bob")
    waiting: tuple[str, str] = ("invoice-1", "bob")
    waiting_too: tuple[str, str] = ("invoice-2", "bob")
    forked: tuple[str, str] = ("oslo-fork", "ada")
    hostile: tuple[str, str] = ("hostile", "bob")


def population(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 709000"


def forecast(city: str) -> str:
    """Look up the weather."""
    raise RuntimeError(f"the weather service is down for {city}")


def researcher(runtime: Runtime, script: list[Any]) -> Agent:
    return Agent(
        "Answer with data.",
        model=ScriptedModel(script),
        runtime=runtime,
        tools=[population, forecast],
        tuning=Tuning(checkpoint=True),
        name="researcher",
    )


async def ask_approval(amount: int) -> str:
    """Ask a person to approve a payment."""
    answer = await wait_for_signal("approve", timeout=3600)
    return f"approved={answer['ok']} for {amount}"


def payer(runtime: Runtime) -> Agent:
    """An agent whose tool waits for the signal "approve"."""
    return Agent(
        "You pay invoices.",
        model=ScriptedModel([ScriptedModel.tool_call("ask_approval", amount=5), "Paid."]),
        runtime=runtime,
        tools=[ask_approval],
        tuning=Tuning(checkpoint=True),
        name="payer",
    )


def payers() -> list[Agent]:
    """The payer on ``$CONSOLE_DB``, for ``loomflow worker``."""
    return [payer(SqliteRuntime(os.environ["CONSOLE_DB"]))]


async def hold() -> str:
    """Wait for the operator's go."""
    print("HOLDING", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    return f"released: {line.strip()}"


def clerk(runtime: Runtime) -> Agent:
    """An agent whose tool holds the run until a line comes on stdin."""
    return Agent(
        "You file papers.",
        model=ScriptedModel([ScriptedModel.tool_call("hold"), "Filed."]),
        runtime=runtime,
        tools=[hold],
        tuning=Tuning(checkpoint=True),
        name="clerk",
    )


def make_journal(db: Path) -> Journal:
    """The journal of the module's docstring, in ``db``."""
    journal = Journal(db)

    async def make() -> None:
        async with SqliteRuntime(db) as runtime:
            session, user = journal.finished
            script = [
                ScriptedModel.tool_call("population", city="Oslo"),
                "709000 people.",
                "Bergen is smaller.",
            ]
            await researcher(runtime, script).run(
                "How many people live in Oslo?", session_id=session, user_id=user
            )
            await researcher(runtime, script).run("And Bergen?", session_id=session, user_id=user)
            session, user = journal.failed
            with contextlib.suppress(ModelError):  # its model has no reply: the run fails
                await researcher(runtime, []).run("Oslo?", session_id=session, user_id=user)
            session, user = journal.tool_error
            await researcher(
                runtime, [ScriptedModel.tool_call("forecast", city="Oslo"), "No forecast."]
            ).run("Will it rain in Oslo?", session_id=session, user_id=user)
            for session, user in (journal.waiting, journal.waiting_too):
                waits = await payer(runtime).run(
                    f"Pay {session}.", session_id=session, user_id=user
                )
                assert waits.stop_reason == "waiting", waits
            parent = Scope(*journal.finished)
            checkpoints = await runtime.store.list_checkpoints(parent, 10)
            await runtime.fork(parent, checkpoints[0].checkpoint_id, session_id=journal.forked[0])
            session, user = journal.hostile
            said = f"You wrote {HOSTILE}.\n{LONG_LINE}\n{CONTROL}"
            await researcher(runtime, [said]).run(
                f"Print {HOSTILE} back.", session_id=session, user_id=user
            )

    asyncio.run(make())
    return journal


async def _clerk_run(db: str, session_id: str, user_id: str) -> str:
    async with SqliteRuntime(db) as runtime:
        try:
            await clerk(runtime).run("File the papers.", session_id=session_id, user_id=user_id)
        except RunCancelledError:
            return "CANCELLED"
    return "FINISHED"


if __name__ == "__main__":
    print(asyncio.run(_clerk_run(*sys.argv[1:4])), flush=True)
