"""What the conformance suites share: factories that close what they opened, and the
agent the runtime suite's mixins continue a session with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, Literal, NoReturn, Protocol, TypeVar

import pytest
import pytest_asyncio

from loomflow import Agent, Tuning
from loomflow.models import ScriptedModel
from loomflow.runtime import EventStore, Runtime, Scope
from loomflow.schemas import Event

__all__ = [
    "Opened",
    "RuntimeFactory",
    "StoreFactory",
    "Suite",
    "commit",
    "follower",
    "opened_fixture",
    "required_fixture",
]


class _Closable(Protocol):
    def close(self) -> Awaitable[None]: ...


C = TypeVar("C", bound=_Closable)


class RuntimeFactory(Protocol):
    """Opens a runtime on the storage of the test: each runtime it returns sees what the
    earlier ones wrote, as a process that reopens a file or reconnects would.

    The options are :class:`loomflow.runtime.Runtime`'s; one not given keeps the
    runtime's own default (the suite checks the default retention of 20).
    """

    def __call__(
        self,
        *,
        max_checkpoints_per_session: int = ...,
        serializer: Literal["json", "pickle"] = ...,
    ) -> Runtime: ...


#: Opens an event store on the storage of the test; each sees what earlier ones wrote.
StoreFactory = Callable[[], EventStore]


class Opened(Generic[C]):
    """A factory that remembers what it opened, so the suite can close it all."""

    def __init__(self, factory: Callable[..., C]) -> None:
        self._factory = factory
        self._opened: list[C] = []

    def __call__(self, **options: Any) -> C:
        made = self._factory(**options)
        self._opened.append(made)
        return made

    async def close_all(self) -> None:
        opened, self._opened = self._opened, []
        for made in reversed(opened):
            await made.close()


async def commit(store: EventStore, events: Sequence[Event]) -> None:
    """Append ``events`` and wait until the store's reads hold them.

    A store that appends to a log first (Kafka) refuses an event when its projector
    meets it, so a refusal is raised by ``append`` or by ``confirm``.
    """
    await store.append(events)
    for scope in dict.fromkeys(Scope(e.session_id, e.user_id) for e in events):
        await store.confirm(scope)


def follower(runtime: Runtime, reply: str = "ok") -> Agent:
    """A checkpointing agent that answers everything with ``reply``."""
    return Agent(
        "x", model=ScriptedModel(lambda m: reply), runtime=runtime, tuning=Tuning(checkpoint=True)
    )


def required_fixture(name: str, makes: str, *, factory: bool = True) -> Any:
    """The fixture ``name`` a subclass must define (a factory of ``makes``, or with
    ``factory=False`` a ``makes`` itself); without it, every test of the class errors
    saying so."""
    what = f"a callable returning a new {makes}" if factory else f"a {makes}"

    def missing(self: object) -> NoReturn:
        raise NotImplementedError(
            f"{type(self).__name__} must define the fixture {name}: {what} on the test's storage"
        )

    return pytest.fixture(missing, name=name)


def opened_fixture(name: str, *, one: bool = False) -> Any:
    """The fixture ``name``: the suite's factory (``one``: the first thing it opens)."""

    def fixture(self: object, _opened: Opened[Any]) -> Any:
        return _opened() if one else _opened

    return pytest.fixture(fixture, name=name)


class Suite:
    """What both suites share: coroutine tests, and a factory that closes what it opened
    when the test ends, before the subclass's fixture tears its storage down."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]
    #: the fixture a subclass defines, which makes what the suite tests
    factory: ClassVar[str]

    @pytest.fixture
    def _factory(self, request: pytest.FixtureRequest) -> Callable[..., Any]:
        # looked up by name from a plain fixture: the subclass's may be async
        factory: Callable[..., Any] = request.getfixturevalue(self.factory)
        return factory

    @pytest_asyncio.fixture
    async def _opened(self, _factory: Callable[..., _Closable]) -> AsyncIterator[Opened[Any]]:
        opened = Opened(_factory)
        yield opened
        await opened.close_all()
