"""plotly.js as the console serves it: the installed plotly package's own file, and the
style rules it would otherwise inject, so the analytics page loads nothing from another
origin and draws under the console's Content Security Policy (``style-src 'self'``).

plotly.js adds its global rules (modebar, hover labels, notifier) with a ``<style>``
element the policy blocks, unless the page already has an element of id
``plotly.js-style-global`` with class ``no-inline-styles`` (plotly.js >= 2.35): the page
links the stylesheet this module serves under that id. The rules are read out of the
same plotly.min.js (its table of ``selector: rules``), so they match the version that
draws. Bundled libraries that inject a ``<style>`` of their own (maplibre, for maps the
console never draws) skip it when an element of the id they check exists: the page
holds an empty one for each (:attr:`PlotlyFiles.markers`).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PlotlyFiles", "plotly_files"]

#: the table of plotly's global rules in its bundle: ``{"X,X div":'direction:…',…}``,
#: X standing for ``.js-plotly-plot .plotly`` and Y for ``.plotly-notifier``
_RULES_START = '{"X,X div":'
_RULE = re.compile(r'"((?:[^"\\]|\\.)*)":(?:\'((?:[^\'\\]|\\.)*)\'|"((?:[^"\\]|\\.)*)")')
#: a bundled library's injected stylesheet: skipped when the id it checks exists
_INJECTED = re.compile(
    r'document\.getElementById\("([0-9a-f]{32,64})"\)\)\{var (\w+)=document\.createElement'
    r'\("style"\)'
)


@dataclass(frozen=True)
class PlotlyFiles:
    """What the analytics page loads of plotly: its script, its rules as a stylesheet,
    and the ids of the placeholders that keep bundled libraries from injecting styles.
    ``tag``: a hash of the script, in the files' URLs, so a browser may cache them for
    as long as the same plotly is installed."""

    version: str
    script: bytes
    css: str
    markers: tuple[str, ...]
    tag: str

    @property
    def script_url(self) -> str:
        return f"/vendor/plotly-{self.tag}.min.js"

    @property
    def css_url(self) -> str:
        return f"/vendor/plotly-{self.tag}.css"


def _bundle() -> tuple[str, bytes]:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return str(plotly.__version__), path.read_bytes()


def _css(source: str) -> str:
    start = source.find(_RULES_START)
    end = source.find("};for(", start)
    if start < 0 or end < 0:
        return ""  # another layout of the bundle: the charts draw, the modebar is plain
    rules = []
    for selector, single, double in _RULE.findall(source[start + 1 : end]):
        full = (
            re.sub(r"^,", " ,", selector)
            .replace("X", ".js-plotly-plot .plotly")
            .replace("Y", ".plotly-notifier")
        )
        rules.append(f"{full}{{{single or double}}}")
    return "\n".join(rules) + "\n"


@functools.cache
def plotly_files() -> PlotlyFiles:
    """The installed plotly's files, read once; ModuleNotFoundError without plotly (the
    ``[report]`` and ``[ui]`` extras)."""
    version, script = _bundle()
    source = script.decode("utf-8", "replace")
    markers = tuple(dict.fromkeys(m.group(1) for m in _INJECTED.finditer(source)))
    tag = hashlib.sha256(script).hexdigest()[:12]
    return PlotlyFiles(version, script, _css(source), markers, tag)
