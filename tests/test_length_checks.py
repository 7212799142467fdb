"""SORT's repair passes against the context (docs/sort-trainer.md, "Length checks"): a recipe whose plan prompt or
teacher pass cannot fit is refused before the model loads (CLI) or before the first rollout (trainer); a pair found
too long during training is skipped and counted; references longer than `max_reference_tokens` warn.

The tiny model has 4096 positions; its tokenizer makes one token of each digit, symbol and newline.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import TrainerCallback

from trl_mintrl.cli.train import main
from trl_mintrl.engines import Generation, GenerationEngine
from trl_mintrl.input_checks import InputError
from trl_mintrl.sort import RepairItem, SORTConfig, SORTTrainer
from trl_mintrl.sort.length_checks import RepairLengthCheck

REPO = Path(__file__).resolve().parent.parent
ROWS = [json.loads(line) for line in (REPO / "recipes/cpu/data/arithmetic.jsonl").read_text().splitlines()[:8]]
LONG_TEACHER = "{question}\n\n" + "(1+2=3) " * 600 + "{plan}"  # 4800 tokens of filler
LONG_PLAN = "{question}\n\n{reference}\n\n" + "(1+2=3) " * 600


def zero_reward(completions, **kwargs):
    """Every rollout wrong: every prompt is deferred."""
    return [0.0] * len(completions)


@pytest.mark.parametrize("method", ["sort", "mintrl-sort"])
def test_cli_refuses_a_teacher_pass_that_cannot_fit_before_loading_the_model(
    method, model_without_weights, tmp_path, monkeypatch
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main([method, "--config", f"recipes/cpu/{method}.yaml", "--model_name_or_path", model_without_weights,
              "--dataset_name", str(data), "--output_dir", str(out), "--teacher_template", LONG_TEACHER])  # fmt: skip
    message = str(exit_info.value.code)
    assert message.startswith("trl-mintrl train: error: SORT's repair cannot fit 8 row(s)"), message
    assert re.search(
        r"the teacher pass \(teacher_template .* max_plan_tokens=16, .* max_reference_tokens=64\) needs up to \d+ "
        r"tokens, more than the model's 4096 positions \(max_position_embeddings\): lower max_reference_tokens",
        message,
    ), message
    assert "plan prompt" not in message  # the plan prompt fits: only the pass that does not is named
    assert not out.exists()


def sort_trainer(tiny_model_path, cpu_args, rows, **overrides) -> SORTTrainer:
    settings = {**cpu_args, "per_device_train_batch_size": 8, "max_plan_tokens": 8, "repair_batch_size": 2}
    args = SORTConfig(**{**settings, **overrides})
    return SORTTrainer(tiny_model_path, zero_reward, args, train_dataset=Dataset.from_list(rows))


def test_trainer_refuses_a_plan_prompt_that_cannot_fit_before_the_first_rollout(tiny_model_path, cpu_args):
    trainer = sort_trainer(tiny_model_path, cpu_args, ROWS, plan_template=LONG_PLAN)
    rollouts = []
    trainer._generate_and_score_completions = lambda inputs: rollouts.append(inputs)
    with pytest.raises(InputError, match=r"rows 0, 1, 2, 3, 4, \.\.\.\).*the plan prompt \(plan_template .*"
                       r"max_plan_tokens=8 generated needs up to \d+ tokens, more than the model's 4096 positions"):  # fmt: skip
        trainer.train()
    assert rollouts == [] and trainer.state.global_step == 0


class RecordingPlanner(GenerationEngine):
    """Records the plan prompts it is given and writes an empty plan."""

    def __init__(self, tokenizer):
        super().__init__([tokenizer.eos_token_id])
        self.prompts = []

    def _generate(self, prompts, max_new_tokens, temperature):
        self.prompts += prompts
        return [Generation([self.eos_token_ids[0]]) for _ in prompts]


@pytest.mark.parametrize("policy_kwargs", [None, {"enable_thinking": False}])
def test_plan_prompt_length_is_that_of_the_prompt_the_policy_gets(
    tiny_model_path, thinking_tokenizer, cpu_args, policy_kwargs
):
    """Under a Qwen3-style thinking template the plan prompt is rendered with `plan_chat_template_kwargs` (thinking
    off), whatever the rollouts use: the check measures exactly the ids the plan is generated from."""
    args = SORTConfig(**cpu_args, chat_template_kwargs=policy_kwargs, max_plan_tokens=8)
    trainer = SORTTrainer(
        tiny_model_path, zero_reward, args, train_dataset=Dataset.from_list(ROWS), processing_class=thinking_tokenizer
    )
    trainer._policy_engine = planner = RecordingPlanner(thinking_tokenizer)
    repair, rows = trainer.repair, ROWS[:2]
    references = [repair.renderer.reference(row["solution"]) for row in rows]
    repair._write_plans([RepairItem(row["prompt"], row["solution"]) for row in rows], references)
    lengths = repair.renderer.repair_lengths([row["prompt"] for row in rows], references)
    assert [length["plan"] for length in lengths] == [len(ids) + 8 for ids in planner.prompts]
    assert all(thinking_tokenizer.decode(ids).endswith("<think>\n\n</think>\n\n") for ids in planner.prompts)


class BufferSpy(TrainerCallback):
    def __init__(self, trainer):
        self.trainer, self.prompts_held = trainer, set()

    def on_step_end(self, args, state, control, **kwargs):
        self.prompts_held |= {item.prompt[0]["content"] for item in self.trainer.repair.buffer.items}


def test_a_pair_too_long_during_training_is_skipped_and_counted(tiny_model_path, cpu_args, caplog):
    """A row the check before training did not see (here: the check is taken out, as for rows of an iterable
    dataset past the first ones) whose reference cannot fit is never deferred; training goes on."""
    long_row = {**ROWS[0], "solution": "6-0=6\n\n" * 600}  # 4200 tokens: no repair pass fits
    trainer = sort_trainer(tiny_model_path, cpu_args, [long_row, ROWS[1]], max_reference_tokens=8000)
    trainer.remove_callback(RepairLengthCheck)
    spy = BufferSpy(trainer)
    trainer.add_callback(spy)
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.repair.buffer.counters["skipped_too_long"] == 2  # once a step
    assert [log["sort/skipped_too_long"] for log in trainer.state.log_history if "sort/skipped_too_long" in log]
    assert spy.prompts_held == {ROWS[1]["prompt"][0]["content"]}
    assert trainer.repair.buffer.counters["empty_references"] == 0
    assert caplog.text.count("SORT skips an all-wrong prompt it cannot repair: the plan prompt") == 1


def test_references_longer_than_max_reference_tokens_warn(tiny_model_path, cpu_args, caplog):
    """Cut, not refused: the repair still learns the first `max_reference_tokens` tokens. The check before training
    warns with the count, the first cut reference deferred during training warns once."""
    trainer = sort_trainer(tiny_model_path, cpu_args, ROWS[:2], max_reference_tokens=8)
    trainer.train()
    assert "2 of 2 references are longer than max_reference_tokens=8 (rows 0, 1)" in caplog.text
    assert caplog.text.count("more than max_reference_tokens=8: the repair learns only its first 8 tokens") == 1
