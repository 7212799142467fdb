"""SORT's logged repair metrics are computed from what `losses.sort_repair_terms` returns for the scored tokens:
checked against a float64 computation on the very log-probs the trainer scored (their scoring is tested in
test_sort_trainer.py)."""

import dataclasses
import math

import pytest
from conftest import digit_count_reward

from trl_mintrl import losses
from trl_mintrl.sort import RepairItem, SORTConfig, SORTTrainer


def test_repair_metrics_follow_the_loss_terms(tiny_model_path, cpu_args, toy_dataset, monkeypatch):
    args = SORTConfig(**{**cpu_args, "per_device_train_batch_size": 8, "max_plan_tokens": 8, "repair_beta": 0.3})
    trainer = SORTTrainer(tiny_model_path, reward_funcs=digit_count_reward, args=args, train_dataset=toy_dataset)
    scored = []
    variant = losses.REPAIR_WEIGHTINGS["salience"]
    real_terms = variant.terms

    def spy(base_logps, plan_logps, mask, beta):
        scored.append((base_logps.detach().double(), plan_logps.detach().double(), mask.double(), beta))
        return real_terms(base_logps, plan_logps, mask, beta)

    monkeypatch.setitem(losses.REPAIR_WEIGHTINGS, "salience", dataclasses.replace(variant, terms=spy))
    items = [  # references of different lengths: the shorter one is padded
        RepairItem(toy_dataset[2]["prompt"], toy_dataset[2]["solution"]),
        RepairItem(toy_dataset[5]["prompt"], "5+1=6"),
    ]
    loss = trainer.repair._repair_loss(trainer.model, items)

    [(base, plan, mask, beta)] = scored
    assert beta == 0.3 and mask.sum() < mask.numel()
    weights = base.exp() ** (1 - beta) * plan.exp() ** beta
    salience = plan - base
    tokens = mask.sum()
    expected_loss = -(weights * base * mask).sum() / tokens
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
    assert metrics["sort/repair_loss"] == pytest.approx(expected_loss.item(), rel=1e-5)
    assert metrics["sort/mean_weight"] == pytest.approx(((weights * mask).sum() / tokens).item(), rel=1e-5)
    assert metrics["sort/salience_mean"] == pytest.approx(((salience * mask).sum() / tokens).item(), rel=1e-5)
    salience_max = salience.masked_fill(mask == 0, -math.inf).max()
    assert metrics["sort/salience_max"] == pytest.approx(salience_max.item(), rel=1e-5)
