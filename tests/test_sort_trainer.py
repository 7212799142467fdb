"""SORTTrainer on the tiny model: config and dataset checks, exact scoring of reference tokens, plan prompts under a
thinking chat template, failed plans, uniform weighting, the separate repair step, gradient-accumulation scaling,
correctness functions, end-to-end repairs with metrics, checkpoint resume with a non-empty buffer, and LoRA."""

import json
import logging
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import digit_count_reward, params_changed, snapshot
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_mintrl.engines import Generation, GenerationEngine
from trl_mintrl.losses import sort_repair_terms
from trl_mintrl.sort import RepairItem, SORTConfig, SORTTrainer
from trl_mintrl.sort.buffer import BUFFER_FILE
from trl_mintrl.text import chat_token_ids, prompt_token_ids

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


def format_bonus(completions, **kwargs):
    """A shaping term that every rollout earns: with it among the correctness functions nothing is ever all-wrong."""
    return [0.5] * len(completions)


def sort_args(cpu_args, **overrides):
    settings = {**cpu_args, "per_device_train_batch_size": 8, "max_plan_tokens": 8, "repair_batch_size": 2}
    return SORTConfig(**{**settings, **overrides})


def prefill(trainer, dataset, n):
    """Defer the first n hard prompts of the dataset by hand."""
    rows = [row for row in dataset if is_hard(row["prompt"])][:n]
    for row in rows:
        trainer.repair.buffer.add(row["prompt"], row["solution"])
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
        ("plan_template", "{question} {reference} {answer}", r"`plan_template` uses unknown field\(s\) \{answer\}"),
        ("base_template", "\\boxed{} {questoin}", r"`base_template` uses unknown.*did you mean \{question\}"),
        ("repair_beta", 1.5, "`repair_beta`"),
        ("repair_batch_size", 0, "`repair_batch_size`"),
        ("repair_update", "alternate", "`repair_update`.*'separate', 'joint'"),
        ("repair_weighting", "sft", "`repair_weighting`.*'salience', 'uniform'"),
        ("plan_chat_template_kwargs", "{enable_thinking: false", "`plan_chat_template_kwargs` must be a JSON object"),
        ("plan_chat_template_kwargs", ["enable_thinking"], "`plan_chat_template_kwargs` must be a dict"),
        ("correctness_reward_funcs", [], "`correctness_reward_funcs` is empty"),
        ("correctness_reward_funcs", [1.5], "`correctness_reward_funcs` holds reward function names or indices"),
        ("remove_unused_columns", True, "remove_unused_columns=False"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(cpu_args, field, value, match):
    with pytest.raises(ValueError, match=match):
        SORTConfig(**{**cpu_args, field: value})


def test_plan_chat_template_kwargs_from_the_command_line(cpu_args):
    assert SORTConfig(**cpu_args).plan_chat_template_kwargs == {"enable_thinking": False}
    parsed = SORTConfig(**cpu_args, plan_chat_template_kwargs='{"enable_thinking": true}')
    assert parsed.plan_chat_template_kwargs == {"enable_thinking": True}


@pytest.mark.parametrize(
    "selection,match",
    [
        (["math_reward"], r"`correctness_reward_funcs` names 'math_reward'.*\['digit_count_reward', 'format_bonus'\]"),
        ([2], r"`correctness_reward_funcs` has index 2, but there are 2 reward functions"),
        (["format_bonus", 1], "names reward function 'format_bonus' twice"),
    ],
)
def test_bad_correctness_reward_funcs_fail_before_loading_the_model(cpu_args, toy_dataset, selection, match):
    args = SORTConfig(**cpu_args, correctness_reward_funcs=selection)
    with pytest.raises(ValueError, match=match):
        SORTTrainer(
            "no/such-model", reward_funcs=[digit_count_reward, format_bonus], args=args, train_dataset=toy_dataset
        )


def test_missing_reference_column_or_unknown_vllm_mode_fails_before_loading_the_model(cpu_args, toy_dataset):
    data = Dataset.from_list([{"prompt": "Compute 1+1 =", "answer": "2"}])
    # The model path does not exist: these checks must come first.
    with pytest.raises(ValueError, match=r"no column 'solution'.*`reference_column`"):
        SORTTrainer("no/such-model", reward_funcs=digit_count_reward, args=SORTConfig(**cpu_args), train_dataset=data)
    unknown = SORTConfig(**cpu_args, use_vllm=True, vllm_mode="remote")
    with pytest.raises(ValueError, match="vllm_mode must be one of"):
        SORTTrainer("no/such-model", reward_funcs=digit_count_reward, args=unknown, train_dataset=toy_dataset)


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
    references = [scoring_trainers[0].repair.renderer.reference(item.reference) for item in items]
    eos = tiny_tokenizer.eos_token_id
    for item, ref in zip(items[:2], references[:2]):  # tokenised once, no special tokens, EOS appended
        assert ref.ids == tiny_tokenizer(item.reference, add_special_tokens=False)["input_ids"] + [eos]
    assert len(references[2].ids) == 32 and references[2].truncated and references[2].ids[-1] != eos

    plan = "1. add the units"
    base_prompts = scoring_trainers[0].repair.renderer.base_prompt_ids([item.prompt for item in items])
    teacher_prompts = scoring_trainers[0].repair.renderer.templated_prompt_ids(
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
                logps, mask = trainer.repair._reference_logps(model, prompts, reference_ids)
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
        references = [trainer.repair.renderer.reference(item.reference) for item in items]
        plans, _ = trainer.repair._write_plans(items, references)  # greedy: the same plans at both temperatures
        assert all(len(trainer._tokenizer(p)["input_ids"]) <= trainer.args.max_plan_tokens for p in plans)
        base_prompts = trainer.repair.renderer.base_prompt_ids([item.prompt for item in items])
        teacher_prompts = trainer.repair.renderer.templated_prompt_ids(
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
        expected = sort_repair_terms(torch.stack(pad[:2]), torch.stack(pad[2:]), mask, 0.5).loss

        loss = trainer.repair._repair_loss(model, items)
        assert any(p.grad is not None for p in model.parameters())  # backpropagated inside
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
    assert trainer.repair.buffer.counters["repairs"] == 1
    return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters() if n in before}


@pytest.mark.parametrize("repair_update", ["separate", "joint"])
def test_repair_enters_the_step_once_whatever_the_accumulation(tiny_model_path, cpu_args, toy_dataset, repair_update):
    """GA=2 with repair_loss_weight=2 moves the weights exactly twice as far as GA=1 with weight 1: the repair is
    added once per optimizer step, not once per micro-batch, and is not divided by the accumulation steps."""
    single = one_repair_step_delta(tiny_model_path, cpu_args, toy_dataset, repair_update=repair_update)
    accumulated = one_repair_step_delta(
        tiny_model_path,
        cpu_args,
        toy_dataset,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
        repair_loss_weight=2.0,
        repair_update=repair_update,
    )
    assert sum(d.abs().sum() for d in single.values()) > 0
    for name, delta in single.items():
        # atol: float32 spacing of weights near 1.0 (norms) is 1.2e-7
        torch.testing.assert_close(accumulated[name], 2 * delta, atol=3e-7, rtol=1e-4)


def test_separate_and_joint_agree_when_the_grpo_gradient_is_zero(tiny_model_path, cpu_args, toy_dataset):
    """Flat rewards, no clipping: the GRPO step is a no-op, so both updates are one SGD step on the repair loss."""
    separate = one_repair_step_delta(tiny_model_path, cpu_args, toy_dataset, repair_update="separate")
    joint = one_repair_step_delta(tiny_model_path, cpu_args, toy_dataset, repair_update="joint")
    for name, delta in joint.items():
        torch.testing.assert_close(separate[name], delta, atol=3e-7, rtol=1e-4)


def test_failures_hidden_by_a_format_bonus_warn_once_naming_the_fields(tiny_model_path, cpu_args, toy_dataset, caplog):
    """Every rollout earns the bonus, so with all functions deciding nothing is ever all-wrong: a warning (once)
    names the function that earned nothing and both fields. Choosing the correctness function defers the hard
    prompts."""
    funcs = [hard_zero_flat_reward, format_bonus]
    settings = dict(max_steps=3, num_generations=2, per_device_train_batch_size=16, repair_batch_size=100)
    trainer = SORTTrainer(
        tiny_model_path, reward_funcs=funcs, args=sort_args(cpu_args, **settings), train_dataset=toy_dataset
    )
    trainer.repair.failures_slip_through_batches = 2  # every batch holds every prompt, the hard ones included
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert len(trainer.repair.buffer) == 0
    warned = [r.getMessage() for r in caplog.records if "correctness_reward_funcs" in r.getMessage()]
    assert len(warned) == 1
    assert "['hard_zero_flat_reward']" in warned[0] and "`correct_threshold` (now 0.0)" in warned[0]

    caplog.clear()
    args = sort_args(cpu_args, **settings, correctness_reward_funcs=["hard_zero_flat_reward"])
    fixed = SORTTrainer(tiny_model_path, reward_funcs=funcs, args=args, train_dataset=toy_dataset)
    fixed.repair.failures_slip_through_batches = 2
    with caplog.at_level(logging.WARNING):
        fixed.train()
    assert sorted(item.prompt[-1]["content"] for item in fixed.repair.buffer.items) == sorted(HARD)
    assert not [r for r in caplog.records if "correctness_reward_funcs" in r.getMessage()]


class BufferSpy(TrainerCallback):
    """Records the buffer at the start of training and after every optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.at_start, self.prompts_held = trainer, None, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.at_start = self.trainer.repair.buffer.state_dict()

    def on_step_end(self, args, state, control, **kwargs):
        self.prompts_held += [item.prompt for item in self.trainer.repair.buffer.items]


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

    assert trainer.repair.buffer.counters["repairs"] >= 1
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
    assert saved == first.repair.buffer.state_dict() and len(saved["items"]) >= 2

    # Resume with a repair batch exactly the size of the saved buffer: the first step repairs the restored items.
    args = sort_args(cpu_args, max_steps=2, save_strategy="no", repair_batch_size=len(saved["items"]))
    second = SORTTrainer(tiny_model_path, reward_funcs=hard_zero_flat_reward, args=args, train_dataset=toy_dataset)
    spy = BufferSpy(second)
    second.add_callback(spy)
    second.train(resume_from_checkpoint=True)
    assert spy.at_start == saved
    assert second.repair.buffer.counters["repairs"] == saved["counters"]["repairs"] + 1
    assert not any(item.prompt in restored_prompts for item in second.repair.buffer.items)


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
    assert trainer.repair.buffer.counters["repairs"] >= 1
    params = dict(trainer.model.named_parameters())
    assert any(not torch.equal(params[n], p) for n, p in lora_before.items())
    assert all(torch.equal(params[n], p) for n, p in base_before.items())


# ---- plans under a thinking chat template ---------------------------------------------------------------------------

# `thinking_tokenizer` (conftest): Qwen3-like, the assistant turn opens a thinking block unless enable_thinking=False.
PLAN = "1. add the units"


class ScriptedPlanner(GenerationEngine):
    """Writes PLAN and stops, unless its prompt leaves a thinking block open: then it thinks until the token cap
    (a thinking model's plan budget spent inside <think>). `ramble=True`: never stops, plan or not."""

    def __init__(self, tokenizer, ramble=False):
        super().__init__([tokenizer.eos_token_id])
        self.tokenizer, self.ramble, self.prompts = tokenizer, ramble, []

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        outputs = []
        for ids, cap in zip(prompt_ids, max_new_tokens):
            text = self.tokenizer.decode(ids)
            self.prompts.append(text)
            if text.endswith("<think>\n"):
                outputs.append(self.tokenizer("Let me think about the units first " * 20)["input_ids"][:cap])
            elif self.ramble:
                outputs.append(self.tokenizer(PLAN + " and then check each case " * 20)["input_ids"][:cap])
            else:
                outputs.append(self.tokenizer(PLAN)["input_ids"] + [self.tokenizer.eos_token_id])
        return [Generation(ids) for ids in outputs]


def thinking_trainer(model_path, tokenizer, cpu_args, dataset, **overrides):
    args = sort_args(
        cpu_args, **{"num_generations": 2, "per_device_train_batch_size": 16, "max_plan_tokens": 24, **overrides}
    )
    trainer = SORTTrainer(
        model_path, reward_funcs=hard_zero_flat_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer._policy_engine = ScriptedPlanner(tokenizer, ramble=overrides.get("max_plan_tokens") == 4)
    return trainer


@pytest.mark.parametrize("policy_kwargs", [None, {"enable_thinking": False}])
def test_plan_prompt_does_not_think_and_base_scoring_renders_like_the_rollouts(
    tiny_model_path, thinking_tokenizer, cpu_args, toy_dataset, policy_kwargs
):
    """Whatever the policy's own `chat_template_kwargs` (thinking rollouts or not), the plan prompt closes the
    thinking block (default plan_chat_template_kwargs), the plan is used, and the reference is scored after exactly
    the token ids the rollouts were generated from; the teacher prompt is rendered like the rollouts too."""
    trainer = thinking_trainer(
        tiny_model_path,
        thinking_tokenizer,
        cpu_args,
        toy_dataset,
        max_steps=1,
        chat_template_kwargs=policy_kwargs,
        max_repairs_per_step=1,  # the step's own deferrals would be a second repair
    )
    repaired = prefill(trainer, toy_dataset, 2)
    rollout_ids, scored = {}, []

    generate_and_score, reference_logps = trainer._generate_and_score_completions, trainer.repair._reference_logps

    def spy_rollouts(inputs):
        output = generate_and_score(inputs)
        for row, ids, mask in zip(inputs, output["prompt_ids"], output["prompt_mask"]):
            rollout_ids.setdefault(json.dumps(row["prompt"]), set()).add(tuple(ids[mask.bool()].tolist()))
        return output

    def spy_scoring(model, prompt_ids, reference_ids):
        scored.append(prompt_ids)
        return reference_logps(model, prompt_ids, reference_ids)

    trainer._generate_and_score_completions, trainer.repair._reference_logps = spy_rollouts, spy_scoring
    trainer.train()

    assert trainer.repair.buffer.counters["repairs"] == 1 and trainer.repair.buffer.counters["failed_plans"] == 0
    planner = trainer._policy_engine
    assert len(planner.prompts) == 2 and all(p.endswith("assistant\n<think>\n\n</think>\n\n") for p in planner.prompts)
    teacher, base = scored  # the teacher pass runs first: its weights are known before the base pass's backward
    assert set(map(json.dumps, repaired)) <= set(rollout_ids)  # both repaired prompts were rolled out this step
    for prompt, ids in zip(repaired, base):
        assert rollout_ids[json.dumps(prompt)] == {tuple(ids)}  # token for token
    opening = "<think>\n\n</think>\n\n" if policy_kwargs else "<think>\n"
    for prompt, ids in zip(repaired, teacher):
        text = trainer.args.teacher_template.format(question=prompt[-1]["content"], plan=PLAN)
        assert (
            thinking_tokenizer.decode(ids) == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{opening}"
        )


@pytest.mark.parametrize(
    "overrides,expected_plan",
    [
        ({"plan_chat_template_kwargs": {}}, ""),  # thinks until the cap: an unclosed block, nothing else
        ({"max_plan_tokens": 4}, None),  # rambles past the cap: the cut plan is kept
    ],
)
def test_failed_plans_are_counted_and_repaired_with_what_they_have(
    tiny_model_path, thinking_tokenizer, cpu_args, toy_dataset, overrides, expected_plan
):
    trainer = thinking_trainer(tiny_model_path, thinking_tokenizer, cpu_args, toy_dataset, **overrides)
    items = [RepairItem(toy_dataset[i]["prompt"], toy_dataset[i]["solution"]) for i in (0, 1)]
    references = [trainer.repair.renderer.reference(item.reference) for item in items]
    plans, failed = trainer.repair._write_plans(items, references)
    assert failed == [True, True]
    if expected_plan is None:
        assert plans == [thinking_tokenizer.decode(thinking_tokenizer(PLAN)["input_ids"][:4])] * 2
    else:
        assert plans == [expected_plan] * 2 and trainer._policy_engine.prompts[0].endswith("assistant\n<think>\n")

    loss = trainer.repair._repair_loss(trainer.model, items)
    assert torch.isfinite(loss) and any(p.grad is not None for p in trainer.model.parameters())  # still repaired
    assert trainer.repair.buffer.counters["failed_plans"] == 2


# ---- uniform weighting ------------------------------------------------------------------------------------------------


def test_uniform_weighting_is_the_mean_nll_of_the_reference_tokens(tiny_model_path, cpu_args, toy_dataset):
    trainer = SORTTrainer(
        tiny_model_path,
        reward_funcs=digit_count_reward,
        args=sort_args(cpu_args, repair_weighting="uniform", temperature=0.7),
        train_dataset=toy_dataset,
    )
    planner = trainer._policy_engine = ScriptedPlanner(trainer._tokenizer)
    items = [RepairItem(toy_dataset[i]["prompt"], toy_dataset[i]["solution"]) for i in (2, 5)]
    tokens = []
    for item in items:
        prompt = prompt_token_ids(trainer._tokenizer, item.prompt)
        tokens.append(manual_logps(trainer.model, prompt, trainer.repair.renderer.reference(item.reference).ids))
    expected = -torch.cat(tokens).mean()  # every reference token weighs 1, over all items' tokens

    loss = trainer.repair._repair_loss(trainer.model, items)
    torch.testing.assert_close(loss.detach(), expected, atol=1e-5, rtol=1e-4)
    assert planner.num_calls == 0  # no plan is written
    metrics = trainer._metrics["train"]
    assert metrics["sort/mean_weight"] == [1.0] and metrics["sort/repair_loss"][-1] == pytest.approx(expected.item())
    assert "sort/salience_mean" not in metrics


# ---- the separate repair step ----------------------------------------------------------------------------------------


class StepSpy(TrainerCallback):
    """Passed to the constructor, so it runs before the trainer's own repair callback at `on_optimizer_step`."""

    def __init__(self):
        self.after_grpo, self.after_step, self.buffered = [], [], []

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.after_grpo.append(snapshot(model))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after_step.append(snapshot(model))


def test_separate_repair_is_its_own_clipped_step_after_the_grpo_step(tiny_model_path, cpu_args, toy_dataset):
    """Dense rewards (the GRPO gradient is not zero) and tight clipping: the GRPO step is clipped to its own norm,
    then the repair step moves the weights by exactly -lr * clip(grad of the repair at the post-GRPO weights); the
    learning-rate schedule and global_step advance once per step, as without repairs."""
    lr, clip = 0.5, 1e-2
    spy = StepSpy()
    args = sort_args(
        cpu_args, max_steps=2, optim="sgd", learning_rate=lr, max_grad_norm=clip, lr_scheduler_type="linear"
    )
    trainer = SORTTrainer(
        tiny_model_path, reward_funcs=hard_zero_reward, args=args, train_dataset=toy_dataset, callbacks=[spy]
    )
    prompts = prefill(trainer, toy_dataset, 2)  # the oldest two: step 1 repairs exactly these
    before = snapshot(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.repair.buffer.counters["repairs"] >= 1
    assert [log["learning_rate"] for log in trainer.state.log_history if "learning_rate" in log] == [lr, lr / 2]

    def norm(delta):
        return math.sqrt(sum(d.pow(2).sum().item() for d in delta.values()))

    after_grpo, after_repair = spy.after_grpo[0], spy.after_step[0]
    grpo_delta = {n: after_grpo[n] - before[n] for n in before}
    repair_delta = {n: after_repair[n] - after_grpo[n] for n in before}
    assert norm(grpo_delta) == pytest.approx(lr * clip, rel=1e-3)
    assert norm(repair_delta) == pytest.approx(lr * clip, rel=1e-3)

    # the repair's gradient, recomputed at the post-GRPO weights on the same items (greedy plans: the same plans)
    trainer.model.load_state_dict(after_grpo, strict=False)
    trainer.model.zero_grad()
    items = [RepairItem(p, row["solution"]) for p in prompts for row in toy_dataset if row["prompt"] == p]
    trainer.repair._repair_loss(trainer.model, items)  # backpropagates
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if n in before}
    factor = min(1.0, clip / norm(grads))
    for name, delta in repair_delta.items():
        torch.testing.assert_close(delta, -lr * factor * grads[name], atol=1e-6, rtol=1e-3)
    assert trainer.state.log_history[0]["sort/repair_grad_norm"] == pytest.approx(norm(grads), rel=1e-3)  # pre-clip
