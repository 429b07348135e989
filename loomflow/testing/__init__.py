"""Conformance suites for event stores, runtimes and the log's consumers, to run against
your own.

A store or runtime written outside loomflow proves itself with the assertions that
loomflow's own four runtimes (in-process, SQLite, PostgreSQL, Kafka) pass; a reader of
a log, or an audit trail, with those its SQLite and Kafka readers and its SQLite and
PostgreSQL trails pass. Install with
``pip install 'loomflow-durable[testing]'`` (pytest and pytest-asyncio); ``import
loomflow`` never imports this package.

Five pytest base classes. Subclass the first two in a test module and define one fixture: a
factory that opens a new store or runtime on the test's storage each time it is called.
Every store or runtime it returns must see what the earlier ones wrote (as a process
that reopens a file or reconnects to a server does); the suite opens several per test
and closes each one itself::

    import pytest
    from loomflow.runtime import Runtime
    from loomflow.testing import RuntimeConformance, StoreConformance


    class TestMyStore(StoreConformance):
        @pytest.fixture
        def open_store(self, tmp_path):
            return lambda: MyStore(tmp_path / "events.db")


    class TestMyRuntime(RuntimeConformance):
        @pytest.fixture
        def open_runtime(self, tmp_path):
            # options: Runtime's max_checkpoints_per_session= and serializer=; one not
            # given keeps the runtime's default (the suite checks a default retention of 20)
            return lambda **options: Runtime(MyStore(tmp_path / "events.db"), **options)

- :class:`StoreConformance` appends hand-made events (:class:`SessionLog`) to an
  :class:`~loomflow.runtime.EventStore`: idempotent retries, seq and epoch rules and their
  typed errors, atomic batches, reads of sessions, checkpoints, transcripts, steps and
  events, retention, prune, erase, scoping by user, payloads kept byte for byte.
  ``atomic_appends = False`` declares a store whose refused batch lands as a prefix (a log
  written before it is folded, as Kafka's).
- :class:`RuntimeConformance` runs scripted agents (:mod:`loomflow.testing.scenario`)
  on the runtime: one checkpoint per pass, resume without repeating a model or tool call,
  ``prompt=None``, forks (also under a ``user_id``), listing, retention (20 by default),
  prune, erase, the journal with and without checkpoints, writes that fail or land in
  doubt, a fenced stale writer, signals, and cancels (a run cancelled from another
  runtime stops at its next step; no worker resumes it), and signed writes (a store
  with a signing key signs every event, and each reads back with its signature holding).
- :class:`ListingConformance` lists the sessions of a
  :class:`~loomflow.runtime.DatabaseStore` (its fixture ``open_store``, as the store
  suite's): ``list_sessions`` in its order, page by page after a
  :class:`~loomflow.schemas.SessionCursor` (ties on ``updated_at`` included), with its
  filters; ``session_totals`` counting and summing what they select; cursor tokens that
  read back, and a ValueError for one that is not.
- :class:`LogReaderConformance` reads the log its fixture ``log`` holds (a
  :class:`ReadableLog`: a store that writes to it, readers of it from a :data:`Start`, a
  record that does not decode): every record once, in log order, with positions; a
  position given back (or committed) resumes right after what was read; a record that
  does not decode returned with its reason; ``drain``; what ``erase`` and ``prune``
  leave. The log's class attributes say what differs: ``deletes_records`` (an embedded
  log; False for one that keeps every record, as Kafka's) and ``starts_at_end``.
- :class:`AuditTrailConformance` audits a log (fixture ``log``, an :class:`AuditedLog`:
  by default a :class:`SqliteLog` in ``tmp_path``) into the trails of its fixture
  ``open_trail``, and changes them behind their back through its fixture ``tamper`` (a
  :class:`TrailTampering`): a trail is its log's chain and verifies; auditing again adds
  nothing; entries deleted, inserted, reordered or altered are found and named; erasure
  and prune read as what they are; what cannot be chained is kept among the rejects.

A fixture may be an async generator that starts a server before it yields and stops it
after; under pytest-asyncio's strict mode, declare it with ``@pytest_asyncio.fixture``.
The tests are coroutines marked ``asyncio``, each on its own event loop. Each suite goes
in a class of its own (they share the fixtures' plumbing); a test may ask for the
suite's fixtures too: ``new_store``/``new_runtime`` (the factory, closing what it
opened when the test ends) and ``store``/``runtime`` (the first thing it opened).
"""

from __future__ import annotations

try:
    import pytest
    import pytest_asyncio  # noqa: F401 - the suite's async fixtures need it
except ModuleNotFoundError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        f"loomflow.testing needs {exc.name!r}, which comes with an extra: "
        "pip install 'loomflow-durable[testing]'",
        name=exc.name,
    ) from exc

# the suites' assertions report their operands, as those of a test module do
pytest.register_assert_rewrite(
    "loomflow.testing.store",
    "loomflow.testing.listing",
    "loomflow.testing.runtime",
    "loomflow.testing.checkpoints",
    "loomflow.testing.resume",
    "loomflow.testing.forks",
    "loomflow.testing.failures",
    "loomflow.testing.journal",
    "loomflow.testing.fencing",
    "loomflow.testing.retention",
    "loomflow.testing.signals",
    "loomflow.testing.cancel",
    "loomflow.testing.keywords",
    "loomflow.testing.signing",
    "loomflow.testing.log",
    "loomflow.testing.sqlite_log",
    "loomflow.testing.trail",
)

from loomflow.testing._support import RuntimeFactory, StoreFactory  # noqa: E402
from loomflow.testing.listing import ListingConformance  # noqa: E402
from loomflow.testing.log import (  # noqa: E402
    AuditedLog,
    LogReaderConformance,
    ReadableLog,
    Start,
)
from loomflow.testing.runtime import RuntimeConformance  # noqa: E402
from loomflow.testing.sqlite_log import SqliteLog  # noqa: E402
from loomflow.testing.store import SessionLog, StoreConformance  # noqa: E402
from loomflow.testing.trail import AuditTrailConformance, TrailTampering  # noqa: E402

__all__ = [
    "AuditTrailConformance",
    "AuditedLog",
    "ListingConformance",
    "LogReaderConformance",
    "ReadableLog",
    "RuntimeConformance",
    "RuntimeFactory",
    "SessionLog",
    "SqliteLog",
    "Start",
    "StoreConformance",
    "StoreFactory",
    "TrailTampering",
]
