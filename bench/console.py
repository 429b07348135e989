"""What the web console's pages cost a browser at 10k sessions / 1M checkpoints.

    .venv/bin/python -m bench.console [--sessions 10000] [--checkpoints 1000000]
                                      [--requests 50] [--warmup 5] [--deep 100]
                                      [--cache DIR] [--fresh]

The journal is :mod:`bench.bigjournal`'s (built, or copied from its cache, into a temporary
directory: the copy is in the OS page cache, which this bench does not control). The
console runs as a user starts it, ``loomflow ui --db <the copy> --port 0``, in its own
process; the bench reads the address it prints on stderr, then asks it over HTTP with one
keep-alive client (httpx), as a browser does.

**Warm.** In one console process: the next-page links of the session list are followed
from ``/`` to page ``--deep`` (or the last), once; then each request below is made
``--warmup`` times untimed and ``--requests`` times timed, one after the other. Each
answer is checked (200, and the session it is about named in it). p50, p90 and max are
in ms, from the request sent to the last byte of its body read.

**Cold-process.** For each request, a console started for it alone: the first request
after it printed its address, on a new connection (it opens the store on that request,
as a console does on its first). The file's pages may be in the OS page cache: this is
not a cold-disk figure.

The requests: the list's first page (``/``), filtered by ``status=failed`` and by one
user, the page after ``--deep`` next-page links; a session page of a typical session (a
finished one, no fork: ~100 checkpoints, ~320 events) and of a forked one (its fork tree
drawn from its parent); the JSON API's first page of the list and that typical session.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import re
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from bench import bigjournal
from bench.workload import loomflow_command, own_env

#: the console's line once it listens
_LISTENING = re.compile(r"loomflow console on (http://\S+/)")
_NEXT = re.compile(r'<a class="next" href="([^"]+)"')
#: the list's user filter: one user of the journal's five
USER = "carol"
#: a console that has not said where it listens by then is broken
START_TIMEOUT = 60.0
#: what the target asks of the list and the session page (p50, warm)
TARGET_MS = 100.0


@dataclass(frozen=True)
class Request:
    """A request the bench times: its name in the table, its URL (a path and query) and
    what its answer must contain."""

    name: str
    url: str
    expect: str
    #: the target holds for it (the list and the session page)
    targeted: bool = False


@dataclass
class Timing:
    request: Request
    cold_ms: float = math.nan
    warm_ms: list[float] = field(default_factory=list)
    size: int = 0

    def p50(self) -> float:
        return statistics.median(self.warm_ms)

    def p90(self) -> float:
        ordered = sorted(self.warm_ms)
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]

    def met(self) -> bool:
        return self.p50() < TARGET_MS


class Console:
    """``loomflow ui --db path --port 0`` in its own process, started and stopped."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.url = ""
        self.start_ms = math.nan
        self._said: list[str] = []
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Console:
        started = time.perf_counter()
        self._process = process = subprocess.Popen(
            [*loomflow_command(), "ui", "--db", str(self.db), "--port", "0"],
            env=own_env(dict(os.environ)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        try:
            self.url = self._address(process, time.monotonic() + START_TIMEOUT)
        except BaseException:
            self._stop()
            raise
        self.start_ms = (time.perf_counter() - started) * 1000
        # what it says later is drained, so a chatty console never blocks on its pipe
        threading.Thread(target=self._drain, args=(process,), daemon=True).start()
        return self

    def _address(self, process: subprocess.Popen[str], deadline: float) -> str:
        assert process.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not selector.select(left):
                    continue
                line = process.stderr.readline()
                if not line:
                    break
                self._said.append(line)
                if found := _LISTENING.search(line):
                    return found.group(1).rstrip("/")
        said = "".join(self._said[-20:])
        raise RuntimeError(f"loomflow ui did not say where it listens; it said:\n{said}")

    def _drain(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self._said.append(line)

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __exit__(self, *exc: object) -> None:
        self._stop()


def _get(client: httpx.Client, request: Request) -> tuple[float, int]:
    """ms of one request, to its body's last byte, and the body's size; its answer
    checked."""
    t0 = time.perf_counter_ns()
    answer = client.get(request.url)
    body = answer.content
    took = (time.perf_counter_ns() - t0) / 1e6
    if answer.status_code != 200 or request.expect not in answer.text:
        raise AssertionError(
            f"{request.name}: {request.url} answered {answer.status_code} "
            f"without {request.expect!r}: {answer.text[:300]}"
        )
    return took, len(body)


def _deep(client: httpx.Client, pages: int) -> tuple[str, int]:
    """The URL of the list's page ``pages`` (the first is 1), following next-page links
    from ``/``, and its number (the last page's, when there are fewer)."""
    url, page = "/", 1
    while page < pages:
        answer = client.get(url)
        answer.raise_for_status()
        found = _NEXT.search(answer.text)
        if found is None:
            break
        url, page = html.unescape(found.group(1)), page + 1
    return url, page


def _session_url(index: int) -> str:
    user = bigjournal.user_of(index)
    tail = f"?user={quote(user)}" if user else ""
    return f"/sessions/{bigjournal.session_id(index)}{tail}"


def _picked(sessions: int) -> tuple[int, int | None]:
    """A typical session (finished, no fork) half-way down the journal, and a finished
    fork (None when the journal has none)."""
    middle = sessions // 2

    def finished(i: int) -> bool:
        return bigjournal.ending(i) == "finished"

    typical = next(
        i
        for i in (*range(middle, sessions), *range(middle))
        if finished(i) and not bigjournal.is_fork(i)
    )
    forks = [i for i in (*range(middle, sessions), *range(middle)) if bigjournal.is_fork(i)]
    fork = next((i for i in forks if finished(i)), forks[0] if forks else None)
    return typical, fork


def requests(sessions: int, deep_url: str, deep_page: int) -> list[Request]:
    """What the bench times, in the table's order."""
    typical, fork = _picked(sessions)
    typical_id = bigjournal.session_id(typical)
    found = [
        Request("list, first page", "/", 'id="row-', True),
        Request("list, status=failed", "/?status=failed", 'class="status-failed"', True),
        Request(f"list, user={USER}", f"/?user={USER}", f'id="row-{USER}-', True),
        Request(f"list, page {deep_page} (cursor)", deep_url, 'id="row-', True),
        Request("session page, typical", _session_url(typical), typical_id, True),
    ]
    if fork is not None:
        url = _session_url(fork)
        found.append(Request("session page, a fork", url, bigjournal.session_id(fork), True))
    found += [
        Request("API list, first page", "/api/sessions", '"next_cursor"'),
        Request("API session, typical", "/api" + _session_url(typical), typical_id),
    ]
    return found


@dataclass(frozen=True)
class Results:
    timings: list[Timing]
    #: ms from ``loomflow ui`` started to its address line, in the warm run
    start_ms: float
    #: the list's page timed deep in, and the seconds following the links to it took
    deep_page: int
    walk_s: float


def measure(db: Path, sessions: int, count: int, warmup: int, deep: int) -> Results:
    """The timings of every request (see the module's docstring)."""
    with Console(db) as console, httpx.Client(base_url=console.url, timeout=120) as client:
        t0 = time.perf_counter()
        deep_url, deep_page = _deep(client, deep)
        walk_s = time.perf_counter() - t0
        timings = [Timing(r) for r in requests(sessions, deep_url, deep_page)]
        for timing in timings:
            for _ in range(warmup):
                _get(client, timing.request)
            for _ in range(count):
                took, timing.size = _get(client, timing.request)
                timing.warm_ms.append(took)
    for timing in timings:
        with Console(db) as cold, httpx.Client(base_url=cold.url, timeout=120) as client:
            timing.cold_ms, _ = _get(client, timing.request)
    return Results(timings, console.start_ms, deep_page, walk_s)


def table(timings: Sequence[Timing], count: int) -> str:
    lines = [
        f"| request | cold-process ms | warm p50 ms | p90 ms | max ms (of {count}) | KB |",
        "|---|---|---|---|---|---|",
    ]
    for t in timings:
        mark = (
            (" (target met)" if t.met() else " (**target missed**)") if t.request.targeted else ""
        )
        lines.append(
            f"| {t.request.name} | {t.cold_ms:.1f} | {t.p50():.1f}{mark} | {t.p90():.1f} | "
            f"{max(t.warm_ms):.1f} | {t.size / 1000:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--checkpoints", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=50, help="timed requests of each")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests of each first")
    parser.add_argument("--deep", type=int, default=100, help="the list's page timed deep in")
    parser.add_argument("--cache", type=Path, default=bigjournal.CACHE)
    parser.add_argument("--fresh", action="store_true", help="build the journal again")
    args = parser.parse_args(argv)
    shape = bigjournal.Shape(args.sessions, args.checkpoints)
    with tempfile.TemporaryDirectory() as tmp:
        db = bigjournal.build(
            Path(tmp) / "journal.db",
            sessions=shape.sessions,
            checkpoints=shape.checkpoints,
            cache=args.cache,
            fresh=args.fresh,
            log=lambda text: print(text, file=sys.stderr, flush=True),
        )
        rows = bigjournal.counts(db)
        size = db.stat().st_size
        results = measure(db, shape.sessions, args.requests, args.warmup, args.deep)
    timings = results.timings
    print(
        f"console: {rows['sessions']:,} sessions, {rows['checkpoints']:,} checkpoints, "
        f"{rows['events']:,} events, {size / 1e9:.2f} GB; `loomflow ui` listened "
        f"{results.start_ms:.0f} ms after it was started; following the next-page links "
        f"to page {results.deep_page} took {results.walk_s:.1f} s"
    )
    print(table(timings, args.requests))
    missed = [t.request.name for t in timings if t.request.targeted and not t.met()]
    verdict = "missed by " + ", ".join(missed) if missed else "met"
    print(f"target (warm p50 < {TARGET_MS:.0f} ms for the list and the session page): {verdict}")
    return results


if __name__ == "__main__":
    main()
