from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_mintrl.tiny import build_tiny_model


def test_tiny_model_is_deterministic_and_loads_with_auto_classes(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    c = build_tiny_model(tmp_path / "c", seed=4)
    assert (Path(a) / "tokenizer.json").read_text() == (Path(b) / "tokenizer.json").read_text()
    ma, mb, mc = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b, c))
    sa, sb, sc = ma.state_dict(), mb.state_dict(), mc.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)  # the seed matters
    n_params = sum(p.numel() for p in ma.parameters())
    assert 1_000_000 < n_params < 5_000_000
    assert ma.config.head_dim == 32


def test_tiny_tokenizer_chat_template_and_padding(tiny_tokenizer):
    tok = tiny_tokenizer
    assert tok.padding_side == "left"
    assert tok.pad_token is not None and tok.pad_token_id != tok.eos_token_id
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 2+3 ="}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nCompute 2+3 =<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("7-7=0\n\nAnswer: \\boxed{0}", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "7-7=0\n\nAnswer: \\boxed{0}"  # byte-level BPE round-trips exactly
    batch = tok(["a", "a longer text"], padding=True, return_tensors="pt")
    assert batch["attention_mask"][0, 0] == 0  # left padding


def test_cli_builds_tiny_model(tmp_path):
    from trl_mintrl.cli import main

    main(["tiny-model", str(tmp_path / "m"), "--num_layers", "1", "--hidden_size", "64"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 64
    AutoTokenizer.from_pretrained(tmp_path / "m")
