"""Analytics of the log as plain functions: no I/O, tested directly.

Both the embedded stats database (``embedded.py``) and the faust app at scale
(``app.py``) turn events into aggregates with the functions here, so the two
paths count the same things the same way:

- :func:`admit` decides whether an event counts at all: it refuses what the projector
  would refuse (a stale or unclaimed epoch, an event after the session's erasure, a seq
  already counted) and what no writer of ours produces (negative or non-finite usage);
- :func:`contribution` is what an admitted event adds, filed under its hour, model and
  user: runs started, finished and failed, model turns, tool calls per tool, the four
  kinds of tokens, cost, and the model calls' latency as a :class:`Histogram` (fixed
  log-scale buckets, so two workers' or two hours' histograms merge by adding counts and
  p50/p95 come from the merged table);
- :class:`Stats` is the read side: rows of aggregates, grouped by model, user or hour,
  cut at a time, summed into totals, and the slowest sessions.
"""

from __future__ import annotations

import math
from collections import Counter as _Tally
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from loomflow.schemas import (
    Event,
    Role,
    RunFailed,
    RunFinished,
    RunStarted,
    SessionErased,
    TranscriptCompacted,
    TurnAppended,
    Usage,
)
from loomflow.schemas.events import CLAIM_TYPES

__all__ = [
    "COUNTS",
    "NO_MODEL",
    "NO_USER",
    "SUMS",
    "Contribution",
    "Counters",
    "Dimension",
    "Histogram",
    "Mark",
    "Row",
    "SessionStats",
    "Stats",
    "Tally",
    "Verdict",
    "admit",
    "contribution",
    "hour_of",
    "hour_start",
    "ms_text",
    "since_text",
    "stats_json",
    "summary_json",
]

Dimension = Literal["model", "user", "hour"]
#: how rows are labelled when the event names no model (tool turns, older events) or user
NO_MODEL = "(unknown)"
NO_USER = "(none)"


def hour_of(at: datetime) -> str:
    """The UTC hour an instant falls in, as the text the tables key by (sorts by time)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:00Z")


def parse_hour(hour: str) -> datetime:
    return datetime.strptime(hour, "%Y-%m-%dT%H:00Z").replace(tzinfo=UTC)


def hour_start(at: datetime) -> datetime:
    """The start of the UTC hour ``at`` falls in: where the hourly tables cut a period."""
    return parse_hour(hour_of(at))


def since_text(when: datetime) -> str:
    """The period :meth:`Stats.since` keeps, for people: ``since 2026-12-01 14:00 UTC
    (whole hours)`` for a ``when`` of 14:56, as the tables count whole hours."""
    return f"since {hour_start(when):%Y-%m-%d %H:%M} UTC (whole hours)"


# --- latency histogram --------------------------------------------------------------

#: bucket k holds latencies in [BASE**k, BASE**(k+1)) ms; below 1 ms goes to bucket 0
_BASE = 2 ** (1 / 8)
#: 2**(200/8) ms is about 9 hours: anything longer lands in the last bucket
_BUCKETS = 200


@dataclass(frozen=True)
class Histogram:
    """Counts of latencies in fixed log-scale buckets, each 9 % wider than the last.

    Fixed buckets are what makes it mergeable: the histogram of two hours, models or
    workers is the sum of their counts, so quantiles come from materialised tables
    instead of from every sample. A quantile is reported as its bucket's geometric
    middle, within 4.5 % of the true sample.
    """

    counts: Mapping[int, int] = field(default_factory=dict)

    @staticmethod
    def bucket(ms: float) -> int:
        if ms < 1:
            return 0
        return min(int(math.log(ms, _BASE)), _BUCKETS - 1)

    @classmethod
    def of(cls, *latencies_ms: float) -> Histogram:
        return cls(dict(_Tally(cls.bucket(ms) for ms in latencies_ms)))

    def __add__(self, other: Histogram) -> Histogram:
        if not other.counts:
            return self
        if not self.counts:
            return other
        merged = dict(self.counts)
        for bucket, count in other.counts.items():
            merged[bucket] = merged.get(bucket, 0) + count
        return Histogram(merged)

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float | None:
        """The latency (ms) that a fraction ``q`` of the samples do not exceed; None
        without samples."""
        total = self.count
        if not total:
            return None
        rank = max(1, math.ceil(q * total))
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return 0.5 if bucket == 0 else _BASE ** (bucket + 0.5)
        raise AssertionError("unreachable: rank <= total")

    def to_json(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.counts.items())}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        return cls({int(k): int(v) for k, v in data.items()})


def ms_text(value: float | None) -> str:
    """A quantile for people: whole milliseconds, "<1" below one, "-" without samples."""
    if value is None:
        return "-"
    return "<1" if value < 1 else f"{value:,.0f}"


# --- counters -----------------------------------------------------------------------

#: the counts of :class:`Counters`, then its two sums: the columns a table stores them in
COUNTS = (
    "runs_started",
    "runs_finished",
    "runs_failed",
    "turns",
    "model_calls",
    "input_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "output_tokens",
)
SUMS = ("cost_usd", "latency_ms_total")


@dataclass(frozen=True)
class Counters:
    """What a set of events adds up to; ``+`` merges two of them.

    ``turns`` counts model turns (``turn.appended`` with a model call), ``model_calls``
    those plus compaction calls; tokens and cost are summed over both, which is every
    model call the log records (a run's ``run.finished`` usage repeats them and a fork
    copies its parent's, so neither is added again).
    """

    runs_started: int = 0
    runs_finished: int = 0
    runs_failed: int = 0
    turns: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms_total: float = 0.0
    latency: Histogram = field(default_factory=Histogram)
    tools: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: Counters) -> Counters:
        tools = dict(self.tools)
        for name, calls in other.tools.items():
            tools[name] = tools.get(name, 0) + calls
        return Counters(
            runs_started=self.runs_started + other.runs_started,
            runs_finished=self.runs_finished + other.runs_finished,
            runs_failed=self.runs_failed + other.runs_failed,
            turns=self.turns + other.turns,
            model_calls=self.model_calls + other.model_calls,
            input_tokens=self.input_tokens + other.input_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            # rounded as Usage rounds, so sums do not drift from the events' own sums
            cost_usd=round(self.cost_usd + other.cost_usd, 10),
            latency_ms_total=round(self.latency_ms_total + other.latency_ms_total, 3),
            latency=self.latency + other.latency,
            tools=tools,
        )

    @property
    def tool_calls(self) -> int:
        return sum(self.tools.values())

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.cached_input_tokens
            + self.cache_write_tokens
            + self.output_tokens
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: getattr(self, name) for name in COUNTS}
        data.update(
            cost_usd=self.cost_usd,
            latency_ms_total=self.latency_ms_total,
            latency=self.latency.to_json(),
            tools=dict(sorted(self.tools.items())),
        )
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Counters:
        def count(name: str) -> int:
            return int(data.get(name, 0))

        return cls(
            runs_started=count("runs_started"),
            runs_finished=count("runs_finished"),
            runs_failed=count("runs_failed"),
            turns=count("turns"),
            model_calls=count("model_calls"),
            input_tokens=count("input_tokens"),
            cached_input_tokens=count("cached_input_tokens"),
            cache_write_tokens=count("cache_write_tokens"),
            output_tokens=count("output_tokens"),
            cost_usd=float(data.get("cost_usd", 0.0)),
            latency_ms_total=float(data.get("latency_ms_total", 0.0)),
            latency=Histogram.from_json(data.get("latency", {})),
            tools={str(k): int(v) for k, v in data.get("tools", {}).items()},
        )


# --- which events count -------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """How far a session has been counted: its last counted seq and writer epoch."""

    last_seq: int = 0
    epoch: int = 0
    erased: bool = False


@dataclass(frozen=True)
class Verdict:
    """:func:`admit`'s answer: the session's new mark, or why the event does not count."""

    mark: Mark
    refused: str | None = None
    duplicate: bool = False


def admit(mark: Mark | None, event: Event, *, contiguous: bool = True) -> Verdict:
    """Whether ``event`` counts, given its session's ``mark`` (None: none counted yet).

    The rules are the projector's (see ``projections.fold``), so stats and the read model
    agree on what happened: an epoch older than the session's is a stale writer's; a
    newer one is only taken by a run start, fork, erasure or signal; nothing counts after an
    erasure; a seq at or below the last counted one is a redelivery (``duplicate``, not
    counted again). ``contiguous`` (Kafka: the topic is never pruned) also refuses a seq
    that skips ahead, as a forged event would; the embedded log may have gaps where
    ``prune`` removed old journal steps, so it passes False. Usage that is negative or
    not finite is refused: no model call costs that, and one such event would falsify
    every sum it enters.
    """
    current = mark or Mark()
    where = f"session {event.session_id!r} (user {event.user_id!r}) seq {event.seq}"
    if mark is not None and event.seq <= mark.last_seq:
        return Verdict(current, f"{where} was counted already", duplicate=True)
    if current.erased:
        return Verdict(current, f"{where} comes after the session's erasure")
    if event.epoch < current.epoch:
        return Verdict(
            current, f"{where}: writer epoch {event.epoch} is older than {current.epoch}"
        )
    if event.epoch > current.epoch and mark is not None and not isinstance(event, CLAIM_TYPES):
        return Verdict(
            current,
            f"{where}: {event.type} claims epoch {event.epoch} (the session is at "
            f"{current.epoch}); only a run start, fork, erasure or signal does",
        )
    if contiguous and mark is not None and event.seq != mark.last_seq + 1:
        return Verdict(current, f"{where} skips ahead of seq {mark.last_seq + 1}")
    usage = _usage(event)
    if usage is not None and not _plausible(usage):
        return Verdict(current, f"{where}: usage {usage.model_dump()} is negative or not finite")
    return Verdict(
        Mark(event.seq, max(current.epoch, event.epoch), isinstance(event, SessionErased))
    )


def _usage(event: Event) -> Usage | None:
    if isinstance(event, TurnAppended | TranscriptCompacted):
        return event.payload.usage
    return None


def _plausible(usage: Usage) -> bool:
    return (
        min(
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.cache_write_tokens,
            usage.output_tokens,
        )
        >= 0
        and math.isfinite(usage.cost_usd)
        and usage.cost_usd >= 0
    )


# --- what an event adds -------------------------------------------------------------


@dataclass(frozen=True)
class Contribution:
    """What one admitted event adds, and under which hour, model and user."""

    hour: str
    model: str
    user: str
    counters: Counters


_NOTHING = Counters()


def _spent(usage: Usage, latency_ms: float | None, *, turns: int = 0) -> Counters:
    return Counters(
        turns=turns,
        model_calls=turns,
        input_tokens=usage.input_tokens,
        cached_input_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
        cost_usd=usage.cost_usd,
        latency_ms_total=latency_ms or 0.0,
        latency=Histogram() if latency_ms is None else Histogram.of(latency_ms),
    )


def contribution(event: Event) -> Contribution | None:
    """What ``event`` adds to the aggregates; None for events that add nothing
    (checkpoints, journal steps, forks, signals, erasures)."""
    match event:
        case RunStarted(payload=p):
            counters, model = Counters(runs_started=1), p.model
        case RunFinished(payload=p):
            counters, model = Counters(runs_finished=1), p.model
        case RunFailed(payload=p):
            counters, model = Counters(runs_failed=1), p.model
        case TurnAppended(payload=p):
            counters = _spent(p.usage, p.latency_ms, turns=int(p.model_call))
            # a tool call is counted where the model asked for it: the tool's result
            # message names only the call's id
            tools = _Tally(
                call.name
                for message in p.messages
                if message.role is Role.ASSISTANT
                for call in message.tool_calls
            )
            if tools:
                counters = replace(counters, tools=dict(tools))
            model = p.model
        case TranscriptCompacted(payload=p):
            counters = replace(_spent(p.usage, p.latency_ms), model_calls=1)
            model = p.model
        case _:
            return None
    if counters == _NOTHING:
        return None  # a prompt or a tool's result: no call, no cost
    return Contribution(hour_of(event.at), model or NO_MODEL, event.user_id or NO_USER, counters)


# --- sessions -----------------------------------------------------------------------


@dataclass(frozen=True)
class SessionStats:
    """One session's totals, for the slowest sessions: its model calls' summed latency,
    and the span from its first to its last counted event."""

    user: str
    session_id: str
    first_at: datetime
    last_at: datetime
    counters: Counters = field(default_factory=Counters)

    @property
    def span_s(self) -> float:
        return (self.last_at - self.first_at).total_seconds()

    @classmethod
    def start(cls, event: Event) -> SessionStats:
        return cls(event.user_id or NO_USER, event.session_id, event.at, event.at)

    def add(self, event: Event, added: Contribution | None) -> SessionStats:
        return SessionStats(
            self.user,
            self.session_id,
            min(self.first_at, event.at),
            max(self.last_at, event.at),
            self.counters + added.counters if added else self.counters,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "session_id": self.session_id,
            "first_at": self.first_at.isoformat(),
            "last_at": self.last_at.isoformat(),
            "counters": self.counters.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionStats:
        return cls(
            str(data["user"]),
            str(data["session_id"]),
            datetime.fromisoformat(data["first_at"]),
            datetime.fromisoformat(data["last_at"]),
            Counters.from_json(data.get("counters", {})),
        )


# --- building aggregates -----------------------------------------------------------

#: a session as the tables key it: (user id, session id)
ScopeKey = tuple[str | None, str]
RowKey = tuple[str, str, str]


@dataclass
class Tally:
    """Aggregates being built from events in log order; the one place that applies
    :func:`admit` and :func:`contribution`.

    ``marks`` and ``sessions`` hold what is known of the sessions involved (a consumer
    loads them for a batch's sessions, or keeps them whole); ``rows`` and ``skipped``
    collect what the events add, per (hour, model, user) and per kind of skip. A session
    mapped to None in ``sessions`` was erased: its row (which names it) is to be deleted.
    """

    marks: dict[ScopeKey, Mark] = field(default_factory=dict)
    sessions: dict[ScopeKey, SessionStats | None] = field(default_factory=dict)
    rows: dict[RowKey, Counters] = field(default_factory=dict)
    skipped: _Tally[str] = field(default_factory=_Tally)

    def add(self, event: Event, *, contiguous: bool = True) -> Verdict:
        """Count ``event`` if :func:`admit` lets it; return the verdict."""
        scope = (event.user_id, event.session_id)
        verdict = admit(self.marks.get(scope), event, contiguous=contiguous)
        if verdict.refused is not None:
            self.skipped["duplicate" if verdict.duplicate else "refused"] += 1
            return verdict
        self.marks[scope] = verdict.mark
        added = contribution(event)
        if added is not None:
            key = (added.hour, added.model, added.user)
            row = self.rows.get(key)
            self.rows[key] = added.counters if row is None else row + added.counters
        if isinstance(event, SessionErased):
            self.sessions[scope] = None  # an erased session is not named anywhere
        else:
            session = self.sessions.get(scope) or SessionStats.start(event)
            self.sessions[scope] = session.add(event, added)
        return verdict

    def skip(self, kind: str = "undecodable") -> None:
        self.skipped[kind] += 1

    # A ledger is a tally of one session (or of one partition's skipped records) as JSON:
    # the faust app keeps one per session scope in a table, so each is updated by the
    # worker that owns the session's partition, with its mark in the same value.

    def to_ledger(self) -> bytes:
        """This tally as one JSON value."""
        (scope, mark), *more = self.marks.items() or [(None, None)]
        if more:
            raise ValueError("a ledger holds one session")
        session = self.sessions.get(scope) if scope is not None else None
        return orjson.dumps(
            {
                "mark": None if mark is None else [mark.last_seq, mark.epoch, mark.erased],
                "scope": None if scope is None else list(scope),
                "session": None if session is None else session.to_json(),
                "rows": [[*key, c.to_json()] for key, c in sorted(self.rows.items())],
                "skipped": dict(self.skipped),
            }
        )

    @classmethod
    def from_ledger(cls, data: bytes | None) -> Tally:
        """The tally a ledger holds (an empty one for None)."""
        tally = cls()
        if not data:
            return tally
        ledger = orjson.loads(data)
        if ledger["scope"] is not None:
            scope: ScopeKey = (ledger["scope"][0], ledger["scope"][1])
            last_seq, epoch, erased = ledger["mark"]
            tally.marks[scope] = Mark(last_seq, epoch, erased)
            session = ledger["session"]
            tally.sessions[scope] = None if session is None else SessionStats.from_json(session)
        for hour, model, user, counters in ledger["rows"]:
            tally.rows[(hour, model, user)] = Counters.from_json(counters)
        tally.skipped.update(ledger["skipped"])
        return tally


# --- the read side ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """Aggregates of one (hour, model, user)."""

    hour: str
    model: str
    user: str
    counters: Counters


@dataclass(frozen=True)
class Stats:
    """Materialised aggregates, as ``loomflow stats`` and the report read them.

    ``skipped`` counts the records that did not count, by kind (``undecodable``,
    ``refused``, ``duplicate``); ``source`` says where the tables were read from.
    """

    rows: list[Row]
    sessions: list[SessionStats]
    skipped: Mapping[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def not_counted(self) -> str | None:
        """The line that says which records did not count, by kind (None: all did).

        ``unverified`` depends on the reader, not on the record: it is what the signature
        settings in force when the records were counted refused (a keyring left set from
        another task, say), and the tables never count a position twice. The line says
        so, and how to count under other settings."""
        if not self.skipped:
            return None
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.skipped.items()))
        line = f"records not counted: {kinds}"
        if self.skipped.get("unverified"):
            line += (
                " (unverified: refused by the signature settings they were counted under, "
                "LOOMFLOW_KEYRING and LOOMFLOW_SIGNATURES; to count them under other "
                "settings, count into new tables: --stats-db NEW with --db)"
            )
        return line

    def since(self, when: datetime | None) -> Stats:
        """Only the hours from the one ``when`` falls in, and the sessions active since
        that hour began (see :func:`since_text`)."""
        if when is None:
            return self
        start = hour_start(when)
        first = hour_of(start)
        return replace(
            self,
            rows=[r for r in self.rows if r.hour >= first],
            sessions=[s for s in self.sessions if s.last_at >= start],
        )

    def of_user(self, user: str) -> Stats:
        """Only what ``user`` did (a user's id, or NO_USER): the rows and sessions filed
        under them. What was skipped is the whole log's, no one user's: it is left off."""
        return replace(
            self,
            rows=[r for r in self.rows if r.user == user],
            sessions=[s for s in self.sessions if s.user == user],
            skipped={},
        )

    def by(self, dimension: Dimension) -> list[tuple[str, Counters]]:
        """Rows summed per model, user or hour: hours in time order, the others by
        cost, highest first."""
        groups: dict[str, Counters] = {}
        for row in self.rows:
            label = getattr(row, dimension)
            groups[label] = groups[label] + row.counters if label in groups else row.counters
        if dimension == "hour":
            return sorted(groups.items())
        return sorted(groups.items(), key=lambda item: (-item[1].cost_usd, item[0]))

    def by_hour_and(self, dimension: Literal["model", "user"]) -> dict[str, dict[str, Counters]]:
        """hour -> model (or user) -> counters, for charts of a series per model or user."""
        table: dict[str, dict[str, Counters]] = {}
        for row in self.rows:
            cell = table.setdefault(row.hour, {})
            label = getattr(row, dimension)
            cell[label] = cell[label] + row.counters if label in cell else row.counters
        return dict(sorted(table.items()))

    def totals(self) -> Counters:
        total = Counters()
        for row in self.rows:
            total = total + row.counters
        return total

    def slowest(self, limit: int = 10) -> list[SessionStats]:
        """Sessions whose model calls took longest in all, longest first; a session
        that made no model call is not among them."""
        ranked = sorted(
            (s for s in self.sessions if s.counters.model_calls),
            key=lambda s: (-s.counters.latency_ms_total, -s.span_s, s.session_id),
        )
        return ranked[:limit]

    @property
    def empty(self) -> bool:
        return not self.rows

    @classmethod
    def of_tallies(cls, tallies: Iterable[Tally], source: str) -> Stats:
        """The sum of tallies (e.g. the faust app's ledgers)."""
        rows: list[Row] = []
        sessions: list[SessionStats] = []
        skipped: _Tally[str] = _Tally()
        for tally in tallies:
            rows.extend(Row(*key, counters) for key, counters in tally.rows.items())
            sessions.extend(s for s in tally.sessions.values() if s is not None)
            skipped.update(tally.skipped)
        return cls.gather(rows, sessions, skipped, source)

    @classmethod
    def gather(
        cls,
        rows: Iterable[Row],
        sessions: Iterable[SessionStats],
        skipped: Mapping[str, int],
        source: str,
    ) -> Stats:
        """Rows with equal keys merged (e.g. the same hour from several partitions)."""
        merged: dict[tuple[str, str, str], Counters] = {}
        for row in rows:
            key = (row.hour, row.model, row.user)
            merged[key] = merged[key] + row.counters if key in merged else row.counters
        return cls(
            [Row(*key, counters) for key, counters in sorted(merged.items())],
            list(sessions),
            dict(skipped),
            source,
        )


def summary_json(counters: Counters) -> dict[str, Any]:
    """A row of ``loomflow stats --json`` (and of the console's ``/api/analytics``): the
    counters, tool calls, and latency as p50 and p95 instead of the histogram."""
    data = counters.to_json()
    del data["latency"]
    data.update(
        tool_calls=counters.tool_calls,
        latency_p50_ms=counters.latency.quantile(0.5),
        latency_p95_ms=counters.latency.quantile(0.95),
    )
    return data


def stats_json(stats: Stats, by: Dimension, *, since: datetime | None = None) -> dict[str, Any]:
    """What ``loomflow stats --json --by BY`` prints: a row per model, user or hour, the
    totals, and the records not counted. ``since``: where ``stats`` was cut."""
    return {
        "source": stats.source,
        # the start of the first hour counted: the tables are hourly
        "since": None if since is None else hour_start(since).isoformat(),
        "by": by,
        "rows": [{by: label, **summary_json(c)} for label, c in stats.by(by)],
        "totals": summary_json(stats.totals()),
        "skipped": dict(stats.skipped),
    }
