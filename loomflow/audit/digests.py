"""Signed digests of the audit trail, written outside the store they cover.

A per-session hash chain proves order, not completeness: whoever can write the log and
the trail can cut both at the same record, drop a session from both, or rewrite both
consistently. A digest, like CloudTrail's digest files or Certificate Transparency's
signed tree heads, commits to what the trail held: the head (``n``, seq, hash) of every
session whose chain grew since the previous digest, the count of entries, and the hash of
the previous digest, signed by the audit's key. Kept where the store's writers cannot
write (a directory another account owns, a topic of its own, an external system reading
standard output), the digests let ``loomflow audit verify --digests`` prove that every
record they commit to is still in the trail, as it was.

- :class:`Digest` is the JSON of one digest; :func:`digest_hash` is what the next one
  chains to.
- A :class:`Place` is where digests go: a directory (``digest-000001.json``, never
  overwritten), ``kafka:<topic>`` (a topic of one partition, kept forever), or ``-``
  (standard output when written, standard input when verified).
- :class:`DigestWriter` writes one when the audit has chained enough records, or enough
  time has passed (``LOOMFLOW_AUDIT_DIGEST_EVENTS``, ``..._SECONDS``), or when asked.
- :func:`check_digests` reads them back, checks each (decodes, signed by a key of the
  keyring, chained to the one before) and says what they commit to.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loomflow.errors import SigningKeyError, StoreError
from loomflow.projections.chain import GENESIS
from loomflow.projections.trail import Digested, SessionHead, Trail
from loomflow.schemas.clock import utcnow
from loomflow.schemas.events import Signature
from loomflow.schemas.scope import Scope
from loomflow.schemas.signing import DIGEST_DOMAIN, Keyring, Signer

if TYPE_CHECKING:
    from loomflow.settings import Settings

__all__ = [
    "Committed",
    "Digest",
    "DigestFinding",
    "DigestHead",
    "DigestWriter",
    "Digests",
    "Place",
    "check_digests",
    "digest_hash",
    "digest_writer",
    "place_of",
]

KIND: Literal["loomflow.audit.digest"] = "loomflow.audit.digest"


class DigestHead(BaseModel):
    """A session's chain as a digest commits to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    user_id: str | None
    session_id: str
    n: int = Field(ge=1)
    seq: int = Field(ge=0)
    hash: str = Field(min_length=64, max_length=64)


class Digest(BaseModel):
    """One digest: ``n`` counts the trail's digests from 1; ``prev`` is the previous
    one's :func:`digest_hash` (:data:`GENESIS` for the first); ``records`` the entries
    the trail held; ``sessions`` the heads of the chains that grew since ``prev``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["loomflow.audit.digest"] = KIND
    v: Literal[1] = 1
    n: int = Field(ge=1)
    at: datetime
    log: str
    prev: str = Field(min_length=64, max_length=64)
    records: int = Field(ge=0)
    sessions: tuple[DigestHead, ...]
    sig: Signature | None = None

    def signed_bytes(self) -> bytes:
        body = self.model_dump(mode="json", exclude={"sig"})
        return DIGEST_DOMAIN + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def digest_hash(digest: Digest) -> str:
    """What the next digest's ``prev`` holds: the hash of this one, signature included."""
    return hashlib.sha256(digest.to_json()).hexdigest()


# -- where digests go -------------------------------------------------------------------


class Place(ABC):
    """Where digests are written and read back from."""

    #: for messages: "digest directory /var/audit", "Kafka topic audit.digests"
    where: str

    @property
    def source(self) -> str:
        """What the digests are read from, for messages (the same place but a stream's)."""
        return self.where

    @abstractmethod
    async def write(self, digest: Digest) -> str:
        """Write one digest; return where it went (a file, a topic's offset)."""

    @abstractmethod
    async def read(self) -> list[tuple[str, bytes]]:
        """Every digest held, as (where, bytes), in the order written."""


class DirectoryPlace(Place):
    """A directory: ``digest-000001.json`` and on, each file written once and never
    replaced. A digest written again after its trail failed to keep it (the place took
    it, then the trail's database went away) goes beside the first as
    ``digest-000002.2.json``: both chain to the same digest, both are the audit's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = f"digest directory {path}"

    async def write(self, digest: Digest) -> str:
        return await asyncio.to_thread(self._write, digest)

    def _write(self, digest: Digest) -> str:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for again in range(1, 100):
                name = f"digest-{digest.n:06d}" + (f".{again}" if again > 1 else "") + ".json"
                target = self.path / name
                try:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    break
                except FileExistsError:
                    there = Digest.model_validate_json(target.read_bytes())
                    if there.prev != digest.prev:
                        raise StoreError(
                            f"{target}: digest {digest.n} of another trail is there already; "
                            "give each trail a digest place of its own"
                        ) from None
            else:
                raise StoreError(f"digest {digest.n} was written to the {self.where} 99 times")
            with os.fdopen(fd, "wb") as out:
                out.write(digest.to_json() + b"\n")
                out.flush()
                os.fsync(out.fileno())
            _sync_directory(self.path)
        except ValidationError as exc:
            raise StoreError(f"{target} is not a digest, and is in the way: {exc}") from None
        except OSError as exc:
            raise StoreError(f"cannot write to the {self.where}: {exc}") from None
        return str(target)

    async def read(self) -> list[tuple[str, bytes]]:
        return await asyncio.to_thread(self._read)

    def _read(self) -> list[tuple[str, bytes]]:
        if not self.path.is_dir():
            raise StoreError(f"the {self.where} does not exist or is not a directory")
        try:
            files = sorted(self.path.glob("digest-*.json"), key=_numbered)
            return [(str(p), p.read_bytes()) for p in files]
        except OSError as exc:
            raise StoreError(f"cannot read the {self.where}: {exc}") from None


def _numbered(path: Path) -> tuple[int, int, str]:
    """A digest file's place in the order written: its number, then which write of it."""
    parts = path.name.removeprefix("digest-").removesuffix(".json").split(".")
    numbers = [int(p) if p.isdigit() else 0 for p in parts[:2]] + [1]
    return numbers[0], numbers[1], path.name


def _sync_directory(path: Path) -> None:
    """Make a new file's name durable (the file's own fsync does not)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StreamPlace(Place):
    """Standard output (written, one JSON line each) and standard input (read)."""

    where = "standard output"
    source = "standard input"

    async def write(self, digest: Digest) -> str:
        sys.stdout.buffer.write(digest.to_json() + b"\n")
        sys.stdout.buffer.flush()
        return "standard output"

    async def read(self) -> list[tuple[str, bytes]]:
        data = await asyncio.to_thread(sys.stdin.buffer.read)
        lines = [line for line in data.splitlines() if line.strip()]
        return [(f"standard input, line {k}", line) for k, line in enumerate(lines, 1)]


class KafkaPlace(Place):
    """A topic of its own, one partition (the digests' one order), kept forever."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self.where = f"Kafka topic {topic}"

    async def write(self, digest: Digest) -> str:
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError

        from loomflow.producers.topics import started

        await self._ensure()
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
        )
        await started(producer, self.settings.kafka_bootstrap)
        try:
            sent = await producer.send_and_wait(self.topic, digest.to_json(), partition=0)
        except KafkaError as exc:
            raise StoreError(
                f"writing digest {digest.n} to the {self.where} failed: {exc}"
            ) from exc
        finally:
            await producer.stop()
        return f"{self.where} at offset {sent.offset}"

    async def _ensure(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import KafkaError, TopicAlreadyExistsError

        from loomflow.producers.topics import unreachable

        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        try:
            await admin.start()
        except KafkaError as exc:
            raise unreachable(self.settings.kafka_bootstrap, exc) from exc
        try:
            if self.topic in set(await admin.list_topics()):
                return
            configs = {"cleanup.policy": "delete", "retention.ms": "-1"}
            topic = NewTopic(self.topic, 1, self.settings.topic_replication, topic_configs=configs)
            response = await admin.create_topics([topic])
            for name, code, *_ in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise StoreError(f"creating Kafka topic {name} failed: error code {code}")
        finally:
            await admin.close()

    async def read(self) -> list[tuple[str, bytes]]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from loomflow.producers.topics import started

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap, enable_auto_commit=False
        )
        await started(consumer, self.settings.kafka_bootstrap)
        try:
            partitions = consumer.partitions_for_topic(self.topic)
            if not partitions:  # not known yet to this new client: ask the cluster
                await consumer._client.force_metadata_update()
                partitions = consumer.partitions_for_topic(self.topic)
            if not partitions:
                raise StoreError(f"the {self.where} does not exist: no digests were written")
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            out: list[tuple[str, bytes]] = []
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                for record in batch.get(tp, []):
                    out.append((f"{self.where} offset {record.offset}", record.value or b""))
            return out
        finally:
            await consumer.stop()


def place_of(text: str, settings: Settings) -> Place:
    """The place ``text`` names: ``-``, ``kafka:<topic>``, or a directory."""
    text = text.strip()
    if not text:
        raise StoreError("an empty digest place: give a directory, kafka:<topic> or -")
    if text == "-":
        return StreamPlace()
    if text.startswith("kafka:"):
        topic = text.removeprefix("kafka:")
        if not topic or any(c not in _TOPIC_CHARS for c in topic) or len(topic) > 249:
            raise StoreError(f"{text!r}: a Kafka topic name is 1-249 of A-Z a-z 0-9 . _ -")
        return KafkaPlace(settings, topic)
    return DirectoryPlace(Path(text))


_TOPIC_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


# -- writing ----------------------------------------------------------------------------


@dataclass
class DigestWriter:
    """Writes the trail's next digest to ``place``, signed by ``signer``: when one is due
    (``every_events`` entries since the last, or ``every_seconds`` since it, or none
    written yet), or now."""

    trail: Trail
    place: Place
    signer: Signer
    log: str
    every_events: int = 10_000
    every_seconds: float = 3600.0
    written: list[str] = field(default_factory=list)
    #: entries chained since the last digest, and when it was written: read from the trail
    #: once, then kept by counting what the audit adds (no count of the trail per batch)
    _fresh: int | None = None
    _last_at: datetime | None = None

    async def maybe(self, added: int) -> Digest | None:
        """Write a digest if one is due, ``added`` entries after the last call; return it."""
        if self._fresh is None:
            last = await self.trail.digested()
            self._last_at = None if last is None else last.at
            self._fresh = await self.trail.entry_count() - (0 if last is None else last.records)
        else:
            self._fresh += added
        if self._fresh <= 0:
            return None
        if (
            self._last_at is not None
            and self._fresh < self.every_events
            and (utcnow() - self._last_at).total_seconds() < self.every_seconds
        ):
            return None
        return await self.write()

    async def write(self) -> Digest:
        """Write the next digest now (one that names no session when no chain grew since
        the last: it still says the trail held what it held, then)."""
        made: list[Digest] = []

        async def make(
            last: Digested | None, heads: list[SessionHead], count: int
        ) -> tuple[Digested, bytes]:
            unsigned = Digest(
                n=(last.n if last else 0) + 1,
                at=utcnow(),
                log=self.log,
                prev=last.hash if last else GENESIS,
                records=count,
                sessions=tuple(
                    DigestHead(
                        user_id=h.user_id, session_id=h.session_id, n=h.n, seq=h.seq, hash=h.hash
                    )
                    for h in heads
                ),
            )
            digest = unsigned.model_copy(update={"sig": self.signer.sign(unsigned.signed_bytes())})
            self.written.append(await self.place.write(digest))
            made.append(digest)
            return Digested(digest.n, digest_hash(digest), digest.at, count), digest.to_json()

        await self.trail.write_digest(make)
        (digest,) = made
        self._fresh, self._last_at = 0, digest.at
        return digest


def digest_writer(
    trail: Trail, settings: Settings, log: str, place: str | None = None
) -> DigestWriter | None:
    """The digest writer the settings ask for (``place`` over ``audit_digests``); None
    when no place is set. Refused without a signing key: a digest is signed."""
    where = place or settings.audit_digests
    if where is None:
        return None
    signer = settings.signer("digests")
    if signer is None:
        raise SigningKeyError(
            "audit digests are signed: set LOOMFLOW_SIGNING_KEY_FILE (`loomflow keys new`) "
            "or LOOMFLOW_SIGNING_KEY"
        )
    return DigestWriter(
        trail,
        place_of(where, settings),
        signer,
        log,
        settings.audit_digest_events,
        settings.audit_digest_seconds,
    )


# -- checking ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DigestFinding:
    """Something wrong with the digests themselves: ``where`` one is, what."""

    where: str
    detail: str


@dataclass(frozen=True)
class Committed:
    """What the digests commit to of one session: its chain through entry ``n`` (seq
    ``seq``, hash ``hash``), by digest ``digest`` written ``at``; ``by_digest`` holds
    every (digest, head ``n``, when) that named the session, in digest order, for a
    verifier to tell which digest first committed an entry."""

    n: int
    seq: int
    hash: str
    digest: int
    at: datetime
    by_digest: tuple[tuple[int, int, datetime], ...]

    def first_committed(self, n: int) -> tuple[int, datetime] | None:
        """The first digest that committed entry ``n`` of the session, and when."""
        for digest, head, at in self.by_digest:
            if head >= n:
                return digest, at
        return None


@dataclass
class Digests:
    """What the digests read from a place commit to, and what is wrong with them."""

    where: str
    count: int = 0
    last: Digest | None = None
    sessions: dict[Scope, Committed] = field(default_factory=dict)
    findings: list[DigestFinding] = field(default_factory=list)


def check_digests(place: str, records: Sequence[tuple[str, bytes]], keyring: Keyring) -> Digests:
    """Decode, authenticate and chain the digests read from ``place``: each must decode,
    be signed by a key the keyring trusts for digests and did not retire before it was
    written, and chain to a digest numbered one before it, from 1 with none missing.

    Two digests of one number that chain to the same one are a digest written again
    after its trail failed to keep it (both are the audit's, both true); two that chain
    to different ones are not one trail's. What the valid digests commit to is merged:
    each session's highest head."""
    out = Digests(place)
    if not records:
        out.findings.append(DigestFinding(place, "holds no digest"))
        return out
    valid: dict[int, list[tuple[str, Digest]]] = defaultdict(list)
    for where, raw in records:
        try:
            digest = Digest.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'digest'}: {e['msg']}"
                for e in exc.errors()[:3]
            )
            out.findings.append(DigestFinding(where, f"not a digest ({problems})"))
            continue
        what = f"digest {digest.n}"
        problem = keyring.problem(digest.signed_bytes(), digest.sig, digest.at, what, "digests")
        if problem is not None:
            out.findings.append(DigestFinding(where, problem))
            continue
        valid[digest.n].append((where, digest))
    hashes = {n: {digest_hash(d) for _, d in same} for n, same in valid.items()}
    expected = 1
    for n in sorted(valid):
        same = valid[n]
        if n > expected:
            gap = (
                f"digest {expected} is" if n == expected + 1 else f"digests {expected}..{n - 1} are"
            )
            out.findings.append(
                DigestFinding(
                    same[0][0], f"{gap} missing before digest {n}: deleted, or never written here"
                )
            )
        before = {GENESIS} if n == 1 else hashes.get(n - 1)
        for where, digest in same:
            if before is not None and digest.prev not in before:
                out.findings.append(
                    DigestFinding(
                        where,
                        f"digest {n} does not chain to digest {n - 1} as read: one of them "
                        "was replaced, or they are not one trail's",
                    )
                )
        if len({digest.prev for _, digest in same}) > 1:
            places = ", ".join(where for where, _ in same)
            out.findings.append(
                DigestFinding(places, f"two different digests numbered {n}: not one trail's")
            )
        expected = n + 1
    ordered = [digest for n in sorted(valid) for _, digest in valid[n]]
    out.count = len(ordered)
    out.last = ordered[-1] if ordered else None
    by_session: dict[Scope, list[tuple[int, int, datetime]]] = defaultdict(list)
    best: dict[Scope, tuple[DigestHead, Digest]] = {}
    for digest in ordered:
        for head in digest.sessions:
            scope = Scope(head.session_id, head.user_id)
            by_session[scope].append((digest.n, head.n, digest.at))
            if scope not in best or head.n > best[scope][0].n:
                best[scope] = (head, digest)
    for scope, (head, digest) in best.items():
        out.sessions[scope] = Committed(
            head.n, head.seq, head.hash, digest.n, digest.at, tuple(by_session[scope])
        )
    return out
