"""The judge-token mask's path through TRL's async packing.

TRL's `RolloutQueueDataset` passes on six fields of a `RolloutSample` (`input_ids`, `completion_mask`,
`old_log_probs`, `advantage`, `group_id`, `metrics`) and `TreeRow.pack` turns them into per-loss-term tensors with
no slot for a per-token flag. The one object that reaches the collator untouched is the sample's `metrics` dict:
the dataset yields it by reference, both planners (`FixedCountBatcher`, `TokenBudgetBatcher`) add the yielded dicts
themselves to their `TreeRow`s, and the collator only reads its keys. So the worker sends a `SampleMetrics` whose
`extras` carry the judge mask (`trajectory_sample` builds each sample), and `MInTRLRolloutCollator` lays it out per
loss term in `pack`'s order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from trl.data_utils import is_conversational
from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
from trl.experimental.async_grpo.packing import TreeRow
from trl.trainer.utils import pad


class SampleMetrics(dict):
    """A rollout sample's float metrics (the keys TRL's collator averages and logs), plus `extras`, which TRL never
    reads: `judge_mask` (np array aligned with `input_ids`, 1 on judge tokens), `model_version`, `is_control`, and
    `step_regression_rows` (the rollouts of the sample's optimizer step that are in the regression)."""

    __slots__ = ("extras",)

    def __init__(self, *args: Any, extras: dict[str, Any], **kwargs: float):
        super().__init__(*args, **kwargs)
        self.extras = extras


class _LossTerms:
    """One row's loss terms as `TreeRow.pack` lays them out: sample by sample, trained positions ascending (a
    position p >= 1 with `completion_mask[p]`, whose target is `input_ids[p]`)."""

    def __init__(self, row: TreeRow):
        self.segment_id: list[int] = []
        self.target: list[int] = []
        self.judge: list[float] = []
        for i, sample in enumerate(row.samples):
            input_ids = np.asarray(sample["input_ids"])
            trained = np.flatnonzero(np.asarray(sample["completion_mask"])[1:]) + 1
            self.segment_id += [i] * len(trained)
            self.target += input_ids[trained].tolist()
            self.judge += _judge_mask(sample, len(input_ids))[trained].tolist()


def _judge_mask(sample: dict[str, Any], length: int) -> np.ndarray:
    metrics = sample["metrics"]
    if not isinstance(metrics, SampleMetrics):
        raise TypeError(
            "MInTRLRolloutCollator needs each RolloutSample's `metrics` to be a SampleMetrics carrying "
            f"extras['judge_mask'], got {type(metrics).__name__}."
        )
    judge_mask = np.asarray(metrics.extras["judge_mask"], dtype=np.float32)
    if judge_mask.shape != (length,):
        raise ValueError(f"judge_mask has shape {judge_mask.shape}, input_ids has {length} tokens.")
    return judge_mask


class MInTRLRolloutCollator(DataCollatorForRollout):
    """TRL's rollout collator plus what MInTRL's loss needs:
    - `judge_mask` (num_processes, M_max) float: 1 on the loss terms whose target is a judge token, laid out as
      `old_log_probs` (padded with 0);
    - `step_regression_rows` (num_processes,): the rollouts in the regression over the whole optimizer step (all
      its micro-batches and ranks), repeated per rank like TRL's `global_n_tokens`: the loss is the mean over them,
      as in `MInTRLTrainer`, however the step's rollouts fall into micro-batches (the worker writes it: one
      optimizer step's rollouts are one batch of its, so a micro-batch never holds two steps' samples).

    `pack`'s term order is re-walked here, and checked against the packed batch (segment and target token of every
    term): if TRL ever lays terms out differently, this raises instead of misaligning the mask.
    """

    def torch_call(self, examples: list[Any]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        (rows,) = examples
        terms = [_LossTerms(row) for row in rows]
        for rank, row_terms in enumerate(terms):
            token_index = batch["token_index"][rank]
            token_index = token_index[token_index >= 0]
            packed_segments = batch["segment_id"][rank, : len(token_index)].tolist()
            packed_targets = batch["shift_labels"][rank, token_index].tolist()
            if packed_segments != row_terms.segment_id or packed_targets != row_terms.target:
                raise RuntimeError(
                    f"Row {rank}: TRL's TreeRow.pack no longer lays out loss terms sample by sample, trained "
                    "positions ascending; the judge-token mask would be misaligned. Update _LossTerms to its order."
                )
        batch["judge_mask"] = pad([torch.tensor(t.judge, dtype=torch.float32) for t in terms], padding_value=0)
        counts = {sample["metrics"].extras["step_regression_rows"] for row in rows for sample in row.samples}
        if len(counts) != 1:
            raise RuntimeError(
                f"A micro-batch holds samples of optimizer steps with {sorted(counts)} rollouts in the regression: "
                "the rollout worker must write one optimizer step's rollouts at a time (whole steps, in order)."
            )
        batch["step_regression_rows"] = torch.full((self.num_processes,), float(counts.pop()))
        return batch


def trajectory_sample(
    prompt,
    t,
    advantage: float,
    metrics: dict[str, float],
    tokenizer,
    *,
    group_id: int,
    version: int,
    is_control: bool,
    trained: bool,
    step_regression_rows: int,
) -> RolloutSample:
    """A finished `Trajectory` (rollout.py) as TRL's trainer takes it: prompt + completion tokens, the policy's and the
    judge's in the loss (`trained`: in the regression, else masked), the environment's (tool results) context only,
    as TRL's own worker masks them; the behaviour policy's sampled log-probs on policy tokens (0 on judge and
    environment tokens and the prompt: the loss anchors judge tokens at kappa); its `metrics` (reward and reward
    columns, for the logs) as a `SampleMetrics` whose extras hold the judge-token mask (the judge's own channel beside
    the completion mask) and the rollouts of its optimizer step in the regression (the loss is their mean, whichever
    micro-batch and rank each lands in). The completion is the trajectory's messages with tools (`tokenizer` None),
    else its text decoded with `tokenizer`."""
    n_prompt = len(t.prompt_ids)
    judge_mask = np.asarray([0] * n_prompt + t.judge_mask, dtype=np.int8)
    written = [int(trained and (policy or judge)) for policy, judge in zip(t.env_mask, t.judge_mask, strict=True)]
    if tokenizer is None:
        completion = t.messages
    else:
        completion = [{"role": "assistant", "content": tokenizer.decode(t.completion_ids, skip_special_tokens=True)}]
    return RolloutSample(
        prompt=prompt if is_conversational({"prompt": prompt}) else [{"role": "user", "content": prompt}],
        completion=completion,
        input_ids=np.asarray(t.prompt_ids + t.completion_ids, dtype=np.int64),
        completion_mask=np.asarray([0] * n_prompt + written, dtype=np.int64),
        old_log_probs=np.asarray([0.0] * n_prompt + [0.0 if lp is None else lp for lp in t.logprobs], np.float32),
        advantage=advantage,
        model_version=version,
        group_id=group_id,
        metrics=SampleMetrics(
            metrics,
            extras={
                "judge_mask": judge_mask,
                "model_version": version,
                "is_control": is_control,
                "step_regression_rows": step_regression_rows,
            },
        ),
    )
