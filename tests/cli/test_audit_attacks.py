"""``loomflow audit verify --digests`` against an attacker, as an operator runs it: the
writers sign with their key (LOOMFLOW_SIGNING_KEY_FILE), the audit signs its digests with
its own (`loomflow keys new --role digests`), and both trust the keyring
(LOOMFLOW_KEYRING). An untampered log verifies with exit code 0, and what came after the
last digest is pending, exit code 3; then one session per tampering case, each found and
named in its session, exit code 1.

On SQLite the attacker can write the log's file and the trail's; on Kafka, the trail's
tables in PostgreSQL, and the events topic, where they can only add records.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loomflow.audit.digests import Digest
from loomflow.projections.audit import PostgresTrail, SqliteTrail, Trail, default_trail_path
from loomflow.projections.chain import Entry, entry_hash
from loomflow.runtime import KafkaRuntime, PostgresStore, Runtime, Scope, SqliteRuntime
from loomflow.schemas import Event, TurnAppended, Usage, utcnow
from loomflow.schemas.codec import decode_event
from loomflow.schemas.events import TurnAppendedPayload
from loomflow.schemas.signing import Signer
from loomflow.settings import Settings
from loomflow.testing import SqliteLog
from loomflow.testing.log import ReadableLog
from loomflow.testing.trail import TrailTampering
from tests.audit.test_conformance import PostgresTampering, SqliteTampering
from tests.support.kafka_env import ROOT, KafkaEnv
from tests.support.logs import KafkaLog
from tests.support.scenario import Research

#: each tampering case (a session of its own) and what verification names in it
CASES = {
    "altered": "altered",
    "deleted": "deleted",
    "inserted": "inserted",
    "reordered": "reordered",
    "truncated": "truncated",
    "gone": "deleted",  # the whole session deleted
    "forged": "forged",  # an event made without the key
    "old-key": "forged",  # an event signed by a writer's key after its retirement
}


@dataclass
class Attacked:
    """One backend as the test drives it: its writers' runtime, the log (to forge into,
    and on SQLite to cut and rewrite), the trail's storage, and the commands' options."""

    runtime: Callable[[Path], Runtime]  # a writer's runtime, signing with this key
    log: ReadableLog
    tamper: TrailTampering
    trail: Callable[[], Trail]
    options: list[str]
    #: the log's file can lose records (SQLite): the attacker cuts the log as the trail
    cuts_log: bool
    environment: dict[str, str] = field(default_factory=dict)


def _shell(variables: dict[str, str], where: Path) -> dict[str, str]:
    """A user's shell: this one's environment with no LOOMFLOW_* but ``variables``, and
    the keyring and the audit's key of the operator in ``where``."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")}
    return (
        shell
        | variables
        | {
            "LOOMFLOW_KEYRING": str(where / "keyring.json"),
            "LOOMFLOW_SIGNING_KEY_FILE": str(where / "audit.key"),
            "PYTHONPATH": str(ROOT),
            "NO_COLOR": "1",
            "COLUMNS": "250",
        }
    )


def _run(
    where: Path, environment: dict[str, str], *argv: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``loomflow ARGV`` in ``where``, as a user's shell starts it."""
    return subprocess.run(
        [sys.executable, "-m", "loomflow.cli", *argv],
        cwd=where,
        env=environment,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _loomflow(where: Path, environment: dict[str, str], *argv: str) -> tuple[int, str]:
    """Its exit code and everything it printed."""
    ran = _run(where, environment, *argv)
    return ran.returncode, ran.stdout + ran.stderr


def _findings(out: str) -> dict[str, set[str]]:
    """Session -> the kinds of what verification found in it."""
    found: dict[str, set[str]] = {}
    for kind, session in re.findall(r"^(\w+) in session (\S+) \(", out, re.MULTILINE):
        found.setdefault(session, set()).add(kind)
    return found


def _inserted(last: Entry) -> Entry:
    """An entry no audit wrote, at the end of a chain, hashed as real ones are."""
    body = b'{"type":"turn.appended","forged":true}'
    digest = hashlib.sha256(body).hexdigest()
    n = last.n + 1
    return Entry(
        last.user_id,
        last.session_id,
        n,
        "999999",
        "evt_inserted",
        last.seq + 1,
        "turn.appended",
        utcnow(),
        digest,
        body,
        last.hash,
        entry_hash(last.hash, n, digest),
    )


def _turn(after: Event) -> TurnAppended:
    """A turn billing $999 at the session's next seq, in its epoch: all that the read
    model's rule asks of an event (the $999 of the issue's attack)."""
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cost_usd=999.0)
    return TurnAppended(
        session_id=after.session_id,
        user_id=after.user_id,
        run_id=after.run_id,
        seq=after.seq + 1,
        epoch=after.epoch,
        payload=TurnAppendedPayload(messages=[], usage=usage, model_call=True),
    )


async def _attack(backend: Attacked, where: Path) -> None:
    env = backend.environment

    def loomflow(*argv: str) -> tuple[int, str]:
        return _loomflow(where, env, *argv)

    for key, role in (("writer.key", "events"), ("audit.key", "digests")):
        code, out = loomflow("keys", "new", key, "--keyring", "keyring.json", "--role", role)
        assert code == 0, out
    writer = where / "writer.key"
    runtime = backend.runtime(writer)
    try:
        for session in [f"s-{case}" for case in CASES]:
            await Research(passes=1).agent(runtime).run("go", session_id=session)
    finally:
        await runtime.close()
    code, out = loomflow("audit", "digest", *backend.options, "--digests", "digests")
    assert code == 0 and "wrote 1 digest" in out, out
    code, out = loomflow("audit", "verify", *backend.options, "--digests", "digests")
    assert code == 0, out
    assert "digests: 1 digest of the digest directory digests" in out, out
    assert "signatures: required, and checked against the keyring" in out, out

    # a run after the last digest: checked, not proven yet
    runtime = backend.runtime(writer)
    try:
        await Research(passes=1).agent(runtime).run("go", session_id="s-late")
    finally:
        await runtime.close()
    assert loomflow("audit", *backend.options)[0] == 0
    code, out = loomflow("audit", "verify", *backend.options, "--digests", "digests")
    assert code == 3, out
    assert "verification pending" in out and "newer than digest 1" in out, out
    code, out = loomflow("audit", "digest", *backend.options, "--digests", "digests")
    assert code == 0, out
    code, out = loomflow("audit", "verify", *backend.options, "--digests", "digests")
    assert code == 0, out

    # the writer's key is retired (its holder left; a digest committed what it signed)
    code, writer_id = loomflow("keys", "public", str(writer))
    code, out = loomflow("keys", "retire", writer_id.split()[0], "--keyring", "keyring.json")
    assert code == 0, out

    async with backend.trail() as trail:
        chains = {case: await trail.entries(None, f"s-{case}") for case in CASES}
    tamper, log = backend.tamper, backend.log
    await _tampered(backend, chains, tamper, log, writer)

    assert loomflow("audit", *backend.options)[0] == 0  # the forged records: refused
    code, out = loomflow("audit", "verify", *backend.options, "--digests", "digests")
    assert code == 1, out
    found = _findings(out)
    for case, kind in CASES.items():
        assert kind in found.get(f"s-{case}", set()), (case, found.get(f"s-{case}"), out)
    # nothing is found where nothing was done
    assert "s-late" not in found, out
    assert "verification failed" in out, out


async def _tampered(
    backend: Attacked,
    chains: dict[str, list[Entry]],
    tamper: TrailTampering,
    log: ReadableLog,
    old_key: Path,
) -> None:
    """Each case done to its session, as someone who can write the storage would."""

    def scope(case: str) -> Scope:
        return Scope(f"s-{case}")

    def last_event(case: str) -> Event:
        body = chains[case][-1].body
        assert body is not None
        return decode_event(body)

    # altered: a record changed where it is (a log the attacker can write), or its entry
    third = chains["altered"][2]
    if backend.cuts_log:
        assert third.body is not None
        changed = decode_event(third.body).model_copy(update={"run_id": "run_elsewhere"})
        await log.rewrite(changed)
    else:
        await tamper.update(None, "s-altered", 3, body=b'{"altered":true}')
    # deleted: a record in the middle, from the log if it can lose one, else the trail
    if backend.cuts_log:
        await log.cut(scope("deleted"), [3])
    else:
        await tamper.delete(None, "s-deleted", 3)
    await tamper.insert(_inserted(chains["inserted"][-1]))
    await tamper.update(None, "s-reordered", 3, n=-1)
    await tamper.update(None, "s-reordered", 4, n=3)
    await tamper.update(None, "s-reordered", -1, n=4)
    # truncated and gone: cut from the trail, and from the log as well where it can be
    for case, keep in (("truncated", len(chains["truncated"]) - 2), ("gone", 0)):
        cut = chains[case][keep:]
        if backend.cuts_log:
            await log.cut(scope(case), [e.seq for e in cut])
        for entry in reversed(cut):
            await tamper.delete(None, f"s-{case}", entry.n)
    await log.forge(_turn(last_event("forged")))
    old = Signer.from_file(old_key)
    await log.forge(old.sign_event(_turn(last_event("old-key"))))


async def test_every_attack_on_an_embedded_log_is_named_and_fails_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("LOOMFLOW_"):
            monkeypatch.delenv(name)
    db = tmp_path / "journal.db"

    def runtime(key: Path) -> Runtime:
        # a writer's process, configured as a user configures one
        monkeypatch.setenv("LOOMFLOW_SIGNING_KEY_FILE", str(key))
        monkeypatch.setenv("LOOMFLOW_KEYRING", str(tmp_path / "keyring.json"))
        return SqliteRuntime(db)

    backend = Attacked(
        runtime=runtime,
        log=SqliteLog(db),
        tamper=SqliteTampering(default_trail_path(db)),
        trail=lambda: SqliteTrail(default_trail_path(db)),
        options=["--db", "journal.db"],
        cuts_log=True,
        environment=_shell({}, tmp_path),
    )
    await _attack(backend, tmp_path)


@pytest.fixture
async def kafka_env() -> AsyncIterator[KafkaEnv]:
    env = await KafkaEnv.create(partitions=2)
    await env.start_projector()
    yield env
    await env.close()


@pytest.mark.kafka
@pytest.mark.postgres
async def test_every_attack_on_the_kafka_log_and_its_trail_is_named_and_fails_verification(
    kafka_env: KafkaEnv, tmp_path: Path
) -> None:
    env = kafka_env

    def runtime(key: Path) -> Runtime:
        update = {"signing_key_file": key, "keyring": tmp_path / "keyring.json"}
        settings: Settings = env.settings.model_copy(update=update)
        return KafkaRuntime(settings=settings)

    def trail() -> Trail:
        store = PostgresStore.from_settings(env.settings, max_size=2)
        return PostgresTrail(store._call, "audit trail of the test", on_close=store.close)

    backend = Attacked(
        runtime=runtime,
        log=KafkaLog(env),
        tamper=PostgresTampering(env.dsn, env.schema),
        trail=trail,
        options=[],  # the settings': LOOMFLOW_KAFKA_BOOTSTRAP, _POSTGRES_DSN, ...
        cuts_log=False,
        environment=_shell(env.variables(), tmp_path),
    )
    await _attack(backend, tmp_path)


async def test_digests_through_a_pipe_and_what_is_wrong_with_a_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``audit digest --digests -`` writes the digest on standard output, for an external
    system to keep, and ``verify --digests -`` reads them back from standard input. A
    place that is not there, a digest not signed by a key trusted for digests, one that is
    not a digest, no key to sign with: each named, never a success."""
    for name in list(os.environ):
        if name.startswith("LOOMFLOW_"):
            monkeypatch.delenv(name)
    environment = _shell({}, tmp_path)

    def loomflow(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        ran = _run(tmp_path, environment, *argv, stdin=stdin)
        return ran.returncode, ran.stdout, ran.stderr

    for key, role in (("writer.key", "events"), ("audit.key", "digests")):
        assert loomflow("keys", "new", key, "--keyring", "keyring.json", "--role", role)[0] == 0
    monkeypatch.setenv("LOOMFLOW_SIGNING_KEY_FILE", str(tmp_path / "writer.key"))
    runtime = SqliteRuntime(tmp_path / "journal.db")
    try:
        await Research(passes=1).agent(runtime).run("go", session_id="s1")
    finally:
        await runtime.close()
    db = ["--db", "journal.db"]

    code, digest, err = loomflow("audit", "digest", *db, "--digests", "-")
    assert code == 0 and "wrote 1 digest, the last to standard output" in err, err
    (line,) = digest.splitlines()
    assert line.startswith("{") and '"kind":"loomflow.audit.digest"' in line
    code, out, err = loomflow("audit", "verify", *db, "--digests", "-", stdin=digest)
    assert code == 0, (out, err)
    assert "digests: 1 digest of the standard input, the last (1)" in out, out

    # signed by the writer's key: a key the keyring trusts, but not for digests
    writer = Signer.from_file(tmp_path / "writer.key")
    forged = Digest.model_validate_json(line)
    forged = forged.model_copy(update={"sig": writer.sign(forged.signed_bytes())})
    code, out, err = loomflow(
        "audit", "verify", *db, "--digests", "-", stdin=forged.to_json().decode()
    )
    assert code == 1, (out, err)
    assert (
        "digest in the standard input: standard input, line 1: digest 1 is signed by key "
        f"{writer.key_id}, which the keyring trusts to sign events only, not digests"
    ) in out, out
    code, out, err = loomflow("audit", "verify", *db, "--digests", "-", stdin="not a digest\n")
    assert code == 1 and "standard input, line 1: not a digest (" in out, out

    code, out, err = loomflow("audit", "verify", *db, "--digests", "nowhere")
    assert (code, out) == (1, ""), out
    assert err == (
        "loomflow audit verify: the digest directory nowhere does not exist or is not a directory\n"
    )

    # the audit's key is what signs a digest: given a writer's (still set in the shell
    # after a rotation), or none, no digest and a clear refusal
    environment["LOOMFLOW_SIGNING_KEY_FILE"] = str(tmp_path / "writer.key")
    code, out, err = loomflow("audit", "digest", *db, "--digests", "digests")
    assert code == 1 and not (tmp_path / "digests").exists(), (out, err)
    assert (
        "cannot sign digests: the keyring trusts key "
        f"{writer.key_id} to sign events only (LOOMFLOW_KEYRING="
    ) in err, err
    del environment["LOOMFLOW_SIGNING_KEY_FILE"]
    code, out, err = loomflow("audit", "digest", *db, "--digests", "digests")
    assert code == 1 and not (tmp_path / "digests").exists(), (out, err)
    assert "audit digests are signed: set LOOMFLOW_SIGNING_KEY_FILE" in err, err
