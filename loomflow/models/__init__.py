"""Model adapters: Claude through the anthropic SDK, and a scripted model for tests."""

from loomflow.models.anthropic import AnthropicModel, price_for
from loomflow.models.base import Model, ModelResponse, ToolSpec
from loomflow.models.scripted import ScriptedModel

__all__ = ["AnthropicModel", "Model", "ModelResponse", "ScriptedModel", "ToolSpec", "price_for"]
