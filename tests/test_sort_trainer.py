"""SORTTrainer on the tiny model: config and dataset checks, exact scoring of reference tokens, gradient-accumulation
scaling, end-to-end repairs with metrics, checkpoint resume with a non-empty buffer, and LoRA."""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import digit_count_reward, params_changed, snapshot
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_mintrl.losses import sort_repair_loss
from trl_mintrl.prompts import chat_token_ids, prompt_token_ids
from trl_mintrl.sort import RepairItem, SORTConfig, SORTTrainer
from trl_mintrl.sort.buffer import BUFFER_FILE

HARD = {f"Compute {a}+{(a * 3) % 7} =" for a in range(4)}  # the toy prompts that never score


def is_hard(prompt) -> bool:
    return prompt[-1]["content"] in HARD


def hard_zero_reward(prompts, completions, **kwargs):
    """0 on the hard prompts (so their groups are all-wrong), a dense positive reward elsewhere."""
    dense = digit_count_reward(completions)
    return [0.0 if is_hard(p) else 0.1 + d for p, d in zip(prompts, dense)]


def hard_zero_flat_reward(prompts, completions, **kwargs):
    """0 on the hard prompts, 1 elsewhere: every group has zero advantage, so only a repair can move the weights."""
    return [0.0 if is_hard(p) else 1.0 for p in prompts]


def sort_args(cpu_args, **overrides):
    settings = {**cpu_args, "per_device_train_batch_size": 8, "max_plan_tokens": 8, "repair_batch_size": 2}
    return SORTConfig(**{**settings, **overrides})


def prefill(trainer, dataset, n):
    """Defer the first n hard prompts of the dataset by hand."""
    rows = [row for row in dataset if is_hard(row["prompt"])][:n]
    for row in rows:
        trainer.sort_buffer.add(row["prompt"], row["solution"])
    return [row["prompt"] for row in rows]


# ---- config and construction ------------------------------------------------------------------------------------


def test_config_defaults_follow_the_paper(cpu_args):
    args = SORTConfig(**cpu_args)
    assert (args.epsilon, args.epsilon_high, args.beta) == (0.2, 0.28, 0.0)
    assert (args.reference_column, args.repair_batch_size, args.repair_beta, args.repair_loss_weight) == (
        "solution",
        8,
        0.5,
        1.0,
    )


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("teacher_template", "{question} without the plan", r"`teacher_template`.*\{plan\}"),
        ("plan_template", "{question} {reference} {answer}", r"`plan_template`.*unknown \['answer'\]"),
        ("base_template", "\\boxed{x} {question}", r"`base_template`.*\{\{"),
        ("repair_beta", 1.5, "`repair_beta`"),
        ("repair_batch_size", 0, "`repair_batch_size`"),
        ("remove_unused_columns", True, "remove_unused_columns=False"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(cpu_args, field, value, match):
    with pytest.raises(ValueError, match=match):
        SORTConfig(**{**cpu_args, field: value})


def test_missing_reference_column_or_vllm_server_fails_before_loading_the_model(cpu_args, toy_dataset):
    data = Dataset.from_list([{"prompt": "Compute 1+1 =", "answer": "2"}])
    # The model path does not exist: these checks must come first.
    with pytest.raises(ValueError, match=r"no column 'solution'.*`reference_column`"):
        SORTTrainer("no/such-model", reward_funcs=digit_count_reward, args=SORTConfig(**cpu_args), train_dataset=data)
    server = SORTConfig(**cpu_args, use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match="vllm_mode='colocate'"):
        SORTTrainer("no/such-model", reward_funcs=digit_count_reward, args=server, train_dataset=toy_dataset)


def test_model_card_names_the_method(tiny_model_path, cpu_args, toy_dataset):
    trainer = SORTTrainer(
        tiny_model_path, reward_funcs=digit_count_reward, args=sort_args(cpu_args), train_dataset=toy_dataset
    )
    trainer.create_model_card(model_name="tiny-sort")
    card = Path(trainer.args.output_dir, "README.md").read_text()
    assert "2605.11505" in card and "SORT" in card
    assert {"trl", "sort"} <= set(trainer.model.model_tags)


# ---- scoring ------------------------------------------------------------------------------------------------------


def manual_logps(model, prompt_ids, reference_ids):
    """log p(reference token | prompt, previous reference tokens) from one unpadded forward pass at temperature 1."""
    ids = torch.tensor([prompt_ids + reference_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(reference_ids) - 1)
    return logits[positions].log_softmax(-1).gather(-1, torch.tensor(reference_ids).unsqueeze(-1)).squeeze(-1)


@pytest.fixture
def scoring_trainers(tiny_model_path, cpu_args, toy_dataset):
    """The same model and data at sampling temperatures 1.0 (TRL's fused scoring) and 0.7 (SORT's own path)."""
    return [
        SORTTrainer(
            tiny_model_path,
            reward_funcs=digit_count_reward,
            args=sort_args(cpu_args, temperature=t, max_reference_tokens=32),
            train_dataset=toy_dataset,
        )
        for t in (1.0, 0.7)
    ]


def test_scoring_passes_score_exactly_the_reference_tokens(scoring_trainers, toy_dataset, tiny_tokenizer):
    items = [
        RepairItem(toy_dataset[0]["prompt"], toy_dataset[0]["solution"]),
        RepairItem([{"role": "user", "content": "Compute 12+30, then check it ="}], "12+30=42"),
        RepairItem(toy_dataset[1]["prompt"], "1+3=4, and 4 is the answer. " * 8),  # over 32 tokens
    ]
    references = [scoring_trainers[0]._prepare_reference(item.reference) for item in items]
    eos = tiny_tokenizer.eos_token_id
    for item, ref in zip(items[:2], references[:2]):  # tokenised once, no special tokens, EOS appended
        assert ref.ids == tiny_tokenizer(item.reference, add_special_tokens=False)["input_ids"] + [eos]
    assert len(references[2].ids) == 32 and references[2].truncated and references[2].ids[-1] != eos

    plan = "1. add the units"
    base_prompts = scoring_trainers[0]._base_prompt_ids([item.prompt for item in items])
    teacher_prompts = scoring_trainers[0]._templated_prompt_ids(
        [scoring_trainers[0].args.teacher_template.format(question=i.prompt[-1]["content"], plan=plan) for i in items],
        [item.prompt for item in items],
    )
    assert base_prompts == [prompt_token_ids(tiny_tokenizer, item.prompt) for item in items]
    # rows of different prompt and reference lengths share one padded batch
    assert len({len(p) for p in base_prompts}) > 1 and len({len(r.ids) for r in references}) == 3
    teacher_text = scoring_trainers[0].args.teacher_template.format(question=items[0].prompt[-1]["content"], plan=plan)
    assert teacher_prompts[0] == chat_token_ids(tiny_tokenizer, teacher_text)

    reference_ids = [r.ids for r in references]
    for trainer in scoring_trainers:
        model = trainer.model
        for prompts in (base_prompts, teacher_prompts):
            with torch.no_grad():
                logps, mask = trainer._reference_logps(model, prompts, reference_ids)
            assert mask.sum(1).tolist() == [len(r) for r in reference_ids]
            for row, (prompt, ref) in enumerate(zip(prompts, reference_ids)):
                expected = manual_logps(model, prompt, ref)
                torch.testing.assert_close(logps[row, : len(ref)], expected, atol=2e-5, rtol=1e-4)
                assert torch.all(logps[row, len(ref) :] == 0)


def test_repair_loss_matches_manual_computation_at_any_temperature(scoring_trainers, toy_dataset):
    items = [RepairItem(toy_dataset[i]["prompt"], toy_dataset[i]["solution"]) for i in (2, 6)]
    losses = []
    for trainer in scoring_trainers:
        model = trainer.model
        references = [trainer._prepare_reference(item.reference) for item in items]
        plans = trainer._write_plans(items, references)  # greedy: the same plans at both temperatures
        assert all(len(trainer._tokenizer(p)["input_ids"]) <= trainer.args.max_plan_tokens for p in plans)
        base_prompts = trainer._base_prompt_ids([item.prompt for item in items])
        teacher_prompts = trainer._templated_prompt_ids(
            [
                trainer.args.teacher_template.format(question=i.prompt[-1]["content"], plan=p)
                for i, p in zip(items, plans)
            ],
            [item.prompt for item in items],
        )
        base = [manual_logps(model, p, r.ids) for p, r in zip(base_prompts, references)]
        plan = [manual_logps(model, p, r.ids) for p, r in zip(teacher_prompts, references)]
        width = max(len(b) for b in base)
        pad = [torch.nn.functional.pad(x, (0, width - len(x))) for x in base + plan]
        mask = torch.stack([torch.arange(width) < len(b) for b in base]).float()
        expected = sort_repair_loss(torch.stack(pad[:2]), torch.stack(pad[2:]), mask, 0.5)

        loss = trainer._repair_loss(model, items)
        assert loss.requires_grad
        torch.testing.assert_close(loss.detach(), expected, atol=1e-5, rtol=1e-4)
        assert trainer._metrics["train"]["sort/repair_loss"][-1] == pytest.approx(expected.item(), rel=1e-4)
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)  # the sampling temperature does not change the weights


# ---- training ------------------------------------------------------------------------------------------------------


def one_repair_step_delta(tiny_model_path, cpu_args, toy_dataset, **overrides):
    """Weight change of one SGD step whose only gradient is a repair of two prefilled prompts."""
    args = sort_args(
        cpu_args, max_steps=1, optim="sgd", learning_rate=0.5, max_grad_norm=0.0, repair_batch_size=2, **overrides
    )
    trainer = SORTTrainer(tiny_model_path, reward_funcs=hard_zero_flat_reward, args=args, train_dataset=toy_dataset)
    prefill(trainer, toy_dataset, 2)
    before = snapshot(trainer.model)
    trainer.train()
    assert trainer.sort_buffer.counters["repairs"] == 1
    return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters() if n in before}


def test_repair_enters_the_step_once_whatever_the_accumulation(tiny_model_path, cpu_args, toy_dataset):
    """GA=2 with repair_loss_weight=2 moves the weights exactly twice as far as GA=1 with weight 1: the repair is
    added once per optimizer step, not once per micro-batch, and is not divided by the accumulation steps."""
    single = one_repair_step_delta(tiny_model_path, cpu_args, toy_dataset)
    accumulated = one_repair_step_delta(
        tiny_model_path,
        cpu_args,
        toy_dataset,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
        repair_loss_weight=2.0,
    )
    assert sum(d.abs().sum() for d in single.values()) > 0
    for name, delta in single.items():
        # atol: float32 spacing of weights near 1.0 (norms) is 1.2e-7
        torch.testing.assert_close(accumulated[name], 2 * delta, atol=3e-7, rtol=1e-4)


class BufferSpy(TrainerCallback):
    """Records the buffer at the start of training and after every optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.at_start, self.prompts_held = trainer, None, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.at_start = self.trainer.sort_buffer.state_dict()

    def on_step_end(self, args, state, control, **kwargs):
        self.prompts_held += [item.prompt for item in self.trainer.sort_buffer.items]


def test_training_defers_hard_prompts_repairs_and_logs(tiny_model_path, cpu_args, toy_dataset):
    trainer = SORTTrainer(
        tiny_model_path,
        reward_funcs=hard_zero_reward,
        args=sort_args(cpu_args, max_steps=3),
        train_dataset=toy_dataset,
    )
    spy = BufferSpy(trainer)
    trainer.add_callback(spy)
    before = snapshot(trainer.model)
    trainer.train()

    assert trainer.sort_buffer.counters["repairs"] >= 1
    assert all(is_hard(prompt) for prompt in spy.prompts_held)
    assert params_changed(before, trainer.model) > 0
    logged = {key for log in trainer.state.log_history for key in log}
    for name in [
        "all_wrong_frac",
        "all_right_frac",
        "buffer_size",
        "repairs",
        "repair_loss",
        "mean_weight",
        "salience_mean",
        "salience_max",
        "truncated_references",
    ]:
        assert f"sort/{name}" in logged, name
    frac = [
        log["sort/all_wrong_frac"] + log["sort/all_right_frac"]
        for log in trainer.state.log_history
        if "sort/all_wrong_frac" in log
    ]
    assert frac and all(f == pytest.approx(1.0) for f in frac)  # each prompt is either always 0 or always > 0


def test_resume_restores_a_non_empty_buffer(tiny_model_path, cpu_args, toy_dataset):
    args = sort_args(cpu_args, max_steps=1, save_strategy="steps", save_steps=1, repair_batch_size=100)
    first = SORTTrainer(tiny_model_path, reward_funcs=hard_zero_flat_reward, args=args, train_dataset=toy_dataset)
    restored_prompts = prefill(first, toy_dataset, 2)
    first.train()
    checkpoint = os.path.join(args.output_dir, "checkpoint-1")
    saved = json.loads(Path(checkpoint, BUFFER_FILE).read_text())
    assert saved == first.sort_buffer.state_dict() and len(saved["items"]) >= 2

    # Resume with a repair batch exactly the size of the saved buffer: the first step repairs the restored items.
    args = sort_args(cpu_args, max_steps=2, save_strategy="no", repair_batch_size=len(saved["items"]))
    second = SORTTrainer(tiny_model_path, reward_funcs=hard_zero_flat_reward, args=args, train_dataset=toy_dataset)
    spy = BufferSpy(second)
    second.add_callback(spy)
    second.train(resume_from_checkpoint=True)
    assert spy.at_start == saved
    assert second.sort_buffer.counters["repairs"] == saved["counters"]["repairs"] + 1
    assert not any(item.prompt in restored_prompts for item in second.sort_buffer.items)


def test_lora_run_repairs_through_the_adapter(tiny_model_path, cpu_args, toy_dataset):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    trainer = SORTTrainer(
        model,
        reward_funcs=hard_zero_flat_reward,  # zero advantages everywhere: only the repair moves the adapter
        args=sort_args(cpu_args, max_steps=2, repair_batch_size=1),
        train_dataset=toy_dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    assert lora_before
    trainer.train()
    assert trainer.sort_buffer.counters["repairs"] >= 1
    params = dict(trainer.model.named_parameters())
    assert any(not torch.equal(params[n], p) for n, p in lora_before.items())
    assert all(torch.equal(params[n], p) for n, p in base_before.items())
