"""What the web console's tests share: a journal a person looks at in the console, and
the console over it, in this process (FastAPI's TestClient; uvicorn on a free port, for
the live streams) or as ``loomflow ui`` in a process of its own.

The journal holds the command line's zoo (a session in every status a person reads, of
three users and of none, with two checkpoints and a fork), sessions of alice and bob
(for a user-scoped console), two runs of alice waiting for a signal, and one session
whose transcript is hostile: script tags in the model's and the tool's text, a very long
line, control characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from loomflow import Agent, Tuning
from loomflow.control.source import Source
from loomflow.models import ScriptedModel
from loomflow.runtime import Runtime, SqliteRuntime
from loomflow.ui import ConsoleConfig, create_app
from tests.support import lifecycle
from tests.support.cli import populate

ROOT = Path(__file__).resolve().parents[2]
#: what the console is reached as: a loopback host name, the default port
BASE = "http://127.0.0.1:8765"

#: the model's answer in the hostile session: markup that must stay text
SCRIPT = '<script>document.title="pwned"</script><img src=x onerror="alert(1)">'
#: the tool's answer in it: one line of 200 000 characters
LONG_LINE = "long " * 40_000
#: text that looks binary: NUL, ESC and DEL among printable ones
BINARY = "bytes\x00\x1b[31mred\x7fend"


def echo(text: str) -> str:
    """Echo a text back, with a very long line after it."""
    return f"{text}\n{LONG_LINE}"


@dataclass(frozen=True)
class Journal:
    """What :func:`make_journal` wrote: the zoo's sessions (status -> (session, user)),
    alice's and bob's sessions, alice's runs waiting for "approve", and the hostile
    session (alice's)."""

    zoo: dict[str, tuple[str, str | None]]
    alice: list[str]
    bob: list[str]
    waiting: list[str]
    hostile: str
    db: Path | None = None

    @property
    def count(self) -> int:
        """How many sessions the journal has (every user's)."""
        return len(self.zoo) + len(self.alice) + len(self.bob) + len(self.waiting) + 1


def chatter(runtime: Runtime, reply: str = "Noted.") -> Agent:
    return Agent("Chat.", model=ScriptedModel([reply]), runtime=runtime)


async def write_journal(runtime: Runtime, *, zoo: bool = True) -> Journal:
    """The sessions of :class:`Journal`, written through ``runtime`` (without the zoo:
    only alice's and bob's)."""
    sessions: dict[str, tuple[str, str | None]] = {}
    if zoo:
        sessions, billing = await populate(runtime)
        sessions["billing"] = (billing, "ada")
    alice = [(await chatter(runtime).run("Hi.", user_id="alice")).session_id for _ in range(3)]
    bob = [(await chatter(runtime).run("Hi.", user_id="bob")).session_id for _ in range(2)]
    waiting = []
    for invoice in ("a-1", "a-2"):
        ran = await lifecycle.payer(runtime).run(
            f"Pay {invoice}.", session_id=invoice, user_id="alice"
        )
        assert ran.stop_reason == "waiting"
        waiting.append(invoice)
    hostile = Agent(
        f"Repeat {SCRIPT}",
        model=ScriptedModel(
            [ScriptedModel.tool_call("echo", text=f"{SCRIPT} {BINARY}"), f"{SCRIPT}\n{BINARY}"]
        ),
        runtime=runtime,
        tools=[echo],
        tuning=Tuning(checkpoint=True),
    )
    done = await hostile.run(f"Say {SCRIPT}", session_id="hostile", user_id="alice")
    assert done.stop_reason == "completed"
    return Journal(sessions, alice, bob, waiting, "hostile")


def make_journal(db: Path) -> Journal:
    """:func:`write_journal` into the SQLite file ``db``."""

    async def make() -> Journal:
        async with SqliteRuntime(db) as runtime:
            made = await write_journal(runtime)
        return Journal(made.zoo, made.alice, made.bob, made.waiting, made.hostile, db)

    return asyncio.run(make())


def console(source: Source | Path, *, base_url: str = BASE, **config: Any) -> TestClient:
    """The console over ``source`` (a SQLite file, or a Source) in this process, with
    ``config`` (ConsoleConfig's fields); use it in a ``with`` block (its lifespan)."""
    if isinstance(source, Path):
        source = Source(db=source)
    return TestClient(create_app(ConsoleConfig(source=source, **config)), base_url=base_url)


def until(condition: Callable[[], Any], *, within: float = 30.0, what: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``within``."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what or condition}")
        time.sleep(0.02)  # the poll interval of the condition, not a wait for an event


@contextlib.contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port, in a thread of this process;
    its base URL. The live streams need a real server: TestClient waits for an answer's
    end, and a stream has none."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        until(lambda: server.started or not thread.is_alive(), what="uvicorn to start")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


class Stream:
    """The server-sent events of one stream, read by a thread: ``events`` grows as they
    arrive, as (event, data) pairs."""

    def __init__(self, url: str, **headers: str) -> None:
        self.events: list[tuple[str, str]] = []
        self.status: int | None = None
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(60, read=None), headers=headers)
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()
        until(lambda: self.status is not None or not self._thread.is_alive(), what=url)

    def _read(self, url: str) -> None:
        with contextlib.suppress(httpx.HTTPError), self._client.stream("GET", url) as answer:
            self.status = answer.status_code
            kind = "message"
            for line in answer.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("event:"):
                    kind = line.partition(":")[2].strip()
                elif line.startswith("data:"):
                    self.events.append((kind, line.partition(":")[2].strip()))
                    kind = "message"

    def text(self) -> str:
        return "\n".join(data for _, data in self.events)

    def close(self) -> None:
        self._stop.set()
        self._client.close()
        self._thread.join(30)


# -- `loomflow ui` in a process of its own ---------------------------------------------


def user_env(**extra: str) -> dict[str, str]:
    """A user's environment for ``loomflow ui``: this venv's commands on PATH, no
    LOOMFLOW_UI_* setting unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOMFLOW_UI_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


@dataclass
class Process:
    """A ``loomflow ui`` process: where it said it listens, its login link (when it has
    a token) and its stderr so far."""

    proc: subprocess.Popen[bytes]
    log: Path
    url: str
    login: str | None

    def stderr(self) -> str:
        return self.log.read_text()


_LISTENS = re.compile(r"loomflow console on (http://\S+/) ")
_LOGIN = re.compile(r"open (http://\S+/login\?code=\S+) to sign in")


@contextlib.contextmanager
def ui_process(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Process]:
    """``loomflow ui ARGS`` started as a user starts it, until it says where it listens;
    stopped (Ctrl-C) after."""
    log = tmp_path / f"ui-{len(list(tmp_path.glob('ui-*.log')))}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["loomflow", "ui", *args], env=env or user_env(), stdout=out, stderr=out
        )
    try:

        def said() -> re.Match[str] | None:
            if proc.poll() is not None:
                raise AssertionError(f"loomflow ui exited {proc.returncode}: {log.read_text()}")
            return _LISTENS.search(log.read_text())

        url = until(said, within=60, what="loomflow ui to say where it listens").group(1)
        login = _LOGIN.search(log.read_text())  # written with the line above, at once
        yield Process(proc, log, url, login.group(1) if login else None)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
