"""`MInTRLSORTConfig`: the fields of `MInTRLConfig` and `SORTConfig` together, each parent's validation included."""

from __future__ import annotations

from dataclasses import dataclass

from ..mintrl.config import MInTRLConfig
from ..sort.config import SORTConfig


@dataclass
class MInTRLSORTConfig(MInTRLConfig, SORTConfig):
    r"""
    Configuration class for the [`MInTRLSORTTrainer`]: MInTRL's rollout and advantage regression, plus SORT's
    deferred repair of the prompts whose controls and intervened rollouts all failed.

    Every parameter of [`MInTRLConfig`] and of [`SORTConfig`] applies with the meaning and default it has there, and
    both configs' checks run (`MInTRLConfig`'s first). Where the two parents disagree:

    - `epsilon`, `epsilon_high`: unused, and other values refused as in MInTRL (like every field of MInTRL's
      `REFUSED_GRPO_FIELDS`). The main update is MInTRL's advantage regression, which has no ratio and no
      clipping, so SORT's asymmetric clipping defaults (`0.2`/`0.28`) do not apply; the fields keep
      `GRPOConfig`'s defaults.
    - `beta`: `0.0` in both; MInTRL's check applies (the regression has no KL term, so any other value is refused).
    - `num_generations`: split into `num_control_generations` and `num_intervened_generations` (or their sum), as
      in MInTRL. A group is every rollout of a prompt, controls and intervened ones: a prompt is deferred for
      repair only when none of them is correct (SORT's all-wrong rule, with `correctness_reward_funcs` and
      `correct_threshold`).
    - `reference_column`: one column serves both, as the judge's privileged context and as the repair's reference.
      With `tools=` / `environment_factory=` it may hold tool-calling conversations, as in SORT: the repair learns
      their assistant turns, the judge reads them as a transcript (`MInTRLSORTTrainer.judge_reference`).
    - `vllm_importance_sampling_correction`: `False`, as in MInTRL (the regression uses no importance sampling);
      `True` is refused.

    This class adds no parameter of its own.
    """
