"""How a run's transcript is compacted once it grows past ``Tuning.auto_compact_at_tokens``.

The messages after the leading system messages, up to about the last
``compact_keep_messages``, are replaced by the model's summary of them; the system messages
and the kept tail stay as they were. Plain functions of the messages, no I/O: the loop
(``loop.py``) decides when, makes the model call and records the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from loomflow.models.base import COMPACTION_INSTRUCTIONS
from loomflow.schemas import Message, Role

__all__ = ["compacted", "estimated_tokens", "split", "summary_request"]


def estimated_tokens(messages: Sequence[Message]) -> int:
    """About how many tokens ``messages`` take (four characters a token), for a run whose
    model has not reported the size of its context yet."""
    return sum(len(m.content) + len(str(m.tool_calls)) for m in messages) // 4


def split(messages: Sequence[Message], keep: int) -> tuple[int, int]:
    """``(lead, cut)``: ``messages[lead:cut]`` is what a compaction that keeps about the
    last ``keep`` messages summarises (empty: nothing to compact)."""
    lead = 0
    while lead < len(messages) and messages[lead].role is Role.SYSTEM:
        lead += 1
    # the kept tail starts at a user message so no tool result loses its tool call
    cut = max(lead, len(messages) - keep)
    while cut > lead and messages[cut].role is not Role.USER:
        cut -= 1
    return lead, cut


def summary_request(head: Sequence[Message]) -> list[Message]:
    """What the model is asked to summarise ``head``, the messages a compaction replaces."""
    transcript = "\n\n".join(_render(m) for m in head)
    return [Message.system(COMPACTION_INSTRUCTIONS), Message.user(transcript)]


def compacted(messages: Sequence[Message], lead: int, cut: int, summary: str) -> list[Message]:
    """``messages`` with ``messages[lead:cut]`` replaced by the model's ``summary`` of them."""
    return [
        *messages[:lead],
        Message.user(f"Summary of the earlier conversation:\n{summary}"),
        *messages[cut:],
    ]


def _render(message: Message) -> str:
    text = f"[{message.role.value}] {message.content}"
    for call in message.tool_calls:
        text += f"\n(called {call.name} with {orjson.dumps(call.arguments).decode()})"
    return text
