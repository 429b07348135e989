"""What scripts read: ``--json`` of every list and show (the fields the README documents),
the filters of ``sessions ls``, ``tail --no-follow`` and ``| head``, and the one-line
errors and exit codes of bad input."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loomflow.control.status import STATUSES
from loomflow.log.describe import event_types
from tests.support.cli import Cli, Zoo, make_zoo, populate
from tests.support.readme import README

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zoo]:
    yield make_zoo(tmp_path_factory.mktemp("zoo") / "journal.db")


def documented(command: str) -> list[str]:
    """The fields the README lists for ``command --json``, in order."""
    (line,) = [line for line in README.split("\n- ") if line.startswith(f"`{command} --json`")] or [
        ""
    ]
    listed = re.split(r"\.\s", line.partition("fields: ")[2], maxsplit=1)[0]
    assert listed, f"the README lists no fields for {command} --json"
    # the names, not what the parentheses say of them
    return re.findall(r"`(\w+)`", re.sub(r"\([^()]*\)", "", listed))


def lines(text: str) -> list[dict[str, Any]]:
    """Each line of ``text`` as a JSON object (and it must be one)."""
    objects = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(o, dict) for o in objects)
    return objects


def _utc(text: str) -> datetime:
    assert text.endswith("Z"), text  # ISO 8601, in UTC
    return datetime.fromisoformat(text)


def _ls(cli: Cli, zoo: Zoo, *options: str) -> list[dict[str, Any]]:
    ran = cli("sessions", "ls", "--all-users", "--json", "--db", str(zoo.db), *options)
    assert ran.code == 0 and not ran.err, ran
    return lines(ran.out)


def test_sessions_ls_json_is_a_line_per_session_with_the_readme_fields(cli: Cli, zoo: Zoo) -> None:
    listed = _ls(cli, zoo)
    fields = documented("sessions ls")
    assert len(listed) == 10 and all(list(row) == fields for row in listed)
    by_id = {row["session_id"]: row for row in listed}
    for name, (session, user) in zoo.sessions.items():
        assert (by_id[session]["status"], by_id[session]["user_id"]) == (name, user)
    assert by_id[zoo.billing]["agent"] == "billing"
    times = [_utc(row["updated_at"]) for row in listed]
    assert times == sorted(times, reverse=True)  # the most recently active first
    finished = by_id[zoo.sessions["finished"][0]]
    assert finished["usage"]["output_tokens"] > 0 and finished["turns"] == 3
    assert by_id["inv-7"]["waiting"]["signal"] == "approve"
    assert "ModelError" in by_id["oslo-stuck"]["last_error"]
    fork = by_id[zoo.sessions["forked"][0]]
    assert fork["parent_session_id"] == finished["session_id"]


def test_status_filters_each_status_a_person_reads(cli: Cli, zoo: Zoo) -> None:
    for name in STATUSES:
        ids = {row["session_id"] for row in _ls(cli, zoo, "--status", name)}
        expected = {zoo.sessions[name][0]} | ({zoo.billing} if name == "finished" else set())
        assert ids == expected, name
    both = [row["session_id"] for row in _ls(cli, zoo, "--status", "stuck,failed")]
    assert sorted(both) == ["oslo-failed", "oslo-stuck"]
    twice = _ls(cli, zoo, "--status", "running", "--status", "abandoned")
    assert sorted(row["session_id"] for row in twice) == ["gone", "live"]
    assert _ls(cli, zoo, "--stuck") == _ls(cli, zoo, "--status", "stuck")


def test_limit_counts_the_rows_that_passed_the_filters(cli: Cli, zoo: Zoo) -> None:
    # the abandoned session is the least recently active: the store's first rows are all
    # running or else, and the command reads on until one passes
    (gone,) = _ls(cli, zoo, "--status", "abandoned", "--limit", "1")
    assert gone["session_id"] == "gone"
    ran = cli(
        "sessions",
        "ls",
        "--all-users",
        "--json",
        "--status",
        "finished",
        "--limit",
        "1",
        "--db",
        str(zoo.db),
    )
    assert len(lines(ran.out)) == 1 and "--limit N for more" in ran.err
    ran = cli(
        "sessions",
        "ls",
        "--all-users",
        "--status",
        "running,abandoned",
        "--limit",
        "1",
        "--db",
        str(zoo.db),
    )
    assert re.findall(r"\b(live|gone)\b", ran.out) == ["live"] and "--limit N for more" in ran.out


def test_since_agent_and_user_filter_in_the_query(cli: Cli, zoo: Zoo) -> None:
    everyone = {row["session_id"] for row in _ls(cli, zoo)}
    recent = {row["session_id"] for row in _ls(cli, zoo, "--since", "1m")}
    assert recent == everyone - {"gone"}  # silent for five minutes
    assert {row["session_id"] for row in _ls(cli, zoo, "--since", "10m")} == everyone
    live = next(row for row in _ls(cli, zoo) if row["session_id"] == "live")
    at = _utc(live["updated_at"])
    newer = {row["session_id"] for row in _ls(cli, zoo, "--since", at.isoformat())}
    assert "live" in newer and "gone" not in newer
    after = (at + timedelta(microseconds=1)).isoformat()
    assert "live" not in {row["session_id"] for row in _ls(cli, zoo, "--since", after)}
    assert [row["session_id"] for row in _ls(cli, zoo, "--agent", "billing")] == [zoo.billing]
    mine = _ls(cli, zoo, "--agent", "agent", "--status", "stuck")
    assert [row["session_id"] for row in mine] == ["oslo-stuck"]
    ran = cli("sessions", "ls", "--db", str(zoo.db), "--user", "bob", "--agent", "billing")
    assert (ran.code, ran.out) == (0, "no sessions of user bob of agent 'billing'\n")
    ran = cli("sessions", "ls", "--db", str(zoo.db), "--user", "ada", "--json", "--agent", "x")
    assert (ran.code, ran.out) == (0, "")


def test_show_json_is_one_object_with_transcript_checkpoints_and_forks(cli: Cli, zoo: Zoo) -> None:
    session, user = zoo.sessions["finished"]
    assert user is not None
    ran = cli("sessions", "show", session, "--user", user, "--json", "--db", str(zoo.db))
    assert ran.code == 0, ran.err
    (shown,) = lines(ran.out)
    assert list(shown) == documented("sessions show")
    assert list(shown)[: len(documented("sessions ls"))] == documented("sessions ls")
    assert [m["role"] for m in shown["transcript"]][:3] == ["system", "user", "assistant"]
    assert shown["transcript"][-1]["content"] == "Bergen is smaller."
    turns = [c["turn"] for c in shown["checkpoints"]]
    assert turns == sorted(turns, reverse=True) and len(turns) == 2  # newest first
    assert all(list(c) == documented("checkpoints ls") for c in shown["checkpoints"])
    assert [f["session_id"] for f in shown["forks"]] == [zoo.sessions["forked"][0]]
    listed = cli("checkpoints", "ls", session, "--user", user, "--json", "--db", str(zoo.db))
    assert lines(listed.out) == shown["checkpoints"]
    newest = _utc(shown["checkpoints"][0]["created_at"]).isoformat()
    since = cli(
        *f"checkpoints ls {session} --user {user} --json --since".split(),
        newest,
        "--db",
        str(zoo.db),
    )
    assert lines(since.out) == shown["checkpoints"][:1]


def test_audit_verify_json(cli: Cli, zoo: Zoo) -> None:
    assert cli("audit", "--db", str(zoo.db)).code == 0
    ran = cli("audit", "verify", "--json", "--db", str(zoo.db))
    assert ran.code == 0, ran.err
    (verified,) = lines(ran.out)
    assert list(verified) == documented("audit verify") and verified["ok"] is True
    assert len(verified["sessions"]) == 10 and verified["problems"] == 0
    ran = cli("audit", "verify", "--json", "--session", "nope", "--db", str(zoo.db))
    assert ran.code == 1 and lines(ran.out)[0]["ok"] is False
    assert ran.err == "loomflow audit verify: no audited sessions matching session_id='nope'\n"


def test_stats_json_has_the_readme_fields(cli: Cli, zoo: Zoo) -> None:
    ran = cli("stats", "--json", "--db", str(zoo.db))
    assert ran.code == 0, ran.err
    assert list(json.loads(ran.out)) == documented("stats")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    return dict(env, NO_COLOR="1")


def _loomflow(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "loomflow"), *argv],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _head(lines: int, *argv: str) -> tuple[str, int, str]:
    """``loomflow ARGV | head -LINES``: what head printed, tail's exit code and stderr."""
    tail = subprocess.Popen(
        [str(BIN / "loomflow"), *argv],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert tail.stdout is not None and tail.stderr is not None
    head = subprocess.Popen(["head", f"-{lines}"], stdin=tail.stdout, stdout=subprocess.PIPE)
    tail.stdout.close()  # head's alone now: when it exits, the pipe has no reader
    try:
        out, _ = head.communicate(timeout=60)
        code = tail.wait(timeout=60)
    finally:
        tail.kill()
        head.kill()
    return out.decode(), code, tail.stderr.read()


def test_tail_no_follow_prints_the_log_and_exits(zoo: Zoo) -> None:
    done = _loomflow("tail", "--db", str(zoo.db), "--no-follow", "--json")
    assert done.returncode == 0, done.stderr
    events = lines(done.stdout)
    positions = [int(e["position"]) for e in events]
    assert len(events) > 40 and sorted(positions) == list(range(1, len(events) + 1))
    assert all(list(e) == documented("tail") and e["at"].endswith("Z") for e in events)
    done = _loomflow("tail", "--db", str(zoo.db), "--no-follow", "--session", "inv-7")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 5, done
    assert all("  inv-7  -  #" in line for line in done.stdout.splitlines())
    done = _loomflow("tail", "--db", str(zoo.db), "--no-follow", "--type", "run.*", "--json")
    assert {e["type"] for e in lines(done.stdout)} == {
        "run.started",
        "run.finished",
        "run.failed",
        "run.waiting",
        "run.cancelled",
    }


def test_tail_ends_when_head_has_its_lines(zoo: Zoo) -> None:
    tail = ["tail", "--db", str(zoo.db), "--from-beginning"]
    out, code, err = _head(2, *tail)
    assert (len(out.splitlines()), code) == (2, 0), (out, err)
    assert "Traceback" not in err and "Broken pipe" not in err, err
    # nothing more to print after head's line: it still ends, as tail -f does
    out, code, err = _head(1, *tail, "--session", "live")
    assert (len(out.splitlines()), code) == (1, 0) and "Traceback" not in err, (out, err)


def test_bad_input_is_one_line_and_a_documented_exit_code(cli: Cli, zoo: Zoo) -> None:
    db = ["--db", str(zoo.db)]
    session, _ = zoo.sessions["finished"]
    cases: list[tuple[list[str], int, str]] = [
        (["sessions", "ls", "--status", "done"], 2, "unknown status 'done': the statuses are "),
        (["sessions", "ls", "--status", "stuck,"], 2, "unknown status ''"),
        (["sessions", "ls", "--stuck", "--status", "stuck"], 2, "not allowed with"),
        (["sessions", "ls", "--since", "last week"], 2, "is neither an ISO date"),
        (["checkpoints", "ls", session, "--since", "1x"], 2, "is neither an ISO date"),
        (["sessions", "show", session, "--user", "bob", "--json"], 1, f"no session {session}"),
        (["checkpoints", "ls", session, "--json"], 1, f"no session {session} (no user)"),
        (["tail", "--no-follow", "--type", "bogus.type"], 2, "unknown event type 'bogus.type'"),
        (["tail", "--no-follow", "--type", "bogus.*"], 2, "unknown event type 'bogus.*'"),
        (["tail", "--no-follow", "--session", "../x"], 2, "invalid session id '../x'"),
        (["tail", "--no-follow", "--user", "a b"], 2, "invalid user id 'a b'"),
        (["tail", "--no-follow", "--from-beginning"], 2, "not allowed with"),
        (["tail", "--no-follow", "--session", "nope"], 1, "no events of session nope in"),
        (["tail", "--no-follow", "--session", "inv-7", "--user", "bob"], 1, "of user bob in"),
        (["audit", "verify", "--session", "a/b"], 2, "invalid session id 'a/b'"),
    ]
    for argv, code, message in cases:
        ran = cli(*argv, *db)
        assert (ran.code, ran.out) == (code, ""), (argv, ran)
        # one line of ours, or argparse's usage and its one line
        error = ran.err.splitlines()
        assert message in error[-1], (argv, ran.err)
        assert len(error) == 1 or (code == 2 and ran.err.startswith("usage: ")), ran.err
    # a payload that is not JSON is a bad argument as the README has them: argparse's usage
    # lines, then what is wrong (checked before the store is opened, so nothing is sent)
    ran = cli("signal", "inv-7", "approve", "--json", "yes", *db)
    assert (ran.code, ran.out) == (2, "") and ran.err.startswith("usage: loomflow signal "), ran
    assert "argument --json: the payload is not JSON: " in ran.err.splitlines()[-1], ran.err
    said = cli("tail", "--type", "bogus.type", *db).err.splitlines()[-1]
    assert all(kind in said for kind in event_types()) and "run.*" in said


@pytest.mark.postgres
def test_the_filters_on_postgresql(cli: Cli, schema: str) -> None:
    from loomflow.runtime import PostgresRuntime

    async def make() -> tuple[dict[str, tuple[str, str | None]], str]:
        async with PostgresRuntime() as runtime:  # the LOOMFLOW_* settings, as the CLI's
            return await populate(runtime)

    sessions, billing = asyncio.run(make())

    def ls(*options: str) -> list[str]:
        ran = cli("sessions", "ls", "--all-users", "--json", *options)
        assert ran.code == 0, ran.err
        return [row["session_id"] for row in lines(ran.out)]

    for name, (session, _) in sessions.items():
        assert set(ls("--status", name)) == {session} | ({billing} if name == "finished" else set())
    assert ls("--agent", "billing") == [billing]
    assert "gone" not in ls("--since", "1m") and "gone" in ls("--since", "10m")
    assert ls("--status", "abandoned", "--limit", "1") == ["gone"]
    assert ls("--status", "stuck,failed", "--agent", "agent", "--since", "1h") == [
        "oslo-stuck",
        "oslo-failed",
    ]
