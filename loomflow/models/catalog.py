"""What loomflow knows of each Claude model: its list price, and what it accepts of
effort, thinking, output length and structured output.

Both tables are keyed by name prefix and read through the same lookup, so a dated
release (``claude-sonnet-4-5-20250929``) or a Vertex name (``claude-opus-4@20250514``)
finds its family's entry. The adapter (:mod:`loomflow.models.anthropic`) prices each
call's usage and shapes each request with them; nothing here imports the SDK.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from loomflow.models.base import Effort
from loomflow.schemas import Usage

__all__ = ["Capabilities", "Price", "capabilities_for", "price_for"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Price:
    """List price of a model in USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    cache_write_1h: float | None = None

    @classmethod
    def of(cls, input: float, output: float) -> Price:
        """The price of a model whose cache reads cost 0.1x input, 5-minute writes 1.25x and
        1-hour writes 2x."""
        return cls(
            input=input,
            output=output,
            cache_read=input * 0.1,
            cache_write=input * 1.25,
            cache_write_1h=input * 2.0,
        )

    def cost(self, usage: Usage, *, long_writes: int = 0) -> float:
        """The cost in USD of ``usage``; its own ``cost_usd`` is ignored.

        ``long_writes`` of its ``cache_write_tokens`` went to 1-hour cache entries and
        are priced as such; the rest are 5-minute writes.
        """
        long_writes = min(long_writes, usage.cache_write_tokens)
        long_price = self.cache_write if self.cache_write_1h is None else self.cache_write_1h
        total = (
            usage.input_tokens * self.input
            + usage.cached_input_tokens * self.cache_read
            + (usage.cache_write_tokens - long_writes) * self.cache_write
            + long_writes * long_price
            + usage.output_tokens * self.output
        )
        # Rounded so sums of many turns compare equal however they were added up.
        return round(total / 1_000_000, 10)


_OPUS_LEGACY = Price.of(15.0, 75.0)
_OPUS = Price.of(5.0, 25.0)
_SONNET = Price.of(3.0, 15.0)

# Keys are matched as prefixes of the normalised name (see _lookup); longest wins.
_PRICES: dict[str, Price] = {
    # Any Opus 4.x newer than 4.1 is priced like 4.5; 4.0 and 4.1 override it below.
    "claude-opus-4": _OPUS,
    "claude-opus-4-0": _OPUS_LEGACY,
    "claude-opus-4-1": _OPUS_LEGACY,
    "claude-opus-4-5": _OPUS,
    "claude-opus-4-6": _OPUS,
    "claude-opus-4-7": _OPUS,
    "claude-sonnet-4": _SONNET,
    "claude-3-7-sonnet": _SONNET,
    "claude-haiku-4-5": Price.of(1.0, 5.0),
    "claude-3-5-haiku": Price.of(0.8, 4.0),
}

# The first Claude 4 releases had no minor version: "claude-opus-4-20250514" (or
# "claude-opus-4@20250514" on Vertex) is Opus 4.0, priced unlike the generic "claude-opus-4".
_UNVERSIONED = re.compile(r"^(claude-[a-z]+-\d+)(?=$|[-@]\d{8})")


def _lookup(table: Mapping[str, _T], model: str) -> _T | None:
    """The entry of ``table`` whose key is the longest prefix of ``model``'s normalised name."""
    name = _UNVERSIONED.sub(r"\1-0", model.strip().lower())
    best: str | None = None
    for prefix in table:
        if not name.startswith(prefix):
            continue
        # "claude-opus-4-1" must not claim a hypothetical "claude-opus-4-10".
        if name[len(prefix) : len(prefix) + 1].isdigit():
            continue
        if best is None or len(prefix) > len(best):
            best = prefix
    return None if best is None else table[best]


def price_for(model: str) -> Price | None:
    """The list price of ``model`` (dated and Vertex ``@`` names included), or None if unknown."""
    return _lookup(_PRICES, model)


# --- what each model accepts -------------------------------------------------------------


@dataclass(frozen=True)
class Capabilities:
    """What a Claude model accepts of effort, thinking and structured output."""

    # "adaptive": thinking {"type": "adaptive"}, depth set by output_config.effort;
    # "budget": thinking {"type": "enabled", "budget_tokens": N}; None: no thinking.
    thinking: Literal["adaptive", "budget"] | None
    # the levels output_config.effort takes; () where the model has no effort parameter
    efforts: tuple[Effort, ...]
    max_output: int  # the largest max_tokens the model takes
    structured_outputs: bool  # output_config.format


_ALL_LEVELS = tuple(Effort)
_UP_TO_HIGH = (Effort.LOW, Effort.MEDIUM, Effort.HIGH)
_ADAPTIVE = Capabilities("adaptive", _ALL_LEVELS, 128_000, True)
_ADAPTIVE_64K = Capabilities("adaptive", _ALL_LEVELS, 64_000, True)
_BUDGET = Capabilities("budget", (), 64_000, True)
_BUDGET_NO_FORMAT = Capabilities("budget", (), 64_000, False)

# Matched like the prices. Opus 4.6+ and Sonnet 4.6+ think adaptively (4.7 and later
# refuse a budget); Opus 4.5, Sonnet 4.5, Haiku 4.5 and older Claude 4 models take a
# budget; Claude 3 models other than 3.7 Sonnet do not think. Effort levels per model
# and output limits as the API's model pages give them.
_CAPABILITIES: dict[str, Capabilities] = {
    "claude-opus-4": _ADAPTIVE,
    "claude-opus-4-0": Capabilities("budget", (), 32_000, False),
    "claude-opus-4-1": Capabilities("budget", (), 32_000, False),
    "claude-opus-4-5": Capabilities("budget", _UP_TO_HIGH, 64_000, True),
    "claude-sonnet-4": _ADAPTIVE_64K,
    "claude-sonnet-4-0": _BUDGET_NO_FORMAT,
    "claude-sonnet-4-5": _BUDGET,
    "claude-haiku-4-5": _BUDGET,
    "claude-3": Capabilities(None, (), 8_192, False),
    "claude-3-7-sonnet": _BUDGET_NO_FORMAT,
    "claude-opus-5": _ADAPTIVE,
    "claude-sonnet-5": _ADAPTIVE_64K,
    "claude-haiku-5": Capabilities("adaptive", _UP_TO_HIGH, 64_000, True),
    "claude-fable-5": _ADAPTIVE,
    "claude-mythos": _ADAPTIVE,
}
# A name we do not know is taken for a current model (a new release, an alias).
_CURRENT = _ADAPTIVE_64K


def capabilities_for(model: str) -> Capabilities:
    """What ``model`` accepts; a name not in the table is taken for a current model."""
    return _lookup(_CAPABILITIES, model) or _CURRENT
