"""The spec page's code runs unchanged against a local Messages API, SIGKILL included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_anthropic import FakeAnthropicServer, text_response

ROOT = Path(__file__).resolve().parents[1]


def _assistant_turns(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    turn = _assistant_turns(body)
    return text_response(f"answer {turn + 1}", input_tokens=100 + turn, output_tokens=10)


def _env(server: FakeAnthropicServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(
        ANTHROPIC_BASE_URL=server.url,
        ANTHROPIC_API_KEY="test-key",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _spec(
    phase: str, backend: str, cwd: Path, server: FakeAnthropicServer
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.spec_example", phase, backend],
        cwd=cwd,
        env=_env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("backend", ["sqlite", "inproc"])
def test_spec_code_runs_unchanged(tmp_path: Path, backend: str) -> None:
    with FakeAnthropicServer(_reply) as server:
        proc = _spec("both", backend, tmp_path, server)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        first, resumed, fork = (json.loads(line) for line in out.splitlines())
    assert first["turns"] == 1 and first["output"] == "answer 1"
    assert resumed["session_id"] == "research-2026-07-04"
    assert resumed["turns"] == 2 and resumed["restored_turns"] == 1 and resumed["model_calls"] == 1
    assert resumed["tokens_in"] == 100 + 101  # restored usage rolled up with the new call
    assert (
        fork["session_id"].startswith("sess") and fork["parent_session_id"] == "research-2026-07-04"
    )
    assert len(server.requests) == 3


def test_spec_code_resumes_after_sigkill(tmp_path: Path) -> None:
    with FakeAnthropicServer(_reply) as server:
        # the resume's model call (the second request) hangs: the process dies in it
        server.hold(lambda body: _assistant_turns(body) == 1)
        victim = _spec("run", "sqlite", tmp_path, server)
        try:
            server.wait_for_requests(2, timeout=60)
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        server.release()
        server.hold(lambda body: False)

        after = _spec("resume", "sqlite", tmp_path, server)
        out, err = after.communicate(timeout=60)
        assert after.returncode == 0, err
        result = json.loads(out.splitlines()[-1])
        requests = server.requests

    # the first turn finished before the kill: it was restored, never requested again
    assert sum(1 for body in requests if _assistant_turns(body) == 0) == 1
    final = requests[-1]
    assert final["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "answer 1"}],
    }
    assert result["restored_turns"] == 1 and result["model_calls"] == 1 and result["turns"] == 2
    assert result["tokens_in"] == 100 + 101
    assert result["output"] == "answer 2"
