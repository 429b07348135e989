"""How the commands' rows look: times, tokens, cost and counts as text, and the rich
tables of sessions, checkpoints and a transcript.

rich loads in the functions that draw, so ``loomflow --help`` needs none of it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from loomflow.projections.fold import CheckpointRow
    from loomflow.schemas import Message, Usage
    from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "checkpoints_table",
    "console",
    "cost",
    "count",
    "session_head",
    "sessions_table",
    "status",
    "timestamp",
    "tokens",
    "transcript",
    "who",
]


def console() -> Console:
    """The console of the store commands: rows whole on one line when piped."""
    from rich.console import Console

    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        # piped or captured: each row whole on one line (ids never cut) for grep and
        # scripts, where rich would otherwise squeeze the tables into 80 columns
        out = Console(highlight=False, width=1000)
    return out


def count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``."""
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def who(user_id: Any) -> str:
    """``user U``, ``no user``, or ``every user`` (``ANY_USER``)."""
    from loomflow.runtime import ANY_USER

    if user_id is ANY_USER:
        return "every user"
    return "no user" if user_id is None else f"user {user_id}"


def status(row: SessionRecord) -> str:
    """The status a person reads: ``forked`` for a session `sessions fork` made that has
    had no run yet; ``abandoned`` for a running one whose writer has been silent past its
    lease (read off the lease and the clock now, never written: a worker takes it over);
    else the status the log gives it."""
    from loomflow.runtime.base import abandoned

    if row.last_run_id is None:
        return "forked"
    return "abandoned" if abandoned(row) else row.status


def timestamp(moment: datetime, *, exact: bool = False) -> str:
    """UTC to the second; ``exact``: with the fraction of a second, when there is one."""
    moment = moment.astimezone(UTC)
    fraction = f".{moment.microsecond:06d}" if exact and moment.microsecond else ""
    return f"{moment:%Y-%m-%d %H:%M:%S}{fraction} UTC"


def tokens(usage: Usage) -> str:
    return f"{usage.total_tokens:,}"


def cost(usage: Usage) -> str:
    if 0 < usage.cost_usd < 0.00005:  # would show as $0.0000: say it is not nothing
        return "<$0.0001"
    return f"${usage.cost_usd:.4f}"


def _usage_line(usage: Usage) -> str:
    return (
        f"{tokens(usage)} tokens (input {usage.input_tokens:,}, cached "
        f"{usage.cached_input_tokens:,}, cache writes {usage.cache_write_tokens:,}, output "
        f"{usage.output_tokens:,}), {cost(usage)}"
    )


def session_head(row: SessionRecord) -> Table:
    """What ``sessions show`` says of a session before its transcript."""
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("session", Text(f"{row.session_id} ({who(row.user_id)})"))
    head.add_row("status", f"{status(row)}, {row.turns} turns, {row.message_count} messages")
    if row.status in ("waiting", "signalled") and row.waiting is not None:
        until = f" until {timestamp(row.waiting.until)}" if row.waiting.until else ""
        head.add_row("waits for", Text(f"signal {row.waiting.signal!r}{until}"))
    if row.inbox:
        head.add_row("inbox", Text(", ".join(f"{s.name} (seq {s.seq})" for s in row.inbox)))
    if row.status == "stuck" and row.last_error:
        head.add_row("error", Text(row.last_error))
    if row.status == "cancelled" and row.last_error:
        head.add_row("cancelled", Text(row.last_error.removeprefix("cancelled: ")))
    if status(row) == "abandoned":
        from loomflow.schemas.events import DEFAULT_LEASE_SECONDS

        lease = row.lease_seconds or DEFAULT_LEASE_SECONDS
        head.add_row(
            "abandoned",
            Text(
                f"run {row.last_run_id} has been silent past its lease ({lease:g} s): a "
                f"worker hosting agent {row.agent!r} resumes it, `loomflow sessions resume` "
                "continues it now"
            ),
        )
    head.add_row("usage", _usage_line(row.usage))
    head.add_row("created", timestamp(row.created_at))
    head.add_row("last activity", timestamp(row.updated_at))
    if row.parent_session_id is not None:
        head.add_row(
            "forked from",
            Text(f"{row.parent_session_id} at checkpoint {row.parent_checkpoint_id}"),
        )
    return head


def _table(*columns: str) -> Table:
    """A table whose id columns (named first) are never wrapped or cut."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        numeric = name in ("turn", "turns", "messages", "tokens", "cost")
        is_id = name in ("session", "checkpoint", "forked from", "from checkpoint")
        table.add_column(
            name,
            justify="right" if numeric else "left",
            no_wrap=is_id or numeric,
            min_width=30 if is_id else None,
        )
    return table


def sessions_table(rows: Sequence[SessionRecord], *, parent: bool) -> Table:
    """One row per session; ``parent``: a listing, naming each row's parent session,
    else the forks of one session, naming the checkpoint each started from."""
    from rich.text import Text

    columns = ["session", "user", "status", "turns", "last activity", "tokens", "cost"]
    # a listing has the column only when some row has a parent
    lineage = not parent or any(row.parent_session_id for row in rows)
    if lineage:
        columns.append("forked from" if parent else "from checkpoint")
    table = _table(*columns)
    for row in rows:
        cells: list[Any] = [
            Text(row.session_id),
            Text(row.user_id or "-"),
            status(row),
            str(row.turns),
            timestamp(row.updated_at),
            tokens(row.usage),
            cost(row.usage),
        ]
        if lineage:
            origin = row.parent_session_id if parent else row.parent_checkpoint_id
            cells.append(Text(origin or ""))
        table.add_row(*cells)
    return table


def checkpoints_table(rows: Sequence[CheckpointRow]) -> Table:
    from rich.text import Text

    table = _table("checkpoint", "turn", "messages", "created", "tokens", "cost")
    for row in rows:
        table.add_row(
            Text(row.checkpoint_id),
            str(row.turn),
            str(row.message_count),
            timestamp(row.created_at),
            tokens(row.cumulative_usage),
            cost(row.cumulative_usage),
        )
    return table


def _short(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def transcript(messages: Sequence[Message]) -> Table:
    """Each message's role and text; a tool call or result on one line each."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    names: dict[str, str] = {}
    for message in messages:
        role = message.role.value
        if message.thinking:
            grid.add_row(role, Text(f"(reasoning: {len(message.thinking)} blocks)", style="dim"))
            role = ""
        if message.tool_call_id is not None:
            name = names.get(message.tool_call_id, message.tool_call_id)
            outcome = "failed" if message.is_error else "returned"
            grid.add_row(role, Text(_short(f"← {name} {outcome}: {message.content}")))
            continue
        if message.content or not message.tool_calls:
            grid.add_row(role, Text(message.content))
            role = ""
        for call in message.tool_calls:
            names[call.id] = call.name
            arguments = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
            grid.add_row(role, Text(_short(f"→ {call.name}({arguments})")))
            role = ""
    return grid
