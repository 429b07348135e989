"""One peer store's measurement, run by the python of the separate peers venv.

Run as a script by path (``.cache/bench-peers/bin/python bench/peer_runner.py --store ...``),
never with ``-m`` from the repo root: that would put our source tree first on sys.path and
``import loomflow`` would load our package instead of loomflow 0.20.0 from PyPI.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# appended, not prepended, so site-packages' loomflow still wins over our source tree
sys.path.append(str(REPO))

from bench.workload import (  # noqa: E402
    LIST_LIMIT,
    SYSTEM_PROMPT,
    Adapter,
    PassContent,
    child_main,
)

PEER_STORES = ("lg-sqlite", "lf020-sqlite")
_RETAIN = 20


def _peer(module: str) -> Any:
    """A module of loomflow 0.20.0, whose names are ours too: untyped, so that mypy does
    not check the peer's API against this repository's package."""
    return importlib.import_module(module)


def _compact_json(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


# -- LangGraph AsyncSqliteSaver ----------------------------------------------------------


@dataclass
class _Thread:
    config: dict[str, Any]
    messages: list[dict[str, Any]]
    versions: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0})


class LangGraphSqlite(Adapter):
    """The transcript as a graph's ``messages`` channel, one checkpoint per pass.

    The saver keeps every checkpoint (it has no retention); its connection is the one
    ``from_conn_string`` opens, with the saver's own settings (WAL, default synchronous).
    """

    retain = 0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        self._stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        self.saver = await self._stack.enter_async_context(
            AsyncSqliteSaver.from_conn_string(str(self.path))
        )
        await self.saver.setup()

    async def seed(self, index: int) -> _Thread:
        config = {"configurable": {"thread_id": f"thread-{index}", "checkpoint_ns": ""}}
        return _Thread(config, [{"role": "system", "content": SYSTEM_PROMPT}])

    def add(self, handle: _Thread, k: int, content: PassContent) -> None:
        handle.messages += [
            {"role": "user", "content": content.user},
            {
                "role": "assistant",
                "content": content.assistant,
                "tool_calls": [
                    {"id": content.call_id, "name": content.tool_name, "args": content.tool_args}
                ],
            },
            {"role": "tool", "content": content.tool_result, "tool_call_id": content.call_id},
        ]
        handle.usage = {
            "input_tokens": handle.usage["input_tokens"] + content.input_tokens,
            "output_tokens": handle.usage["output_tokens"] + content.output_tokens,
        }

    async def put(self, handle: _Thread, k: int, new: None) -> None:
        from langgraph.checkpoint.base import create_checkpoint

        # what the pregel loop hands the saver after a step that wrote both channels
        saver = self.saver
        new_versions = {
            ch: saver.get_next_version(handle.versions.get(ch), None)
            for ch in ("messages", "usage")
        }
        handle.versions.update(new_versions)
        state = {
            "channel_values": {"messages": list(handle.messages), "usage": dict(handle.usage)},
            "channel_versions": dict(handle.versions),
            "versions_seen": {"agent": dict(handle.versions)},
        }
        # langgraph is installed in the peers venv only; where mypy sees it, state is
        # a plain dict where it wants its Checkpoint TypedDict
        checkpoint = create_checkpoint(state, None, k)  # type: ignore[arg-type, unused-ignore]
        meta = {"source": "loop", "step": k, "parents": {}}
        handle.config = await saver.aput(handle.config, checkpoint, meta, new_versions)

    def _thread(self, handle: _Thread) -> dict[str, Any]:
        return {"configurable": {**handle.config["configurable"], "checkpoint_id": None}}

    async def get_latest(self, handle: _Thread) -> tuple[list[Any], int]:
        found = await self.saver.aget_tuple(self._thread(handle))
        if found is None:
            return [], -1
        return found.checkpoint["channel_values"]["messages"], found.metadata["step"]

    async def list50(self, handle: _Thread) -> int:
        count = 0
        async for _ in self.saver.alist(self._thread(handle), limit=LIST_LIMIT):
            count += 1
        return count

    def written(self, handle: _Thread) -> list[Any]:
        return handle.messages

    def ref(self, handle: _Thread) -> str:
        return str(handle.config["configurable"]["thread_id"])

    def from_ref(self, ref: str) -> _Thread:
        return _Thread({"configurable": {"thread_id": ref, "checkpoint_ns": ""}}, [])

    def transcript_json_bytes(self, messages: list[Any]) -> int:
        return _compact_json(messages)

    async def close(self) -> None:
        await self._stack.aclose()

    def reopen(self) -> Adapter:
        return LangGraphSqlite(self.path)


# -- loomflow 0.20.0 (PyPI) SqliteRuntime ------------------------------------------------


@dataclass
class _Session:
    session_id: str
    messages: list[Any]
    usage: Any = None


class Loomflow020Sqlite(Adapter):
    """loomflow 0.20.0's checkpoint path: one ``Checkpoint`` (full transcript) per pass.

    Its agent builds ``Checkpoint(...)`` and calls ``runtime.put_checkpoint``, which hands
    it to ``runtime.store``; the timed put is that build plus the store call.
    """

    retain = _RETAIN

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runtime = _peer("loomflow.runtime").SqliteRuntime(
            path, max_checkpoints_per_session=_RETAIN
        )
        self.store = self.runtime.store
        self.types = _peer("loomflow.core.types")
        self.checkpoint = _peer("loomflow.runtime.journal").Checkpoint
        self.files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]

    async def seed(self, index: int) -> _Session:
        lf = self.types
        return _Session(
            f"sess-{index}", [lf.Message(role=lf.Role.SYSTEM, content=SYSTEM_PROMPT)], lf.Usage()
        )

    def add(self, handle: _Session, k: int, content: PassContent) -> None:
        lf = self.types
        call = lf.ToolCall(id=content.call_id, tool=content.tool_name, args=content.tool_args)
        handle.messages += [
            lf.Message(role=lf.Role.USER, content=content.user),
            lf.Message(role=lf.Role.ASSISTANT, content=content.assistant, tool_calls=(call,)),
            lf.Message(
                role=lf.Role.TOOL, content=content.tool_result, tool_call_id=content.call_id
            ),
        ]
        handle.usage = lf.Usage(
            input_tokens=handle.usage.input_tokens + content.input_tokens,
            output_tokens=handle.usage.output_tokens + content.output_tokens,
        )

    async def put(self, handle: _Session, k: int, new: None) -> None:
        await self.store.put_checkpoint(
            self.checkpoint(
                session_id=handle.session_id,
                turn=k,
                messages=list(handle.messages),
                cumulative_usage=handle.usage,
                cursor=None,
            )
        )

    async def get_latest(self, handle: _Session) -> tuple[list[Any], int]:
        found = await self.store.get_latest_checkpoint(handle.session_id)
        return ([], -1) if found is None else (list(found.messages), found.turn)

    async def list50(self, handle: _Session) -> int:
        return len(await self.store.list_checkpoints(handle.session_id, LIST_LIMIT))

    def written(self, handle: _Session) -> list[Any]:
        return handle.messages

    def ref(self, handle: _Session) -> str:
        return handle.session_id

    def from_ref(self, ref: str) -> _Session:
        return _Session(ref, [])

    def transcript_json_bytes(self, messages: list[Any]) -> int:
        return _compact_json([m.model_dump(mode="json") for m in messages])

    async def close(self) -> None:
        await self.store.aclose()

    def reopen(self) -> Adapter:
        return Loomflow020Sqlite(self.path)


def _make(store: str, tmp: Path) -> Adapter:
    if store == "lg-sqlite":
        return LangGraphSqlite(tmp / "lg.db")
    if store == "lf020-sqlite":
        import loomflow

        origin = Path(loomflow.__file__).resolve()
        if origin.parent == REPO / "loomflow":
            raise RuntimeError(f"imported our loomflow ({origin}), not the PyPI 0.20.0")
        return Loomflow020Sqlite(tmp / "lf020.db")
    raise ValueError(f"unknown peer store {store!r}")


def _versions() -> dict[str, Any]:
    names = ("langgraph-checkpoint", "langgraph-checkpoint-sqlite", "aiosqlite", "loomflow")
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return {"versions": found, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}


if __name__ == "__main__":
    child_main(_make, _versions, command=[sys.executable, str(Path(__file__).resolve())])
