"""What the CLI tests share: ``loomflow ARGS`` run in this process, and a journal with a
session in every status a person reads (``loomflow.cli.render.STATUSES``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from loomflow import Agent, new_id
from loomflow.cli import main
from loomflow.errors import ModelError
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, Scope, SqliteRuntime
from loomflow.schemas import RunStarted, utcnow
from loomflow.schemas.events import RunStartedPayload
from tests.support import lifecycle

__all__ = ["LONG_USER", "Cli", "Ran", "Zoo", "make_zoo", "populate", "runner"]


@dataclass
class Ran:
    code: int
    out: str
    err: str


Cli = Callable[..., Ran]


def runner(capsys: pytest.CaptureFixture[str]) -> Cli:
    """``loomflow ARGS`` in this process: exit code, stdout and stderr."""

    def run(*argv: str) -> Ran:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse refusing the arguments
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


#: a user id long enough that an 80-column table cuts it
LONG_USER = "operations-team-7"


@dataclass(frozen=True)
class Zoo:
    """A journal's sessions: status -> (session id, user id), and ``billing``: the one
    session whose run is of the agent ``billing``."""

    db: Path
    sessions: dict[str, tuple[str, str | None]]
    billing: str
    long_user: str = LONG_USER


def make_zoo(db: Path) -> Zoo:
    """A SQLite journal of :func:`populate`'s sessions."""

    async def make() -> Zoo:
        async with SqliteRuntime(db) as runtime:
            sessions, billing = await populate(runtime)
        return Zoo(db, sessions, billing)

    return asyncio.run(make())


async def populate(runtime: Runtime) -> tuple[dict[str, tuple[str, str | None]], str]:
    """A session in each status: finished (with two checkpoints and a fork), failed,
    stuck, waiting, signalled, cancelled, forked (no run yet), abandoned (silent past its
    lease), running; and one of the agent ``billing``. Returns status -> (session, user)
    and the billing session."""
    long_user = LONG_USER
    done = await lifecycle.researcher(runtime=runtime).run(
        "How many people live in Oslo?", user_id="ada"
    )
    ada = Scope(done.session_id, "ada")
    await lifecycle.researcher(runtime=runtime).resume(
        "How many people live in Oslo?", session_id=done.session_id, user_id="ada"
    )
    with pytest.raises(ModelError):
        await lifecycle.researcher(replies=1, runtime=runtime).run(
            "How many people live in Oslo?", session_id="oslo-failed", user_id="ada"
        )
    parked = lifecycle.researcher(replies=1, runtime=runtime)
    with pytest.raises(ModelError):
        await parked.run("Oslo?", session_id="oslo-stuck", user_id=long_user)
    row = await runtime.session(Scope("oslo-stuck", long_user))
    assert row is not None
    with pytest.raises(ModelError):
        await parked.take_over(
            "oslo-stuck", user_id=long_user, after_seq=row.last_seq, worker="w1", last_attempt=True
        )
    for invoice in ("inv-7", "inv-8", "inv-9"):
        waits = await lifecycle.payer(runtime).run(f"Pay {invoice}.", session_id=invoice)
        assert waits.stop_reason == "waiting"
    await runtime.signal(Scope("inv-8"), "approve", {"ok": True})
    await runtime.cancel(Scope("inv-9"), "paid by hand")
    checkpoints = await runtime.store.list_checkpoints(ada, 10)
    fork = await runtime.fork(ada, checkpoints[-1].checkpoint_id)
    silent = RunStarted(
        session_id="gone",
        user_id="bob",
        run_id="run-gone",
        seq=1,
        epoch=1,
        at=utcnow() - timedelta(minutes=5),
        payload=RunStartedPayload(agent="agent", lease_seconds=30),
    )
    await runtime.store.append([silent])
    await runtime.open_session(Scope("live", "bob"), run_id=new_id("run"), agent="agent")
    billing = Agent("Bill.", model=ScriptedModel(["Billed."]), name="billing")
    billing.runtime = runtime
    billed = await billing.run("Bill ada.", user_id="ada")
    sessions: dict[str, tuple[str, str | None]] = {
        "finished": (done.session_id, "ada"),
        "failed": ("oslo-failed", "ada"),
        "stuck": ("oslo-stuck", long_user),
        "waiting": ("inv-7", None),
        "signalled": ("inv-8", None),
        "cancelled": ("inv-9", None),
        "forked": (fork.session_id, "ada"),
        "abandoned": ("gone", "bob"),
        "running": ("live", "bob"),
    }
    return sessions, billed.session_id
