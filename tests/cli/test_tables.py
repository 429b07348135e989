"""Every table of the command line at 80 and at 120 columns: no column dropped, every
header whole, every row on one line, no line wider than the terminal; ``--wide`` and a
pipe keep everything whole."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from loomflow.cli.render import Column, Fitted, age, compact_time, middle
from tests.support.cli import Cli, Zoo, make_zoo

ROOT = Path(__file__).resolve().parents[2]
RULE = re.compile(r"─+")
SESSIONS = ["session", "user", "status", "turns", "active", "tokens", "cost"]
CHECKPOINTS = ["checkpoint", "turn", "messages", "created", "tokens", "cost"]
STATS = [
    "runs",
    "finished",
    "failed",
    "turns",
    "tool calls",
    "input",
    "cached",
    "cache write",
    "output",
    "cost $",
    "p50 ms",
    "p95 ms",
]


@dataclass
class Drawn:
    """A table as printed: its headers, its rows' lines and its footer's line."""

    headers: list[str]
    rows: list[str]
    footer: str | None


def tables(text: str) -> list[Drawn]:
    """The tables of a command's output: each is a header line, a rule, its rows up to
    a blank line, and maybe a footer (``total``) after it."""
    lines = text.splitlines()
    found = []
    for at, line in enumerate(lines):
        if not RULE.fullmatch(line.strip()) or at == 0:
            continue
        headers = re.split(r"\s{2,}", lines[at - 1].strip())
        rows, end = [], at + 1
        while end < len(lines) and lines[end].strip():
            rows.append(lines[end])
            end += 1
        footer = None
        if end + 1 < len(lines) and lines[end + 1].startswith("total"):
            footer = lines[end + 1]
        found.append(Drawn(headers, rows, footer))
    return found


def check(text: str, width: int, headers: list[list[str]], rows: list[int]) -> list[Drawn]:
    """That ``text`` holds tables of these ``headers`` (each table possibly folded into
    several, each repeating its first column), with ``rows`` rows each, every header
    whole and every row on one line, and that no line is wider than ``width``."""
    for line in text.splitlines():
        assert cell_len(line.rstrip()) <= width, (width, line)
    drawn = tables(text)
    at = 0
    for names, count in zip(headers, rows, strict=True):
        seen: list[str] = []
        while at < len(drawn) and drawn[at].headers[0] == names[0] and set(seen) != set(names):
            part = drawn[at]
            assert part.headers[0] == names[0] and "…" not in " ".join(part.headers), part
            seen += part.headers[1:] if seen else part.headers
            # one line a row: each starts with its key, none is a cell wrapped over
            assert len(part.rows) == count, (names, part.rows)
            assert all(not row[0].isspace() for row in part.rows), part.rows
            at += 1
        assert seen == names, (width, names, seen)
    assert at == len(drawn), drawn[at:]
    return drawn


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zoo]:
    yield make_zoo(tmp_path_factory.mktemp("zoo") / "journal.db")


@pytest.fixture(params=[80, 120])
def width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("COLUMNS", str(request.param))
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    value: int = request.param
    return value


def test_sessions_ls_fits_with_every_column(cli: Cli, zoo: Zoo, width: int) -> None:
    ran = cli("sessions", "ls", "--all-users", "--db", str(zoo.db))
    assert ran.code == 0, ran.err
    (drawn, *_) = check(ran.out, width, [[*SESSIONS, "forked from"]], [10])
    ids = [session for session, _ in zoo.sessions.values()] + [zoo.billing]
    assert {row.split()[0] for row in drawn.rows} <= {*ids, *(middle(i, 13) for i in ids)}
    assert "UTC" not in ran.out and "ago" in ran.out  # how long ago, not a timestamp
    stuck = cli("sessions", "ls", "--all-users", "--stuck", "--db", str(zoo.db))
    check(stuck.out.split("\noslo-stuck: ")[0], width, [SESSIONS], [1])


def test_a_table_is_cut_before_it_is_folded(cli: Cli, zoo: Zoo, width: int) -> None:
    # ada's rows fit in one table: at 120 with the ids whole, at 80 with them cut
    ran = cli("sessions", "ls", "--user", "ada", "--db", str(zoo.db))
    assert len(check(ran.out, width, [[*SESSIONS, "forked from"]], [4])) == 1
    finished, _ = zoo.sessions["finished"]
    assert (finished in ran.out, middle(finished, 13) in ran.out) == (width > 80, width == 80)
    assert "ago" in ran.out and "UTC" not in ran.out
    # and a checkpoint's time is compact before its id is cut
    listed = cli("checkpoints", "ls", finished, "--user", "ada", "--db", str(zoo.db))
    check(listed.out, width, [CHECKPOINTS], [2])
    assert len(re.findall(r"ckpt[0-9a-z]{26}", listed.out)) == 2


def test_sessions_show_and_checkpoints_ls_fit(cli: Cli, zoo: Zoo, width: int) -> None:
    session, user = zoo.sessions["finished"]
    assert user is not None
    shown = cli("sessions", "show", session, "--user", user, "--db", str(zoo.db))
    assert shown.code == 0, shown.err
    check(shown.out, width, [CHECKPOINTS, [*SESSIONS, "from checkpoint"]], [2, 1])
    assert f"{session} (user ada)" in shown.out  # the head names it whole
    listed = cli("checkpoints", "ls", session, "--user", user, "--db", str(zoo.db))
    assert listed.code == 0, listed.err
    check(listed.out, width, [CHECKPOINTS], [2])
    assert "UTC" not in listed.out if width == 80 else "UTC" in listed.out


@pytest.mark.parametrize("by", ["model", "user", "hour"])
def test_stats_fits_folded_when_it_must(cli: Cli, zoo: Zoo, width: int, by: str) -> None:
    ran = cli("stats", "--db", str(zoo.db), "--by", by)
    assert ran.code == 0, ran.err
    # a model, and (unknown): runs that called none; the hours are those the zoo's runs
    # took (two when it was built across the turn of an hour), as the JSON gives them
    hours = cli("stats", "--db", str(zoo.db), "--by", "hour", "--json")
    rows = {"model": 2, "user": 4, "hour": len(json.loads(hours.out)["rows"])}[by]
    drawn = check(ran.out, width, [[by, *STATS], ["tool", "tool calls"]], [rows, 2])
    stats = [part for part in drawn if part.headers[0] == by]
    assert all(part.footer and part.footer.startswith("total") for part in stats)
    assert len(stats) == (2 if width == 80 else 1)  # folded in two at 80 columns


def test_audit_verify_fits(cli: Cli, zoo: Zoo, width: int) -> None:
    assert cli("audit", "--db", str(zoo.db)).code == 0
    ran = cli("audit", "verify", "--db", str(zoo.db))
    assert ran.code == 0, ran.err
    check(ran.out, width, [["session", "user", "entries", "erased / pruned", "status"]], [10])
    assert "verified 10 sessions" in ran.out


def test_keys_list_fits_with_its_ids_whole(cli: Cli, width: int, tmp_path: Path) -> None:
    keyring = str(tmp_path / "keyring.json")
    ids = [
        cli(
            "keys", "new", str(tmp_path / f"{n}.pem"), "--keyring", keyring, "--role", role
        ).out.strip()
        for n, role in enumerate(["events", "events", "digests"])
    ]
    assert cli("keys", "retire", ids[0], "--keyring", keyring).code == 0
    ran = cli("keys", "list", "--keyring", keyring)
    assert ran.code == 0, ran.err
    check(ran.out, width, [["key id", "roles", "added", "retired"]], [3])
    assert all(key_id in ran.out for key_id in ids)  # whole, as `keys retire` takes them
    assert (" UTC" in ran.out) == (width >= 120)  # compact times at 80 columns


def test_tail_lines_fit(cli: Cli, zoo: Zoo, width: int) -> None:
    ran = cli("tail", "--no-follow", "--db", str(zoo.db))
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert len(lines) > 40 and all(len(line) <= width for line in lines)
    assert all(re.match(r"\d\d:\d\d:\d\d\.\d{3}  \S+  \S+  #\d+  [a-z.]+", line) for line in lines)
    finished, _ = zoo.sessions["finished"]
    assert (middle(finished, 13) if width < 120 else finished) in ran.out


def test_wide_and_a_pipe_print_every_row_whole(
    cli: Cli, zoo: Zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    finished, _ = zoo.sessions["finished"]
    for argv in (["sessions", "ls", "--all-users"], ["tail", "--no-follow"], ["stats"]):
        ran = cli(*argv, "--wide", "--db", str(zoo.db))
        assert ran.code == 0, ran.err
        assert max(len(line) for line in ran.out.splitlines()) > 80, ran.out
        assert middle(finished, 13) not in ran.out and middle(zoo.long_user, 12) not in ran.out
    ran = cli("sessions", "ls", "--all-users", "--wide", "--db", str(zoo.db))
    (line,) = [line for line in ran.out.splitlines() if line.startswith(finished)]
    assert " UTC " in line and len(tables(ran.out)) == 1
    # piped, no COLUMNS: whole too, as the README's commands show them
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    argv = ["checkpoints", "ls", finished, "--user", "ada", "--db", str(zoo.db)]
    done = subprocess.run(
        [sys.executable, "-m", "loomflow.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"ckpt[0-9a-z]{26} .* \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC ", done.stdout)


# --- the parts ---------------------------------------------------------------------------


def _drawn(table: Fitted, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


def test_a_table_too_wide_for_its_cells_is_folded_repeating_its_first_column() -> None:
    columns = [Column("key", cut=6), *(Column(f"column {n}", numeric=True) for n in range(8))]
    table = Fitted(columns, [["a-long-key", *map(str, range(8))], ["b", *"abcdefgh"]])
    whole = _drawn(table, 200)
    assert len(tables(whole)) == 1 and "a-long-key" in whole
    for width in (40, 60):
        text = _drawn(table, width)
        drawn = check(text, width, [[c.name for c in columns]], [2])
        assert len(drawn) > 1 and all(part.rows[0].startswith("a-lo…y ") for part in drawn)


def test_times_are_compact_and_ids_are_cut_in_the_middle() -> None:
    now = datetime(2026, 12, 3, 9, 14, 5, 123456, tzinfo=UTC)
    assert compact_time(now) == "12-03 09:14:05"
    assert [age(now - timedelta(seconds=s), now) for s in (0, 59, 61, 7200, 86400 * 3)] == [
        "0s ago",
        "59s ago",
        "1m ago",
        "2h ago",
        "3d ago",
    ]
    assert age(now + timedelta(seconds=5), now) == "0s ago"  # a clock ahead: not negative
    assert middle("sess01jxz2k9m0a3b7c8d9e0f14k2p", 13) == "sess01jx…4k2p"
    assert middle("short", 13) == "short"
