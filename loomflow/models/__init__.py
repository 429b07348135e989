"""Model adapters: Claude through the anthropic SDK, and a scripted model for tests.

``AnthropicModel`` loads on first use, and the SDK itself when that model first builds
its client: an embedded user who never names a Claude model imports none of it. The
Claude models' prices and capabilities are tables of their own
(:mod:`loomflow.models.catalog`), which import no SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loomflow.models.base import CallOptions, Effort, Model, ModelResponse, ToolSpec
from loomflow.models.catalog import price_for
from loomflow.models.scripted import ScriptedModel

if TYPE_CHECKING:
    from loomflow.models.anthropic import AnthropicModel

__all__ = [
    "AnthropicModel",
    "CallOptions",
    "Effort",
    "Model",
    "ModelResponse",
    "ScriptedModel",
    "ToolSpec",
    "price_for",
]


def __getattr__(name: str) -> Any:
    if name == "AnthropicModel":
        return importlib.import_module("loomflow.models.anthropic").AnthropicModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
