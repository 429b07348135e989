"""The runtime conformance suite: every rule of checkpoints, resume, fork and the journal,
as an :class:`loomflow.Agent` on the runtime under test lives them.

:class:`RuntimeConformance` holds the fixtures; its tests come from one mixin per
feature, each in a module of its own: :mod:`~loomflow.testing.checkpoints`,
:mod:`~loomflow.testing.resume`, :mod:`~loomflow.testing.forks`,
:mod:`~loomflow.testing.failures`, :mod:`~loomflow.testing.journal`,
:mod:`~loomflow.testing.fencing`, :mod:`~loomflow.testing.retention`,
:mod:`~loomflow.testing.signals`, :mod:`~loomflow.testing.cancel`,
:mod:`~loomflow.testing.keywords` and :mod:`~loomflow.testing.signing`. The agents are
scripted (:mod:`loomflow.testing.scenario`), so a repeated model or tool call shows in
the counts, and a crash is a ``BaseException`` raised mid-run.
"""

from __future__ import annotations

from loomflow.testing._support import Suite, opened_fixture, required_fixture
from loomflow.testing.cancel import Cancellation
from loomflow.testing.checkpoints import Checkpoints
from loomflow.testing.failures import Failures
from loomflow.testing.fencing import Fencing
from loomflow.testing.forks import Forks
from loomflow.testing.journal import JournalSteps
from loomflow.testing.keywords import RunKeywords
from loomflow.testing.resume import Resume
from loomflow.testing.retention import Retention
from loomflow.testing.signals import Signals
from loomflow.testing.signing import Signing

__all__ = ["RuntimeConformance"]


class RuntimeConformance(
    Checkpoints,
    Resume,
    Forks,
    Failures,
    JournalSteps,
    Fencing,
    Retention,
    Signals,
    Cancellation,
    RunKeywords,
    Signing,
    Suite,
):
    """Subclass in a test module and define the fixture ``open_runtime``: a callable that
    takes :class:`loomflow.runtime.Runtime`'s options and returns a new runtime on the
    test's storage, each seeing what the earlier ones wrote.
    """

    factory = "open_runtime"
    open_runtime = required_fixture("open_runtime", "Runtime")
    new_runtime = opened_fixture("new_runtime")
    runtime = opened_fixture("runtime", one=True)
