"""Thin hooks into TRL's `GRPOTrainer` shared by MInTRL and SORT.

TRL computes rewards and group advantages inside `_generate_and_score_completions` (~600 lines). Rather than copy
it, the mixin keeps what a subclass needs from the current generation batch: its dataset rows and the rewards
gathered across processes, so the subclass can adjust `super()`'s output afterwards.
"""

from __future__ import annotations

import torch


class BatchCaptureMixin:
    """Mix in before `GRPOTrainer`: records `self._batch_inputs` (this process's rows) and
    `self._batch_rewards_per_func` ((global rows, reward funcs), gathered across processes) for the batch being
    generated and scored."""

    _batch_inputs: list[dict] | None = None
    _batch_rewards_per_func: torch.Tensor | None = None

    def _generate_and_score_completions(self, inputs):
        self._batch_inputs = inputs
        return super()._generate_and_score_completions(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._batch_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _batch_rewards(self) -> torch.Tensor:
        """(global rows,) weighted reward of each rollout, NaN where every reward function returned None."""
        per_func = self._batch_rewards_per_func
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        return rewards

    def _process_slice(self, local_rows: int) -> slice:
        """This process's rows within the gathered batch (TRL's own convention)."""
        start = self.accelerator.process_index * local_rows
        return slice(start, start + local_rows)
