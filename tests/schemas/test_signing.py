"""Signatures of events and digests: what a reader of the log accepts, what it refuses
and what the refusal names; key files and keyrings, and what their errors never say."""

from __future__ import annotations

import base64
import os
import re
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from loomflow.errors import SignatureError, SigningKeyError
from loomflow.schemas import Usage
from loomflow.schemas.events import (
    RunFinished,
    RunFinishedPayload,
    SignalSent,
    SignalSentPayload,
)
from loomflow.schemas.signing import (
    DIGEST_DOMAIN,
    EVENT_DOMAIN,
    NO_SIGNATURES,
    Keyring,
    Signatures,
    Signer,
    TrustedKey,
    key_id_of,
    public_from_text,
    public_text,
    signed_bytes,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _event(at: datetime = T0, **changes: Any) -> SignalSent:
    fields: dict[str, Any] = {
        "session_id": "s1",
        "user_id": "ada",
        "run_id": "run1",
        "seq": 3,
        "epoch": 1,
        "at": at,
        "payload": SignalSentPayload(name="approve", data={"amount": 10}),
    }
    return SignalSent(**{**fields, **changes})


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture(scope="module")
def keyring(signer: Signer) -> Keyring:
    return Keyring.of(signer.trusted(("events",), added_at=T0 - timedelta(days=1)))


def test_a_signed_event_verifies_against_the_keyring_and_survives_the_wire(
    signer: Signer, keyring: Keyring
) -> None:
    event = _event()
    signed = signer.sign_event(event)
    assert signed.sig is not None and signed.sig.key == signer.key_id
    assert keyring.event_problem(signed) is None
    # the same event as a reader decodes it from the log: what was signed is unchanged
    decoded = SignalSent.model_validate_json(signed.model_dump_json())
    assert keyring.event_problem(decoded) is None
    # signing covers every field but the signature: signing again signs the same bytes
    assert signed_bytes(signed) == signed_bytes(event)
    assert signed_bytes(event).startswith(EVENT_DOMAIN)


@pytest.mark.parametrize(
    "change",
    [
        {"payload": SignalSentPayload(name="approve", data={"amount": 1000})},
        {"seq": 4},
        {"session_id": "s2"},
        {"user_id": "bob"},
        {"epoch": 2},
    ],
    ids=["payload", "seq", "session", "user", "epoch"],
)
def test_a_signature_over_other_bytes_fails_naming_the_key_session_and_seq(
    signer: Signer, keyring: Keyring, change: dict[str, Any]
) -> None:
    signed = signer.sign_event(_event())
    forged = signed.model_copy(update=change)  # the signature kept, a field changed
    problem = keyring.event_problem(forged)
    assert problem is not None and "does not match its signature" in problem
    assert signer.key_id in problem
    assert f"session {forged.session_id!r}" in problem and f"seq {forged.seq}" in problem


def test_an_unsigned_event_and_a_mangled_signature_fail(signer: Signer, keyring: Keyring) -> None:
    unsigned = _event()
    assert keyring.event_problem(unsigned) == (
        f"event {unsigned.event_id} (session 's1', user 'ada', seq 3) is not signed"
    )
    signed = signer.sign_event(_event())
    assert signed.sig is not None
    for value in ("AAAA", "not base64!", signed.sig.value[::-1]):
        mangled = signed.model_copy(update={"sig": signed.sig.model_copy(update={"value": value})})
        problem = keyring.event_problem(mangled)
        assert problem is not None and "does not match its signature" in problem, value


def test_a_key_the_keyring_does_not_hold_is_refused_by_its_id(keyring: Keyring) -> None:
    stranger = Signer.generate()
    problem = keyring.event_problem(stranger.sign_event(_event()))
    assert problem is not None
    assert f"signed by key {stranger.key_id}, which the keyring does not hold" in problem
    assert "seq 3" in problem


def test_a_key_signs_only_what_its_roles_allow(signer: Signer, keyring: Keyring) -> None:
    digest = DIGEST_DOMAIN + b'{"entries":13}'
    # a writer's key (events) cannot sign a digest a verifier accepts ...
    problem = keyring.problem(digest, signer.sign(digest), T0, "digest 7", role="digests")
    assert problem == (
        f"digest 7 is signed by key {signer.key_id}, which the keyring trusts to sign events "
        "only, not digests"
    )
    # ... the audit's key (digests) can, and cannot sign an event
    audit = Signer.generate()
    both = Keyring.of(*keyring.keys.values(), audit.trusted(("digests",)))
    assert both.problem(digest, audit.sign(digest), T0, "digest 7", role="digests") is None
    refused = both.event_problem(audit.sign_event(_event()))
    assert refused is not None and "not events" in refused


def test_an_event_signature_is_never_a_digest_signature(signer: Signer) -> None:
    everything = Keyring.of(signer.trusted())  # both roles
    event = _event()
    signature = signer.sign(signed_bytes(event))
    as_digest = DIGEST_DOMAIN + signed_bytes(event).removeprefix(EVENT_DOMAIN)
    assert everything.problem(signed_bytes(event), signature, T0, "e", role="events") is None
    problem = everything.problem(as_digest, signature, T0, "digest", role="digests")
    assert problem == f"digest does not match its signature by key {signer.key_id}"


def test_a_retired_key_holds_on_what_it_signed_before_its_retirement_only(
    signer: Signer, keyring: Keyring
) -> None:
    retired = keyring.retire(signer.key_id, at=T0)
    assert keyring.keys[signer.key_id].retired_at is None  # a new keyring; this one unchanged
    before = signer.sign_event(_event(at=T0 - timedelta(seconds=1)))
    at = signer.sign_event(_event(at=T0))
    after = signer.sign_event(_event(at=T0 + timedelta(seconds=1)))
    assert retired.event_problem(before) is None and retired.event_problem(at) is None
    problem = retired.event_problem(after)
    assert problem is not None
    assert f"signed by key {signer.key_id}, retired at {T0.isoformat()}" in problem
    assert "seq 3" in problem
    # and the date is signed: moving an event back before the retirement breaks it
    backdated = after.model_copy(update={"at": T0 - timedelta(seconds=1)})
    assert "does not match" in (retired.event_problem(backdated) or "")


def test_retiring_an_unknown_or_retired_key_is_refused(signer: Signer, keyring: Keyring) -> None:
    with pytest.raises(SigningKeyError, match="holds no key ed25519:0000"):
        keyring.retire("ed25519:0000000000000000")
    retired = keyring.retire(signer.key_id, at=T0)
    with pytest.raises(SigningKeyError, match=re.escape(f"was retired at {T0.isoformat()}")):
        retired.retire(signer.key_id)
    with pytest.raises(SigningKeyError, match="already holds"):
        keyring.with_key(signer.trusted())


def test_off_checks_nothing_check_counts_and_require_refuses(
    signer: Signer, keyring: Keyring
) -> None:
    good = signer.sign_event(_event())
    bad = good.model_copy(update={"seq": 9})
    unsigned = _event()
    assert NO_SIGNATURES.mode == "off"
    for off in (NO_SIGNATURES, Signatures("off", keyring)):
        assert off.check(bad) is None and off.check(unsigned) is None
    check = Signatures("check", keyring)
    assert check.check(good) is None
    assert "does not match its signature" in (check.check(bad) or "")
    assert "is not signed" in (check.check(unsigned) or "")
    require = Signatures("require", keyring)
    assert require.check(good) is None
    with pytest.raises(
        SignatureError, match=rf"session 's1', user 'ada', seq 9\) does not match .*{signer.key_id}"
    ):
        require.check(bad)
    with pytest.raises(SignatureError, match="is not signed"):
        require.check(unsigned)


@pytest.mark.parametrize("mode", ["check", "require"])
def test_checking_without_a_keyring_is_refused(mode: Any) -> None:
    with pytest.raises(SigningKeyError, match="needs a keyring"):
        Signatures(mode)


# --- key files ---------------------------------------------------------------------------


def test_a_key_file_is_new_owner_only_and_reads_back_as_the_same_key(tmp_path: Path) -> None:
    signer = Signer.generate()
    path = tmp_path / "writer.pem"
    signer.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again = Signer.from_file(path)
    assert again.key_id == signer.key_id
    assert Keyring.of(signer.trusted()).event_problem(again.sign_event(_event())) is None
    # never overwritten, not even by the same key
    before = path.read_bytes()
    with pytest.raises(SigningKeyError, match="exists: a key file is never overwritten"):
        Signer.generate().write(path)
    assert path.read_bytes() == before


def test_a_key_given_as_its_seed_is_the_same_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    text = base64.urlsafe_b64encode(seed).decode().rstrip("=")
    assert Signer.from_text(text, "X").key_id == key_id_of(private.public_key())
    assert repr(Signer.from_text(text, "X")) == f"Signer({key_id_of(private.public_key())})"


def _secret_of(signer: Signer) -> str:
    """The base64 body of a key's PEM: what no message may contain any part of."""
    return "".join(signer.pem().decode().splitlines()[1:-1])


def test_a_key_file_that_is_no_ed25519_key_is_refused_naming_it_never_its_bytes(
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    signer = Signer.generate()
    body = _secret_of(signer)
    truncated = tmp_path / "truncated.pem"
    truncated.write_text(signer.pem().decode()[:-40])
    short_seed = tmp_path / "seed.txt"
    short_seed.write_text(body[:30])
    other = tmp_path / "ec.pem"
    ec_key = ec.generate_private_key(ec.SECP256R1())
    other.write_bytes(
        ec_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    for path, said in [
        (truncated, "is not an Ed25519 private key"),
        (short_seed, "is not an Ed25519 private key"),
        (other, "PrivateKey, not Ed25519"),
        (tmp_path / "missing.pem", "cannot read the signing key file"),
    ]:
        with pytest.raises(SigningKeyError) as refused:
            Signer.from_file(path)
        message = str(refused.value)
        assert str(path) in message and said in message, message
        assert body[:30] not in message and body[-30:] not in message
        # nor does a traceback logged of it: the parser's error is not chained
        error = refused.value
        assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


# --- keyrings ---------------------------------------------------------------------------


def test_a_keyring_file_reads_back_as_it_was_saved(tmp_path: Path, signer: Signer) -> None:
    audit = Signer.generate()
    keyring = Keyring.of(
        signer.trusted(("events",), added_at=T0), audit.trusted(("digests",), added_at=T0)
    ).retire(signer.key_id, at=T0 + timedelta(hours=1))
    path = tmp_path / "keyring.json"
    keyring.save(path)
    loaded = Keyring.load(path)
    assert loaded.keys.keys() == keyring.keys.keys()
    for key_id, key in keyring.keys.items():
        got = loaded.keys[key_id]
        assert (got.roles, got.added_at) == (key.roles, key.added_at)
        assert got.retired_at == key.retired_at
        assert got.public.public_bytes_raw() == key.public.public_bytes_raw()
    assert b"PRIVATE" not in path.read_bytes()  # it holds no secret
    assert [p.name for p in tmp_path.iterdir()] == ["keyring.json"]  # no temporary left


def _entry(signer: Signer, **changes: Any) -> dict[str, Any]:
    return {**signer.trusted(("events",), added_at=T0).to_json(), **changes}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{not json", "is not JSON"),
        (b'[{"id": "x"}]', 'is not {"keys": [...]}'),
        (b'{"keys": {}}', 'is not {"keys": [...]}'),
        (None, "cannot read the keyring"),
    ],
    ids=["not-json", "a-list", "keys-not-a-list", "missing"],
)
def test_a_keyring_that_is_not_one_is_refused_naming_the_file(
    tmp_path: Path, body: bytes | None, said: str
) -> None:
    path = tmp_path / "keyring.json"
    if body is not None:
        path.write_bytes(body)
    with pytest.raises(SigningKeyError) as refused:
        Keyring.load(path)
    assert str(path) in str(refused.value) and said in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"public": "AAAA"}, "a key entry is malformed (ValueError"),
        ({"public": None}, "a key entry is malformed"),
        ({"roles": ["events", "payments"]}, "each is one of events, digests"),
        ({"roles": []}, "a key entry is malformed"),
        ({"added_at": "yesterday"}, "a key entry is malformed"),
        ({"id": "ed25519:0000000000000000"}, "holds the public key of"),
    ],
    ids=["short-key", "no-key", "unknown-role", "no-role", "bad-date", "other-id"],
)
def test_a_malformed_keyring_entry_is_refused_naming_the_file(
    tmp_path: Path, signer: Signer, changes: dict[str, Any], said: str
) -> None:
    path = tmp_path / "keyring.json"
    good = Signer.generate()
    path.write_bytes(orjson.dumps({"keys": [_entry(good), _entry(signer, **changes)]}))
    with pytest.raises(SigningKeyError) as refused:
        Keyring.load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and said in message, message


def test_an_entry_whose_id_names_another_key_is_refused() -> None:
    """An id is derived from its key: an entry cannot lend a trusted id to another key."""
    trusted, other = Signer.generate(), Signer.generate()
    entry = {**_entry(other), "id": trusted.key_id}
    with pytest.raises(SigningKeyError, match=f"the entry '{trusted.key_id}' holds the public"):
        TrustedKey.from_json(entry, "keyring.json")


# --- a public key as text ------------------------------------------------------------------


def test_a_public_key_travels_as_one_line_checked_against_its_id(signer: Signer) -> None:
    line = public_text(signer.public)
    key_id, encoded = line.split(" ")
    assert key_id == signer.key_id and len(encoded) == 43 and "\n" not in line
    for text in (line, f"  {line}\n", encoded):
        assert key_id_of(public_from_text(text, "writer.pub")) == signer.key_id
    from cryptography.hazmat.primitives import serialization

    pem = signer.public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    assert key_id_of(public_from_text(pem, "writer.pub")) == signer.key_id


def test_a_public_key_whose_id_does_not_match_is_refused(signer: Signer) -> None:
    other = Signer.generate()
    changed = f"{other.key_id} {public_text(signer.public).split()[1]}"
    with pytest.raises(SigningKeyError) as refused:
        public_from_text(changed, "writer.pub")
    assert str(refused.value).startswith(
        f"writer.pub names the key {other.key_id} but holds the key {signer.key_id}"
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "ed25519:nothex0000000000 " + "A" * 43,
        "A" * 42,
        "A" * 43 + " " + "A" * 43,
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----",
    ],
)
def test_text_that_is_no_public_key_is_refused_without_repeating_it(text: str) -> None:
    with pytest.raises(SigningKeyError) as refused:
        public_from_text(text, "the argument")
    message = str(refused.value)
    assert message.startswith("the argument is not an Ed25519 public key"), message
    assert not text or text not in message


def test_a_private_key_given_as_public_is_refused_never_echoed(tmp_path: Path) -> None:
    signer = Signer.generate()
    body = _secret_of(signer)
    with pytest.raises(SigningKeyError) as refused:
        public_from_text(signer.pem().decode(), "writer.pem")
    message = str(refused.value)
    assert message.startswith("writer.pem holds a private key") and body[:20] not in message
    assert "`loomflow keys public KEYFILE`" in message


def test_signing_loads_cryptography_only_when_a_key_is_used() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, loomflow.schemas.signing, loomflow.settings; "
        "print('cryptography' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_")},
    )
    assert done.stdout == "False\n"


def test_a_run_finished_signed_with_or_without_its_answer_verifies(
    signer: Signer, keyring: Keyring
) -> None:
    """The answer left out of a new run.finished changes no old event's signed bytes."""
    for output in ("Oslo it is.", None):
        event = RunFinished(
            session_id="s1",
            run_id="run1",
            seq=4,
            epoch=1,
            at=T0,
            payload=RunFinishedPayload(output=output, turns=1, usage=Usage(input_tokens=9)),
        )
        signed = signer.sign_event(event)
        decoded = RunFinished.model_validate_json(signed.model_dump_json())
        assert decoded.payload.output == output
        assert keyring.event_problem(decoded) is None
        # the answer is among the signed bytes exactly when the event carries it
        assert (b'"output"' in signed_bytes(decoded)) is (output is not None)
