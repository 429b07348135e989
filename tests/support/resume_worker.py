"""What ``loomflow worker tests.support.resume_worker:research`` hosts in tests.

The research agent of the crash worker, on ``SqliteRuntime($RESEARCH_DB)`` or, without
that variable, on ``KafkaRuntime()`` from the LOOMFLOW_* variables; each model and tool
call is appended to ``$RESEARCH_LOG`` before it runs, as the crash worker does.
"""

from __future__ import annotations

import os
from pathlib import Path

from loomflow import Agent
from loomflow.runtime import KafkaRuntime, Runtime, SqliteRuntime
from tests.support.crash_worker import logged_agent
from tests.support.scenario import Research


def research() -> list[Agent]:
    db = os.environ.get("RESEARCH_DB")
    runtime: Runtime = SqliteRuntime(db) if db else KafkaRuntime()
    return [logged_agent(Research(passes=3), runtime, Path(os.environ["RESEARCH_LOG"]))]
