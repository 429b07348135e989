"""Signatures of events and of audit digests: Ed25519, with key ids and rotation.

A writer with a signing key signs each event it appends: the signature covers the
event's canonical bytes (:func:`signed_bytes`: every field but ``sig``, so its scope,
seq, epoch and payload), and names the key by its id. A reader of the log checks the
signature against a :class:`Keyring` of public keys, so a verifier never holds what can
forge: Ed25519 rather than an HMAC, whose one shared secret would let every auditor and
consumer sign as a writer. A key is rotated by adding the new one to the keyring and
retiring the old one from a moment on; a retired key's signature holds only on what it
signed before then.

Each key of a keyring has its roles: ``events`` (a writer's: agents, the CLI's lifecycle
verbs) or ``digests`` (the audit's). A writer's key then cannot sign a digest a verifier
accepts: the digests are as trustworthy as the audit's machine, whatever becomes of a
writer's.

:class:`Signatures` is the one rule every reader applies (the projector, the audit, every
consumer of :mod:`loomflow.log`): ``off`` checks nothing, ``check`` counts what fails,
``require`` refuses it with a :class:`~loomflow.errors.SignatureError` naming the key
id, the session and the seq.

``cryptography`` is imported when a key is first used: a log without signatures never
loads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson

from loomflow.errors import SignatureError, SigningKeyError
from loomflow.schemas.clock import utcnow
from loomflow.schemas.events import EventBase, Signature
from loomflow.schemas.options import SignatureMode

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "DIGEST_DOMAIN",
    "EVENT_DOMAIN",
    "NO_SIGNATURES",
    "ROLES",
    "Keyring",
    "Role",
    "SignatureMode",
    "Signatures",
    "Signer",
    "TrustedKey",
    "key_id_of",
    "public_from_text",
    "public_text",
    "signed_bytes",
]

E = TypeVar("E", bound=EventBase)

#: what each kind of signed bytes starts with, so that a signature of one kind (an event)
#: can never be passed off as another (a digest)
EVENT_DOMAIN = b"loomflow.event.v1\n"
DIGEST_DOMAIN = b"loomflow.digest.v1\n"

#: what a key of a keyring may sign
Role = Literal["events", "digests"]
ROLES: tuple[Role, ...] = ("events", "digests")


def signed_bytes(event: EventBase) -> bytes:
    """What an event's signature covers: its canonical JSON (every field but ``sig``,
    sorted keys), the same however the log stored it.

    ``at`` is taken in UTC with microseconds: SQLite and PostgreSQL keep the moment, not
    the offset it was written with (an event dated ``+02:00`` comes back in UTC)."""
    body = event.model_dump(mode="json", exclude={"sig"})
    body["at"] = event.at.astimezone(UTC).isoformat(timespec="microseconds")
    return EVENT_DOMAIN + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _raw_public(public: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(public: Ed25519PublicKey) -> str:
    """A key's id: derived from the public key, so an id can never name another key."""
    return "ed25519:" + hashlib.sha256(_raw_public(public)).hexdigest()[:16]


#: a key id as :func:`key_id_of` makes it, and a public key's 32 bytes in base64url
_KEY_ID = re.compile(r"ed25519:[0-9a-f]{16}")
_PUBLIC = re.compile(r"[A-Za-z0-9_-]{43}")


def public_text(public: Ed25519PublicKey) -> str:
    """A public key as ``loomflow keys public`` prints it and ``loomflow keys add`` reads
    it: one line, its key id and its 32 raw bytes in base64url, so that the id, which
    the owner reads out too, is checked against the key on arrival."""
    return f"{key_id_of(public)} {_b64(_raw_public(public))}"


def public_from_text(text: str, where: str) -> Ed25519PublicKey:
    """The public key in ``text``: a line of :func:`public_text` (its id must be the
    key's), the key alone in base64url, or a PEM public key. ``where`` names the file or
    argument in errors, which never repeat the text: it may be a private key given by
    mistake, and that is refused."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    text = text.strip()
    if "PRIVATE KEY" in text:
        raise SigningKeyError(
            f"{where} holds a private key, which a keyring never takes: give its public "
            "half, which `loomflow keys public KEYFILE` prints"
        )
    expected = (
        f"{where} is not an Ed25519 public key: give the line `loomflow keys public "
        "KEYFILE` prints (a key id and the key in base64url), or the key alone"
    )
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode())
        except (ValueError, TypeError):
            raise SigningKeyError(expected) from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningKeyError(f"{where} holds a {type(key).__name__}, not an Ed25519 key")
        return key
    words = text.split()
    named = words[0] if len(words) == 2 else None
    if not (
        1 <= len(words) <= 2
        and _PUBLIC.fullmatch(words[-1])
        and (named is None or _KEY_ID.fullmatch(named))
    ):
        raise SigningKeyError(expected)
    try:
        public = Ed25519PublicKey.from_public_bytes(_unb64(words[-1]))
    except (ValueError, binascii.Error):
        raise SigningKeyError(expected) from None
    if named is not None and named != key_id_of(public):
        raise SigningKeyError(
            f"{where} names the key {named} but holds the key {key_id_of(public)}: it was "
            "changed on the way; ask its owner for `loomflow keys public` again"
        )
    return public


class Signer:
    """A writer's signing key: signs events and digests, naming itself by its key id."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public = private.public_key()
        self.key_id = key_id_of(self.public)

    def __repr__(self) -> str:  # never the key itself
        return f"Signer({self.key_id})"

    @classmethod
    def generate(cls) -> Signer:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_text(cls, text: str, where: str) -> Signer:
        """The key in ``text``: a PEM private key (what ``loomflow keys new`` writes) or
        its 32-byte seed in base64. ``where`` names the setting or file for errors."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        text = text.strip()
        try:
            if text.startswith("-----BEGIN"):
                key = serialization.load_pem_private_key(text.encode(), password=None)
            else:
                key = Ed25519PrivateKey.from_private_bytes(_unb64(text))
        except (ValueError, TypeError, binascii.Error) as exc:
            raise SigningKeyError(
                f"the signing key in {where} is not an Ed25519 private key (a PEM file "
                f"from `loomflow keys new`, or a base64 32-byte seed): {type(exc).__name__}"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(
                f"the signing key in {where} is a {type(key).__name__}, not Ed25519"
            )
        return cls(key)

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        try:
            text = path.read_text()
        except OSError as exc:
            raise SigningKeyError(f"cannot read the signing key file {path}: {exc}") from None
        return cls.from_text(text, str(path))

    def pem(self) -> bytes:
        """The private key as an unencrypted PKCS#8 PEM (keep it as a secret)."""
        from cryptography.hazmat.primitives import serialization

        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, path: Path) -> None:
        """Write the private key to a new file only its owner can read."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise SigningKeyError(f"{path} exists: a key file is never overwritten") from None
        with os.fdopen(fd, "wb") as out:
            out.write(self.pem())

    def sign(self, data: bytes) -> Signature:
        return Signature(key=self.key_id, value=_b64(self._private.sign(data)))

    def sign_event(self, event: E) -> E:
        """The event with this key's signature (a signature it had is replaced)."""
        return event.model_copy(update={"sig": self.sign(signed_bytes(event))})

    def trusted(
        self, roles: tuple[Role, ...] = ROLES, added_at: datetime | None = None
    ) -> TrustedKey:
        """This key as a keyring holds it (its public half), for ``roles``."""
        return TrustedKey(self.key_id, self.public, added_at or utcnow(), None, roles)


@dataclass(frozen=True)
class TrustedKey:
    """A public key of a keyring: valid for what was signed at or before ``retired_at``
    (None: not retired), and for what its ``roles`` say it may sign."""

    key_id: str
    public: Ed25519PublicKey
    added_at: datetime
    retired_at: datetime | None
    roles: tuple[Role, ...] = ROLES

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.key_id,
            "public": _b64(_raw_public(self.public)),
            "roles": list(self.roles),
            "added_at": self.added_at.isoformat(),
            "retired_at": None if self.retired_at is None else self.retired_at.isoformat(),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> TrustedKey:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            public = Ed25519PublicKey.from_public_bytes(_unb64(data["public"]))
            added = datetime.fromisoformat(data["added_at"])
            retired = data.get("retired_at")
            roles = tuple(data["roles"])
            if not roles or any(role not in ROLES for role in roles):
                raise ValueError(f"roles {list(roles)}: each is one of {', '.join(ROLES)}")
            key = cls(
                key_id_of(public),
                public,
                added,
                None if retired is None else datetime.fromisoformat(retired),
                roles,
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise SigningKeyError(
                f"{where}: a key entry is malformed ({type(exc).__name__}: {exc}); each is "
                '{"id", "public", "roles", "added_at", "retired_at"}'
            ) from None
        if data.get("id") != key.key_id:
            raise SigningKeyError(
                f"{where}: the entry {data.get('id')!r} holds the public key of "
                f"{key.key_id}: an id is derived from its key and cannot be changed"
            )
        return key


@dataclass(frozen=True)
class Keyring:
    """The public keys a verifier trusts, by key id."""

    keys: Mapping[str, TrustedKey]

    @classmethod
    def of(cls, *keys: TrustedKey) -> Keyring:
        return cls({key.key_id: key for key in keys})

    @classmethod
    def load(cls, path: Path) -> Keyring:
        """The keyring file ``path`` (JSON, written by ``loomflow keys``)."""
        try:
            data = orjson.loads(path.read_bytes())
        except OSError as exc:
            raise SigningKeyError(f"cannot read the keyring {path}: {exc}") from None
        except orjson.JSONDecodeError as exc:
            raise SigningKeyError(f"the keyring {path} is not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise SigningKeyError(f'the keyring {path} is not {{"keys": [...]}}')
        return cls.of(*(TrustedKey.from_json(entry, str(path)) for entry in data["keys"]))

    def save(self, path: Path) -> None:
        """Write the keyring (it holds no secret), replacing the file at once."""
        body = {"keys": [key.to_json() for key in self.keys.values()]}
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
        temporary.replace(path)

    def with_key(self, key: TrustedKey) -> Keyring:
        if key.key_id in self.keys:
            raise SigningKeyError(f"the keyring already holds {key.key_id}")
        return Keyring({**self.keys, key.key_id: key})

    def retire(self, key_id: str, at: datetime | None = None) -> Keyring:
        """The keyring with ``key_id`` valid only for what it signed until ``at`` (now)."""
        key = self.keys.get(key_id)
        if key is None:
            raise SigningKeyError(f"the keyring holds no key {key_id}")
        if key.retired_at is not None:
            raise SigningKeyError(f"{key_id} was retired at {key.retired_at.isoformat()}")
        return Keyring({**self.keys, key_id: replace(key, retired_at=at or utcnow())})

    def refusal(self, key_id: str, role: Role, at: datetime) -> str | None:
        """Why what key ``key_id`` signs at ``at`` for ``role`` is refused by a reader
        with this keyring (None: it is not), the reason as ``problem`` gives it."""
        key = self.keys.get(key_id)
        if key is None:
            return f"key {key_id} is not in the keyring"
        if role not in key.roles:
            return f"the keyring trusts key {key_id} to sign {' and '.join(key.roles)} only"
        if key.retired_at is not None and at > key.retired_at:
            return f"key {key_id} was retired at {key.retired_at.isoformat()}"
        return None

    def problem(
        self, data: bytes, sig: Signature | None, at: datetime, what: str, role: Role
    ) -> str | None:
        """Why ``sig`` is not a valid signature of ``data`` made at ``at`` by a key
        trusted for ``role`` (None: it is); ``what`` names the signed thing in the reason."""
        from cryptography.exceptions import InvalidSignature

        if sig is None:
            return f"{what} is not signed"
        key = self.keys.get(sig.key)
        if key is None:
            return f"{what} is signed by key {sig.key}, which the keyring does not hold"
        if role not in key.roles:
            return (
                f"{what} is signed by key {sig.key}, which the keyring trusts to sign "
                f"{' and '.join(key.roles)} only, not {role}"
            )
        if key.retired_at is not None and at > key.retired_at:
            return (
                f"{what} is signed by key {sig.key}, retired at {key.retired_at.isoformat()}, "
                f"but is dated {at.isoformat()}"
            )
        try:
            key.public.verify(_unb64(sig.value), data)
        except (InvalidSignature, ValueError, binascii.Error):
            return f"{what} does not match its signature by key {sig.key}"
        return None

    def event_problem(self, event: EventBase) -> str | None:
        """Why the event's signature does not hold (None: it does)."""
        what = (
            f"event {event.event_id} (session {event.session_id!r}, user "
            f"{event.user_id!r}, seq {event.seq})"
        )
        return self.problem(signed_bytes(event), event.sig, event.at, what, "events")


@dataclass(frozen=True)
class Signatures:
    """What a reader of the log does with events' signatures: the mode and the keyring
    it checks them against (None only with ``off``)."""

    mode: SignatureMode = "off"
    keyring: Keyring | None = None

    def __post_init__(self) -> None:
        if self.mode != "off" and self.keyring is None:
            raise SigningKeyError(
                f"signatures={self.mode} needs a keyring (LOOMFLOW_KEYRING) or a signing key"
            )

    def check(self, event: EventBase) -> str | None:
        """The one rule: None when the event passes (or nothing is checked); in
        ``check`` mode, why it does not, to count; in ``require`` mode a failure raises
        :class:`~loomflow.errors.SignatureError`."""
        if self.keyring is None or self.mode == "off":
            return None
        problem = self.keyring.event_problem(event)
        if problem is not None and self.mode == "require":
            raise SignatureError(problem)
        return problem


#: what a reader does with no signature settings
NO_SIGNATURES = Signatures()
