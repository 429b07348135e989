"""``loomflow sessions``, ``checkpoints`` and ``prune`` on sessions a scripted agent made,
checked for what a user looks for in the output: ids, order, lineage, tokens."""

from __future__ import annotations

import asyncio
import io
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from loomflow import Agent, Tuning, new_id
from loomflow.cli import main
from loomflow.models import ScriptedModel
from loomflow.projections.fold import CheckpointRow
from loomflow.runtime import (
    ANY_USER,
    DatabaseStore,
    PostgresRuntime,
    Runtime,
    Scope,
    SqliteRuntime,
)
from loomflow.schemas import RunStarted, utcnow
from loomflow.schemas.events import RunStartedPayload
from loomflow.schemas.sessions import SessionRecord
from loomflow.schemas.signing import Keyring, Signer
from tests.support import lifecycle
from tests.support.cli import Cli, Ran
from tests.support.services import postgres_dsn
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SESSION_ID = re.compile(r"sess[0-9a-z]{26}")


def population(city: str) -> str:
    """Look up a city's population."""
    return f"{city}: 709000"


def _model() -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedModel.tool_call("population", city="Oslo"),
            "Oslo has 709000 people.",
            "Bergen is smaller.",
        ]
    )


def _agent(runtime: Runtime, model: ScriptedModel | None = None) -> Agent:
    return Agent(
        "Answer with data.",
        model=model or _model(),
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
        tools=[population],
    )


@dataclass
class Sessions:
    """What the scenario made: ada's session with two checkpoints and a fork of it from
    the older one, bob's session and one run without a user."""

    ada: str
    fork: str
    bob: str
    anon: str
    checkpoints: list[CheckpointRow]  # ada's, newest first


async def _make_sessions(runtime: Runtime) -> Sessions:
    agent = _agent(runtime)
    first = await agent.run("How many people live in Oslo?", user_id="ada")
    bob = await _agent(runtime).run("How many people live in Oslo?", user_id="bob")
    anon = await _agent(runtime).run("How many people live in Oslo?")
    await agent.resume("And Bergen?", session_id=first.session_id, user_id="ada")
    checkpoints = await runtime.store.list_checkpoints(Scope(first.session_id, "ada"), 10)
    fork = await _agent(runtime).resume(
        "And Bergen, from the start?",
        session_id=first.session_id,
        user_id="ada",
        from_checkpoint=checkpoints[-1].checkpoint_id,
    )
    assert len(checkpoints) == 2 and fork.parent_session_id == first.session_id
    return Sessions(first.session_id, fork.session_id, bob.session_id, anon.session_id, checkpoints)


def _store(runtime: Runtime) -> DatabaseStore:
    store = runtime.store
    assert isinstance(store, DatabaseStore)
    return store


def _lines_with(text: str, *needles: str) -> list[str]:
    return [line for line in text.splitlines() if all(n in line for n in needles)]


# --- SQLite ------------------------------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[Path, Sessions]]:
    db = tmp_path / "journal.db"

    async def make() -> Sessions:
        async with SqliteRuntime(db) as runtime:
            return await _make_sessions(runtime)

    yield db, asyncio.run(make())


def _read(db: Path, read: Callable[[Runtime], object]) -> object:
    async def go() -> object:
        async with SqliteRuntime(db) as runtime:
            result = read(runtime)
            return await result if asyncio.iscoroutine(result) else result

    return asyncio.run(go())


def _row(db: Path, session_id: str, user_id: str | None) -> SessionRecord | None:
    row = _read(db, lambda runtime: runtime.store.session(Scope(session_id, user_id)))
    assert row is None or isinstance(row, SessionRecord)
    return row


def test_ls_lists_one_users_sessions_newest_activity_first_with_their_parent(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    ran = cli("sessions", "ls", "--db", str(db), "--user", "ada")
    assert ran.code == 0, ran.err
    ids = SESSION_ID.findall(ran.out)
    # the fork was active last; its row names the session it was forked from
    assert ids == [made.fork, made.ada, made.ada]
    (fork_line,) = _lines_with(ran.out, made.fork)
    assert fork_line.index(made.fork) < fork_line.index(made.ada)
    (ada_line,) = [line for line in _lines_with(ran.out, made.ada) if made.fork not in line]
    row = _row(db, made.ada, "ada")
    assert row is not None
    assert "finished" in ada_line and f" {row.turns} " in ada_line
    assert f"{row.usage.total_tokens:,}" in ada_line and f"${row.usage.cost_usd:.4f}" in ada_line
    assert made.bob not in ran.out and made.anon not in ran.out


def test_ls_without_a_user_lists_the_sessions_run_without_one_and_all_users_every_one(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    ran = cli("sessions", "ls", "--db", str(db))
    assert ran.code == 0 and SESSION_ID.findall(ran.out) == [made.anon]
    ran = cli("sessions", "ls", "--db", str(db), "--all-users")
    assert ran.code == 0
    assert set(SESSION_ID.findall(ran.out)) == {made.ada, made.fork, made.bob, made.anon}
    assert _lines_with(ran.out, made.bob, " bob ")
    ran = cli("sessions", "ls", "--db", str(db), "--user", "carol")
    assert ran.code == 0 and "no sessions of user carol" in ran.out
    ran = cli("sessions", "ls", "--db", str(db), "--all-users", "--limit", "1")
    assert SESSION_ID.findall(ran.out) == [made.fork, made.ada]  # one row, and its parent
    assert "--limit" in ran.out


def test_ls_with_nothing_to_list_says_whose_sessions_it_looked_for(
    cli: Cli, tmp_path: Path
) -> None:
    db = tmp_path / "empty.db"

    async def make() -> None:
        async with SqliteRuntime(db):
            pass

    asyncio.run(make())
    ran = cli("sessions", "ls", "--db", str(db), "--all-users")
    assert (ran.code, ran.out) == (0, "no sessions of any user\n")
    ran = cli("sessions", "ls", "--db", str(db), "--user", "carol")
    assert (ran.code, ran.out) == (0, "no sessions of user carol; --all-users lists everyone's\n")
    ran = cli("sessions", "ls", "--db", str(db))
    assert (ran.code, ran.out) == (
        0,
        "no sessions run without a user; --user U lists a user's, --all-users everyone's\n",
    )


def test_show_prints_the_transcript_checkpoints_newest_first_forks_and_usage(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    ran = cli("sessions", "show", made.ada, "--db", str(db), "--user", "ada")
    assert ran.code == 0, ran.err
    out = ran.out
    transcript = [
        ("user", "How many people live in Oslo?"),
        ("assistant", "→ population(city='Oslo')"),
        ("tool", "← population returned: Oslo: 709000"),
        ("assistant", "Oslo has 709000 people."),
        ("user", "And Bergen?"),
        ("assistant", "Bergen is smaller."),
    ]
    at = 0
    for role, text in transcript:  # in order, each on one line with its role
        (line,) = _lines_with(out[at:], text)
        assert line.split()[0] == role, line
        at = out.index(line, at) + len(line)
    newest, older = (c.checkpoint_id for c in made.checkpoints)
    assert "checkpoints (2, newest first)" in out and out.index(newest) < out.index(older)
    (older_line,) = [line for line in _lines_with(out, older) if made.fork not in line]
    assert f"{made.checkpoints[1].cumulative_usage.total_tokens:,}" in older_line
    (fork_line,) = _lines_with(out, made.fork)  # forked from it, and from which checkpoint
    assert older in fork_line and "forked from this session (1)" in out
    row = _row(db, made.ada, "ada")
    assert row is not None and f"{row.usage.total_tokens:,} tokens" in out

    ran = cli("sessions", "show", made.fork, "--db", str(db), "--user", "ada")
    assert ran.code == 0, ran.err
    (lineage,) = _lines_with(ran.out, "forked from", " at checkpoint ")
    assert made.ada in lineage and older in lineage
    assert "Bergen is smaller." in ran.out and "And Bergen, from the start?" in ran.out
    assert "And Bergen?\n" not in ran.out  # the parent's turn after the checkpoint is not its
    assert "forked from this session: none" in ran.out


def test_checkpoints_ls_lists_them_newest_first_with_turn_messages_and_tokens(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    ran = cli("checkpoints", "ls", made.ada, "--db", str(db), "--user", "ada")
    assert ran.code == 0, ran.err
    assert re.findall(r"ckpt[0-9a-z]{26}", ran.out) == [c.checkpoint_id for c in made.checkpoints]
    for ckpt in made.checkpoints:
        (line,) = _lines_with(ran.out, ckpt.checkpoint_id)
        cells = line.split()
        assert cells[1:3] == [str(ckpt.turn), str(ckpt.message_count)]
        assert f"{ckpt.cumulative_usage.total_tokens:,}" in cells
    ran = cli("checkpoints", "ls", made.bob, "--db", str(db), "--user", "bob")
    assert ran.code == 0 and len(re.findall(r"ckpt[0-9a-z]{26}", ran.out)) == 1


def test_fork_makes_a_session_from_a_checkpoint_that_the_library_resumes(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    older = made.checkpoints[-1]
    fork = ["sessions", "fork", made.ada, "--from", older.checkpoint_id, "--user", "ada"]
    ran = cli(*fork, "--as", "ada-bergen", "--db", str(db))
    assert (ran.code, ran.out) == (0, "ada-bergen\n"), ran.err
    ran = cli(*fork, "--db", str(db))
    assert ran.code == 0 and SESSION_ID.fullmatch(ran.out.strip()), ran.out
    row = _row(db, "ada-bergen", "ada")
    assert row is not None and row.parent_session_id == made.ada
    assert (row.parent_checkpoint_id, row.turns) == (older.checkpoint_id, older.turn)
    listed = cli("sessions", "ls", "--db", str(db), "--user", "ada")
    (line,) = _lines_with(listed.out, "ada-bergen")
    assert "forked" in line.split() and made.ada in line

    model = ScriptedModel(lambda messages: "Bergen: 291000.")

    async def resume() -> tuple[str, list[object]]:
        async with SqliteRuntime(db) as runtime:
            result = await _agent(runtime, model).resume(
                "And Bergen?", session_id="ada-bergen", user_id="ada"
            )
            at = await runtime.get_checkpoint(Scope(made.ada, "ada"), older.checkpoint_id)
            assert at is not None
            return result.output, list(at.messages)

    output, at_checkpoint = asyncio.run(resume())
    assert output == "Bergen: 291000."
    sent = model.calls[0]  # the transcript at the checkpoint, then the new prompt
    assert sent[: len(at_checkpoint)] == at_checkpoint and len(sent) == len(at_checkpoint) + 1
    row = _row(db, "ada-bergen", "ada")
    assert row is not None and row.status == "finished" and row.turns == older.turn + 1


def test_prune_deletes_what_it_reports(cli: Cli, journal: tuple[Path, Sessions]) -> None:
    db, made = journal
    newest, older = made.checkpoints
    assert older.created_at < newest.created_at
    only_ada = ["--db", str(db), "--user", "ada", "--session", made.ada]
    ran = cli("prune", *only_ada, "--before", newest.created_at.isoformat(), "--yes")
    assert ran.code == 0, ran.err
    assert "deleted 0 sessions, 1 checkpoint, 0 journal steps, 0 events" in ran.out
    listed = cli("checkpoints", "ls", made.ada, "--db", str(db), "--user", "ada")
    assert re.findall(r"ckpt[0-9a-z]{26}", listed.out) == [newest.checkpoint_id]

    bob = _row(db, made.bob, "bob")
    assert bob is not None
    events = _read(db, lambda runtime: runtime.store.read_events(Scope(made.bob, "bob")))
    assert isinstance(events, list) and len(events) == bob.last_seq
    # a naive time is UTC; one microsecond after bob's last activity takes his session whole
    cutoff = (bob.updated_at + timedelta(microseconds=1)).replace(tzinfo=None).isoformat()
    ran = cli("prune", "--db", str(db), "--user", "bob", "--before", cutoff, "--yes")
    assert ran.code == 0, ran.err
    assert f"deleted 1 session, 1 checkpoint, 0 journal steps, {bob.last_seq} events" in ran.out
    assert _row(db, made.bob, "bob") is None
    assert _row(db, made.ada, "ada") is not None and _row(db, made.anon, None) is not None

    ran = cli("prune", "--db", str(db), "--all-users", "--before", "30d", "--yes")
    assert ran.code == 0 and "deleted 0 sessions, 0 checkpoints" in ran.out


def test_prune_asks_first_and_without_a_terminal_needs_yes(
    cli: Cli, journal: tuple[Path, Sessions], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, made = journal
    ran = cli("prune", "--db", str(db), "--user", "bob", "--before", "0s")
    assert ran.code == 2 and "--yes" in ran.err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    ran = cli("prune", "--db", str(db), "--user", "bob", "--before", "0s")
    assert ran.code == 0 and "nothing pruned" in ran.out
    assert _row(db, made.bob, "bob") is not None
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    ran = cli("prune", "--db", str(db), "--user", "bob", "--before", "0s")
    assert ran.code == 0 and "deleted 1 session" in ran.out
    assert _row(db, made.bob, "bob") is None


def test_another_users_session_looks_like_one_that_does_not_exist(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    for command in (["sessions", "show"], ["checkpoints", "ls"]):
        theirs = cli(*command, made.ada, "--db", str(db), "--user", "bob")
        missing = cli(*command, "no-such-session", "--db", str(db), "--user", "bob")
        assert theirs.code == missing.code == 1 and theirs.out == missing.out == ""
        assert theirs.err == missing.err.replace("no-such-session", made.ada)
        assert f"no session {made.ada} (user bob)" in theirs.err
        unscoped = cli(*command, made.ada, "--db", str(db))  # ada's, asked without a user
        assert unscoped.code == 1 and "(no user)" in unscoped.err
    older = made.checkpoints[-1].checkpoint_id
    ran = cli("sessions", "fork", made.ada, "--from", older, "--user", "bob", "--db", str(db))
    assert ran.code == 1 and f"no session {made.ada} (user bob)" in ran.err
    everyone = cli("sessions", "ls", "--db", str(db), "--all-users")
    assert len(SESSION_ID.findall(everyone.out)) == 5  # four sessions and the fork's parent


def test_bad_input_is_a_clear_message_and_an_exit_code(
    cli: Cli, journal: tuple[Path, Sessions], tmp_path: Path
) -> None:
    db, made = journal
    older = made.checkpoints[-1].checkpoint_id
    missing = tmp_path / "nope.db"
    ran = cli("sessions", "ls", "--db", str(missing))
    assert ran.code == 1 and "no loomflow store" in ran.err and "does not exist" in ran.err
    assert not missing.exists()  # reading never creates a journal
    notes = tmp_path / "notes.db"
    notes.write_text("not a database\n")
    ran = cli("checkpoints", "ls", made.ada, "--db", str(notes))
    assert ran.code == 1 and "notes.db" in ran.err
    assert notes.read_text() == "not a database\n"

    fork = ["sessions", "fork", made.ada, "--user", "ada"]
    cases: list[tuple[list[str], int, str]] = [
        ([*fork, "--from", "ckpt_gone"], 1, f"no checkpoint ckpt_gone for session {made.ada}"),
        ([*fork, "--from", older, "--as", made.fork], 1, "already exists"),
        ([*fork, "--from", older, "--as", "a b"], 2, "invalid session id"),
        (fork, 2, "--from"),
        ([*fork, "--from", older, "--kafka"], 2, "--kafka"),
        (["prune", "--before", "last tuesday", "--yes"], 2, "argument --before"),
        (["prune", "--before", "30d", "--user", "ada", "--all-users"], 2, "not allowed"),
        (["sessions", "show", made.ada, "--user", "ada", "--schema", "lf"], 2, "--schema"),
        (["sessions", "show", "../etc", "--user", "ada"], 2, "invalid session id"),
        (["sessions"], 2, "required"),
    ]
    before = cli("sessions", "ls", "--db", str(db), "--all-users").out
    for argv, code, message in cases:
        ran = cli(*argv, "--db", str(db)) if argv != ["sessions"] else cli(*argv)
        assert (ran.code, ran.out) == (code, ""), (argv, ran)
        assert message in ran.err, (argv, ran.err)
    assert cli("sessions", "ls", "--db", str(db), "--all-users").out == before  # nothing made


def test_piped_output_keeps_each_row_whole_on_one_line(journal: tuple[Path, Sessions]) -> None:
    db, made = journal
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    done = subprocess.run(
        [sys.executable, "-m", "loomflow.cli", "sessions", "ls", "--all-users", "--db", str(db)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (fork_line,) = _lines_with(done.stdout, made.fork)
    assert made.ada in fork_line and "ada" in fork_line.split() and "\x1b" not in done.stdout


# --- resume, retry, cancel, erase; abandoned -------------------------------------------------

LIFECYCLE = "tests.support.lifecycle"


def _ids(text: str) -> list[str]:
    return re.findall(r"ckpt[0-9a-z]{26}", text)


def test_cancel_keeps_workers_and_signals_off_a_run_until_resume_continues_it(
    cli: Cli, tmp_path: Path
) -> None:
    from loomflow.agent.worker import Worker

    db = tmp_path / "journal.db"
    lifecycle.APPROVALS.clear()

    async def wait() -> None:
        async with SqliteRuntime(db) as runtime:
            agent = lifecycle.payer(runtime)
            result = await agent.run("Pay invoice 7.", session_id="inv-7", user_id="ada")
            assert result.stop_reason == "waiting"

    asyncio.run(wait())
    store = ["--db", str(db), "--user", "ada"]
    ran = cli("sessions", "cancel", "inv-7", *store, "--reason", "paid by hand")
    assert ran.code == 0, ran.err
    row = _row(db, "inv-7", "ada")
    assert row is not None and row.status == "cancelled"
    said = f"cancelled run {row.last_run_id} of session inv-7 (user ada) (seq {row.last_seq})"
    assert ran.out.startswith(said)
    (line,) = _lines_with(cli("sessions", "ls", *store).out, "inv-7")
    assert "cancelled" in line.split()
    assert _lines_with(cli("sessions", "show", "inv-7", *store).out, "cancelled", "paid by hand")

    async def scan() -> list[object]:
        async with SqliteRuntime(db) as runtime:
            return list(await Worker([lifecycle.payer(runtime)]).scan())

    assert asyncio.run(scan()) == []  # no worker takes it
    ran = cli("signal", "inv-7", "approve", "--json", '{"ok": true}', *store)
    assert ran.code == 1 and "it is cancelled" in ran.err
    ran = cli("sessions", "cancel", "inv-7", *store)
    assert ran.code == 1 and "no run in flight to cancel: it is cancelled" in ran.err
    assert _row(db, "inv-7", "ada") == row  # nothing was appended by either

    resume = ["sessions", "resume", "inv-7", *store, "--agent", f"{LIFECYCLE}:payer"]
    ran = cli(*resume, "--prompt", "Never mind: it was paid by hand.")
    assert ran.code == 0, ran.err
    head, output = ran.out.splitlines()
    assert "of session inv-7 (user ada): completed (1 model call, 2 turns in all" in head
    assert output == "Paid." and lifecycle.APPROVALS == []  # the wait ended with the prompt
    row = _row(db, "inv-7", "ada")
    assert row is not None and row.status == "finished"


def test_a_signal_the_waiting_run_does_not_wait_for_is_refused_unless_meant_for_later(
    cli: Cli, tmp_path: Path
) -> None:
    """`loomflow signal inv-7 aprove` while the run waits for "approve": a likely typo,
    refused with the name it waits for, nothing sent (a new user's trial saw it recorded
    with exit 0, the run waiting on). --later sends it for a later wait of that name."""
    db = tmp_path / "journal.db"

    async def wait() -> None:
        async with SqliteRuntime(db) as runtime:
            result = await lifecycle.payer(runtime).run("Pay.", session_id="inv-7")
            assert result.stop_reason == "waiting"

    asyncio.run(wait())
    store = ["--db", str(db)]
    before = _row(db, "inv-7", None)
    ran = cli("signal", "inv-7", "aprove", "--json", '{"ok": true}', *store)
    assert (ran.code, ran.out) == (2, ""), ran
    assert ran.err.strip() == (
        "loomflow signal: session inv-7 (no user) waits for signal 'approve', not 'aprove': "
        "nothing sent. Send 'approve', or pass --later to send 'aprove' for a later wait of "
        "that name"
    )
    assert _row(db, "inv-7", None) == before
    ran = cli("signal", "inv-7", "aprove", "--later", *store)
    assert ran.code == 0 and ran.out.startswith("sent aprove to inv-7"), ran
    row = _row(db, "inv-7", None)
    assert row is not None and [s.name for s in row.inbox] == ["aprove"]
    ran = cli("signal", "inv-7", "approve", "--json", '{"ok": true}', *store)
    assert ran.code == 0, ran


def test_an_operator_with_a_signing_key_signs_the_cancel_and_the_erasure(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "journal.db"

    async def wait() -> None:  # written by a process without a key
        async with SqliteRuntime(db) as runtime:
            result = await lifecycle.payer(runtime).run("Pay.", session_id="inv-8", user_id="ada")
            assert result.stop_reason == "waiting"

    asyncio.run(wait())
    operator = Signer.generate()
    keyring = Keyring.of(operator.trusted())
    monkeypatch.setenv("LOOMFLOW_SIGNING_KEY", operator.pem().decode())
    store = ["--db", str(db), "--user", "ada"]
    ran = cli("sessions", "cancel", "inv-8", *store, "--reason", "paid by hand")
    assert ran.code == 0, ran.err
    events = _read(db, lambda runtime: runtime.store.read_events(Scope("inv-8", "ada")))
    assert isinstance(events, list)
    *run, cancel = events
    assert run and all(e.sig is None for e in run)  # the run's own, as it wrote them
    assert cancel.type == "run.cancelled" and keyring.event_problem(cancel) is None
    ran = cli("sessions", "erase", "inv-8", *store, "--yes")
    assert ran.code == 0, ran.err
    events = _read(db, lambda runtime: runtime.store.read_events(Scope("inv-8", "ada")))
    assert isinstance(events, list)
    (tombstone,) = events
    assert tombstone.type == "session.erased" and keyring.event_problem(tombstone) is None


def test_retry_takes_a_stuck_run_over_once_and_resume_continues_it_with_a_prompt(
    cli: Cli, tmp_path: Path
) -> None:
    db = tmp_path / "journal.db"

    lifecycle.TOOL_RUNS.clear()
    asyncio.run(lifecycle.park(db))  # a first attempt and a worker's last one fail
    assert lifecycle.TOOL_RUNS["Oslo"] == 1
    assert "oslo" in cli("sessions", "ls", "--db", str(db), "--stuck").out
    retry = ["sessions", "retry", "oslo", "--db", str(db), "--agent"]

    ran = cli(*retry, f"{LIFECYCLE}:broken")
    assert ran.code == 1 and ran.out == ""
    assert "the retry failed (as a last attempt: it parks the run again): ModelError" in ran.err
    row = _row(db, "oslo", None)
    assert row is not None and row.status == "stuck" and "has 0 replies" in str(row.last_error)

    ran = cli(*retry, f"{LIFECYCLE}:researcher")
    assert ran.code == 0, ran.err
    head, output = ran.out.splitlines()
    assert "of session oslo (no user): completed (1 model call, 2 turns in all" in head
    assert output == "Oslo has 709000 people."
    assert lifecycle.TOOL_RUNS["Oslo"] == 1  # recorded, so replayed: never run again
    events = _read(db, lambda runtime: runtime.store.read_events(Scope("oslo")))
    assert isinstance(events, list)
    (took,) = [e for e in events if isinstance(e, RunStarted) and e.run_id in head]
    assert str(took.payload.worker).startswith("loomflow sessions retry@")
    # and the process that ran it (this one: the command runs in the test's process)
    assert took.payload.process == f"{socket.gethostname()}:{os.getpid()}"
    ran = cli(*retry, f"{LIFECYCLE}:researcher")
    assert ran.code == 1 and "session oslo (no user) is not stuck (it is finished)" in ran.err

    before = _ids(cli("checkpoints", "ls", "oslo", "--db", str(db)).out)
    resume = ["sessions", "resume", "oslo", "--db", str(db), "--agent", f"{LIFECYCLE}:researcher"]
    ran = cli(*resume, "--prompt", "And Bergen?")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[-1] == "Bergen is smaller."
    # the retention of the factory's runtime (one checkpoint), not this command's default
    after = _ids(cli("checkpoints", "ls", "oslo", "--db", str(db)).out)
    assert len(before) == len(after) == 1 and before != after


def test_show_prints_the_error_a_failed_run_points_to_and_keeps_it_while_the_session_goes_on(
    cli: Cli, tmp_path: Path
) -> None:
    from loomflow.errors import ModelError

    db = tmp_path / "journal.db"

    async def fail() -> None:  # a first run whose model has no reply at all
        async with SqliteRuntime(db) as runtime:
            with pytest.raises(ModelError):
                agent = lifecycle.researcher(replies=0, runtime=runtime)
                await agent.run("Pay invoice 7.", session_id="inv-7")

    asyncio.run(fail())
    store = ["inv-7", "--db", str(db)]
    resume = ["sessions", "resume", *store, "--agent"]
    ran = cli(*resume, f"{LIFECYCLE}:broken", "--prompt", "Pay invoice 7.")
    assert ran.code == 1 and "see `loomflow sessions show inv-7`" in ran.err, ran.err
    row = _row(db, "inv-7", None)
    assert row is not None and row.status == "failed" and row.last_error is not None
    assert row.last_error.startswith("ModelError: ") and row.last_error in ran.err
    (line,) = _lines_with(cli("sessions", "show", *store).out, row.last_error)
    assert line.split()[0] == "error", line

    # a person's run goes on from there and waits: the error is still the last one
    ran = cli(*resume, f"{LIFECYCLE}:payer", "--prompt", "Pay invoice 7.")
    assert ran.code == 0 and "waits for signal 'approve'" in ran.out, ran
    (line,) = _lines_with(cli("sessions", "show", *store).out, row.last_error)
    assert line.startswith("last error "), line


def test_a_run_silent_past_its_lease_lists_as_abandoned_and_resume_takes_it_not_a_live_one(
    cli: Cli, tmp_path: Path
) -> None:
    db = tmp_path / "journal.db"
    silent = RunStarted(
        session_id="gone",
        run_id="run-gone",
        seq=1,
        epoch=1,
        at=utcnow() - timedelta(minutes=5),
        payload=RunStartedPayload(agent="agent", lease_seconds=30),
    )

    async def make() -> None:
        async with SqliteRuntime(db) as runtime:
            await runtime.store.append([silent])
            await runtime.open_session(Scope("live"), run_id=new_id("run"), agent="agent")

    asyncio.run(make())
    listed = cli("sessions", "ls", "--db", str(db)).out
    (gone,) = _lines_with(listed, "gone")
    (live,) = _lines_with(listed, "live")
    assert "abandoned" in gone.split() and "running" in live.split()
    shown = cli("sessions", "show", "gone", "--db", str(db)).out
    assert _lines_with(shown, "abandoned", "run run-gone has been silent past its lease (30 s)")

    resume = ["sessions", "resume", "--db", str(db), "--agent", f"{LIFECYCLE}:researcher"]
    ran = cli(*resume, "live", "--prompt", "How many people live in Oslo?")
    assert ran.code == 1 and "is running" in ran.err and "sessions cancel live" in ran.err
    ran = cli(*resume, "gone", "--prompt", "How many people live in Oslo?")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[-1] == "Oslo has 709000 people."
    events = _read(db, lambda runtime: runtime.store.read_events(Scope("gone")))
    assert isinstance(events, list)
    assert [e.payload.interrupted for e in events if isinstance(e, RunStarted)] == [
        None,
        "run-gone",
    ]


def test_erase_asks_first_and_then_leaves_a_tombstone(
    cli: Cli, journal: tuple[Path, Sessions], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, made = journal
    erase = ["sessions", "erase", made.bob, "--db", str(db), "--user", "bob"]
    ran = cli(*erase)
    assert ran.code == 2 and "would erase session" in ran.err and "--yes" in ran.err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    ran = cli(*erase)
    assert ran.code == 0 and "nothing erased" in ran.out
    row = _row(db, made.bob, "bob")
    assert row is not None and row.status == "finished"
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    ran = cli(*erase)
    assert ran.code == 0 and f"erased session {made.bob} (user bob)" in ran.out
    row = _row(db, made.bob, "bob")
    assert row is not None and row.status == "erased"  # the tombstone
    events = _read(db, lambda runtime: runtime.store.read_events(Scope(made.bob, "bob")))
    assert isinstance(events, list) and [e.type for e in events] == ["session.erased"]
    assert made.bob not in cli("sessions", "ls", "--db", str(db), "--all-users").out
    ran = cli(*erase, "--yes")
    assert ran.code == 1 and "was erased" in ran.err
    ran = cli("sessions", "erase", made.anon, "--db", str(db), "--yes")
    assert ran.code == 0 and _row(db, made.ada, "ada") is not None


def test_the_lifecycle_verbs_refuse_bad_input_with_one_line_and_an_exit_code(
    cli: Cli, journal: tuple[Path, Sessions]
) -> None:
    db, made = journal
    agent = ["--agent", f"{LIFECYCLE}:researcher"]
    ada = [made.ada, "--user", "ada"]
    cases: list[tuple[list[str], int, str]] = [
        (["sessions", "resume", made.ada, "--user", "bob", *agent], 1, f"no session {made.ada}"),
        (["sessions", "retry", "nope", "--user", "ada", *agent], 1, "no session nope (user ada)"),
        (["sessions", "cancel", made.ada], 1, f"no session {made.ada} (no user)"),
        (["sessions", "erase", "nope", "--yes"], 1, "no session nope (no user)"),
        (["sessions", "retry", *ada, *agent], 1, "is not stuck (it is finished)"),
        (["sessions", "cancel", *ada], 1, "no run in flight to cancel: it is finished"),
        (["sessions", "resume", *ada, "--agent", "nocolon"], 2, "is not module:factory"),
        (["sessions", "resume", *ada, "--agent", f"{LIFECYCLE}:nope"], 2, "no attribute 'nope'"),
        (
            ["sessions", "resume", *ada, "--agent", f"{LIFECYCLE}:others"],
            1,
            "belongs to agent 'agent', which tests.support.lifecycle:others does not give "
            "(it gives billing, support)",
        ),
        (["sessions", "resume", *ada, *agent, "--prompt", " "], 2, "a prompt needs some text"),
        (["sessions", "resume", *ada], 2, "--agent"),
        (["sessions", "cancel", *ada, "--kafka"], 2, "--kafka goes with"),
        (["sessions", "cancel", *ada, "--reason", "x" * 2001], 2, "reason is a string of <= 2000"),
        (["sessions", "erase", "a b", "--yes"], 2, "invalid session id"),
    ]
    before = cli("sessions", "ls", "--db", str(db), "--all-users").out
    for argv, code, message in cases:
        ran = cli(*argv, "--db", str(db))
        assert (ran.code, ran.out) == (code, ""), (argv, ran)
        assert message in ran.err, (argv, ran.err)
        # one line of ours, or argparse's usage and its line
        assert len(ran.err.splitlines()) == 1 or ran.err.startswith("usage: "), ran.err
    assert cli("sessions", "ls", "--db", str(db), "--all-users").out == before  # nothing made


# --- PostgreSQL --------------------------------------------------------------------------


def _on_postgres(read: Callable[[Runtime], object]) -> object:
    async def go() -> object:
        async with PostgresRuntime() as runtime:  # the LOOMFLOW_* settings, as the CLI's
            result = read(runtime)
            return await result if asyncio.iscoroutine(result) else result

    return asyncio.run(go())


@pytest.mark.postgres
def test_on_postgresql_with_the_settings_alone(cli: Cli, schema: str) -> None:
    made = _on_postgres(_make_sessions)
    assert isinstance(made, Sessions)
    ran = cli("sessions", "ls", "--user", "ada")
    assert ran.code == 0, ran.err
    assert SESSION_ID.findall(ran.out) == [made.fork, made.ada, made.ada]
    ran = cli("checkpoints", "ls", made.ada, "--user", "ada")
    assert re.findall(r"ckpt[0-9a-z]{26}", ran.out) == [c.checkpoint_id for c in made.checkpoints]
    ran = cli("sessions", "show", made.fork, "--user", "ada")
    (lineage,) = _lines_with(ran.out, "forked from", " at checkpoint ")
    assert made.ada in lineage and made.checkpoints[-1].checkpoint_id in lineage
    assert _lines_with(ran.out, "→ population(city='Oslo')")
    theirs = cli("sessions", "show", made.ada, "--user", "bob")
    assert theirs.code == 1 and f"no session {made.ada} (user bob)" in theirs.err

    older = made.checkpoints[-1]
    ran = cli("sessions", "fork", made.ada, "--from", older.checkpoint_id, "--user", "ada")
    assert ran.code == 0, ran.err
    forked = ran.out.strip()
    assert SESSION_ID.fullmatch(forked)
    model = ScriptedModel(lambda messages: "Bergen: 291000.")

    async def resume(runtime: Runtime) -> int:
        result = await _agent(runtime, model).resume(
            "And Bergen?", session_id=forked, user_id="ada"
        )
        assert result.output == "Bergen: 291000." and result.parent_session_id == made.ada
        return result.restored_turns

    assert _on_postgres(resume) == older.turn
    assert len(model.calls[0]) == older.message_count + 1  # the checkpoint's transcript + prompt

    ran = cli("prune", "--user", "bob", "--before", "0s", "--yes")
    assert ran.code == 0 and "deleted 1 session, 1 checkpoint" in ran.out, ran.err
    everyone = cli("sessions", "ls", "--all-users")
    assert made.bob not in everyone.out and made.anon in everyone.out and forked in everyone.out


@pytest.mark.postgres
def test_on_postgresql_with_dsn_and_schema_options(
    cli: Cli, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _on_postgres(_make_sessions)
    assert isinstance(made, Sessions)
    dsn = postgres_dsn()
    monkeypatch.delenv("LOOMFLOW_SCHEMA")
    monkeypatch.delenv("LOOMFLOW_POSTGRES_DSN")
    ran = cli("sessions", "ls", "--all-users", "--dsn", dsn, "--schema", schema)
    assert ran.code == 0, ran.err
    assert set(SESSION_ID.findall(ran.out)) == {made.ada, made.fork, made.bob, made.anon}
    ran = cli("sessions", "ls", "--user", "ada", "--dsn", dsn, "--schema", "lf_none")
    assert ran.code == 1 and "no loomflow schema 'lf_none'" in ran.err
    # and what makes one, for a schema named right that nothing has written yet
    assert "`loomflow processor` creates a Kafka log's read model" in ran.err, ran.err
    assert "a PostgresRuntime its schema on first use, and `loomflow setup`" in ran.err

    async def exists(name: str) -> bool:
        conn = await asyncpg.connect(dsn)
        try:
            return bool(await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", name))
        finally:
            await conn.close()

    assert not asyncio.run(exists("lf_none"))  # reading never creates a schema


@pytest.mark.postgres
def test_the_lifecycle_verbs_on_postgresql_with_the_settings_alone(cli: Cli, schema: str) -> None:
    async def wait(runtime: Runtime) -> str:
        result = await lifecycle.payer(runtime).run("Pay invoice 7.", session_id="inv-7")
        return result.stop_reason

    assert _on_postgres(wait) == "waiting"
    ran = cli("sessions", "cancel", "inv-7", "--reason", "paid by hand")
    assert ran.code == 0 and ran.out.startswith("cancelled run run"), ran.err
    (line,) = _lines_with(cli("sessions", "ls").out, "inv-7")
    assert "cancelled" in line.split()
    ran = cli("sessions", "resume", "inv-7", "--agent", f"{LIFECYCLE}:payer", "--prompt", "Paid.")
    assert ran.code == 0 and ran.out.splitlines()[-1] == "Paid.", ran.err
    ran = cli("sessions", "retry", "inv-7", "--agent", f"{LIFECYCLE}:payer")
    assert ran.code == 1 and "is not stuck (it is finished)" in ran.err
    ran = cli("sessions", "cancel", "inv-7")
    assert ran.code == 1 and "it is finished" in ran.err
    ran = cli("sessions", "erase", "inv-7", "--yes")
    assert ran.code == 0 and "erased session inv-7 (no user)" in ran.out, ran.err
    row = _on_postgres(lambda runtime: runtime.session(Scope("inv-7")))
    assert isinstance(row, SessionRecord) and row.status == "erased"


@pytest.mark.postgres
def test_writes_into_a_read_model_that_kafka_feeds_need_kafka(cli: Cli, schema: str) -> None:
    made = _on_postgres(_make_sessions)
    assert isinstance(made, Sessions)

    async def fed_by_kafka() -> None:  # as `loomflow processor` records what it consumed
        conn = await asyncpg.connect(postgres_dsn())
        try:
            await conn.execute(
                f'INSERT INTO "{schema}".positions VALUES '
                "('loomflow-processor-projector', 'loomflow.events', 0, 42)"
            )
        finally:
            await conn.close()

    asyncio.run(fed_by_kafka())
    older = made.checkpoints[-1].checkpoint_id
    agent = ["--agent", f"{LIFECYCLE}:researcher"]
    for argv in (
        ["sessions", "fork", made.ada, "--from", older, "--user", "ada"],
        ["prune", "--before", "0s", "--all-users", "--yes"],
        ["sessions", "cancel", made.ada, "--user", "ada"],
        ["sessions", "erase", made.ada, "--user", "ada", "--yes"],
        ["sessions", "resume", made.ada, "--user", "ada", *agent, "--prompt", "And Bergen?"],
        ["sessions", "retry", made.ada, "--user", "ada", *agent],
    ):
        ran = cli(*argv)
        assert ran.code == 2 and "pass --kafka" in ran.err, ran
        assert "loomflow-processor-projector" in ran.err
    ran = cli("sessions", "ls", "--all-users")  # reading it is fine, and nothing was written
    assert ran.code == 0 and len(SESSION_ID.findall(ran.out)) == 5
    rows = _on_postgres(lambda runtime: _store(runtime).list_sessions(user_id=ANY_USER))
    assert isinstance(rows, list) and len(rows) == 4


def test_a_write_through_kafka_with_kafka_down_is_one_clear_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    env["LOOMFLOW_KAFKA_BOOTSTRAP"] = "127.0.0.1:1"  # nothing listens there
    prune = ["prune", "--before", "30d", "--all-users", "--yes", "--kafka"]
    done = subprocess.run(
        [sys.executable, "-m", "loomflow.cli", *prune],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    # where it went (no --db), then the one error: not aiokafka's "Unable connect to ..."
    note, line = done.stderr.splitlines()
    assert note.startswith("loomflow: appending through the Kafka log at 127.0.0.1:1 "), note
    assert line.startswith("loomflow prune: Kafka at 127.0.0.1:1 is not reachable"), line


# --- Kafka --------------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.postgres
async def test_fork_and_prune_with_kafka_go_through_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from loomflow.runtime import KafkaRuntime
    from tests.support.backends import BACKENDS

    backend = BACKENDS["kafka"](tmp_path)  # its own topics and schema, a projector task here
    await backend.open()
    try:
        runtime = backend.runtime()
        assert isinstance(runtime, KafkaRuntime)
        settings = runtime.settings
        for name, value in {
            "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "POSTGRES_DSN": settings.postgres_dsn,
            "SCHEMA": settings.db_schema,
            "TOPIC_PREFIX": settings.topic_prefix,
            "PROCESSOR_ID": settings.processor_id,
        }.items():
            monkeypatch.setenv(f"LOOMFLOW_{name}", value)
        async with runtime:
            made = await _make_sessions(runtime)

        async def cli(*argv: str) -> Ran:  # in a thread: the projector runs on this loop
            code = await asyncio.to_thread(main, list(argv))
            out, err = capsys.readouterr()
            return Ran(code, out, err)

        older = made.checkpoints[-1]
        fork = ["sessions", "fork", made.ada, "--from", older.checkpoint_id, "--user", "ada"]
        ran = await cli(*fork)
        assert ran.code == 2 and "pass --kafka" in ran.err  # the projector's read model
        ran = await cli(*fork, "--kafka", "--as", "ada-k")
        assert (ran.code, ran.out) == (0, "ada-k\n"), ran.err
        model = ScriptedModel(lambda messages: "Bergen: 291000.")
        scope = Scope("ada-k", "ada")
        async with backend.runtime() as again:
            assert isinstance(again, KafkaRuntime)
            in_the_log = await again.store.unprojected(scope, 0, 0)  # read from offset 0
            assert [e.type for e in in_the_log] == ["session.forked"]
            result = await _agent(again, model).resume(
                "And Bergen?", session_id="ada-k", user_id="ada"
            )
        assert result.restored_turns == older.turn and result.parent_session_id == made.ada
        assert len(model.calls[0]) == older.message_count + 1

        ran = await cli("sessions", "ls", "--user", "ada")
        assert "ada-k" in ran.out
        prune = ["prune", "--user", "ada", "--session", "ada-k", "--before", "0s", "--yes"]
        ran = await cli(*prune, "--kafka")
        assert ran.code == 0 and "deleted 1 session" in ran.out, ran.err
        ran = await cli("sessions", "ls", "--user", "ada")
        assert "ada-k" not in ran.out and made.ada in ran.out
    finally:
        await backend.close()


def test_ctrl_c_in_a_resume_is_one_line_and_leaves_the_run_as_a_crash_would(
    tmp_path: Path,
) -> None:
    """Ctrl-C while `loomflow sessions resume` runs a tool: exit 130 and one line saying
    what became of the run, not a traceback (a new user's trial got ~60 lines); the run
    is left running, for a resume or a worker to take over, as after a crash."""
    import signal

    db, started = tmp_path / "journal.db", tmp_path / "started"

    async def begin() -> None:  # a session whose first run finished
        async with SqliteRuntime(db) as runtime:
            await Agent("Hi.", model=ScriptedModel(["Hello."]), runtime=runtime).run(
                "Hi.", session_id="s1"
            )

    asyncio.run(begin())
    env = {**os.environ, "LOOMFLOW_TEST_STARTED": str(started), "PYTHONPATH": str(ROOT)}
    command = [str(Path(sys.executable).parent / "loomflow"), "sessions", "resume", "s1"]
    command += ["--db", str(db), "--agent", f"{LIFECYCLE}:hanging", "--prompt", "Look x up."]
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as process:
        try:
            asyncio.run(eventually(started.exists, within=60, what="the tool to start"))
        finally:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "loomflow sessions: interrupted: the run is left as a crash leaves it; "
        "`loomflow sessions resume` again goes on from there"
    )
    assert "Traceback" not in err
    row = _row(db, "s1", None)
    assert row is not None and row.status == "running"


def test_what_a_pipe_reads_has_no_spaces_at_the_ends_of_lines(cli: Cli, tmp_path: Path) -> None:
    """rich pads a table's cells to its columns' width; a program or a file reading the
    output gets lines without those spaces at their ends (`| cat -A` showed them)."""
    db = tmp_path / "journal.db"

    async def wait() -> None:
        async with SqliteRuntime(db) as runtime:
            await lifecycle.payer(runtime).run("Pay invoice 7.", session_id="inv-7")

    asyncio.run(wait())
    for argv in (["sessions", "show", "inv-7"], ["sessions", "ls"]):
        ran = cli(*argv, "--db", str(db))
        assert ran.code == 0 and ran.out.count("\n") > 1, ran
        assert [line for line in ran.out.splitlines() if line != line.rstrip(" ")] == [], argv
    assert "waiting" in cli("sessions", "show", "inv-7", "--db", str(db)).out
