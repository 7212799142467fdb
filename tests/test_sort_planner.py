"""SORT's planner seam: a `Planner` object (e.g. `FunctionPlanner`) writes the repair plans instead of the policy."""

import logging

import pytest
import torch

from trl_mintrl.combined import MInTRLSORTConfig, MInTRLSORTTrainer
from trl_mintrl.sort import FunctionPlanner, Plan, PlanRequest, RepairItem, SORTConfig, SORTTrainer
from trl_mintrl.text import chat_token_ids


def test_function_planner_calls_the_function_per_item_and_fails_items_not_batches(caplog):
    def plan_fn(question, reference):
        if "boom" in question:
            raise RuntimeError("no plan")
        return 3 if "int" in question else f"use {reference}"

    planner = FunctionPlanner(plan_fn)
    requests = [PlanRequest("q1", "r1"), PlanRequest("boom", "r2"), PlanRequest("int", "r3")]
    with caplog.at_level(logging.WARNING):
        plans = planner.plan(requests)
    assert plans == [Plan("use r1"), Plan(failed=True), Plan(failed=True)]
    assert "failed on 2 of 3 items; first: raised RuntimeError: no plan" in caplog.text
    with pytest.raises(TypeError, match="callable"):
        FunctionPlanner("not a function")


class NoGeneration:
    """A policy engine that must not be called: the planner, not the policy, writes the plans."""

    def generate(self, *args, **kwargs):
        raise AssertionError("the policy was asked to write a plan")


@pytest.mark.parametrize("combined", [False, True])
def test_planner_plans_reach_the_teacher_scoring_pass_and_failures_are_counted(
    tiny_model_path, tiny_tokenizer, cpu_args, toy_dataset, combined
):
    seen = []

    def plan_fn(question, reference):
        seen.append((question, reference))
        if len(seen) == 2:
            raise ValueError("cannot plan this one")
        return f"  hint: {reference[:5]}  "

    settings = {**cpu_args, "per_device_train_batch_size": 8, "repair_batch_size": 2}
    if combined:
        args = MInTRLSORTConfig(**settings, num_control_generations=2, num_intervened_generations=2)
        trainer = MInTRLSORTTrainer(
            tiny_model_path,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=toy_dataset,
            planner=FunctionPlanner(plan_fn),
        )
    else:
        trainer = SORTTrainer(
            tiny_model_path,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=SORTConfig(**settings),
            train_dataset=toy_dataset,
            planner=FunctionPlanner(plan_fn),
        )
    trainer._policy_engine = NoGeneration()
    items = [RepairItem(toy_dataset[i]["prompt"], toy_dataset[i]["solution"]) for i in (0, 1)]
    scored = []
    reference_logps = trainer.repair._reference_logps

    def spy(model, prompt_ids, reference_ids):
        scored.append(prompt_ids)
        return reference_logps(model, prompt_ids, reference_ids)

    trainer.repair._reference_logps = spy
    loss = trainer.repair._repair_loss(trainer.model, items)

    assert torch.isfinite(loss) and any(p.grad is not None for p in trainer.model.parameters())  # backpropagated
    assert seen == [(item.prompt[-1]["content"], item.reference) for item in items]
    teacher, base = scored  # the teacher pass runs first: its weights are known before the base pass's backward
    plans = [f"hint: {items[0].reference[:5]}", ""]  # stripped; the failed item is repaired with an empty plan
    for item, plan, ids in zip(items, plans, teacher):
        text = trainer.args.teacher_template.format(question=item.prompt[-1]["content"], plan=plan)
        assert ids == chat_token_ids(tiny_tokenizer, text)
    assert "hint: " + items[0].reference[:5] in tiny_tokenizer.decode(teacher[0])
    assert trainer.repair.buffer.counters["failed_plans"] == 1


def test_a_planner_that_is_not_a_planner_is_refused_before_the_model_loads(cpu_args, toy_dataset):
    with pytest.raises(TypeError, match="FunctionPlanner"):
        SORTTrainer(
            "no/such-model",
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=SORTConfig(**cpu_args),
            train_dataset=toy_dataset,
            planner=lambda q, r: "plan",
        )
