"""Judges and evaluation on real vLLM: a judge model in a second colocated engine, the endpoint judge against a
`vllm serve` (the session's server), and `trl-mintrl eval --backend vllm`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from mintrl_helpers import mintrl_args
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_mintrl import MInTRLTrainer
from trl_mintrl.data.loaders import fixture_path
from trl_mintrl.engines import TransformersEngine
from trl_mintrl.engines.vllm import VLLMEngine
from trl_mintrl.judges import CorrectionRequest, EndpointJudge, GeneratingJudge
from trl_mintrl.text import chat_token_ids


def intervened_reward(completions, mintrl_intervened, **kwargs):
    return [float(flag) for flag in mintrl_intervened]


def vllm_mintrl_args(cpu_args, **overrides):
    """The shared small MInTRL config (`mintrl_helpers.mintrl_args`) on colocated vLLM, one step."""
    settings = dict(max_completion_length=16, judge_max_review_tokens=12, max_steps=1, use_vllm=True)
    return mintrl_args(cpu_args, vllm_mode="colocate", **{**settings, **overrides})


def transformers_judge(path: str) -> GeneratingJudge:
    """The reference: the same judge prompts answered greedily by `transformers` in fp32."""
    judge = GeneratingJudge.from_pretrained(
        path, device="cpu", dtype="float32", max_review_tokens=12, max_correction_tokens=8
    )
    assert isinstance(judge.engine, TransformersEngine)
    return judge


CORRECTIONS = [
    CorrectionRequest(question="Compute 3+4 =", prefix="3+4=", reference="3+4=7"),
    CorrectionRequest(question="Compute 8*2 =", prefix="", reference="8*2=16"),
]


def corrections_and_raw_answers(judge: GeneratingJudge, monkeypatch) -> tuple[list, list[list[int]]]:
    """`judge.correct(CORRECTIONS)` and the token ids its engine generated for them, before the judge's checks."""
    raw = []
    generate = judge.engine.generate

    def recording_generate(prompt_ids, max_new_tokens, temperature=None):
        out = generate(prompt_ids, max_new_tokens, temperature)
        raw.extend(g.token_ids for g in out)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(judge.engine, "generate", recording_generate)
        corrections = judge.correct(CORRECTIONS)
    return corrections, raw


def test_judge_model_in_a_second_colocated_engine(tiny_model_path, cpu_args, toy_dataset, llm_kwargs, monkeypatch):
    """judge='model' on GPU: a second vLLM engine in the training process, with its own memory share."""
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=intervened_reward,
        args=vllm_mintrl_args(cpu_args),
        train_dataset=toy_dataset,
    )
    engine = VLLMEngine.from_model_path(tiny_model_path, gpu_memory_utilization=0.2, **llm_kwargs)
    assert engine.llm is not trainer.vllm_generation.llm
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    judge = GeneratingJudge(engine, tokenizer, max_review_tokens=12, max_correction_tokens=8, temperature=0.0)
    corrections, raw = corrections_and_raw_answers(judge, monkeypatch)
    reference, reference_raw = corrections_and_raw_answers(transformers_judge(tiny_model_path), monkeypatch)
    # the second engine answers the judge's prompts token for token as greedy fp32 `transformers` does
    assert len(raw) == len(CORRECTIONS) and raw == reference_raw
    # the untrained tiny model never ends an answer within 8 tokens: every correction is cut by the cap, so it
    # fails on both engines alike and is never inserted
    assert all(len(ids) == 8 and ids[-1] not in engine.eos_token_ids for ids in raw)
    assert [(c.text, c.failed) for c in corrections] == [(c.text, c.failed) for c in reference] == [("", True)] * 2
    # greedy answers of the untrained model repeat one token: the sampled tokens' log-probs check the whole
    # distribution of the second engine against the fp32 model
    sampler = VLLMEngine(engine.llm, eos_token_ids=engine.eos_token_ids, return_logprobs=True)
    prompts = [chat_token_ids(tokenizer, f"Compute {a}*{a + 3} =") for a in range(3)]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    for prompt, sampled in zip(prompts, sampler.generate(prompts, 12), strict=True):
        assert len(set(sampled.token_ids)) > 1
        with torch.no_grad():
            logits = model(torch.tensor([prompt + sampled.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = logits.log_softmax(-1).gather(1, torch.tensor(sampled.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(sampled.logprobs), expected, atol=1e-4, rtol=0)

    trainer.judge = judge
    calls_before = engine.num_calls
    trainer.train()
    assert engine.num_calls > calls_before  # the rollout's reviews went to the judge's engine
    assert trainer.state.log_history[0]["mintrl/reviews_per_rollout"] > 0


def test_endpoint_judge_against_vllm_serve(vllm_server, tiny_model_path, cpu_args, toy_dataset, monkeypatch):
    """The endpoint judge against the session's `vllm serve`, which serves the tiny model under its path."""
    base_url = f"{vllm_server}/v1"
    judge = EndpointJudge(
        base_url, tiny_model_path, api_key_env=None, max_review_tokens=12, max_correction_tokens=8, temperature=0.0
    )
    replies = []
    real_batch = EndpointJudge._batch

    def recording_batch(self, prompts, max_tokens):
        out = real_batch(self, prompts, max_tokens)
        replies.extend(out)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(EndpointJudge, "_batch", recording_batch)
        corrections = judge.correct(CORRECTIONS)
    # the server renders the same chat template and decodes greedily in fp32: the same answers as transformers
    _, reference_raw = corrections_and_raw_answers(transformers_judge(tiny_model_path), monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    assert [getattr(r, "text", r) for r in replies] == [tokenizer.decode(ids, skip_special_tokens=True)
                                                        for ids in reference_raw]  # fmt: skip
    # ... both cut by max_correction_tokens: failed, counted as too long, never inserted
    assert [r.finish_reason for r in replies] == ["length", "length"]
    assert [(c.text, c.failed) for c in corrections] == [("", True)] * 2
    assert judge.failures == {"too_long": 2}

    args = vllm_mintrl_args(cpu_args, judge="endpoint", judge_base_url=base_url, judge_model=tiny_model_path)
    trainer = MInTRLTrainer(
        model=tiny_model_path, reward_funcs=intervened_reward, args=args, train_dataset=toy_dataset
    )
    assert isinstance(trainer.judge, EndpointJudge)
    trainer.train()
    assert trainer.state.log_history[0]["mintrl/reviews_per_rollout"] > 0


def test_eval_cli_vllm_backend_matches_transformers(tiny_model_path, tmp_path, monkeypatch, llm_kwargs):
    import vllm

    from trl_mintrl.cli import main

    real_llm = vllm.LLM
    monkeypatch.setattr(vllm, "LLM", lambda *args, **kwargs: real_llm(*args, **{**kwargs, **llm_kwargs}))
    common = ["--model", tiny_model_path, "--dataset", f"math500={fixture_path('math500')}", "--limit", "2",
              "--num_samples", "2", "--k", "1,2", "--temperature", "0", "--max_new_tokens", "12"]  # fmt: skip
    samples = {}
    for backend in ("vllm", "transformers"):
        out = tmp_path / backend
        main(["eval", *common, "--backend", backend, "--output", str(out)])
        summary = json.loads((out / "summary.json").read_text())
        assert summary["benchmarks"]["math500"]
        samples[backend] = [json.loads(line) for line in (out / "math500.samples.jsonl").read_text().splitlines()]
    assert len(samples["vllm"]) == 4
    assert [(s["problem"], s["completion"]) for s in samples["vllm"]] == [
        (s["problem"], s["completion"]) for s in samples["transformers"]
    ]


def test_eval_all_checkpoints_vllm_frees_each_engine_before_the_next(tiny_model_path, tmp_path):
    """One engine at a time: each checkpoint's engine core is gone before the next checkpoint's engine is built
    (on GPU each one takes its `--vllm_gpu_memory_utilization` share)."""
    run = tmp_path / "run"
    for step in (1, 2):
        shutil.copytree(tiny_model_path, run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    script = Path(__file__).with_name("eval_checkpoints_script.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the CLI's default: the engine core in its own process
    out = tmp_path / "eval"
    cmd = [sys.executable, str(script), str(run), str(out), f"math500={fixture_path('math500')}"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record == {"alive_at_build": [0, 0], "alive_at_end": 0}
    report = json.loads((out / "checkpoints.json").read_text())
    assert sorted(report["checkpoints"]) == ["1", "2"]


def test_judge_model_engine_from_config(tiny_model_path, cpu_args, toy_dataset):
    """`judge_vllm_gpu_memory_utilization` puts judge='model' on its own colocated vLLM engine."""
    args = vllm_mintrl_args(
        cpu_args, judge="model", judge_model_name_or_path=tiny_model_path, judge_vllm_gpu_memory_utilization=0.2
    )
    trainer = MInTRLTrainer(
        model=tiny_model_path, reward_funcs=intervened_reward, args=args, train_dataset=toy_dataset
    )
    assert isinstance(trainer.judge.engine, VLLMEngine)
    assert trainer.judge.engine.llm is not trainer.vllm_generation.llm
    trainer.train()
    assert trainer.judge.engine.num_calls > 0
