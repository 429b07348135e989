"""``loomflow keys``: a key made, its public half trusted here or on another machine,
rotated and retired; and every bad file a line naming it, with no secret in it."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from loomflow.schemas.events import SignalSent, SignalSentPayload
from loomflow.schemas.signing import DIGEST_DOMAIN, Keyring, Signer
from tests.cli.test_scripting import documented
from tests.support.cli import Cli, Ran
from tests.support.readme import block, commands, user_env

_SIGNING = ("SIGNING_KEY_FILE", "SIGNING_KEY", "KEYRING", "SIGNATURES")


@pytest.fixture(autouse=True)
def _no_signing_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LOOMFLOW_* signing setting from outside, and the files relative to tmp_path."""
    for name in _SIGNING:
        monkeypatch.delenv(f"LOOMFLOW_{name}", raising=False)
    monkeypatch.chdir(tmp_path)


def _event(at: datetime, seq: int = 1) -> SignalSent:
    return SignalSent(
        session_id="s1",
        run_id="run1",
        seq=seq,
        epoch=1,
        at=at,
        payload=SignalSentPayload(name="go"),
    )


def _secret(key_file: Path) -> list[str]:
    """Pieces of a key file's secret body: no output may contain any of them."""
    body = "".join(key_file.read_text().splitlines()[1:-1])
    return [body[:16], body[16:32], body[-16:]]


def _one_line(ran: Ran, command: str) -> str:
    """The error of ``ran``: one line on stderr, prefixed with the command, no traceback."""
    assert ran.err.endswith("\n") and ran.err.count("\n") == 1, ran.err
    assert ran.err.startswith(f"loomflow {command}: "), ran.err
    assert "Traceback" not in ran.err and not ran.out, ran
    return ran.err


def _new(cli: Cli, key_file: str, keyring: str = "keyring.json", *options: str) -> str:
    ran = cli("keys", "new", key_file, "--keyring", keyring, *options)
    assert ran.code == 0, ran
    return ran.out.strip()


def test_new_writes_the_private_key_to_a_file_of_its_own_and_trusts_its_public_half(
    cli: Cli, tmp_path: Path
) -> None:
    ran = cli("keys", "new", "writer.pem", "--keyring", "keyring.json")
    assert ran.code == 0, ran
    key_id = ran.out.strip()
    assert ran.out == f"{key_id}\n"  # alone on stdout, for ID=$(loomflow keys new ...)
    assert "writer.pem" in ran.err and "keep it secret" in ran.err
    key_file = tmp_path / "writer.pem"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert Signer.from_file(key_file).key_id == key_id
    (key,) = Keyring.load(tmp_path / "keyring.json").keys.values()
    assert (key.key_id, key.roles, key.retired_at) == (key_id, ("events",), None)
    assert datetime.now(UTC) - key.added_at < timedelta(minutes=1)
    assert not any(piece in ran.out + ran.err for piece in _secret(key_file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keyring.json", "writer.pem"]

    # a second key joins the same keyring, with the role asked for
    ran = cli(
        "keys", "new", "audit.pem", "--keyring", "keyring.json", "--json", "--role", "digests"
    )
    made = json.loads(ran.out)
    assert list(made) == ["key_id", "key_file", "keyring", "roles"] == documented("keys new")
    assert made["key_file"] == "audit.pem" and made["keyring"] == "keyring.json"
    assert made["roles"] == ["digests"] and not ran.err
    keys = Keyring.load(tmp_path / "keyring.json").keys
    assert set(keys) == {key_id, made["key_id"]} and keys[made["key_id"]].roles == ("digests",)


def test_new_never_overwrites_a_file_and_changes_nothing_when_it_refuses(
    cli: Cli, tmp_path: Path
) -> None:
    first = _new(cli, "writer.pem")
    before = (tmp_path / "writer.pem").read_bytes(), (tmp_path / "keyring.json").read_bytes()
    ran = cli("keys", "new", "writer.pem", "--keyring", "keyring.json")
    assert ran.code == 1
    assert "writer.pem exists: a key file is never overwritten" in _one_line(ran, "keys new")
    after = (tmp_path / "writer.pem").read_bytes(), (tmp_path / "keyring.json").read_bytes()
    assert after == before and list(Keyring.load(tmp_path / "keyring.json").keys) == [first]

    ran = cli("keys", "new", "keyring.json", "--keyring", "keyring.json")
    assert ran.code == 2 and "is the keyring" in _one_line(ran, "keys new")
    fresh = cli("keys", "new", "ring.json", "--keyring", "ring.json")
    assert fresh.code == 2 and not (tmp_path / "ring.json").exists()
    assert (tmp_path / "keyring.json").read_bytes() == before[1]


def test_new_with_a_keyring_it_cannot_write_leaves_no_key_file(cli: Cli, tmp_path: Path) -> None:
    ran = cli("keys", "new", "writer.pem", "--keyring", "nowhere/keyring.json")
    assert ran.code == 1
    assert "cannot write the keyring nowhere/keyring.json" in _one_line(ran, "keys new")
    assert list(tmp_path.iterdir()) == []  # no private key the keyring does not know


def test_the_keyring_is_the_option_else_loomflow_keyring_else_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for argv in (["new", "writer.pem"], ["add", "A" * 43], ["list"], ["retire", "ed25519:x"]):
        ran = cli("keys", *argv)
        assert ran.code == 2, (argv, ran)
        err = _one_line(ran, f"keys {argv[0]}")
        assert "--keyring FILE" in err and "LOOMFLOW_KEYRING" in err
    assert list(tmp_path.iterdir()) == []  # the key file was not written before the refusal

    monkeypatch.setenv("LOOMFLOW_KEYRING", str(tmp_path / "env.json"))
    key_id = cli("keys", "new", "writer.pem").out.strip()
    assert list(Keyring.load(tmp_path / "env.json").keys) == [key_id]
    assert key_id in cli("keys", "list").out


def test_a_key_made_elsewhere_is_trusted_from_the_line_keys_public_prints(
    cli: Cli, tmp_path: Path
) -> None:
    # the audit's machine makes its key; the line goes to the keyring of its verifiers
    key_id = _new(cli, "audit.pem", "theirs.json", "--role", "digests")
    shown = cli("keys", "public", "audit.pem")
    assert shown.code == 0 and shown.out.startswith(f"{key_id} ") and not shown.err
    assert not any(piece in shown.out for piece in _secret(tmp_path / "audit.pem"))
    (tmp_path / "audit.pub").write_text(shown.out)
    as_json = json.loads(cli("keys", "public", "audit.pem", "--json").out)
    assert as_json == {"key_id": key_id, "public": shown.out.split()[1]}

    added = cli("keys", "add", "audit.pub", "--keyring", "ours.json", "--role", "digests")
    assert added.code == 0 and added.out == f"{key_id}\n", added
    ours = Keyring.load(tmp_path / "ours.json")
    assert ours.keys[key_id].roles == ("digests",)
    signer = Signer.from_file(tmp_path / "audit.pem")
    digest = DIGEST_DOMAIN + b"{}"
    now = datetime.now(UTC)
    assert ours.problem(digest, signer.sign(digest), now, "digest", role="digests") is None

    # the key alone, as text, is the same key; --json says where it went
    alone = cli("keys", "add", as_json["public"], "--keyring", "text.json", "--json")
    assert json.loads(alone.out) == {"key_id": key_id, "keyring": "text.json", "roles": ["events"]}


def test_add_refuses_a_private_key_a_changed_line_and_a_key_it_holds(
    cli: Cli, tmp_path: Path
) -> None:
    key_id = _new(cli, "writer.pem")
    line = cli("keys", "public", "writer.pem").out
    (tmp_path / "writer.pub").write_text(line)
    other = Signer.generate().key_id
    (tmp_path / "changed.pub").write_text(line.replace(key_id, other))
    cases = [
        (["writer.pem"], "writer.pem holds a private key, which a keyring never takes"),
        (["changed.pub"], f"changed.pub names the key {other} but holds the key {key_id}"),
        (["writer.pub"], f"keyring.json holds {key_id} already; nothing changed"),
        (["missing.pub"], "no file missing.pub: give the file `loomflow keys public` wrote"),
        (["not-a-key"], "the PUBLIC argument is not an Ed25519 public key"),
    ]
    before = (tmp_path / "keyring.json").read_bytes()
    for argv, said in cases:
        ran = cli("keys", "add", *argv, "--keyring", "keyring.json")
        assert ran.code == 1, (argv, ran)
        assert said in _one_line(ran, "keys add"), argv
        assert not any(piece in ran.err for piece in _secret(tmp_path / "writer.pem"))
    assert (tmp_path / "keyring.json").read_bytes() == before


def test_retire_ends_a_keys_validity_from_now_and_a_retirement_is_not_moved(
    cli: Cli, tmp_path: Path
) -> None:
    key_id = _new(cli, "writer.pem")
    signer = Signer.from_file(tmp_path / "writer.pem")
    signed_before = signer.sign_event(_event(datetime.now(UTC) - timedelta(seconds=1)))
    ran = cli("keys", "retire", key_id, "--keyring", "keyring.json")
    assert ran.code == 0 and ran.out.startswith(f"retired {key_id} at "), ran
    keyring = Keyring.load(tmp_path / "keyring.json")
    retired_at = keyring.keys[key_id].retired_at
    assert retired_at is not None and datetime.now(UTC) - retired_at < timedelta(minutes=1)
    assert keyring.event_problem(signed_before) is None
    signed_after = signer.sign_event(_event(datetime.now(UTC) + timedelta(seconds=1), seq=2))
    assert f"signed by key {key_id}, retired at" in (keyring.event_problem(signed_after) or "")

    again = cli("keys", "retire", key_id, "--keyring", "keyring.json")
    assert again.code == 1 and "already; a retirement is not moved" in _one_line(
        again, "keys retire"
    )
    unknown = cli("keys", "retire", "ed25519:0000000000000000", "--keyring", "keyring.json")
    assert unknown.code == 1
    err = _one_line(unknown, "keys retire")
    assert "keyring.json holds no key ed25519:0000000000000000" in err and "keys list" in err


def test_retire_at_a_moment_past_but_never_in_the_future(cli: Cli, tmp_path: Path) -> None:
    key_id = _new(cli, "writer.pem")
    # from a moment past, what the key signed since is refused, for good: not without a yes
    # (a new user's trial backdated a retirement by a day with no word of what it did)
    asked = cli("keys", "retire", key_id, "--keyring", "keyring.json", "--at", "2h")
    assert asked.code == 2 and "pass --yes to do it without asking" in _one_line(
        asked, "keys retire"
    )
    assert Keyring.load(tmp_path / "keyring.json").keys[key_id].retired_at is None
    past = cli("keys", "retire", key_id, "--keyring", "keyring.json", "--at", "2h", "--yes")
    assert past.code == 0  # an age: two hours ago
    second = _new(cli, "second.pem")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    ran = cli("keys", "retire", second, "--keyring", "keyring.json", "--at", tomorrow)
    assert ran.code == 2 and "is in the future" in _one_line(ran, "keys retire")
    assert Keyring.load(tmp_path / "keyring.json").keys[second].retired_at is None
    ran = cli(
        "keys",
        "retire",
        second,
        "--keyring",
        "keyring.json",
        "--at",
        "2026-11-30T09:00Z",
        "--json",
        "--yes",
    )
    assert json.loads(ran.out) == {
        "key_id": second,
        "keyring": "keyring.json",
        "retired_at": "2026-11-30T09:00:00Z",
    }
    keys = Keyring.load(tmp_path / "keyring.json").keys
    assert keys[second].retired_at == datetime(2026, 11, 30, 9, tzinfo=UTC)
    first_at = keys[key_id].retired_at
    assert first_at is not None
    assert timedelta(hours=2) - (datetime.now(UTC) - first_at) < timedelta(minutes=1)


def test_list_prints_each_key_with_its_roles_and_dates(cli: Cli, tmp_path: Path) -> None:
    writer = _new(cli, "writer.pem")
    audit = _new(cli, "audit.pem", "keyring.json", "--role", "digests")
    cli("keys", "retire", writer, "--keyring", "keyring.json", "--at", "2026-11-30T09:00Z", "--yes")
    ran = cli("keys", "list", "--keyring", "keyring.json", "--wide")
    assert ran.code == 0 and not ran.err
    header, _, *rows = ran.out.splitlines()
    assert header.split() == ["key", "id", "roles", "added", "retired"]
    assert rows[0].split()[:2] == [writer, "events"] and rows[0].endswith("2026-11-30 09:00:00 UTC")
    assert rows[1].split()[:2] == [audit, "digests"] and rows[1].rstrip().endswith("-")

    printed = cli("keys", "list", "--keyring", "keyring.json", "--json").out
    listed = [json.loads(line) for line in printed.splitlines()]
    assert [key["key_id"] for key in listed] == [writer, audit]
    assert all(list(key) == documented("keys list") for key in listed)
    assert listed[0]["retired_at"] == "2026-11-30T09:00:00Z" and listed[1]["retired_at"] is None
    assert listed[1]["roles"] == ["digests"] and listed[0]["added_at"].endswith("Z")
    line = cli("keys", "public", "writer.pem").out.split()
    assert listed[0]["public"] == line[1]

    (tmp_path / "empty.json").write_text('{"keys": []}')
    empty = cli("keys", "list", "--keyring", "empty.json")
    assert empty.code == 0 and empty.out == "no keys in empty.json\n"


def test_a_change_replaces_the_keyring_whole_at_once(cli: Cli, tmp_path: Path) -> None:
    key_id = _new(cli, "writer.pem")
    path = tmp_path / "keyring.json"
    before = path.read_bytes()
    with path.open("rb") as reader:  # a reader that opened it before the change
        assert cli("keys", "retire", key_id, "--keyring", "keyring.json").code == 0
        assert reader.read() == before  # still the whole old keyring, never half of a new one
    assert path.read_bytes() != before and Keyring.load(path).keys[key_id].retired_at
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keyring.json", "writer.pem"]


def _bad_files(tmp_path: Path) -> None:
    """Files that are not what their command takes, and real.pem, whose secret no
    message may show."""
    real = Signer.generate()
    real.write(tmp_path / "real.pem")
    (tmp_path / "truncated.pem").write_text((tmp_path / "real.pem").read_text()[:-30])
    (tmp_path / "not-json.json").write_text("{'keys': []}")
    (tmp_path / "a-list.json").write_text("[]")
    entry = real.trusted(("events",)).to_json()
    (tmp_path / "other-id.json").write_text(
        json.dumps({"keys": [{**entry, "id": Signer.generate().key_id}]})
    )
    (tmp_path / "no-roles.json").write_text(json.dumps({"keys": [{**entry, "roles": []}]}))


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["list", "--keyring", "not-json.json"], 1, "the keyring not-json.json is not JSON"),
        (["list", "--keyring", "a-list.json"], 1, 'the keyring a-list.json is not {"keys": [...]}'),
        (["list", "--keyring", "other-id.json"], 1, "other-id.json: the entry 'ed25519:"),
        (["list", "--keyring", "no-roles.json"], 1, "no-roles.json: a key entry is malformed"),
        (["new", "k.pem", "--keyring", "not-json.json"], 1, "not-json.json is not JSON"),
        (["add", "A" * 43, "--keyring", "a-list.json"], 1, 'a-list.json is not {"keys"'),
        (["retire", "ed25519:x", "--keyring", "other-id.json"], 1, "other-id.json: the entry"),
        (["list", "--keyring", "missing.json"], 1, "no keyring at missing.json: `loomflow keys"),
        (["retire", "ed25519:x", "--keyring", "missing.json"], 1, "no keyring at missing.json"),
        (["public", "missing.pem"], 1, "cannot read the signing key file missing.pem"),
        (["public", "truncated.pem"], 1, "truncated.pem is not an Ed25519 private key"),
        (["public", "a-list.json"], 1, "a-list.json is not an Ed25519 private key"),
        (["list", "--keyring", "."], 1, "cannot read the keyring .: Is a directory"),
    ],
)
def test_a_bad_file_is_one_line_naming_it_and_never_the_secret(
    cli: Cli, tmp_path: Path, argv: list[str], code: int, said: str
) -> None:
    _bad_files(tmp_path)
    ran = cli("keys", *argv)
    assert ran.code == code, ran
    err = _one_line(ran, f"keys {argv[0]}")
    assert said in err, err
    if argv[0] != "public" and "missing" not in err and "directory" not in err:
        assert "restore the file from a copy or mend it by hand" in err
    assert not any(piece in err for piece in _secret(tmp_path / "real.pem"))
    assert not (tmp_path / "k.pem").exists()  # a refused `new` wrote no key
    assert os.listdir(tmp_path).count("not-json.json.tmp") == 0


def test_bad_arguments_are_usage_errors(cli: Cli) -> None:
    assert cli("keys").code == 2
    assert cli("keys", "new", "w.pem", "--keyring", "k.json", "--role", "payments").code == 2
    ran = cli("keys", "retire", "ed25519:x", "--keyring", "k.json", "--at", "soon")
    assert ran.code == 2 and "'soon' is neither an ISO date" in ran.err


def _shape(shown: str) -> re.Pattern[str]:
    """A line the README shows, with its key ids and numbers left open."""
    parts = re.split(r"(ed25519:[0-9a-f]{16}|\d+)", shown)
    return re.compile(
        "".join(
            r"ed25519:[0-9a-f]{16}"
            if part.startswith("ed25519:")
            else r"\d+"
            if part.isdigit()
            else re.escape(part)
            for part in parts
        )
    )


def test_the_readme_signing_commands_run_as_written(tmp_path: Path) -> None:
    marker = "loomflow keys new writer.pem"
    readme = block(marker, "sh")
    done = subprocess.run(
        ["bash", "-eu", "-c", readme.text],  # a shell: the block sets variables and exports
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    printed = done.stdout.splitlines()
    shown = [command.shown for command in commands(readme) if command.shown is not None]
    assert len(shown) == 2
    for line in shown:
        assert any(_shape(line).fullmatch(out) for out in printed), (line, done.stdout)
    keys = Keyring.load(tmp_path / "keyring.json").keys
    made = {name: Signer.from_file(tmp_path / f"{name}.pem").key_id for name in _README_KEYS}
    assert set(keys) == set(made.values())
    for name, (roles, retired) in _README_KEYS.items():
        key = keys[made[name]]
        assert (key.roles, key.retired_at is not None) == (roles, retired), name
        assert stat.S_IMODE((tmp_path / f"{name}.pem").stat().st_mode) == 0o600
    assert f"retired {made['writer']} at " in done.stdout  # the old writer's, by its id
    assert all(key_id in done.stdout for key_id in made.values())  # listed, and printed


#: the keys the README's block leaves: each key file's roles, and whether it is retired
_README_KEYS = {
    "writer": (("events",), True),
    "audit": (("digests",), False),
    "writer-2": (("events",), False),
}
