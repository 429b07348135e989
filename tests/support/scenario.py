"""The scenario agents of the conformance suite (loomflow.testing.scenario), for the
tests of one backend and the crash worker."""

from loomflow.testing.scenario import (
    FACTS,
    CrashingModel,
    Research,
    SimulatedCrash,
    research_script,
)

__all__ = ["FACTS", "CrashingModel", "Research", "SimulatedCrash", "research_script"]
