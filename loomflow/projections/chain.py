"""The audit trail as a fold of the log: entries chained by hash per session, and their
verification.

Plain functions with no I/O (the trail's interface is in ``projections/trail.py``, its
SQL in each dialect's ``audit.py``, the consumer that feeds it in ``audit/auditor.py``).
Each record of the log becomes one entry of its session's chain, keyed by its
:class:`~loomflow.schemas.scope.Scope`::

    digest = sha256(canonical bytes)        hash = sha256(prev hash : n : digest)

``n`` counts the session's entries from 1, and the first entry's ``prev`` is
:data:`GENESIS`. An erasure (``session.erased``) or a prune note is an entry too; it
redacts the bodies of the entries it removed from the log but keeps their digests and
hashes, so the chain still verifies and the removal reads as what it is.

:func:`verify` compares a session's chain with the log read again: it finds entries
deleted, inserted, reordered or altered on either side, and says where the chain breaks.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import orjson

from loomflow.schemas import Event
from loomflow.schemas.scope import Scope, scope_of

__all__ = [
    "GENESIS",
    "NOTE_TYPE",
    "Chained",
    "Entry",
    "Finding",
    "Head",
    "Link",
    "canonical",
    "chain",
    "entry_hash",
    "note_body",
    "verify",
]

GENESIS = "0" * 64
#: the type of the entry a prune note becomes
NOTE_TYPE = "log.pruned"


@dataclass(frozen=True)
class Link:
    """What the chain keeps of one log record, before it is chained."""

    user_id: str | None
    session_id: str
    position: str
    key: str  # the event id, or ``note:<position>`` for a prune note
    seq: int
    type: str
    at: datetime
    body: bytes

    @property
    def scope(self) -> Scope:
        return scope_of(self)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One entry of a session's chain, as the trail stores it."""

    user_id: str | None
    session_id: str
    n: int
    position: str
    key: str
    seq: int
    type: str
    at: datetime
    digest: str
    body: bytes | None  # None once erasure or prune removed the record from the log
    prev: str
    hash: str

    @property
    def scope(self) -> Scope:
        return scope_of(self)


@dataclass(frozen=True)
class Head:
    """The newest entry of a session's chain: where the next one links."""

    n: int
    hash: str


def canonical(event: Event) -> bytes:
    """The event's canonical bytes: its JSON with every field and sorted keys, the same
    however the log stored it (a Kafka record's JSON or a SQLite row's columns)."""
    return orjson.dumps(event.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def note_body(
    user_id: str | None,
    session_id: str,
    seqs: tuple[int, ...] | None,
    through_seq: int,
    at: datetime,
) -> bytes:
    """The canonical bytes of a prune note (an embedded log's record that prune deleted
    rows; it is not an event)."""
    return orjson.dumps(
        {
            "type": NOTE_TYPE,
            "user_id": user_id,
            "session_id": session_id,
            "seqs": None if seqs is None else list(seqs),
            "through_seq": through_seq,
            "at": at.isoformat(),
        },
        option=orjson.OPT_SORT_KEYS,
    )


def entry_hash(prev: str, n: int, digest: str) -> str:
    """The hash of entry ``n``: it covers the previous entry's hash and this content."""
    return hashlib.sha256(f"{prev}:{n}:{digest}".encode()).hexdigest()


@dataclass
class Chained:
    """What one batch adds to the trail."""

    entries: list[Entry] = field(default_factory=list)
    #: per session, the entries whose bodies an erasure or prune in this batch removes:
    #: (scope, up to entry n, the seqs removed or None for all)
    redactions: list[tuple[Scope, int, tuple[int, ...] | None]] = field(default_factory=list)


def chain(links: Iterable[Link], heads: dict[Scope, Head]) -> Chained:
    """Chain links (in log order) onto the sessions' heads; ``heads`` is updated."""
    out = Chained()
    for link in links:
        head = heads.get(link.scope, Head(0, GENESIS))
        n, digest = head.n + 1, link.digest
        entry = Entry(
            link.user_id,
            link.session_id,
            n,
            link.position,
            link.key,
            link.seq,
            link.type,
            link.at,
            digest,
            link.body,
            head.hash,
            entry_hash(head.hash, n, digest),
        )
        out.entries.append(entry)
        heads[link.scope] = Head(n, entry.hash)
        removed = _removes(link.type, link.body)
        if removed is not False:
            out.redactions.append((link.scope, n - 1, removed))
    return out


def _removes(type_: str, body: bytes | None) -> tuple[int, ...] | Literal[False] | None:
    """Which earlier records of its session an entry removes from the log: the seqs,
    None for all of them, False for none."""
    if type_ == "session.erased":
        return None
    if type_ == NOTE_TYPE and body is not None:
        seqs = orjson.loads(body)["seqs"]
        return None if seqs is None else tuple(seqs)
    return False


# -- verification ----------------------------------------------------------------------


#: ``truncated``, ``rewritten``: against a digest (``audit/digests.py``); ``forged``: a
#: signature that does not hold
FindingKind = Literal[
    "deleted", "inserted", "reordered", "altered", "truncated", "rewritten", "forged"
]


@dataclass(frozen=True)
class Finding:
    """Something wrong with a session's chain or with its log."""

    kind: FindingKind
    n: int | None  # the entry where the chain breaks (None: the trail has no such entry)
    position: str | None  # the log position concerned
    detail: str


def verify(
    entries: Sequence[Entry],
    log: Sequence[Link],
    vacated: Callable[[str], bool],
    undecodable: Mapping[str, str] | None = None,
    held: Callable[[str], bool] | None = None,
    chained_as: Callable[[str], str | None] | None = None,
) -> list[Finding]:
    """What is wrong with one session's chain (``entries`` as stored, in ``n`` order)
    against its records in the log (``log``, in log order, read again).

    Records an erasure or a prune removed from the log are expected to be missing from
    it. ``vacated(position)`` says whether the log held a record at that position when
    it was audited and holds none now: an entry whose record is missing from the log was
    deleted from the log if so, and inserted into the trail if not, unless ``held(position)``
    says the log holds a record there now, which is then not the one the entry chained
    (its ids were changed in the log, or the entry was added to the trail). ``undecodable``
    maps the positions of records that no longer decode to the reason. ``chained_as(key)``
    names the other session whose chain holds a record the log now gives this one.
    """
    findings = _chain_breaks(entries)
    broken = {f.n for f in findings}
    by_key = {e.key: e for e in entries}
    in_log = {link.key for link in log}
    removed = _removed_keys(entries)
    trail_keys = [e.key for e in entries if not (e.key in removed and e.key not in in_log)]
    log_keys = [link.key for link in log]
    matcher = difflib.SequenceMatcher(a=trail_keys, b=log_keys, autojunk=False)
    missing_from_log: list[str] = []
    missing_from_trail: list[str] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for key, link in zip(trail_keys[i1:i2], log[j1:j2], strict=True):
                entry = by_key[key]
                # where the chain breaks, the trail was altered (reported above); where it
                # holds, the entry is as written, so the log's record changed since
                if entry.digest != link.digest and entry.n not in broken:
                    findings.append(
                        Finding(
                            "altered",
                            entry.n,
                            link.position,
                            f"the log's record at {link.position} (seq {link.seq}, {link.type}) "
                            f"was altered after it was audited: it no longer matches entry "
                            f"{entry.n}",
                        )
                    )
            continue
        missing_from_log += trail_keys[i1:i2]
        missing_from_trail += log_keys[j1:j2]
    moved = set(missing_from_log) & set(missing_from_trail)
    links = {link.key: link for link in log}
    # which side changed: where the chain holds, the trail is as it was written
    for key in missing_from_log:
        entry = by_key[key]
        what = f"entry {entry.n} (seq {entry.seq}, {entry.type}, {entry.key})"
        if key in moved:
            findings.append(
                Finding(
                    "reordered",
                    entry.n,
                    links[key].position,
                    f"{what} is at another place in the log ({links[key].position}) than "
                    "in the chain",
                )
            )
        elif undecodable and entry.position in undecodable:
            findings.append(
                Finding(
                    "altered",
                    entry.n,
                    entry.position,
                    f"{what}: the log's record at {entry.position} no longer decodes "
                    f"({undecodable[entry.position]})",
                )
            )
        elif entry.n not in broken and held is not None and held(entry.position):
            findings.append(
                Finding(
                    "altered",
                    entry.n,
                    entry.position,
                    f"{what}: the log's record at {entry.position} is not the one it "
                    "chained: its event, user or session id was changed in the log after "
                    "it was audited, or the entry was added to the trail",
                )
            )
        elif entry.n in broken or not vacated(entry.position):
            findings.append(
                Finding("inserted", entry.n, None, f"{what} was inserted into the trail")
            )
        else:
            findings.append(
                Finding(
                    "deleted",
                    entry.n,
                    entry.position,
                    f"{what} was deleted from the log (it was at {entry.position})",
                )
            )
    for key in missing_from_trail:
        if key in moved:
            continue
        link = links[key]
        other = None if chained_as is None else chained_as(key)
        if other is not None:  # audited as another session's: the log's ids changed since
            findings.append(
                Finding(
                    "altered",
                    None,
                    link.position,
                    f"the log's record at {link.position} (seq {link.seq}, {link.type}, "
                    f"{key}) was audited as {other}'s: its user or session id was changed "
                    "in the log after it was audited",
                )
            )
            continue
        # the log gave this record to the audit (it is within the audited positions), and
        # the audit chains every record it is given: its entry was taken out of the trail
        findings.append(
            Finding(
                "deleted",
                None,
                link.position,
                f"the log's record at {link.position} (seq {link.seq}, {link.type}, {key}) "
                "was audited, but its entry was deleted from the trail",
            )
        )
    return sorted(findings, key=lambda f: (f.n is None, f.n or 0))


def _removed_keys(entries: Sequence[Entry]) -> set[str]:
    """Keys of the entries that a later erasure or prune entry of the chain removed."""
    removed: set[str] = set()
    for k, entry in enumerate(entries):
        seqs = _removes(entry.type, entry.body)
        if seqs is False:
            continue
        for earlier in entries[:k]:
            if seqs is None or earlier.seq in seqs:
                removed.add(earlier.key)
    return removed


def _chain_breaks(entries: Sequence[Entry]) -> list[Finding]:
    """Where the stored chain itself does not hold: a gap in ``n``, a link to something
    other than the entry before it, a hash or digest that does not match."""
    findings: list[Finding] = []
    links_to, expected = {GENESIS}, 1
    hashes = {e.hash for e in entries}
    for entry in entries:
        computed = entry_hash(entry.prev, entry.n, entry.digest)
        where = entry.position
        if entry.n != expected:
            kind: FindingKind = "deleted" if entry.n > expected else "inserted"
            findings.append(
                Finding(
                    kind,
                    entry.n,
                    where,
                    f"the chain breaks at entry {entry.n}: expected entry {expected} "
                    + ("(entries are missing)" if kind == "deleted" else "(an extra entry)"),
                )
            )
        elif entry.prev not in links_to:
            findings.append(
                Finding(
                    "reordered" if entry.prev in hashes else "deleted",
                    entry.n,
                    where,
                    f"the chain breaks at entry {entry.n}: it does not link to entry {entry.n - 1}",
                )
            )
        elif entry.hash != computed or (
            entry.body is not None and hashlib.sha256(entry.body).hexdigest() != entry.digest
        ):
            findings.append(
                Finding(
                    "altered",
                    entry.n,
                    where,
                    f"the chain breaks at entry {entry.n} (seq {entry.seq}, {entry.type}): "
                    "its content does not match its hash",
                )
            )
        # the next entry may link to the hash as stored or as it should be: an altered
        # entry is one finding, not one more for the entry after it
        links_to, expected = {entry.hash, computed}, entry.n + 1
    return findings
