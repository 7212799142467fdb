"""vLLM behind the engine interface: TRL's colocated engine for training, a standalone engine for eval and judges.

The multi-round loops (MInTRL chunks and judge calls, SORT plans) send token ids and get token ids back, one
`LLM.generate` call per round for the whole batch, with per-request `SamplingParams`. Each round's prompt is the
previous round's prompt plus the accepted tokens, so vLLM's prefix cache skips the prefill already done; the hit rate
is counted from each request's `num_cached_tokens`.

vLLM is imported lazily: `check_vllm_mode_supported` must work where vLLM is not installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from .base import Generation, GenerationEngine

SERVER_MODE_MESSAGE = (
    "vllm_mode='server' is not supported by trl-mintrl's trainers: their rollouts are multi-round (policy chunks, "
    "judge reviews and corrections, SORT plans), and TRL's server client takes one `max_tokens` per call and lives on "
    "rank 0 only. Use vllm_mode='colocate' (each process holds its engine; tune vllm_gpu_memory_utilization and "
    "vllm_enable_sleep_mode), or use_vllm=False. To run a judge on a separate vLLM server, start `vllm serve JUDGE` "
    "and point the endpoint judge at it (judge_base_url)."
)


def check_vllm_mode_supported(args) -> None:
    """Refuse, at trainer construction, a vLLM mode whose rollouts would silently go wrong."""
    if not getattr(args, "use_vllm", False):
        return
    if getattr(args, "vllm_mode", "colocate") != "colocate":
        raise ValueError(f"{SERVER_MODE_MESSAGE} (got vllm_mode={args.vllm_mode!r})")
    if getattr(args, "vllm_tensor_parallel_size", 1) > 1:
        raise ValueError(
            f"vllm_tensor_parallel_size={args.vllm_tensor_parallel_size} is not supported yet: the ranks of a "
            "tensor-parallel group must make identical engine calls, but each rank's multi-round rollout ends after "
            "its own number of rounds. Use vllm_tensor_parallel_size=1 (data-parallel colocate engines)."
        )


class VLLMEngine(GenerationEngine):
    """Batched token-in/token-out generation with a `vllm.LLM`.

    Args:
        llm: the engine (TRL's colocated `trainer.vllm_generation.llm`, or one built by `from_model_path`).
        eos_token_ids: generation stops at any of them (passed as `stop_token_ids`, like the `transformers` engine).
        sampling_defaults: `SamplingParams` fields used when `generate(temperature=None)`: temperature, top_p, top_k,
            min_p, repetition_penalty and any extra `generation_kwargs`.
        return_logprobs: ask vLLM for the sampled token's log-probability (the policy needs it, a judge does not).
        tp_group: the tensor-parallel process group of a colocated engine with `vllm_tensor_parallel_size > 1`:
            prompts are gathered within it and each rank keeps its own slice, as TRL does.
    """

    def __init__(
        self,
        llm,
        *,
        eos_token_ids: Sequence[int],
        sampling_defaults: dict[str, Any] | None = None,
        return_logprobs: bool = True,
        tp_group=None,
    ):
        super().__init__(eos_token_ids)
        self.llm = llm
        self.sampling_defaults = dict(sampling_defaults or {"temperature": 1.0})
        self.return_logprobs = return_logprobs
        self.tp_group = tp_group
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self._trainer = None

    @classmethod
    def from_trainer(cls, trainer) -> VLLMEngine:
        """The colocated engine of a `GRPOTrainer(use_vllm=True)`, sampling like TRL's own vLLM calls."""
        check_vllm_mode_supported(trainer.args)
        vg = trainer.vllm_generation
        defaults = {
            "temperature": vg.temperature,
            "top_p": vg.top_p,
            "top_k": vg.top_k,
            "min_p": 0.0 if vg.min_p is None else vg.min_p,
            "repetition_penalty": vg.repetition_penalty,
            **vg.generation_kwargs,
        }
        engine = cls(
            vg.llm,
            eos_token_ids=trainer.eos_token_ids,
            sampling_defaults=defaults,
            tp_group=vg.tp_group if vg.tensor_parallel_size > 1 else None,
        )
        engine._trainer = trainer
        return engine

    @classmethod
    def from_model_path(
        cls,
        path: str,
        *,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        return_logprobs: bool = False,
        seed: int = 0,
        **llm_kwargs,
    ) -> VLLMEngine:
        """A standalone engine for `trl-mintrl eval --backend vllm` or an in-process judge model.

        The sampling arguments are the defaults of `generate(temperature=None)`. Inside a training process
        (torch.distributed initialised, as TRL's colocated engine does) it joins the process group with the
        `external_launcher` backend, so it can live next to the policy engine with its own `gpu_memory_utilization`
        share. Extra keyword arguments go to `vllm.LLM`.
        """
        import torch.distributed as dist
        from transformers import AutoTokenizer, GenerationConfig
        from vllm import LLM

        if dist.is_available() and dist.is_initialized():
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        llm = LLM(
            model=path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            enable_prefix_caching=True,
            **llm_kwargs,
        )
        eos = {AutoTokenizer.from_pretrained(path).eos_token_id}
        with contextlib.suppress(OSError):
            configured = GenerationConfig.from_pretrained(path).eos_token_id
            eos.update(configured if isinstance(configured, list) else [configured])
        eos.discard(None)
        defaults = dict(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty
        )
        return cls(llm, eos_token_ids=sorted(eos), sampling_defaults=defaults, return_logprobs=return_logprobs)

    # ----------------------------------------------------------------------------------------------------------------
    # session: weight sync and sleep mode

    @contextlib.contextmanager
    def _open_session(self):
        """Once per rollout: make sure the engine holds the current weights, wake it, and put it to sleep after.

        TRL syncs weights before calling a `rollout_func`, so inside a rollout the check below finds them current;
        called elsewhere (a SORT plan after the optimizer step, or after sleep level 2 discarded the weights) it
        syncs itself, exactly as TRL's own `_generate` would.
        """
        trainer = self._trainer
        if trainer is None:
            yield
            return
        vg = trainer.vllm_generation
        stale = trainer.state.global_step != trainer._last_loaded_step
        if stale or (vg.enable_sleep_mode and vg._llm_weights_sleeping):
            from trl.extras.profiling import profiling_context

            with profiling_context(trainer, "sync_weights"):
                vg.sync_weights()
            trainer._last_loaded_step = trainer.state.global_step
        if not vg.enable_sleep_mode:
            yield
            return
        self.llm.wake_up(tags=["kv_cache"])
        try:
            yield
        finally:
            self.llm.sleep(level=2)
            vg._llm_weights_sleeping = True

    # ----------------------------------------------------------------------------------------------------------------
    # generation

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        temperature: float | None = None,
    ) -> list[Generation]:
        """As the base class; with tensor parallelism a rank with no prompts still joins its group's call."""
        if not prompt_ids and self.tp_group is not None:
            with self.session():
                self._generate([], [], temperature)
            return []
        return super().generate(prompt_ids, max_new_tokens, temperature)

    def sampling_params(self, max_tokens: int, temperature: float | None):
        """The `SamplingParams` of one request: defaults, `temperature` override (0 = greedy), this request's cap."""
        from vllm import SamplingParams

        kwargs = dict(self.sampling_defaults)
        if temperature is not None:
            kwargs["temperature"] = temperature
            if temperature == 0:
                kwargs.update(top_p=1.0, top_k=0, min_p=0.0)
        kwargs.update(
            n=1,
            max_tokens=max_tokens,
            logprobs=0 if self.return_logprobs else None,
            stop_token_ids=self.eos_token_ids,
            detokenize=False,
        )
        return SamplingParams(**kwargs)

    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        local = slice(0, len(prompt_ids))
        if self.tp_group is not None:
            import torch.distributed as dist

            gathered = [None] * dist.get_world_size(group=self.tp_group)
            dist.all_gather_object(gathered, (prompt_ids, max_new_tokens), group=self.tp_group)
            rank = dist.get_rank(group=self.tp_group)
            start = sum(len(p) for p, _ in gathered[:rank])
            local = slice(start, start + len(prompt_ids))
            prompt_ids = [p for ps, _ in gathered for p in ps]
            max_new_tokens = [m for _, ms in gathered for m in ms]

        # vLLM rejects max_tokens=0: a request with no budget left gets an empty completion without a call.
        todo = [i for i, cap in enumerate(max_new_tokens) if cap > 0]
        results = [Generation([], [] if self.return_logprobs else None) for _ in prompt_ids]
        if todo:
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=prompt_ids[i]) for i in todo],
                [self.sampling_params(max_new_tokens[i], temperature) for i in todo],
                use_tqdm=False,
            )
            for i, out in zip(todo, outputs, strict=True):
                results[i] = self._to_generation(out)
        return results[local]

    def _to_generation(self, request_output) -> Generation:
        self.prompt_tokens += len(request_output.prompt_token_ids)
        self.cached_prompt_tokens += request_output.num_cached_tokens or 0
        completion = request_output.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = None
        if self.return_logprobs:
            logprobs = [float(lp[tok].logprob) for tok, lp in zip(token_ids, completion.logprobs, strict=True)]
        return Generation(token_ids, logprobs)

    # ----------------------------------------------------------------------------------------------------------------
    # prefix-cache statistics

    def prefix_cache_hit_rate(self) -> float:
        """Share of prompt tokens served from vLLM's prefix cache since the last `reset_cache_stats` (0 if none)."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def reset_cache_stats(self) -> None:
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
