"""One colour per model, per user and per token kind, for every chart of a page: the
report's and the web console's charts, which must read alike.

No plotly here: the console's JSON API gives the colours without the ``[report]`` extra.
"""

from __future__ import annotations

import colorsys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from loomflow.analytics.tally import Stats

__all__ = ["TOKEN_KINDS", "Colours"]

#: the token counters of :class:`~loomflow.analytics.tally.Counters` and their names in
#: a chart, in the order their bars are stacked
TOKEN_KINDS = (
    ("input_tokens", "input"),
    ("cached_input_tokens", "cached"),
    ("cache_write_tokens", "cache write"),
    ("output_tokens", "output"),
)

#: token kinds are shades of one blue (parts of one thing, stacked in a fixed order);
#: models and users take the colours of two other sets in turn, by name
_TOKEN_COLOURS = {
    "input": "#08519c",
    "cached": "#4292c6",
    "cache write": "#9ecae1",
    "output": "#0b8a8f",
}
_MODEL_COLOURS = (
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#e377c2",
    "#8c564b",
    "#bcbd22",
    "#17becf",
)
_USER_COLOURS = (
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#e6ab02",
    "#a6761d",
    "#b2182b",
    "#1b7837",
    "#762a83",
)


def _generated(k: int) -> str:
    """The k-th colour past a set's end: hues a golden angle apart, saturated."""
    hue = (k * 0.618033988749895 + 0.11) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.42 + 0.1 * (k % 2), 0.75)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _assign(names: Iterable[str], palette: Sequence[str], taken: set[str]) -> dict[str, str]:
    colours: dict[str, str] = {}
    free = (c for c in palette if c not in taken)
    generated = (_generated(k) for k in range(1 << 30))
    for name in sorted(set(names)):
        colour = next(free, None)
        while colour is None or colour in taken:
            colour = next(generated)
        taken.add(colour)
        colours[name] = colour
    return colours


@dataclass(frozen=True)
class Colours:
    """One colour per model, per user and per token kind, for every chart of a page: no
    two of them share a colour, so a colour means one thing wherever it is."""

    model: Mapping[str, str]
    user: Mapping[str, str]
    token: Mapping[str, str] = field(default_factory=lambda: dict(_TOKEN_COLOURS))

    @classmethod
    def of(cls, stats: Stats) -> Colours:
        taken = set(_TOKEN_COLOURS.values())
        models = _assign((r.model for r in stats.rows), _MODEL_COLOURS, taken)
        users = _assign((r.user for r in stats.rows), _USER_COLOURS, taken)
        return cls(models, users)

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"model": dict(self.model), "user": dict(self.user), "token": dict(self.token)}
