"""The real-model task's warm starts (benchmarks/tasks/real/warm_start.py), built on the tiny model: a warm-up that
continues another starts from that one's checkpoint, built first, on problems of its own; the chain regime's splits."""

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.tasks.real.task import DECISIVE_OP
from benchmarks.tasks.real.warm_start import (
    MARKER,
    WARMUP_CHAIN,
    WARMUP_CHAIN_LONG,
    build_warm_start,
    regime_splits,
    sft_epoch,
    train_problems,
    warm_start_dir,
    warmup_problems,
)

FIRST = dict(problems=4, num_steps=[7], seed="test-warmup/0", batch_size=2, learning_rate=1e-3, family="chain-easy")
SECOND = dict(after=FIRST, problems=4, num_steps=[10], seed="test-warmup/1", batch_size=2, learning_rate=1e-3,
              family="chain-easy")  # fmt: skip


def test_a_warm_up_after_another_trains_from_that_ones_checkpoint_on_fresh_problems(tiny_model_path, tmp_path):
    base = tmp_path / "model"
    base.symlink_to(tiny_model_path, target_is_directory=True)
    second = build_warm_start(base, SECOND)
    first = warm_start_dir(base, FIRST)
    assert second == warm_start_dir(base, SECOND) != first
    assert (first / MARKER).is_file()  # built on the way
    marker = json.loads((second / MARKER).read_text())
    assert marker["start"] == str(first) and marker["base"] == str(base) and marker["steps"] == 2
    assert {p.key for p in warmup_problems(FIRST)}.isdisjoint(p.key for p in warmup_problems(SECOND))
    # the same epoch on the first warm start's weights gives the second's, and differs from one on the base model's
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(first)
    again = AutoModelForCausalLM.from_pretrained(first, dtype=torch.float32)
    sft_epoch(again, tokenizer, warmup_problems(SECOND), batch_size=2, learning_rate=1e-3)
    built = load_file(second / "model.safetensors")
    assert all(torch.equal(built[name], tensor) for name, tensor in again.state_dict().items() if name in built)
    from_base = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    sft_epoch(from_base, tokenizer, warmup_problems(SECOND), batch_size=2, learning_rate=1e-3)
    assert not all(torch.equal(built[name], t) for name, t in from_base.state_dict().items() if name in built)


def test_the_chain_regime_trains_on_12_step_chains_no_chain_warm_up_saw():
    splits = regime_splits("chain")
    assert {p.num_steps for p in splits["train"] + splits["heldout"]} == {12}
    assert {p.num_steps for p in splits["heldout_longer"]} == {14}
    for problems in splits.values():  # every one has its decisive step
        assert all([op for _, op, _, _ in p.computations].count(DECISIVE_OP) == 1 for p in problems)
    keys = {p.key for problems in splits.values() for p in problems}
    for settings in (WARMUP_CHAIN, WARMUP_CHAIN_LONG):
        assert keys.isdisjoint(p.key for p in warmup_problems(settings))
    assert set(train_problems("chain", 8, seed=0)) <= set(splits["train"])
