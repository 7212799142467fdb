"""`transformers` generate behind the engine interface: works on any device, CPU included."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence

import torch
from transformers import (
    DynamicCache,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.cache_utils import DynamicLayer

from .base import Generation, GenerationEngine
from .kv_cache import RowCachePool, batch_cache_layers, harvest_rows, layout_batch

logger = logging.getLogger(__name__)


class _PerRowMaxNewTokens(StoppingCriteria):
    """Stop each row at its own budget, so one batched call can serve rows with different caps."""

    def __init__(self, prompt_length: int, caps: Sequence[int]):
        self.prompt_length = prompt_length
        self.caps = torch.tensor(list(caps))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        return (generated >= self.caps).to(input_ids.device)


class _SampledLogprobs(LogitsProcessor):
    """Records the log-probability of each sampled token: `log_softmax(logits / temperature)` of the scores before
    top-k/top-p filtering, as the trainer computes its own (TRL divides the logits by the temperature the same way).
    A step's token is known at the next step (the last column of `input_ids`), the last one after `generate`."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, tokens[:, None]).squeeze(-1))
            self.previous = None

    def per_row(self, last_tokens: torch.Tensor) -> list[list[float]]:
        self._take(last_tokens)
        return torch.stack(self.steps, dim=1).cpu().tolist() if self.steps else [[] for _ in last_tokens]


class TransformersEngine(GenerationEngine):
    """Batched `model.generate` with left padding.

    With `kv_cache` (the default), each row's keys and values are kept between the calls of one `session()`, keyed
    by the token ids they were computed from (engines/kv_cache.py): a request whose ids share a prefix with a kept
    row prefills only what follows that prefix. In a chunked rollout an accepted chunk continues from its row's cache,
    a row the judge cut reuses its cache up to the cut and reads only the judge's tokens, and a finished row is no
    longer asked for and its cache is dropped after `cache_idle_calls` calls; rows with different cached lengths
    share one batch. The caches are freed when the session ends, never reused across sessions (the weights may have
    changed). `kv_cache=False` re-reads every request in full, as `generate` without a cache does. Counters:
    `prefill_tokens` (request tokens the model read), `reused_tokens` (request tokens served from a kept cache),
    `generated_tokens`; `prefix_cache_hit_rate()` is reused / (reused + read) since `reset_cache_stats()` (None
    with `kv_cache=False`). Memory between calls: one cache per row of the last few calls (a live trajectory's, and
    a self-judge's review and correction rows), no more than those calls' `generate` held.
    Models whose cache layers are not all plain full-attention `DynamicLayer`s (sliding windows, linear attention),
    and a `cache_implementation` other than "dynamic", run without the kept caches. Logits processors that read the
    whole ids (repetition penalty, no-repeat n-grams) see pad tokens in other places than without the cache (between
    a row's cached and new tokens), as they do today whenever the batch's composition moves a row's padding.

    Args:
        model: a causal LM, or `None` when `model_context` supplies it.
        pad_token_id / eos_token_ids: from the tokenizer that wrote the prompts.
        generation_config: sampling settings used when `generate(temperature=None)`.
        model_context: a factory of context managers yielding the model to generate with; a trainer's engine uses it
            to unwrap DDP/DeepSpeed/FSDP once per rollout session instead of once per call.
        kv_cache: keep each row's cache across the calls of a session (above).
        cache_idle_calls: a kept row unused for this many calls is dropped (a self-judge's review and correction
            calls come between two policy calls: keep it at 3 or more).
        return_logprobs: report each sampled token's log-probability (`Generation.logprobs`): `log_softmax` of the
            logits divided by the temperature (1 when greedy), before top-k/top-p. Off by default: a trainer then
            computes its own, as it did before the engine reported them.
    """

    def __init__(
        self,
        model=None,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        generation_config: GenerationConfig | None = None,
        model_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        kv_cache: bool = True,
        cache_idle_calls: int = 4,
        return_logprobs: bool = False,
    ):
        super().__init__(eos_token_ids)
        if model is None and model_context is None:
            raise ValueError("TransformersEngine needs a `model` or a `model_context`.")
        self.pad_token_id = pad_token_id
        self.generation_config = generation_config or GenerationConfig(do_sample=True)
        self._model_context = model_context or (lambda: contextlib.nullcontext(model))
        self._active_model = None
        self.kv_cache = kv_cache
        self.return_logprobs = return_logprobs
        self._pool = RowCachePool(cache_idle_calls)
        self._scope: object = None
        self._keep_rows = False
        self.prefill_tokens = self.reused_tokens = self.generated_tokens = 0
        self._stats = [0, 0]  # reused, read since reset_cache_stats

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
            self._pool.clear()
            try:
                yield
            finally:
                self._active_model = None
                self._pool.clear()  # the caches of this session's weights: never reused by another session

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        temperature: float | None = None,
    ) -> list[Generation]:
        # a call inside an open session may be continued; one outside it is its own session, which ends with it
        self._keep_rows = self._session_depth > 0
        return super().generate(prompt_ids, max_new_tokens, temperature)

    @contextlib.contextmanager
    def cache_scope(self, scope: object) -> Iterator[None]:
        """Calls inside share kept caches only with calls of the same `scope`: a view of the model whose keys and
        values differ for the same ids (the policy with its PEFT adapter disabled) must not read the policy's."""
        previous, self._scope = self._scope, scope
        try:
            yield
        finally:
            self._scope = previous

    def prefix_cache_hit_rate(self) -> float | None:
        reused, read = self._stats
        if not self.kv_cache:
            return None
        return reused / (reused + read) if reused + read else 0.0

    def reset_cache_stats(self) -> None:
        self._stats = [0, 0]

    def _generation_config(self, max_new_tokens: list[int], temperature: float | None) -> GenerationConfig:
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
        return config

    def _cache_usable(self, model, config: GenerationConfig) -> bool:
        """Whether the kept caches work for `model`: every layer of its cache a plain full-attention layer, and no
        other cache asked for (`cache_implementation` "static", "offloaded", "quantized"...; "dynamic" is ours)."""
        if not self.kv_cache or config.cache_implementation not in (None, "dynamic"):
            return False
        layers = DynamicCache(config=model.config).layers
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        model = self._active_model
        device = next(model.parameters()).device
        config = self._generation_config(max_new_tokens, temperature)
        cached = self._cache_usable(model, config)
        matches = self._pool.match(prompt_ids, self._scope) if cached else [(None, 0)] * len(prompt_ids)
        layout, input_ids, attention_mask = layout_batch(prompt_ids, matches, self.pad_token_id)
        kwargs = {}
        if cached:
            layers = batch_cache_layers(matches, layout, device)
            kwargs[self._cache_argument(model)] = cache = DynamicCache(layers, config=model.config)
            config.use_cache, config.cache_implementation = True, None  # the cache passed in is a DynamicCache
        recorder = _SampledLogprobs(config.temperature if config.do_sample and config.temperature else 1.0)
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([_PerRowMaxNewTokens(input_ids.shape[1], max_new_tokens)]),
            logits_processor=LogitsProcessorList([recorder] if self.return_logprobs else []),
            **kwargs,
        )
        generated = out[:, input_ids.shape[1] :]
        logprobs = recorder.per_row(generated[:, -1]) if self.return_logprobs else [None] * len(prompt_ids)
        outputs = [
            self._truncate(Generation(ids, lp), cap)
            for ids, lp, cap in zip(generated.cpu().tolist(), logprobs, max_new_tokens, strict=True)
        ]
        if cached:
            self._keep(cache, matches, layout, prompt_ids, outputs, generated.shape[1])
        self._count(layout, outputs)
        return outputs

    def _keep(self, cache, matches, layout, prompt_ids, outputs: list[Generation], steps: int) -> None:
        """Keep each row's cache after a call (engines/kv_cache.py); the rows this call continued are dropped."""
        rows = []
        if cache.get_seq_length() != layout.cached + layout.new + steps - 1:  # every generated token but the last
            logger.warning("generate left a cache of an unexpected length: the rows of this call are not kept.")
        elif self._keep_rows:
            completions = [o.token_ids for o in outputs]
            rows = harvest_rows(cache.layers, layout, prompt_ids, completions, self._scope, self._pool.calls)
        self._pool.update(matches, rows)

    def _count(self, layout, outputs: list[Generation]) -> None:
        read, reused = sum(layout.fresh), sum(layout.reused)
        self.prefill_tokens += read
        self.reused_tokens += reused
        self.generated_tokens += sum(o.num_tokens for o in outputs)
        self._stats[0] += reused
        self._stats[1] += read

    @staticmethod
    def _cache_argument(model) -> str:
        """The name `generate` takes a starting cache under: `cache` (transformers >= 5.x), `past_key_values` before."""
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
