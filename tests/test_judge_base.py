"""judge='base': the initial weights as judge (the paper's self-intervention ablation). With PEFT the policy's own
module with its adapter disabled (no copy); without PEFT a frozen copy loaded from the policy's path."""

from __future__ import annotations

import pytest
import torch
from mintrl_helpers import mintrl_args, role_reward
from transformers import AutoModelForCausalLM

from trl_mintrl import MInTRLTrainer
from trl_mintrl.engines import AdapterDisabledEngine, TransformersEngine


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)


def _greedy(engine, prompts, n=10):
    with engine.session():
        return [g.token_ids for g in engine.generate(prompts, n, temperature=0.0)]


def _base_engine(path, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return TransformersEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id])


def _prompts(tokenizer):
    return [tokenizer(f"Compute {a}+{a * 2} =", add_special_tokens=False)["input_ids"] for a in range(4)]


def test_base_judge_with_peft_is_the_policy_with_its_adapter_disabled(tiny_model_path, cpu_args, toy_dataset):
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, judge="base", judge_max_review_tokens=8, learning_rate=5e-2),
        train_dataset=toy_dataset,
        peft_config=_lora(),  # random (non-zero) LoRA init: the adapted policy differs from the base from the start
    )
    engine = trainer.judge.engine
    assert isinstance(engine, AdapterDisabledEngine)
    assert engine.policy_engine is trainer.policy_engine and engine.peft_model is trainer.model  # no second copy
    tok = trainer.processing_class
    prompts = _prompts(tok)
    base = _greedy(_base_engine(tiny_model_path, tok), prompts)
    assert _greedy(engine, prompts) == base
    assert _greedy(trainer.policy_engine, prompts) != base

    lora_layers = [m for n, m in trainer.model.named_modules() if n.endswith("q_proj") and hasattr(m, "lora_A")]
    adapter_off = []  # per engine call during training: (judge prompt?, adapter disabled?)
    generate = trainer.policy_engine._generate

    def recording(prompt_ids, max_new_tokens, temperature):
        is_judge = "## New steps to review" in tok.decode(prompt_ids[0])
        adapter_off.append((is_judge, all(m.disable_adapters for m in lora_layers)))
        return generate(prompt_ids, max_new_tokens, temperature)

    trainer.policy_engine._generate = recording
    trainer.train()
    assert (True, True) in adapter_off and (False, False) in adapter_off
    assert all(is_judge == off for is_judge, off in adapter_off)  # the adapter is off exactly for the judge
    assert trainer.state.log_history[0]["mintrl/reviews_per_rollout"] > 0
    trainer.policy_engine._generate = generate
    assert _greedy(engine, prompts) == base  # training moved the adapter only: the judge is still the base model
    assert _greedy(trainer.policy_engine, prompts) != base


def test_base_judge_without_peft_is_a_frozen_copy_of_the_initial_weights(tiny_model_path, cpu_args, toy_dataset):
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, judge="base", judge_max_review_tokens=8, max_steps=1, learning_rate=5e-2),
        train_dataset=toy_dataset,
    )
    judge_model = trainer.judge.engine._model_context().__enter__()
    assert judge_model is not trainer.model
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    trainer.train()
    assert trainer.state.log_history[0]["mintrl/reviews_per_rollout"] > 0
    policy = dict(trainer.model.named_parameters())
    for name, p in initial.named_parameters():
        torch.testing.assert_close(dict(judge_model.named_parameters())[name], p, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(policy[n], p) for n, p in initial.named_parameters())  # the policy did train


def test_base_judge_with_peft_on_vllm_is_refused_before_loading(cpu_args, toy_dataset):
    args = mintrl_args(cpu_args, judge="base", use_vllm=True, vllm_mode="colocate")
    with pytest.raises(ValueError, match="judge='base' with a PEFT adapter is not supported with use_vllm=True"):
        MInTRLTrainer(
            model="no/such-model", reward_funcs=role_reward, args=args, train_dataset=toy_dataset, peft_config=_lora()
        )
