"""SORT's repair at the papers' shapes, on the tiny model: every repair forward takes at most
`per_device_train_batch_size` rows (with and without gradients; the plans have a batch of their own,
`plan_batch_size`, tests/test_sort_plan_batch.py), the main step's gradients are
released before a separate repair runs, scoring at a sampling temperature other than 1 goes through the fused head
at temperature 1 (exact in float64, no full-vocabulary logits), micro-batching leaves the loss and its gradient
unchanged, and `repair_optimizer="own"` keeps moments and step counts of its own while the schedule follows the main
steps only."""

import logging
import math
import os

import pytest
import torch
from conftest import snapshot
from test_sort_trainer import hard_zero_reward, manual_logps, prefill
from transformers import TrainerCallback

from trl_mintrl.losses import sort_repair_terms
from trl_mintrl.sort import FunctionPlanner, RepairItem, SORTConfig, SORTTrainer
from trl_mintrl.sort.repair_optimizer import scheduler_detached


def zero_reward(completions, **kwargs):
    """Every group all-wrong: nothing deferred is ever solved."""
    return [0.0] * len(completions)


def make_trainer(model_path, cpu_args, dataset, planner=None, callbacks=None, reward=hard_zero_reward, **overrides):
    settings = {**cpu_args, "per_device_train_batch_size": 2, "num_generations": 2, "max_plan_tokens": 4}
    args = SORTConfig(**{**settings, **overrides})
    return SORTTrainer(
        model_path,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        planner=planner,
        callbacks=callbacks,
    )


def items_of(dataset, rows):
    return [RepairItem(dataset[i]["prompt"], dataset[i]["solution"]) for i in rows]


class ScoringForwards:
    """Records (rows, gradients enabled) of every repair scoring forward (`score_at_unit_temperature=True`)."""

    def __init__(self, model):
        self.calls = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        if kwargs.get("score_at_unit_temperature"):
            self.calls.append((kwargs["input_ids"].shape[0], torch.is_grad_enabled()))


@pytest.mark.parametrize("repair_update", ["separate", "joint"])
def test_every_repair_forward_takes_at_most_a_micro_batch(tiny_model_path, cpu_args, toy_dataset, repair_update):
    """Five items at `per_device_train_batch_size=2`: three teacher and three base forwards of 2, 2 and 1 rows; only
    the base forwards have gradients. The plans are one generate call of 5 (`plan_batch_size=None`)."""
    trainer = make_trainer(
        tiny_model_path,
        cpu_args,
        toy_dataset,
        reward=zero_reward,
        max_steps=1,
        repair_batch_size=5,
        repair_update=repair_update,
    )
    for item in items_of(toy_dataset, range(5)):
        trainer.repair.buffer.add(item.prompt, item.reference)
    forwards = ScoringForwards(trainer.model)
    engine, plan_calls = trainer.policy_engine, []
    generate = engine.generate

    def spy_generate(prompt_ids, *args, **kwargs):
        plan_calls.append(len(prompt_ids))
        return generate(prompt_ids, *args, **kwargs)

    engine.generate = spy_generate
    trainer.train()
    assert trainer.repair.buffer.counters["repairs"] == 1
    assert forwards.calls == [(2, False), (2, False), (1, False), (2, True), (2, True), (1, True)]
    assert plan_calls == [5]


def test_separate_repair_starts_with_the_main_gradients_released(tiny_model_path, cpu_args, toy_dataset):
    """Dense rewards: the GRPO step leaves gradients on every parameter; the repair's first act (writing plans) must
    see none of them."""
    trainer = make_trainer(tiny_model_path, cpu_args, toy_dataset, max_steps=1, repair_batch_size=2)
    prefill(trainer, toy_dataset, 2)
    grads_at_plans, write_plans = [], trainer.repair._write_plans

    def spy(items, references):
        grads_at_plans.append(sum(p.grad is not None for p in trainer.model.parameters()))
        return write_plans(items, references)

    trainer.repair._write_plans = spy
    trainer.train()
    assert grads_at_plans == [0]


def test_scoring_at_another_temperature_is_exact_at_temperature_one_without_full_logits(
    tiny_model_path, cpu_args, toy_dataset
):
    """At sampling temperature 0.7 the reference is scored at temperature 1 (float64 reference) through the fused
    head: the LM head module never projects a whole sequence. TRL's own fused scoring keeps the sampling
    temperature."""
    trainer = make_trainer(tiny_model_path, cpu_args, toy_dataset, temperature=0.7)
    model = trainer.model
    items = items_of(toy_dataset, (0, 3, 5))
    references = [trainer.repair.renderer.reference(item.reference).ids for item in items]
    prompts = trainer.repair.renderer.base_prompt_ids([item.prompt for item in items])
    projections = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, i, out: projections.append(out.shape))
    with torch.no_grad():
        logps, mask = trainer.repair._reference_logps(model, prompts, references)
    handle.remove()
    assert projections == []

    for row, (prompt, reference) in enumerate(zip(prompts, references)):
        ids = torch.tensor([prompt + reference])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double()
        positions = torch.arange(len(prompt) - 1, len(prompt) + len(reference) - 1)
        target = torch.tensor(reference).unsqueeze(-1)
        expected = logits[positions].log_softmax(-1).gather(-1, target).squeeze(-1)
        torch.testing.assert_close(logps[row, : len(reference)].double(), expected, atol=2e-5, rtol=1e-5)
        sampled = (logits[positions] / 0.7).log_softmax(-1).gather(-1, target).squeeze(-1)
        labels = ids.clone()
        labels[:, : len(prompt)] = -100
        with torch.no_grad():
            trl_logps = model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs[0, -len(reference) :]
        torch.testing.assert_close(trl_logps.double(), sampled, atol=2e-5, rtol=1e-5)


def test_micro_batched_loss_and_gradient_equal_the_whole_repair(tiny_model_path, cpu_args, toy_dataset):
    """Five references of different lengths in micro-batches of 2: the loss and every parameter's gradient equal
    those of the SORT loss over all reference tokens at once (one forward per row, float tolerance)."""
    planner = FunctionPlanner(lambda question, reference: f"start from {reference[:3]}")
    trainer = make_trainer(tiny_model_path, cpu_args, toy_dataset, planner=planner, repair_loss_weight=1.0)
    model = trainer.model
    items = items_of(toy_dataset, range(5))
    items[1] = RepairItem(items[1].prompt, "1+3=4, since 1+3 is 4. " * 3)
    model.zero_grad()
    loss = trainer.repair._repair_loss(model, items)
    chunked = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    references = [trainer.repair.renderer.reference(item.reference).ids for item in items]
    base_prompts = trainer.repair.renderer.base_prompt_ids([item.prompt for item in items])
    teacher_prompts = trainer.repair.renderer.templated_prompt_ids(
        [
            trainer.args.teacher_template.format(
                question=i.prompt[-1]["content"], plan=f"start from {i.reference[:3]}"
            )
            for i in items
        ],
        [item.prompt for item in items],
    )
    model.zero_grad()
    base = [row_logps(model, p, r) for p, r in zip(base_prompts, references)]
    plan = [manual_logps(model, p, r) for p, r in zip(teacher_prompts, references)]
    width = max(map(len, references))
    mask = torch.stack([torch.arange(width) < len(r) for r in references]).float()
    whole = sort_repair_terms(pad(base, width), pad(plan, width), mask, trainer.args.repair_beta).loss
    whole.backward()
    expected = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert chunked.keys() == expected.keys() and chunked
    torch.testing.assert_close(loss, whole.detach(), atol=1e-5, rtol=1e-5)
    for name, grad in expected.items():
        torch.testing.assert_close(chunked[name], grad, atol=1e-6, rtol=1e-4)


def row_logps(model, prompt_ids, reference_ids):
    """`manual_logps` with gradients."""
    logits = model(input_ids=torch.tensor([prompt_ids + reference_ids])).logits[0].float()
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(reference_ids) - 1)
    return logits[positions].log_softmax(-1).gather(-1, torch.tensor(reference_ids).unsqueeze(-1)).squeeze(-1)


def pad(rows, width):
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


# ---- the separate repair's optimizer state ---------------------------------------------------------------------


class MainStateSpy(TrainerCallback):
    """Passed to the constructor, so it runs before the repair at `on_optimizer_step`: snapshots the main optimizer's
    state right after the main step, and again at the end of the step (after the repairs)."""

    def __init__(self):
        self.after_main, self.at_step_end = [], []

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.after_main.append(optimizer_state(optimizer))

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.at_step_end.append(optimizer_state(optimizer))


def optimizer_state(optimizer):
    return [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]


def states_equal(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("repair_optimizer", ["own", "shared"])
def test_repair_optimizer_state_and_schedule(tiny_model_path, cpu_args, toy_dataset, repair_optimizer):
    """AdamW with a linear schedule, two steps that each repair twice: with "own", the repair never touches the main
    moments, whose step counter is the number of main steps, while its own counts the repairs; with "shared" the
    main state moves with each repair. Either way the schedule advances once per main step."""
    spy = MainStateSpy()
    trainer = make_trainer(
        tiny_model_path,
        cpu_args,
        toy_dataset,
        callbacks=[spy],
        max_steps=2,
        optim="adamw_torch",
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        repair_batch_size=1,
        max_repairs_per_step=2,
        repair_optimizer=repair_optimizer,
    )
    prefill(trainer, toy_dataset, 4)
    before = snapshot(trainer.model)
    trainer.train()
    assert trainer.repair.buffer.counters["repairs"] == 4
    assert trainer.lr_scheduler.last_epoch == 2
    assert [log["learning_rate"] for log in trainer.state.log_history if "learning_rate" in log] == [1e-3, 5e-4]
    main_steps = {s["step"].item() for s in trainer.optimizer.state.values()}
    unchanged = [states_equal(a, b) for a, b in zip(spy.after_main, spy.at_step_end)]
    if repair_optimizer == "own":
        assert main_steps == {2.0}
        assert {s["step"].item() for s in trainer.repair.optimizer.own_state.state.values()} == {4.0}
        assert unchanged == [True, True]
    else:
        assert main_steps == {6.0}
        assert unchanged == [False, False]
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters() if n in before)


@pytest.mark.parametrize("repair_optimizer", ["own", "shared"])
def test_own_repair_optimizer_state_is_checkpointed_and_restored(
    tiny_model_path, cpu_args, toy_dataset, repair_optimizer, caplog
):
    """The own state (moments and step counts of the repair steps) goes into each checkpoint as repair_optimizer.pt
    and a new trainer resuming from it steps the repair from exactly that state; "shared" writes no such file (the
    main optimizer.pt holds it). Without the file after repairs ran, the state restarts empty with a warning."""
    settings = dict(
        max_steps=2, optim="adamw_torch", learning_rate=1e-3, repair_batch_size=1, max_repairs_per_step=2,
        repair_optimizer=repair_optimizer, save_strategy="steps", save_steps=1,
    )  # fmt: skip
    trainer = make_trainer(tiny_model_path, cpu_args, toy_dataset, **settings)
    prefill(trainer, toy_dataset, 4)
    trainer.train()
    checkpoint = f"{cpu_args['output_dir']}/checkpoint-2"
    saved = [f"{cpu_args['output_dir']}/checkpoint-{step}/repair_optimizer.pt" for step in (1, 2)]
    assert [os.path.exists(path) for path in saved] == [repair_optimizer == "own"] * 2
    if repair_optimizer == "shared":
        return
    resumed = make_trainer(tiny_model_path, cpu_args, toy_dataset, **settings)
    resumed.create_optimizer_and_scheduler(num_training_steps=2)
    resumed._load_optimizer_and_scheduler(checkpoint)
    params = dict(resumed.model.named_parameters())
    own = {name: trainer.repair.optimizer.own_state.state[p] for name, p in trainer.model.named_parameters()}
    restored = {name: resumed.repair.optimizer.own_state.state[params[name]] for name in own}
    assert states_equal(list(own.values()), list(restored.values()))
    assert {s["step"].item() for s in restored.values()} == {4.0}
    os.remove(saved[1])
    with caplog.at_level(logging.WARNING):
        resumed._load_optimizer_and_scheduler(checkpoint)
    assert "repair_optimizer.pt is missing although 4 repairs ran" in caplog.text
    assert not resumed.repair.optimizer.own_state.state


def test_deepspeed_engine_scheduler_is_detached_for_the_repair_step():
    """Under DeepSpeed the engine steps `engine.lr_scheduler` unless it is None: it is None for the repair step only."""

    class Engine:
        lr_scheduler = "schedule"

    engine = Engine()
    with scheduler_detached(engine):
        assert engine.lr_scheduler is None
    assert engine.lr_scheduler == "schedule"
    with pytest.raises(RuntimeError), scheduler_detached(engine):
        raise RuntimeError
    assert engine.lr_scheduler == "schedule"


def test_deepspeed_repair_backward_gives_the_engine_its_boundary_through_accelerates_public_wrapper():
    """Under DeepSpeed each repair micro-batch goes through accelerate's `DeepSpeedEngineWrapper.backward` (its
    contract pinned in tests/test_trl_guard.py) with the boundary the repair decides, the loss undivided by the
    accumulation steps, and no write to accelerate's private gradient state (this fake accelerator has none)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from trl_mintrl.sort.repair import ReferenceRepair

    calls = []
    wrapper = SimpleNamespace(backward=lambda loss, **kwargs: calls.append((loss, kwargs)))
    accelerator = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, deepspeed_engine_wrapped=wrapper)
    repair = SimpleNamespace(host=SimpleNamespace(accelerator=accelerator))
    for steps_engine in (False, True):
        ReferenceRepair._backward(
            repair, model=None, loss=f"loss {steps_engine}", last=True, steps_engine=steps_engine
        )
    assert calls == [
        ("loss False", {"sync_gradients": False, "scale_wrt_gas": False}),
        ("loss True", {"sync_gradients": True, "scale_wrt_gas": False}),
    ]


def test_repair_age_is_logged_in_optimizer_steps(tiny_model_path, cpu_args, toy_dataset):
    planner = FunctionPlanner(lambda question, reference: "")
    trainer = make_trainer(tiny_model_path, cpu_args, toy_dataset, planner=planner)
    trainer.state.global_step = 7
    items = [RepairItem(i.prompt, i.reference, deferred_at=d) for i, d in zip(items_of(toy_dataset, (0, 1)), (2, 6))]
    trainer.repair._repair_loss(trainer.model, items)
    metrics = trainer._metrics["train"]
    assert (metrics["sort/repair_age_mean"], metrics["sort/repair_age_max"]) == ([3.0], [5])
    assert math.isfinite(metrics["sort/repair_loss"][-1])
