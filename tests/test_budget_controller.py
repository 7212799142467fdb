"""The intervention budget controller (`judge_token_target`): its pure steps, and the trainer holding the judge-token
share near the target, logging it, and restoring the controller exactly on resume."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_on_two_processes
from mintrl_helpers import RecordingTrainer, mintrl_args, revise_first_step_judge, role_reward

from trl_mintrl import MInTRLConfig, MInTRLTrainer
from trl_mintrl.mintrl.budget import (
    MAX_STEP,
    MIN_SHARE,
    next_intervention_share,
    reviewed_slot_count,
    reviewed_slots,
)
from trl_mintrl.mintrl.trainer import STATE_FILE


def test_share_moves_towards_the_target_by_a_clamped_step():
    assert next_intervention_share(0.5, measured=0.12, target=0.03) == pytest.approx(0.25)  # (1/4) ** 0.5 = 1/2
    assert next_intervention_share(0.25, measured=0.0075, target=0.03) == pytest.approx(0.5)
    assert next_intervention_share(0.5, measured=1.0, target=0.001) == 0.5 / MAX_STEP  # factor clamped
    assert next_intervention_share(0.1, measured=0.0, target=0.03) == 0.1 * MAX_STEP  # no judge tokens: raise
    assert next_intervention_share(0.9, measured=0.001, target=0.03) == 1.0  # never above every slot
    assert next_intervention_share(MIN_SHARE, measured=0.5, target=0.03) == MIN_SHARE  # never stuck at 0


def test_share_converges_on_a_proportional_plant_without_overshoot():
    tokens_per_share = 0.25  # judge-token share when every intervened slot is reviewed
    share, errors = 1.0, []
    for _ in range(12):
        measured = share * tokens_per_share
        errors.append(abs(math.log(measured / 0.03)))
        share = next_intervention_share(share, measured, 0.03)
        assert share * tokens_per_share >= 0.03 - 1e-12  # approaches from above: no overshoot
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False))
    assert share * tokens_per_share == pytest.approx(0.03, rel=1e-3)


def test_first_measured_step_is_a_full_proportional_step():
    # every slot reviewed gave a 40% share: one step to the share that gives 3% on a proportional plant, not x1/2
    assert next_intervention_share(1.0, measured=0.4, target=0.03, first=True) == pytest.approx(0.075)
    assert next_intervention_share(1.0, measured=0.01, target=0.03, first=True) == 1.0  # never above every slot
    assert next_intervention_share(1.0, measured=1.0, target=1e-5, first=True) == MIN_SHARE
    assert next_intervention_share(0.5, measured=0.0, target=0.03, first=True) == 0.5 * MAX_STEP  # nothing measured


def test_slot_count_carries_the_fraction_and_slots_are_spread_evenly():
    counts, carry = [], 0.0
    for _ in range(8):
        count, carry = reviewed_slot_count(0.125, 2, carry)  # a quarter of a slot per batch
        counts.append(count)
    assert counts == [0, 0, 0, 1, 0, 0, 0, 1]
    assert reviewed_slot_count(1.0, 7, 0.0) == (7, 0.0)
    assert reviewed_slots(2, 8) == [False, False, False, True, False, False, False, True]
    assert reviewed_slots(0, 3) == [False] * 3 and reviewed_slots(3, 3) == [True] * 3


@pytest.mark.parametrize("value", [0.0, 1.0, -0.1])
def test_target_outside_zero_one_is_refused(cpu_args, value):
    with pytest.raises(ValueError, match="judge_token_target must be in \\(0, 1\\)"):
        mintrl_args(cpu_args, judge_token_target=value)


def budget_args(cpu_args, **overrides) -> MInTRLConfig:
    """2 prompts x (1 control + 7 intervened) per step: 14 intervened slots, each revised once at its first chunk
    with a known correction (CORRECTION capped at 8 tokens) in a 24-token completion."""
    args = dict(
        per_device_train_batch_size=16,
        num_control_generations=1,
        num_intervened_generations=7,
        judge_token_target=0.05,
        max_steps=4,
        lr_scheduler_type="constant",
    )
    args.update(overrides)
    return mintrl_args(cpu_args, **args)


def test_trainer_moves_the_judge_token_share_towards_the_target(tiny_model_path, cpu_args, toy_dataset):
    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=budget_args(cpu_args),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(),
    )
    trainer.train()
    logs = [e for e in trainer.state.log_history if "mintrl/intervention_share" in e]
    assert len(logs) == 4 and all(e["mintrl/judge_token_target"] == 0.05 for e in logs)
    settings = [e["mintrl/intervention_share"] for e in logs]
    measured = [e["mintrl/judge_token_frac"] for e in logs]
    assert settings[0] == 1.0 and measured[0] > 0.15  # every slot reviewed at first: far above the target
    # the first measured step is a full proportional step: straight to the share that would give the target
    assert settings[1] == pytest.approx(0.05 / measured[0], rel=1e-4)
    gaps = [abs(math.log(m / 0.05)) for m in measured]
    assert max(gaps[1:]) < gaps[0] / 2  # the measured share moved towards the target at once and stayed near it
    reviewed_rows = [int((r["tool_mask"] == 0).any(dim=1).sum()) for r in trainer.records]
    assert reviewed_rows[0] == 14 and reviewed_rows[-1] < reviewed_rows[0]
    for record in trainer.records:  # unreviewed intervened slots are controls: no judge tokens, in the baseline
        rewards = record["rewards"].view(2, 8)
        judged = (record["tool_mask"] == 0).any(dim=1).view(2, 8)
        assert not judged[:, 0].any()  # column 0 is always a control
        assert (rewards[judged] == 1.0).all()  # role_reward: only reviewed rows are marked intervened


def test_controller_state_is_saved_and_restored_exactly(tiny_model_path, cpu_args, toy_dataset, tmp_path):
    def make(max_steps):
        args = budget_args(
            cpu_args, max_steps=max_steps, save_strategy="steps", save_steps=1, per_device_train_batch_size=8
        )
        return MInTRLTrainer(
            model=tiny_model_path,
            reward_funcs=role_reward,
            args=args,
            train_dataset=toy_dataset,
            judge=revise_first_step_judge(),
        )

    straight = make(3)
    straight.train()
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / STATE_FILE).read_text())["intervention_budget"]
    assert saved["share"] < 1.0 and 0.0 <= saved["carry"] < 1.0
    resumed = make(3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    step3 = [e for e in straight.state.log_history if e.get("step") == 3 and "mintrl/intervention_share" in e]
    resumed3 = [e for e in resumed.state.log_history if e.get("step") == 3 and "mintrl/intervention_share" in e]
    assert resumed3[0]["mintrl/intervention_share"] == step3[0]["mintrl/intervention_share"] == saved["share"]
    assert resumed.schedule.intervention_budget == straight.schedule.intervention_budget


@pytest.mark.slow
def test_two_processes_take_the_same_decision(tiny_model_path, tmp_path):
    """Groups span the processes: every process holds the same controller state and the reviewed rows across them
    are exactly the slots the pure functions pick for the shared share."""
    ranks = run_on_two_processes("budget_ddp_script.py", tiny_model_path, str(tmp_path), out=tmp_path)
    assert all(r["world"] == 2 and len(r["records"]) == 3 for r in ranks)
    carry, counts = 0.0, []
    for step in range(3):
        zero, one = ranks[0]["records"][step], ranks[1]["records"][step]
        assert zero["budget"] == one["budget"] and zero["share_used"] == one["share_used"]
        assert (zero["first_row"], one["first_row"]) == (0, 6)
        count, carry = reviewed_slot_count(zero["share_used"], 9, carry)  # 3 groups x 3 intervened slots
        slots = reviewed_slots(count, 9)
        expected = [g % 4 >= 1 and slots[g // 4 * 3 + g % 4 - 1] for g in range(12)]
        assert zero["reviewed"] + one["reviewed"] == expected
        assert zero["judge_rows"] + one["judge_rows"] == expected  # every reviewed row was revised
        assert zero["budget"]["carry"] == pytest.approx(carry)
        counts.append(count)
    assert counts[0] == 9 and counts[-1] < counts[0]
