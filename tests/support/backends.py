"""The runtimes the conformance suite runs against, each able to reopen its storage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomflow.runtime import InProcRuntime, Runtime, SqliteRuntime


@dataclass
class Backend:
    """Opens runtimes on one storage: a second runtime sees what the first wrote."""

    name: str
    opener: Callable[..., Runtime]
    opened: list[Runtime] = field(default_factory=list)

    def runtime(self, **kwargs: Any) -> Runtime:
        runtime = self.opener(**kwargs)
        self.opened.append(runtime)
        return runtime

    async def close(self) -> None:
        for runtime in self.opened:
            await runtime.close()


def inproc_backend(tmp_path: Path) -> Backend:
    shared: list[Runtime] = []

    def opener(**kwargs: Any) -> Runtime:
        # every runtime shares the first one's memory, as a reopened file would
        if not shared:
            shared.append(InProcRuntime(**kwargs))
            return shared[0]
        return Runtime(shared[0].store, **kwargs)

    return Backend("inproc", opener)


def sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "journal.db"
    return Backend("sqlite", lambda **kwargs: SqliteRuntime(path, **kwargs))


BACKENDS: dict[str, Callable[[Path], Backend]] = {
    "inproc": inproc_backend,
    "sqlite": sqlite_backend,
}
