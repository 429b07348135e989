"""Rows read back from either SQL dialect, decoded into the read model's types.

Both dialects select the same columns in the same order; only timestamps differ (text in
SQLite, ``timestamptz`` in PostgreSQL), and both store "no user" as ``''``. A row that
does not decode raises CorruptRecordError naming what it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson

from loomflow.errors import CorruptRecordError
from loomflow.projections.fold import CheckpointRow
from loomflow.schemas import Event, RunOptions, Usage
from loomflow.schemas.codec import decode_event
from loomflow.schemas.sessions import PendingSignal, SessionRecord, SessionTotals, Waiting

__all__ = [
    "CHECKPOINT_FIELDS",
    "EVENT_FIELDS",
    "SESSION_FIELDS",
    "USAGE_FIELDS",
    "checkpoint_from_row",
    "control_json",
    "control_parts",
    "decoded_events",
    "event_from_row",
    "session_from_row",
    "sig_json",
    "stored_user",
    "totals_from_row",
]

logger = logging.getLogger("loomflow.projections")

R = TypeVar("R")

#: the column order of each decoder's row
SESSION_FIELDS = (
    "user_id",
    "session_id",
    "status",
    "last_seq",
    "epoch",
    "turns",
    "usage",
    "message_count",
    "base_seq",
    "parent_session_id",
    "parent_checkpoint_id",
    "last_run_id",
    "created_at",
    "updated_at",
    "control",
)
CHECKPOINT_FIELDS = (
    "checkpoint_id",
    "seq",
    "base_seq",
    "turn",
    "message_count",
    "usage",
    "cursor",
    "created_at",
)
EVENT_FIELDS = (
    "user_id",
    "session_id",
    "seq",
    "type",
    "event_id",
    "run_id",
    "epoch",
    "v",
    "at",
    "sig",
)
#: the keys of a usage column's JSON (model_dump_json writes every one), which
#: session_totals sums in this order
USAGE_FIELDS = tuple(Usage.model_fields)


def stored_user(user_id: str | None) -> str:
    """A user id as both dialects store it: ``''`` for no user (the column is part of
    every key, so it is never NULL; no id is empty, see schemas.ids)."""
    return "" if user_id is None else user_id


def _moment(value: datetime | str) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def control_parts(row: SessionRecord) -> tuple[Any, ...]:
    """What the ``control`` column is made of: a store rewrites it when these change."""
    return (
        row.agent,
        row.lease_seconds,
        row.waiting,
        row.inbox,
        row.attempts,
        row.last_error,
        row.run_metadata,
        row.run_options,
        row.takes,
        row.spent_calls,
        row.spent,
    )


def control_json(row: SessionRecord) -> str | None:
    """The ``control`` column: what a worker needs of the session (its agent, lease,
    what it waits for, its inbox of signals, the options its run recorded, its budget)
    as JSON; None when the session has none of it (sessions written before it was
    kept)."""
    if (
        row.agent is None
        and row.lease_seconds is None
        and row.waiting is None
        and not row.inbox
        and row.last_error is None
        and row.run_metadata is None
        and row.run_options is None
    ):
        return None
    control: dict[str, Any] = {"agent": row.agent, "lease": row.lease_seconds}
    if row.attempts:
        control["attempts"] = row.attempts
    if row.last_error is not None:
        control["error"] = row.last_error
    if row.waiting is not None:
        w = row.waiting
        control["waiting"] = {
            "signal": w.signal,
            "step_key": w.step_key,
            # fixed-width UTC text: SQLite compares it with the time as text
            "until": None if w.until is None else _text(w.until),
            "where": w.where,
        }
    if row.inbox:
        control["inbox"] = [
            {"seq": p.seq, "name": p.name, "data": p.data, "at": p.at.isoformat()}
            for p in row.inbox
        ]
    if row.run_metadata is not None:
        control["metadata"] = row.run_metadata
    if row.run_options is not None:
        control["options"] = row.run_options.model_dump(mode="json", exclude_defaults=True)
    if row.takes:
        control["takes"] = row.takes
    if row.spent_calls:
        control["calls"] = row.spent_calls
    if row.spent is not _NOTHING and row.spent != _NOTHING:
        control["spent"] = row.spent.model_dump(exclude_defaults=True)
    return orjson.dumps(control).decode()


_NOTHING = Usage()


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _control(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    control = orjson.loads(text)
    fields: dict[str, Any] = {
        "agent": control.get("agent"),
        "lease_seconds": control.get("lease"),
        "attempts": control.get("attempts", 0),
        "last_error": control.get("error"),
        "takes": control.get("takes", 0),
        "spent_calls": control.get("calls", 0),
    }
    if "spent" in control:
        fields["spent"] = Usage.model_validate(control["spent"])
    if "options" in control:
        fields["run_options"] = RunOptions.model_validate(control["options"])
    fields["run_metadata"] = control.get("metadata")
    if (w := control.get("waiting")) is not None:
        fields["waiting"] = Waiting(
            w["signal"],
            w["step_key"],
            None if w["until"] is None else _moment(w["until"]),
            w["where"],
        )
    fields["inbox"] = tuple(
        PendingSignal(p["seq"], p["name"], p["data"], _moment(p["at"]))
        for p in control.get("inbox", ())
    )
    return fields


def session_from_row(row: Sequence[Any]) -> SessionRecord:
    """A session row from the columns of SESSION_FIELDS."""
    try:
        return SessionRecord(
            user_id=row[0] or None,
            session_id=row[1],
            status=row[2],
            last_seq=row[3],
            epoch=row[4],
            turns=row[5],
            usage=Usage.model_validate_json(row[6]),
            message_count=row[7],
            base_seq=row[8],
            parent_session_id=row[9],
            parent_checkpoint_id=row[10],
            last_run_id=row[11],
            created_at=_moment(row[12]),
            updated_at=_moment(row[13]),
            **_control(row[14]),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecordError(f"session row {row[1]!r} does not decode: {exc}") from exc


def totals_from_row(row: Sequence[Any]) -> SessionTotals:
    """Session totals from a count and the sums of USAGE_FIELDS, in that order."""
    count, *sums = row
    fields = dict(zip(USAGE_FIELDS, sums, strict=True))
    # as Usage's + rounds it: a sum of many costs in float carries noise past 1e-10
    fields["cost_usd"] = round(float(fields["cost_usd"]), 10)
    return SessionTotals(int(count), Usage(**fields))


def checkpoint_from_row(row: Sequence[Any]) -> CheckpointRow:
    """A checkpoint row from the columns of CHECKPOINT_FIELDS."""
    try:
        return CheckpointRow(
            checkpoint_id=row[0],
            seq=row[1],
            base_seq=row[2],
            turn=row[3],
            message_count=row[4],
            cumulative_usage=Usage.model_validate_json(row[5]),
            cursor=row[6],
            created_at=_moment(row[7]),
        )
    except (ValueError, TypeError) as exc:
        raise CorruptRecordError(f"checkpoint row {row[0]!r} does not decode: {exc}") from exc


def sig_json(event: Event) -> str | None:
    """The ``sig`` column of the event's log row: its signature as JSON, None (NULL) when
    it is not signed."""
    return None if event.sig is None else event.sig.model_dump_json()


def event_from_row(row: Sequence[Any], payload: str | bytes, where: str) -> Event:
    """The event of one log row: the columns of EVENT_FIELDS and its payload JSON;
    ``where`` names the row in the error when it does not decode."""
    fields = dict(zip(EVENT_FIELDS, row, strict=True))
    fields["user_id"] = fields["user_id"] or None
    try:
        if fields["sig"] is not None:
            fields["sig"] = orjson.loads(fields["sig"])
        fields["payload"] = orjson.loads(payload)
        return decode_event(fields)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise CorruptRecordError(f"{where} does not decode: {exc}") from exc


def decoded_events(rows: Iterable[R], decode: Callable[[R], Event]) -> list[Event]:
    """The events of log rows; a row that does not decode is skipped with a warning, so
    one bad row never stops a reader of the log."""
    events: list[Event] = []
    for row in rows:
        try:
            events.append(decode(row))
        except CorruptRecordError as exc:
            logger.warning("skipping a log row: %s", exc)
    return events
