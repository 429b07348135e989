"""The Agent, its Tuning, and the loop of passes, tools, stop hooks and compaction."""

from loomflow.agent.loop import Agent
from loomflow.agent.tools import Tool, as_tool
from loomflow.agent.tuning import CONTINUATION_PROMPT, SessionState, StopHook, Tuning

__all__ = ["CONTINUATION_PROMPT", "Agent", "SessionState", "StopHook", "Tool", "Tuning", "as_tool"]
