"""One lifecycle for everything that holds connections, threads or clients."""

from __future__ import annotations

from typing import Self

__all__ = ["Resource"]


class Resource:
    """Opens once, closes once, and works as ``async with`` returning itself.

    ``open`` connects now instead of on first use; ``close`` releases what the resource
    holds and may be called again (and after a failed open). ``async with`` opens, and a
    failed open closes again so that nothing is left behind.
    """

    async def open(self) -> None:
        """Connect now instead of on first use (nothing to do for most resources)."""

    async def close(self) -> None:
        """Release connections and threads; calling it again does nothing."""

    async def __aenter__(self) -> Self:
        try:
            await self.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
