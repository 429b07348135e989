"""The Agent, its Tuning, and the loop of passes, tools, stop hooks and compaction."""

from loomflow.agent.agent import Agent
from loomflow.agent.context import RunContext, get_run_context
from loomflow.agent.signals import wait_for_signal
from loomflow.agent.streaming import RunItem, TextDelta
from loomflow.agent.tools import Tool, as_tool
from loomflow.agent.tuning import CONTINUATION_PROMPT, SessionState, StopHook, Tuning

__all__ = [
    "CONTINUATION_PROMPT",
    "Agent",
    "RunContext",
    "RunItem",
    "SessionState",
    "StopHook",
    "TextDelta",
    "Tool",
    "Tuning",
    "as_tool",
    "get_run_context",
    "wait_for_signal",
]
