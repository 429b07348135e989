"""A local stand-in for the Anthropic Messages API, for tests that must not reach the network.

In-process use::

    with FakeAnthropicServer(lambda body: text_response("hi")) as server:
        model = AnthropicModel(api_key="test", base_url=server.url)
        ...
        assert server.requests[0]["messages"][0]["role"] == "user"

``responder(body)`` gets each parsed ``POST /v1/messages`` body and returns the response
JSON, ``(status, json)`` for an error, or ``(status, json, headers)`` to add headers such as
``retry-after-ms``. A request with ``"stream": true`` gets the same reply as server-sent
events, in the order the API sends them (``message_start``, ``ping``, per block
``content_block_start``/``_delta``/``_stop``, ``message_delta``, ``message_stop``), text,
thinking and tool input cut into several deltas; see :func:`stream_events`.
``server.break_streams(after, ...)`` ends streams early: an error event, a cut, or a clean end.
``server.gate_stream(event)`` makes a stream pause after its first text delta until the
client sets ``event``, so a test can tell deltas arrive before the reply is whole.
``server.hold(predicate)`` makes matching requests hang (after they are
recorded) until ``server.release()`` or the server closes, so a test can SIGKILL a client
mid-request; ``server.wait_for_requests(n)`` tells it when the request has arrived.
``server.raw_requests`` keeps each body's bytes as the client sent them.

As a separate process::

    python -m tests.support.fake_anthropic --script replies.json --port-file port.txt \
        [--log requests.jsonl] [--port 0]

``replies.json`` is a JSON list; a request containing ``i`` assistant messages gets entry
``i``, so a client that crashes and resumes a session gets the same next reply. An entry is
a Messages API response object, or ``{"status": 529, "body": {...}, "headers": {...}}`` for
an error, or ``{"hold": true, "then": <entry>}`` to hang until the server is stopped (then
answer with ``then``, by default a 529). Requests past the end of the script get a 500. The
chosen port is written to ``--port-file`` (atomically, once listening); each request body
is appended to ``--log`` as one JSON line. SIGTERM or SIGINT stops the server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

__all__ = [
    "FakeAnthropicServer",
    "Responder",
    "error_response",
    "redacted_thinking_block",
    "scripted_responder",
    "stream_events",
    "text_response",
    "thinking_block",
    "tool_use_response",
]

logger = logging.getLogger("tests.support.fake_anthropic")

Reply = dict[str, Any] | tuple[int, dict[str, Any]] | tuple[int, dict[str, Any], dict[str, str]]
Responder = Callable[[dict[str, Any]], Reply]

DEFAULT_MODEL = "claude-opus-4-7"


def _usage(
    input_tokens: int,
    output_tokens: int,
    cache_read: int,
    cache_write: int,
    cache_write_1h: int | None = None,
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_write,
    }
    if cache_write_1h is not None:
        # The API's breakdown of the writes by cache lifetime.
        usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": cache_write - cache_write_1h,
            "ephemeral_1h_input_tokens": cache_write_1h,
        }
    return usage


def thinking_block(thinking: str, signature: str) -> dict[str, Any]:
    """A ``thinking`` content block as the API returns it."""
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def redacted_thinking_block(data: str) -> dict[str, Any]:
    """A ``redacted_thinking`` content block (opaque ``data``) as the API returns it."""
    return {"type": "redacted_thinking", "data": data}


def _message(
    content: list[dict[str, Any]], stop_reason: str, model: str, usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def text_response(
    text: str,
    *,
    thinking: Sequence[dict[str, Any]] = (),
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int = 0,
    cache_write: int = 0,
    cache_write_1h: int | None = None,
    model: str = DEFAULT_MODEL,
) -> dict[str, Any]:
    """A Messages API reply of one text block (after any ``thinking`` blocks), ending the turn."""
    return _message(
        [*thinking, {"type": "text", "text": text}],
        "end_turn",
        model,
        _usage(input_tokens, output_tokens, cache_read, cache_write, cache_write_1h),
    )


def tool_use_response(
    name: str,
    input: dict[str, Any],
    *,
    id: str | None = None,
    text: str = "",
    thinking: Sequence[dict[str, Any]] = (),
    input_tokens: int = 10,
    output_tokens: int = 5,
    model: str = DEFAULT_MODEL,
) -> dict[str, Any]:
    """A Messages API reply asking for one tool call, optionally preceded by thinking and text."""
    content: list[dict[str, Any]] = [*thinking]
    if text:
        content.append({"type": "text", "text": text})
    content.append(
        {
            "type": "tool_use",
            "id": id or f"toolu_{uuid.uuid4().hex[:24]}",
            "name": name,
            "input": input,
        }
    )
    return _message(content, "tool_use", model, _usage(input_tokens, output_tokens, 0, 0))


def error_response(
    status: int, error_type: str, message: str, *, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """An API error reply in the shape the real API sends (``{"type": "error", ...}``)."""
    body = {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": f"req_{uuid.uuid4().hex[:24]}",
    }
    return status, body, dict(headers or {})


def _pieces(text: str) -> list[str]:
    """``text`` cut into words with their trailing spaces: several deltas, none empty."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


def _chunks(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_events(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The server-sent events the API streams for the reply ``message`` (a response object).

    ``message_start`` carries the input and cache usage and one output token, as the API's
    does; ``message_delta`` the stop reason and the final output count, so the stream adds
    up to ``message``'s usage.
    """
    usage = dict(message["usage"])
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                **message,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage, "output_tokens": 1},
            },
        },
        {"type": "ping"},
    ]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        start: dict[str, Any]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        elif kind == "tool_use":
            start = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in _chunks(json.dumps(block["input"]))
            ]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": piece}
                for piece in _pieces(block["thinking"])
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:  # redacted_thinking and anything else arrive whole
            start = dict(block)
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": message.get("stop_reason"),
                "stop_sequence": message.get("stop_sequence"),
            },
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


def _assistant_turns(body: Mapping[str, Any]) -> int:
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")


def _entry_reply(entry: Mapping[str, Any]) -> Reply:
    if "status" in entry:
        return int(entry["status"]), dict(entry.get("body", {})), dict(entry.get("headers", {}))
    return dict(entry)


def scripted_responder(script: Sequence[Mapping[str, Any]]) -> Responder:
    """A responder answering a request with ``i`` assistant messages by ``script[i]``.

    Entries are as in the module docstring; a ``hold`` entry answers with its ``then``
    (the hanging itself is the server's job, see ``_hold_predicate``).
    """

    def respond(body: dict[str, Any]) -> Reply:
        turn = _assistant_turns(body)
        if turn >= len(script):
            return error_response(500, "api_error", f"script has no reply for turn {turn}")
        entry = script[turn]
        if entry.get("hold"):
            then = entry.get("then")
            if then is None:
                return error_response(529, "overloaded_error", "held request released")
            return _entry_reply(then)
        return _entry_reply(entry)

    return respond


def _hold_predicate(script: Sequence[Mapping[str, Any]]) -> Callable[[dict[str, Any]], bool]:
    def held(body: dict[str, Any]) -> bool:
        turn = _assistant_turns(body)
        return turn < len(script) and bool(script[turn].get("hold"))

    return held


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeAnthropicServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def do_POST(self) -> None:
        fake = self.server.fake
        if self.path.split("?", 1)[0] != "/v1/messages":
            self._send(*error_response(404, "not_found_error", f"no route {self.path}"))
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            self._send(*error_response(400, "invalid_request_error", "body is not JSON"))
            return
        if not isinstance(body, dict):
            self._send(*error_response(400, "invalid_request_error", "body is not an object"))
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        release = fake._record(body, headers, raw)
        if release is not None:
            release.wait()
        try:
            reply = fake.responder(body)
        except Exception as exc:
            # An exploding responder must fail the request, not leave the client hanging.
            logger.exception("responder failed")
            reply = error_response(500, "api_error", f"fake responder raised {exc!r}")
        if isinstance(reply, tuple):
            self._send(*reply)
        elif body.get("stream"):
            self._send_stream(reply)
        else:
            self._send(200, reply)

    def _send_stream(self, reply: dict[str, Any]) -> None:
        fake = self.server.fake
        gate, breaking = fake._stream_gate, fake._stream_break
        events = stream_events(reply)
        cut = False
        if breaking is not None:
            after, error, cut = breaking
            events = events[:after] + ([{"type": "error", "error": error}] if error else [])
            cut = cut and error is None
        # The client may have been killed while its request was held.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # HTTP/1.1 chunks, as the API sends: a body cut short is then seen to be.
            self.protocol_version = "HTTP/1.1"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.send_header("request-id", "req_fake")
            self.end_headers()
            self.close_connection = True
            for event in events:
                data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                delta = event.get("delta", {})
                if gate is not None and delta.get("type") == "text_delta":
                    fake._gate_results.append(gate.wait(timeout=5.0))
                    gate = None
            if not cut:
                self.wfile.write(b"0\r\n\r\n")  # the last chunk

    def _send(
        self, status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        # The client may have been killed while its request was held.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("request-id", str(body.get("request_id", "req_fake")))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)


class FakeAnthropicServer:
    """An HTTP server on 127.0.0.1 (OS-assigned port) answering ``POST /v1/messages``."""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        port: int = 0,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.responder: Responder = responder or (lambda body: text_response("ok"))
        self._port = port
        self._log_path = Path(log_path) if log_path is not None else None
        self._cond = threading.Condition()
        self._requests: list[dict[str, Any]] = []
        self._raw: list[bytes] = []
        self._headers: list[dict[str, str]] = []
        self._stream_gate: threading.Event | None = None
        self._stream_break: tuple[int, dict[str, Any] | None, bool] | None = None
        self._gate_results: list[bool] = []
        self._hold: Callable[[dict[str, Any]], bool] | None = None
        self._release = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port the server listens on; only known once started."""
        if self._httpd is None:
            raise RuntimeError("the fake server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give the SDK (``base_url`` / ``ANTHROPIC_BASE_URL``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of the request bodies received so far, oldest first."""
        with self._cond:
            return list(self._requests)

    @property
    def raw_requests(self) -> list[bytes]:
        """The request bodies received so far as the client sent them, oldest first."""
        with self._cond:
            return list(self._raw)

    @property
    def gate_results(self) -> list[bool]:
        """For each stream paused by :meth:`gate_stream`: whether the client opened the gate
        (False: it waited the 5 s out, so the client had not seen the first delta)."""
        with self._cond:
            return list(self._gate_results)

    def break_streams(
        self, after: int, *, error: dict[str, Any] | None = None, cut: bool = True
    ) -> None:
        """End each stream after its first ``after`` events: with an ``error`` event (the
        API's ``{"type": ..., "message": ...}``), by closing the connection mid-body
        (``cut``), or else as if it were whole."""
        with self._cond:
            self._stream_break = (after, error, cut)

    def gate_stream(self, event: threading.Event | None) -> None:
        """Pause each stream after its first text delta until ``event`` is set (at most 5 s)."""
        with self._cond:
            self._stream_gate = event

    @property
    def headers(self) -> list[dict[str, str]]:
        """A snapshot of the request headers (names lower-cased), parallel to ``requests``."""
        with self._cond:
            return list(self._headers)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until ``n`` requests have arrived (held ones count); raise TimeoutError if not."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests, got {len(self._requests)}")
            return list(self._requests)

    def hold(self, predicate: Callable[[dict[str, Any]], bool]) -> None:
        """Make requests whose body satisfies ``predicate`` hang until ``release()``."""
        with self._cond:
            self._hold = predicate
            self._release = threading.Event()

    def release(self) -> None:
        """Let held requests proceed to their replies and stop holding new ones."""
        with self._cond:
            self._hold = None
            self._release.set()

    def _record(
        self, body: dict[str, Any], headers: dict[str, str], raw: bytes
    ) -> threading.Event | None:
        """Store a request; return the event to wait on if it must be held."""
        with self._cond:
            self._requests.append(body)
            self._raw.append(raw)
            self._headers.append(headers)
            if self._log_path is not None:
                with self._log_path.open("a", encoding="utf-8") as log:
                    log.write(json.dumps(body) + "\n")
            self._cond.notify_all()
            hold = self._hold
            release = self._release
        try:
            held = hold is not None and hold(body)
        except Exception:
            logger.exception("hold predicate failed; not holding")
            held = False
        return release if held else None

    def start(self) -> FakeAnthropicServer:
        """Bind and serve in a daemon thread; returns self."""
        httpd = _Server(("127.0.0.1", self._port), _Handler)
        httpd.fake = self
        self._httpd = httpd
        # A short poll keeps close() quick; shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-anthropic-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Release held requests, stop serving and free the port."""
        self.release()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeAnthropicServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake API from a script file until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--script", required=True, type=Path, help="JSON list of replies")
    parser.add_argument("--port-file", required=True, type=Path, help="where to write the port")
    parser.add_argument("--log", type=Path, help="append each request body here as JSON lines")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: any)")
    args = parser.parse_args(argv)

    script = json.loads(args.script.read_text(encoding="utf-8"))
    if not isinstance(script, list):
        parser.error("--script must contain a JSON list")

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    server = FakeAnthropicServer(scripted_responder(script), port=args.port, log_path=args.log)
    server.hold(_hold_predicate(script))
    with server, contextlib.suppress(KeyboardInterrupt):
        _write_atomically(args.port_file, f"{server.port}\n")
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
