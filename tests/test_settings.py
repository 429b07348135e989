"""Settings: what every process reads from LOOMFLOW_*, and what it refuses up front."""

from __future__ import annotations

import base64
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from loomflow import Agent
from loomflow.errors import SignatureError, SigningKeyError
from loomflow.models import ScriptedModel
from loomflow.producers import Topics
from loomflow.runtime import (
    InProcRuntime,
    KafkaRuntime,
    PostgresRuntime,
    PostgresStore,
    Runtime,
    Scope,
    SqliteRuntime,
    SqliteStore,
)
from loomflow.schemas import RunStarted, new_id
from loomflow.schemas.events import SignalSent
from loomflow.schemas.signing import Keyring, Signatures, Signer
from loomflow.settings import Settings


def test_topics_are_replicated_as_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOMFLOW_TOPIC_REPLICATION", "3")
    monkeypatch.setenv("LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS", "2")
    topics = Topics.from_settings(Settings())
    assert (topics.replication, topics.min_insync_replicas) == (3, 2)
    monkeypatch.delenv("LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS")
    assert Topics.from_settings(Settings()).min_insync_replicas is None  # the broker's default


def test_more_insync_replicas_than_replicas_is_refused_naming_both_variables() -> None:
    with pytest.raises(ValidationError, match="LOOMFLOW_TOPIC_MIN_INSYNC_REPLICAS at most"):
        Settings(topic_replication=1, topic_min_insync_replicas=2)


def test_every_runtime_takes_its_run_options_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION", "3")
    monkeypatch.setenv("LOOMFLOW_SERIALIZER", "pickle")
    monkeypatch.setenv("LOOMFLOW_LEASE_SECONDS", "7.5")
    monkeypatch.setenv("LOOMFLOW_RETRY_SECONDS", "2")
    for runtime in (
        InProcRuntime(),
        SqliteRuntime(tmp_path / "j.db"),
        PostgresRuntime(),
        KafkaRuntime(),
    ):
        got = (runtime.max_checkpoints_per_session, runtime.serializer, runtime.lease_seconds)
        assert got == (3, "pickle", 7.5), type(runtime).__name__
        assert runtime.retry_seconds == 2.0
        assert runtime.settings.max_checkpoints_per_session == 3
    given = SqliteRuntime(tmp_path / "k.db", max_checkpoints_per_session=5, serializer="json")
    assert (given.max_checkpoints_per_session, given.serializer) == (5, "json")


def test_a_bad_run_option_in_the_environment_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION", "2.5")
    with pytest.raises(ValueError, match="max_checkpoints_per_session must be a whole number"):
        SqliteRuntime(tmp_path / "j.db")
    assert not (tmp_path / "j.db").exists()  # refused before anything is written
    monkeypatch.setenv("LOOMFLOW_MAX_CHECKPOINTS_PER_SESSION", "0")
    monkeypatch.setenv("LOOMFLOW_LEASE_SECONDS", "soon")
    with pytest.raises(ValueError, match=r"lease_seconds must be a number from 0\.5 to 86400"):
        InProcRuntime()


def test_retention_is_a_keyword_of_every_runtime() -> None:
    with pytest.raises(TypeError):
        InProcRuntime(5)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "constructor",
    [
        Runtime.__init__,
        InProcRuntime.__init__,
        SqliteRuntime.__init__,
        SqliteStore.__init__,
        PostgresRuntime.__init__,
        PostgresStore.__init__,
        KafkaRuntime.__init__,
    ],
    ids=lambda constructor: constructor.__qualname__,
)
def test_no_constructor_writes_a_default_of_its_own(constructor: Any) -> None:
    """A default is written once, in Settings: a constructor's option left out means
    "as the settings say", so the environment and every process agree."""
    own = {
        name: param.default
        for name, param in inspect.signature(constructor).parameters.items()
        if param.default is not inspect.Parameter.empty
        and param.default is not None
        and name != "create"  # whether to create a missing file: a call's intent
    }
    assert own == {}


def _shown(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def test_the_readme_lists_every_setting_with_its_default() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `LOOMFLOW_") and len(cells) == 3:
            rows[cells[0].strip("`")] = cells[1]
    settings = {
        "LOOMFLOW_SCHEMA" if name == "db_schema" else f"LOOMFLOW_{name.upper()}": _shown(
            field.default
        )
        for name, field in Settings.model_fields.items()
    }
    assert rows == settings


# --- signing: the key a process signs with, and what its readers check ------------------

_SIGNING = ("SIGNING_KEY_FILE", "SIGNING_KEY", "KEYRING", "SIGNATURES")


@pytest.fixture
def unsigned(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment with no signing setting: each test sets its own."""
    for name in _SIGNING:
        monkeypatch.delenv(f"LOOMFLOW_{name}", raising=False)
    return monkeypatch


def _keyed() -> tuple[Signer, str]:
    """A signing key, and its seed as LOOMFLOW_SIGNING_KEY takes it (base64)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    seed = base64.urlsafe_b64encode(private.private_bytes_raw()).decode().rstrip("=")
    return Signer(private), seed


def test_with_no_key_and_no_keyring_nothing_signs_and_nothing_is_checked(
    unsigned: pytest.MonkeyPatch,
) -> None:
    settings = Settings()
    assert settings.signer() is None
    assert settings.signatures_policy() == Signatures("off")


def test_a_signing_key_alone_signs_and_its_readers_require_its_signature(
    unsigned: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    signer, seed = _keyed()
    signer.write(tmp_path / "writer.pem")
    unsigned.setenv("LOOMFLOW_SIGNING_KEY_FILE", str(tmp_path / "writer.pem"))
    settings = Settings()
    signed = signer.sign_event(_event())
    assert (got := settings.signer()) is not None and got.key_id == signer.key_id
    policy = settings.signatures_policy()
    assert policy.mode == "require" and policy.keyring is not None
    assert list(policy.keyring.keys) == [signer.key_id]  # its own key, trusted
    assert policy.check(signed) is None
    with pytest.raises(SignatureError, match="is not signed"):
        policy.check(_event())
    # the same key given as text (its seed, as a secret store holds it)
    unsigned.delenv("LOOMFLOW_SIGNING_KEY_FILE")
    unsigned.setenv("LOOMFLOW_SIGNING_KEY", seed)
    assert (again := Settings().signer()) is not None and again.key_id == signer.key_id
    assert Settings().signatures_policy().check(signed) is None


def test_a_keyring_is_what_readers_trust_and_require_by_default(
    unsigned: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trusted, own = Signer.generate(), Signer.generate()
    Keyring.of(trusted.trusted(("events",))).save(tmp_path / "keyring.json")
    own.write(tmp_path / "own.pem")
    unsigned.setenv("LOOMFLOW_KEYRING", str(tmp_path / "keyring.json"))
    unsigned.setenv("LOOMFLOW_SIGNING_KEY_FILE", str(tmp_path / "own.pem"))
    policy = Settings().signatures_policy()
    assert policy.mode == "require" and policy.keyring is not None
    # the keyring's keys, and only them: a signing key set beside it is not trusted for it
    assert list(policy.keyring.keys) == [trusted.key_id]
    assert policy.check(trusted.sign_event(_event())) is None
    with pytest.raises(SignatureError, match=f"{own.key_id}, which the keyring does not hold"):
        policy.check(own.sign_event(_event()))


async def test_a_key_the_keyring_does_not_trust_for_its_role_now_signs_nothing(
    unsigned: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A writer left with a retired key, a rotated key not yet in the keyring, the
    audit's key given to a writer, a writer's to the audit: refused at the runtime's first
    append (or when the digest writer is made), as every reader would refuse what it
    signs."""
    writer, retired, audit, unknown = (Signer.generate() for _ in range(4))
    keyring = Keyring.of(
        writer.trusted(("events",)), retired.trusted(("events",)), audit.trusted(("digests",))
    ).retire(retired.key_id)
    keyring.save(tmp_path / "keyring.json")
    unsigned.setenv("LOOMFLOW_KEYRING", str(tmp_path / "keyring.json"))
    refusals = [
        (writer, "events", None),
        (writer, "digests", f"the keyring trusts key {writer.key_id} to sign events only"),
        (audit, "digests", None),
        (audit, "events", f"the keyring trusts key {audit.key_id} to sign digests only"),
        (retired, "events", f"key {retired.key_id} was retired at "),
        (unknown, "events", f"key {unknown.key_id} is not in the keyring"),
    ]
    for signer, role, refusal in refusals:
        signer.write(key := tmp_path / f"{signer.key_id[8:]}-{role}.pem")
        unsigned.setenv("LOOMFLOW_SIGNING_KEY_FILE", str(key))
        if refusal is None:
            assert (got := Settings().signer(role)) is not None and got.key_id == signer.key_id  # type: ignore[arg-type]
            continue
        with pytest.raises(SigningKeyError) as refused:
            Settings().signer(role)  # type: ignore[arg-type]
        assert f"LOOMFLOW_SIGNING_KEY_FILE={key} cannot sign {role}: {refusal}" in str(
            refused.value
        )
        if role == "events":  # a runtime made with it reads, but appends nothing
            for runtime in (SqliteRuntime(tmp_path / "journal.db"), InProcRuntime()):
                try:
                    assert await runtime.store.session(Scope("s1")) is None
                    agent = Agent("x", model=ScriptedModel(["ok"]), runtime=runtime)
                    with pytest.raises(SigningKeyError, match=f"cannot sign events: {refusal}"):
                        await agent.run("go", session_id="s1")
                    assert await runtime.store.read_events(Scope("s1")) == []
                finally:
                    await runtime.close()
    assert Settings().signer() is not None  # not checked when no role is named


async def test_a_writer_without_a_key_where_signatures_are_required_appends_nothing(
    unsigned: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LOOMFLOW_KEYRING set (so signatures required) and no signing key: every reader
    would refuse the events as forgeries, which the log would keep (a new user's trial:
    a run exited 0, then the audit refused all 12 of its records). Refused at the first
    append; with LOOMFLOW_SIGNATURES=check the events go in, counted as unsigned."""
    Keyring.of(Signer.generate().trusted()).save(tmp_path / "keyring.json")
    unsigned.setenv("LOOMFLOW_KEYRING", str(tmp_path / "keyring.json"))
    for runtime in (SqliteRuntime(tmp_path / "journal.db"), InProcRuntime()):
        try:
            agent = Agent("x", model=ScriptedModel(["ok"]), runtime=runtime)
            with pytest.raises(SigningKeyError, match="this process has no signing key"):
                await agent.run("go", session_id="s1")
            assert await runtime.store.read_events(Scope("s1")) == []
            # an event appended as it is, not made by a run's writer (a fork's, say)
            claim = RunStarted(session_id="s2", run_id=new_id("run"), seq=1, epoch=1)
            with pytest.raises(SigningKeyError, match="this process has no signing key"):
                await runtime.store.append([claim])
            assert await runtime.store.read_events(Scope("s2")) == []
        finally:
            await runtime.close()
    unsigned.setenv("LOOMFLOW_SIGNATURES", "check")
    async with SqliteRuntime(tmp_path / "journal.db") as runtime:
        agent = Agent("x", model=ScriptedModel(["ok"]), runtime=runtime)
        assert (await agent.run("go", session_id="s1")).output == "ok"


def test_the_mode_given_is_the_mode_used(unsigned: pytest.MonkeyPatch, tmp_path: Path) -> None:
    signer = Signer.generate()
    Keyring.of(signer.trusted()).save(tmp_path / "keyring.json")
    unsigned.setenv("LOOMFLOW_KEYRING", str(tmp_path / "keyring.json"))
    unsigned.setenv("LOOMFLOW_SIGNATURES", "check")
    checking = Settings().signatures_policy()
    assert checking.mode == "check" and "is not signed" in (checking.check(_event()) or "")
    unsigned.setenv("LOOMFLOW_SIGNATURES", "off")
    assert Settings().signatures_policy() == Signatures("off")
    unsigned.setenv("LOOMFLOW_SIGNATURES", "sometimes")
    with pytest.raises(ValidationError, match="'off', 'check' or 'require'"):
        Settings()


@pytest.mark.parametrize("mode", ["check", "require"])
def test_checking_with_no_key_to_check_against_is_refused_naming_the_keyring_setting(
    unsigned: pytest.MonkeyPatch, mode: str
) -> None:
    unsigned.setenv("LOOMFLOW_SIGNATURES", mode)
    with pytest.raises(SigningKeyError, match=f"LOOMFLOW_SIGNATURES={mode} needs") as refused:
        Settings().signatures_policy()
    assert "set LOOMFLOW_KEYRING" in str(refused.value)


def test_the_signing_key_is_given_once(unsigned: pytest.MonkeyPatch, tmp_path: Path) -> None:
    signer, seed = _keyed()
    signer.write(tmp_path / "writer.pem")
    unsigned.setenv("LOOMFLOW_SIGNING_KEY_FILE", str(tmp_path / "writer.pem"))
    unsigned.setenv("LOOMFLOW_SIGNING_KEY", seed)
    with pytest.raises(ValidationError) as refused:
        Settings()
    message = str(refused.value)
    assert "both LOOMFLOW_SIGNING_KEY_FILE and LOOMFLOW_SIGNING_KEY are set" in message
    assert seed not in message


def test_a_bad_key_or_keyring_is_refused_naming_where_never_the_secret(
    unsigned: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = _keyed()[1][:-2]  # 30 bytes: no key, but a secret all the same
    unsigned.setenv("LOOMFLOW_SIGNING_KEY", secret)
    settings = Settings()
    assert secret not in repr(settings)
    with pytest.raises(SigningKeyError) as refused:
        settings.signer()
    assert "LOOMFLOW_SIGNING_KEY is not an Ed25519 private key" in str(refused.value)
    assert secret not in str(refused.value)
    with pytest.raises(SigningKeyError, match="LOOMFLOW_SIGNING_KEY"):
        settings.signatures_policy()  # the readers of a writer's process: not silently off

    unsigned.delenv("LOOMFLOW_SIGNING_KEY")
    keyring = tmp_path / "keyring.json"
    keyring.write_text('{"keys": [{"id": "ed25519:0000000000000000", "public": "AAAA"}]}')
    unsigned.setenv("LOOMFLOW_KEYRING", str(keyring))
    with pytest.raises(SigningKeyError, match=f"^{re.escape(str(keyring))}: a key entry is"):
        Settings().signatures_policy()
    unsigned.setenv("LOOMFLOW_KEYRING", str(tmp_path / "missing.json"))
    with pytest.raises(SigningKeyError, match=r"cannot read the keyring .*missing\.json"):
        Settings().signatures_policy()


def _event() -> SignalSent:
    return SignalSent(
        session_id="s1", run_id="run1", seq=1, epoch=1, payload={"name": "go", "data": None}
    )
