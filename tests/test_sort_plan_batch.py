"""SORT's plans have a batch of their own, `plan_batch_size`: plan writing is generation without gradients, so it is
not split into `per_device_train_batch_size` micro-batches as the scoring passes are. By default (None) every plan of
a process's share of a repair is written in one generate call; a number bounds the rows per call. The plans, the
token weights and the gradients do not depend on it (a scripted engine and greedy decoding), and every process makes
the same calls whatever its share."""

from types import SimpleNamespace

import pytest
import torch
from test_combined_trainer import combined_args
from test_sort_repair_microbatch import ScoringForwards, items_of, make_trainer, zero_reward

from trl_mintrl.engines import Generation, GenerationEngine
from trl_mintrl.sort import SORTConfig
from trl_mintrl.sort.repair import ReferenceRepair


class ScriptedEngine(GenerationEngine):
    """Writes each prompt's plan from that prompt alone (its question, then EOS), whatever else is in the call;
    records the rows of every call."""

    def __init__(self, tokenizer, eos_token_id: int):
        super().__init__([eos_token_id])
        self.tokenizer, self.calls = tokenizer, []

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        self.calls.append(len(prompt_ids))
        questions = [self.tokenizer.decode(ids).split("Problem:\n")[1].split("\n")[0] for ids in prompt_ids]
        return [Generation([*self.tokenizer(q)["input_ids"], self.eos_token_ids[0]]) for q in questions]


def record_calls(engine) -> list[int]:
    """The rows of each `generate` call the engine gets from now on."""
    calls, generate = [], engine.generate

    def spy(prompt_ids, *args, **kwargs):
        calls.append(len(prompt_ids))
        return generate(prompt_ids, *args, **kwargs)

    engine.generate = spy
    return calls


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
@pytest.mark.parametrize("config", ["sort", "mintrl-sort"])
def test_plan_batch_size_must_be_a_positive_integer_or_none(cpu_args, config, value):
    build = (lambda **kw: SORTConfig(**{**cpu_args, **kw})) if config == "sort" else (
        lambda **kw: combined_args(cpu_args, **kw)
    )  # fmt: skip
    with pytest.raises(ValueError, match="`plan_batch_size` must be a positive integer, or None"):
        build(plan_batch_size=value)
    assert build().plan_batch_size is None
    assert build(plan_batch_size=3).plan_batch_size == 3


@pytest.mark.parametrize(("plan_batch_size", "plan_calls"), [(None, [4]), (2, [2, 2]), (3, [3, 1])])
def test_plans_take_their_own_batch_and_scoring_the_micro_batch(
    tiny_model_path, cpu_args, toy_dataset, plan_batch_size, plan_calls
):
    """Four buffered items at `per_device_train_batch_size=2`, one training step: the policy's engine gets one call
    of the four plan prompts by default, calls of `plan_batch_size` otherwise; the teacher and base passes take
    micro-batches of 2 either way (only the base pass with gradients)."""
    trainer = make_trainer(
        tiny_model_path, cpu_args, toy_dataset, reward=zero_reward, max_steps=1, repair_batch_size=4,
        plan_batch_size=plan_batch_size,
    )  # fmt: skip
    for item in items_of(toy_dataset, range(4)):
        trainer.repair.buffer.add(item.prompt, item.reference)
    forwards = ScoringForwards(trainer.model)
    calls = record_calls(trainer.policy_engine)
    trainer.train()
    assert trainer.repair.buffer.counters["repairs"] == 1
    assert calls == plan_calls
    assert forwards.calls == [(2, False), (2, False), (2, True), (2, True)]


@pytest.mark.parametrize("engine", ["scripted", "greedy"])
def test_plan_batch_size_changes_no_plan_weight_or_gradient(tiny_model_path, cpu_args, toy_dataset, engine):
    """The same repair of four items on the same weights, its plans written in one call and then in two calls of 2:
    the same plans, the same logged weights and salience, the same loss and gradients. Scripted: each plan depends on
    its own prompt only. Greedy: the tiny policy's own plans (`plan_temperature=0`, left-padded batches)."""
    trainer = make_trainer(tiny_model_path, cpu_args, toy_dataset, repair_batch_size=4, max_plan_tokens=6)
    if engine == "scripted":
        trainer._policy_engine = ScriptedEngine(trainer.processing_class, trainer.eos_token_ids[0])
    calls = record_calls(trainer.policy_engine)
    repair, model = trainer.repair, trainer.model
    plans, write_plans = [], repair._write_plans
    repair._write_plans = lambda *args: plans.append(write_plans(*args)) or plans[-1]
    items = items_of(toy_dataset, (0, 2, 4, 6))
    runs = []
    for size in (None, 2):
        trainer.args.plan_batch_size = size
        model.zero_grad()
        trainer._metrics["train"].clear()
        loss = repair._repair_loss(model, items)
        metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        runs.append((loss, metrics, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert calls == [4, 2, 2]
    assert plans[0] == plans[1]
    if engine == "scripted":
        assert all(plans[0][0]) and len(set(plans[0][0])) == 4  # four different, non-empty plans
    (loss, metrics, grads), (loss_2, metrics_2, grads_2) = runs
    assert torch.equal(loss, loss_2) and metrics == metrics_2 and "sort/mean_weight" in metrics
    assert grads.keys() == grads_2.keys() and grads
    assert all(torch.equal(grads[name], grads_2[name]) for name in grads)


@pytest.mark.parametrize(("plan_batch_size", "plan_calls"), [(None, [3]), (1, [1, 1, 1]), (2, [2, 1]), (4, [3])])
def test_every_process_makes_the_same_plan_calls(tiny_model_path, cpu_args, toy_dataset, plan_batch_size, plan_calls):
    """Five items on two processes: the round-robin shares are 3 and 2 items, the second padded with a zero-weight
    copy (`_process_share`), so both processes make the same generate calls (ZeRO-3 gathers parameters collectively;
    a synchronized engine needs the same calls on every rank)."""
    trainer = make_trainer(
        tiny_model_path, cpu_args, toy_dataset, repair_batch_size=5, plan_batch_size=plan_batch_size
    )
    repair = trainer.repair
    items = items_of(toy_dataset, range(5))
    references = [repair.renderer.reference(item.reference) for item in items]
    calls, reals = [], []
    for rank in (0, 1):
        process = SimpleNamespace(
            host=SimpleNamespace(accelerator=SimpleNamespace(num_processes=2, process_index=rank))
        )
        share, share_references, real = ReferenceRepair._process_share(process, items, references)
        trainer._policy_engine = engine = ScriptedEngine(trainer.processing_class, trainer.eos_token_ids[0])
        plans, _ = repair._write_plans(share, share_references)
        calls.append(engine.calls)
        reals.append(real)
        assert len(plans) == len(share)
    assert calls == [plan_calls, plan_calls]
    assert reals == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
