"""`transformers` generate behind the engine interface: works on any device, CPU included."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from .base import Generation, GenerationEngine


class _PerRowMaxNewTokens(StoppingCriteria):
    """Stop each row at its own budget, so one batched call can serve rows with different caps."""

    def __init__(self, prompt_length: int, caps: Sequence[int]):
        self.prompt_length = prompt_length
        self.caps = torch.tensor(list(caps))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        return (generated >= self.caps).to(input_ids.device)


class TransformersEngine(GenerationEngine):
    """Batched `model.generate` with left padding.

    Args:
        model: a causal LM, or `None` when `model_context` supplies it.
        pad_token_id / eos_token_ids: from the tokenizer that wrote the prompts.
        generation_config: sampling settings used when `generate(temperature=None)`.
        model_context: a factory of context managers yielding the model to generate with; a trainer's engine uses it
            to unwrap DDP/DeepSpeed/FSDP once per rollout session instead of once per call.
    """

    def __init__(
        self,
        model=None,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        generation_config: GenerationConfig | None = None,
        model_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        super().__init__(eos_token_ids)
        if model is None and model_context is None:
            raise ValueError("TransformersEngine needs a `model` or a `model_context`.")
        self.pad_token_id = pad_token_id
        self.generation_config = generation_config or GenerationConfig(do_sample=True)
        self._model_context = model_context or (lambda: contextlib.nullcontext(model))
        self._active_model = None

    @classmethod
    def from_trainer(cls, trainer) -> TransformersEngine:
        """The engine of a `GRPOTrainer`: its model, its sampling settings, its unwrapping for generation."""
        from trl.models import unwrap_model_for_generation

        @contextlib.contextmanager
        def model_context():
            with (
                unwrap_model_for_generation(
                    trainer.model_wrapped,
                    trainer.accelerator,
                    gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                    generation_kwargs=trainer.generation_kwargs,
                    gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
                ) as unwrapped_model,
                trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
            ):
                yield unwrapped_model

        return cls(
            pad_token_id=trainer._tokenizer.pad_token_id,
            eos_token_ids=trainer.eos_token_ids,
            generation_config=trainer.generation_config,
            model_context=model_context,
        )

    @classmethod
    def from_model_path(
        cls,
        path: str,
        *,
        tokenizer=None,
        device: str | None = None,
        dtype: str = "auto",
        temperature: float | None = None,
        top_p: float = 1.0,
    ) -> TransformersEngine:
        """A standalone engine for `trl-mintrl eval` or an in-process judge model, as `VLLMEngine.from_model_path`.

        Args:
            path: the model directory (or name, when the Hub is reachable).
            tokenizer: the model's tokenizer (for its EOS and pad tokens); loaded from `path` when None.
            device: where the model runs; default "cuda" when available, else "cpu".
            dtype: the model's dtype ("auto" keeps the checkpoint's).
            temperature, top_p: the sampling defaults of `generate(temperature=None)` (temperature 0: greedy);
                None keeps the checkpoint's own generation config.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        eos = model.generation_config.eos_token_id
        eos_ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
        if not eos_ids:
            raise ValueError(f"model at {path!r} defines no EOS token (tokenizer or generation_config).")
        if temperature is None:
            config = model.generation_config
        elif temperature > 0:
            config = GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            config = GenerationConfig(do_sample=False)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
        return cls(model, pad_token_id=pad, eos_token_ids=sorted(eos_ids), generation_config=config)

    @contextlib.contextmanager
    def _open_session(self):
        with self._model_context() as model, torch.no_grad():
            self._active_model = model
            try:
                yield
            finally:
                self._active_model = None

    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        model = self._active_model
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompt_ids):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                attention_mask[row, width - len(ids) :] = 1
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = max(max_new_tokens)
        config.pad_token_id = self.pad_token_id
        config.eos_token_id = self.eos_token_ids
        if temperature is not None:
            config.do_sample = temperature > 0
            if temperature > 0:
                config.temperature = temperature
            else:
                config.temperature, config.top_p, config.top_k, config.min_p = None, None, None, None
        device = next(model.parameters()).device
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([_PerRowMaxNewTokens(width, max_new_tokens)]),
        )
        completions = out[:, width:].cpu().tolist()
        return [Generation(ids) for ids in completions]
