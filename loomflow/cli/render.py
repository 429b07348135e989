"""How the commands' rows look: times, tokens, cost and counts as text, the tables of
sessions, checkpoints and a transcript, and the JSON objects ``--json`` prints.

A table is a :class:`Fitted`: it is drawn to the width of the output, and never drops,
wraps or cuts a column to get there. It is drawn whole when it fits; else with compact
cells (``3m ago``, ``12-03 09:14:05``, ``123k``); else with ids and names cut in the
middle as well (``sess01jx…4k2p``); else folded into several tables, each repeating the
first column. ``--wide`` draws every table whole, and so does a pipe or a file when
``COLUMNS`` is unset (each row on one line, ids whole, for grep and scripts).

rich loads in the functions that draw, so ``loomflow --help`` needs none of it.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import IO, TYPE_CHECKING, Any, cast

from loomflow.control.status import status

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table

    from loomflow.projections.fold import CheckpointRow
    from loomflow.runtime import Scope
    from loomflow.schemas import Message, Usage
    from loomflow.schemas.sessions import SessionRecord

__all__ = [
    "Cell",
    "Column",
    "Fitted",
    "age",
    "checkpoint_json",
    "checkpoints_table",
    "compact_time",
    "console",
    "console_type",
    "cost",
    "count",
    "iso",
    "middle",
    "output_width",
    "print_json",
    "quiet_stdout",
    "session_head",
    "session_json",
    "sessions_table",
    "stdout_gone",
    "timestamp",
    "tokens",
    "transcript",
    "who",
]

#: the width of a pipe's or a file's output, and of ``--wide``'s: every row whole
WHOLE = 1000

#: the cells a cut id or user keeps: ``sess01jx…4k2p``
ID_CELLS = 13
USER_CELLS = 12


def output_width(wide: bool = False) -> int | None:
    """The width to fit lines to, or None for every line whole: ``--wide``, or a pipe or
    a file when ``COLUMNS`` is unset; else ``COLUMNS``, else the terminal's width."""
    if wide:
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def console(*, wide: bool = False, soft_wrap: bool = False, stderr: bool = False) -> Console:
    """The console of the commands: the width of ``output_width``, or rows whole on one
    line (``--wide``; piped or captured with no ``COLUMNS``); on stderr when stdout is
    the command's data."""
    width = output_width(wide)
    return console_type()(
        highlight=False,
        width=WHOLE if width is None else width,
        soft_wrap=soft_wrap,
        stderr=stderr,
        file=None if stderr or sys.stdout.isatty() else cast("IO[str]", _Trimmed(sys.stdout)),
    )


class _Trimmed:
    """Stdout for a program or a file rather than a person: each line without the spaces
    at its end that rich pads a table's cells with (``| cat -A`` showed them). rich has
    no setting for it; its console writes to any file-like object, so this is one."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._spaces = ""  # held back until the line goes on: at its end, they go

    def write(self, text: str) -> int:
        whole = self._spaces + text
        head, newline, tail = whole.rpartition("\n")
        kept = tail.rstrip(" ")
        self._spaces = tail[len(kept) :]
        lines = "\n".join(line.rstrip(" ") for line in head.split("\n")) + newline
        self._file.write((lines if newline else "") + kept)
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, isatty: the file's
        return getattr(self._file, name)


def console_type() -> type[Console]:
    """rich's Console, but a reader of stdout that goes away raises BrokenPipeError, for
    ``loomflow.cli.main`` to end quietly with 0 as for any other write: rich's own
    handling exits 1, which scripts read as "not found or failed". Imported at each
    call, so that a missing rich is named (ModuleNotFoundError) every time."""
    from rich.console import Console

    return _pipe_console(Console)


@cache
def _pipe_console(base: type[Console]) -> type[Console]:
    class PipeConsole(base):  # type: ignore[valid-type, misc]
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, "the reader of stdout is gone")

    return PipeConsole


#: the exit code a command settled on before printing its report (see ``settle``)
_SETTLED: list[int] = []


def settle(code: int) -> None:
    """Say the exit code this command ends with, before printing what it found: if the
    reader of stdout goes away meanwhile (``| head``), the command still ends with it,
    not with the 0 of a pipe that was merely cut (``audit verify | head`` of a tampered
    log exited 0, which a CI step with ``set -o pipefail`` took for a pass)."""
    _SETTLED[:] = [code]


def settled() -> int:
    """The exit code ``settle`` set (0 when none was)."""
    return _SETTLED[0] if _SETTLED else 0


def stdout_gone() -> bool:
    """Whether stdout is a pipe (or a socket) whose reader has gone: ``| head`` took its
    lines. A file or a terminal is never gone."""
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return False
        poll = select.poll()
    except (AttributeError, OSError, ValueError):  # no fileno, or no poll (Windows)
        return False
    poll.register(fd, 0)  # a closed pipe's error is reported whatever is asked
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def quiet_stdout() -> None:
    """Send what is left of stdout nowhere: its reader is gone, and the interpreter's
    flush at exit would raise BrokenPipeError once more (Python's advice, in the docs of
    ``signal``: "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_json(data: Any) -> None:
    """One JSON object on one line of stdout."""
    import orjson

    sys.stdout.write(orjson.dumps(data).decode() + "\n")
    sys.stdout.flush()


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


# -- times, numbers, ids ---------------------------------------------------------------


def timestamp(moment: datetime) -> str:
    """UTC to the second: ``2026-12-03 09:14:05 UTC``."""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def compact_time(moment: datetime) -> str:
    """UTC to the second, without the year: ``12-03 09:14:05``."""
    return f"{moment.astimezone(UTC):%m-%d %H:%M:%S}"


def age(moment: datetime, now: datetime | None = None) -> str:
    """How long ago, in its largest unit: ``12s ago``, ``3m ago``, ``5h ago``, ``4d ago``."""
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, as pydantic writes the events' times: ``2026-12-03T09:14:05.123Z``."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def middle(text: str, cells: int) -> str:
    """``text`` cut in the middle to ``cells`` characters, its start and end kept."""
    if len(text) <= cells:
        return text
    tail = max(1, (cells - 1) // 3)
    return f"{text[: cells - 1 - tail]}…{text[-tail:]}"


def _compact_number(n: int) -> str:
    """``98``, ``12,345``, ``123k``, ``1.2M``: at most six characters."""
    if n < 100_000:
        return f"{n:,}"
    if n < 999_500:
        return f"{round(n / 1000)}k"
    if n < 999_950_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.1f}G"


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


# -- tables that fit -------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """A cell's text whole, and (``compact``) shorter for a narrow output."""

    whole: str
    compact: str | None = None
    style: str | None = None


@dataclass(frozen=True)
class Column:
    """A column: its header, right-aligned when ``numeric``, and the characters its
    cells are cut to in the middle when nothing else makes the table fit (``cut``)."""

    name: str
    numeric: bool = False
    cut: int | None = None


#: the ways a table is drawn, widest first: whole; compact cells; ids and names cut too
_WHOLE, _COMPACT, _CUT = 0, 1, 2


class Fitted:
    """A table drawn to the width it is given (see the module's docstring): every
    header whole, every row on one line, no column dropped."""

    def __init__(
        self,
        columns: Sequence[Column],
        rows: Sequence[Sequence[str | Cell]],
        footer: Sequence[str | Cell] | None = None,
    ) -> None:
        self.columns = list(columns)
        self.rows = [list(row) for row in rows]
        self.footer = None if footer is None else list(footer)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        every = list(range(len(self.columns)))
        for level in (_WHOLE, _COMPACT, _CUT):
            table = self.table(level, every)
            if self._width(console, options, table) <= options.max_width:
                yield table
                return
        yield from self._folded(console, options)

    def _folded(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        """Several tables, each the first column and as many of the next as fit."""
        from rich.text import Text

        parts: list[list[int]] = [[]]
        for index in range(1, len(self.columns)):
            trial = [0, *parts[-1], index]
            if parts[-1] and self._width(console, options, self.table(_CUT, trial)) > (
                options.max_width
            ):
                parts.append([index])
            else:
                parts[-1].append(index)
        for n, part in enumerate(parts):
            if n:
                yield Text("")
            yield self.table(_CUT, [0, *part])

    @staticmethod
    def _width(console: Console, options: ConsoleOptions, table: Table) -> int:
        from rich.measure import Measurement

        return Measurement.get(console, options.update_width(WHOLE * 100), table).maximum

    def table(self, level: int, columns: Sequence[int]) -> Table:
        """The rich table of ``columns`` drawn at ``level``."""
        from rich import box
        from rich.table import Table

        table = Table(
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, 1, 0, 0),
            show_footer=self.footer is not None,
        )
        for index in columns:
            column = self.columns[index]
            footer = "" if self.footer is None else self._text(self.footer[index], level, column)
            table.add_column(
                column.name,
                justify="right" if column.numeric else "left",
                no_wrap=True,
                footer=footer,
            )
        for row in self.rows:
            table.add_row(*(self._text(row[i], level, self.columns[i]) for i in columns))
        return table

    @staticmethod
    def _text(cell: str | Cell, level: int, column: Column) -> Any:
        from rich.text import Text

        if isinstance(cell, str):
            cell = Cell(cell)
        text = cell.compact if level >= _COMPACT and cell.compact is not None else cell.whole
        if level >= _CUT and column.cut is not None:
            text = middle(text, column.cut)
        return Text(text, style=cell.style or "")


def sessions_table(rows: Sequence[SessionRecord], *, parent: bool) -> Fitted:
    """One row per session; ``parent``: a listing, naming each row's parent session,
    else the forks of one session, naming the checkpoint each started from."""
    columns = [
        Column("session", cut=ID_CELLS),
        Column("user", cut=USER_CELLS),
        Column("status"),
        Column("turns", numeric=True),
        Column("active"),
        Column("tokens", numeric=True),
        Column("cost", numeric=True),
    ]
    # a listing has the column only when some row has a parent
    lineage = not parent or any(row.parent_session_id for row in rows)
    if lineage:
        columns.append(Column("forked from" if parent else "from checkpoint", cut=ID_CELLS))
    now = datetime.now(UTC)
    cells: list[list[str | Cell]] = []
    for row in rows:
        cell: list[str | Cell] = [
            row.session_id,
            row.user_id or "-",
            status(row),
            str(row.turns),
            Cell(timestamp(row.updated_at), age(row.updated_at, now)),
            Cell(tokens(row.usage), _compact_number(row.usage.total_tokens)),
            cost(row.usage),
        ]
        if lineage:
            origin = row.parent_session_id if parent else row.parent_checkpoint_id
            cell.append(origin or "")
        cells.append(cell)
    return Fitted(columns, cells)


def checkpoints_table(rows: Sequence[CheckpointRow]) -> Fitted:
    columns = [
        Column("checkpoint", cut=ID_CELLS),
        Column("turn", numeric=True),
        Column("messages", numeric=True),
        Column("created"),
        Column("tokens", numeric=True),
        Column("cost", numeric=True),
    ]
    cells: list[list[str | Cell]] = [
        [
            row.checkpoint_id,
            str(row.turn),
            str(row.message_count),
            Cell(timestamp(row.created_at), compact_time(row.created_at)),
            Cell(tokens(row.cumulative_usage), _compact_number(row.cumulative_usage.total_tokens)),
            cost(row.cumulative_usage),
        ]
        for row in rows
    ]
    return Fitted(columns, cells)


# -- sessions show ---------------------------------------------------------------------


def session_head(row: SessionRecord) -> Table:
    """What ``sessions show`` says of a session before its transcript."""
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    head.add_row("session", Text(f"{row.session_id} ({who(row.user_id)})"))
    head.add_row(
        "status",
        f"{status(row)}, {count(row.turns, 'turn')}, {count(row.message_count, 'message')}",
    )
    if row.agent is not None:
        head.add_row("agent", Text(row.agent))
    if row.status in ("waiting", "signalled") and row.waiting is not None:
        until = f" until {timestamp(row.waiting.until)}" if row.waiting.until else ""
        head.add_row("waits for", Text(f"signal {row.waiting.signal!r}{until}"))
    if row.inbox:
        head.add_row("inbox", Text(", ".join(f"{s.name} (seq {s.seq})" for s in row.inbox)))
    if row.status == "cancelled" and row.last_error:
        head.add_row("cancelled", Text(row.last_error.removeprefix("cancelled: ")))
    elif row.last_error:
        # a failed or parked run's error; only a finished run clears it, so a session
        # whose run went on after one (resumed, retried, now waiting) still has it
        said = "error" if row.status in ("failed", "stuck") else "last error"
        head.add_row(said, Text(row.last_error))
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
    head.add_row("last activity", f"{timestamp(row.updated_at)} ({age(row.updated_at)})")
    if row.parent_session_id is not None:
        head.add_row(
            "forked from",
            Text(f"{row.parent_session_id} at checkpoint {row.parent_checkpoint_id}"),
        )
    return head


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
            blocks = count(len(message.thinking), "block")
            grid.add_row(role, Text(f"(reasoning: {blocks})", style="dim"))
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


# -- JSON ------------------------------------------------------------------------------
# The field names are documented in the README ("Scripting: --json"): keep them stable.


def session_json(row: SessionRecord) -> dict[str, Any]:
    """A session as ``sessions ls --json`` prints it (a line each)."""
    waits = row.status in ("waiting", "signalled") and row.waiting is not None
    return {
        "session_id": row.session_id,
        "user_id": row.user_id,
        "status": status(row),
        "agent": row.agent,
        "turns": row.turns,
        "messages": row.message_count,
        "usage": row.usage.model_dump(mode="json"),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "last_run_id": row.last_run_id,
        "parent_session_id": row.parent_session_id,
        "parent_checkpoint_id": row.parent_checkpoint_id,
        "waiting": None
        if not waits or row.waiting is None
        else {
            "signal": row.waiting.signal,
            "until": iso(row.waiting.until),
            "where": row.waiting.where,
        },
        "inbox": [{"seq": s.seq, "name": s.name, "at": iso(s.at)} for s in row.inbox],
        "last_error": row.last_error,
    }


def checkpoint_json(row: CheckpointRow, scope: Scope) -> dict[str, Any]:
    """A checkpoint as ``checkpoints ls --json`` prints it (a line each)."""
    return {
        "checkpoint_id": row.checkpoint_id,
        "session_id": scope.session_id,
        "user_id": scope.user_id,
        "seq": row.seq,
        "turn": row.turn,
        "messages": row.message_count,
        "created_at": iso(row.created_at),
        "usage": row.cumulative_usage.model_dump(mode="json"),
    }
