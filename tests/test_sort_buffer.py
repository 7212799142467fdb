"""SORT's deferred buffer: all-wrong detection (several reward functions, weights, None, the functions that decide
correctness and the threshold, a format bonus, {-1, 1} rewards), de-duplication, the flush at exactly
`repair_batch_size`, and the state round trip."""

import json

import pytest
import torch
from datasets import Dataset

from trl_mintrl.cpu import cpu_training_fields
from trl_mintrl.sort import RepairBuffer, SORTConfig, SORTTrainer, classify_groups
from trl_mintrl.sort.hosting import WithReferenceRepair, reward_func_names

G = 2  # rollouts per prompt in these tests

# Five cases, one prompt each. Per case: (accuracy, format) rewards of the two rollouts; None = unscorable.
# Weighted reward = 1.0 * accuracy + 0.5 * format + 0.0 * constant (None rewards are skipped, as TRL's nansum does).
CASES = [
    ([0.0, 0.0], [0.0, 0.0]),  # 0: every rollout 0 -> all-wrong
    ([0.0, 0.0], [1.0, 0.0]),  # 1: one rollout earns 0.5 -> not all-wrong
    ([None, None], [0.0, 0.0]),  # 2: accuracy unscorable, format 0 -> weighted 0 -> all-wrong
    ([None, None], [None, None]),  # 3: no function scores it (NaN) -> neither
    ([1.0, 1.0], [0.0, 0.0]),  # 4: all-right
]


def accuracy(completions, case, **kwargs):
    return [CASES[c][0][i % G] for i, c in enumerate(case)]


def format_reward(completions, case, **kwargs):
    return [CASES[c][1][i % G] for i, c in enumerate(case)]


def constant(completions, case, **kwargs):
    """Non-zero, but weighted 0: must not stop a group from being all-wrong (None in case 3: nothing scores it)."""
    return [None if c == 3 else 5.0 for c in case]


def _row(case, **fields):
    return {
        "prompt": [{"role": "user", "content": f"Compute {case}+1 ="}],
        "solution": f"{case}+1={case + 1}",
        "case": case,
        **fields,
    }


def signed_accuracy(completions, case, **kwargs):
    """The accuracy of CASES as {-1, 1} rewards (None stays None)."""
    return [None if a is None else 2 * a - 1 for a in accuracy(completions, case)]


def make_trainer(model_path, output_dir, reward_funcs, **overrides):
    args = SORTConfig(
        **cpu_training_fields(output_dir=output_dir),
        per_device_train_batch_size=2 * G,
        num_generations=G,
        max_completion_length=4,
        repair_batch_size=3,
        max_plan_tokens=4,
        seed=0,
        **overrides,
    )
    trainer = SORTTrainer(
        model_path,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=Dataset.from_list([_row(c) for c in range(len(CASES))]),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by `train()`; these tests call its pieces directly
    return trainer


@pytest.fixture(scope="module")
def trainer(tiny_model_path, tmp_path_factory):
    # "joint": `test_repair_flushes_at_exactly_repair_batch_size` reads the repair in the micro-batch loss
    return make_trainer(
        tiny_model_path,
        str(tmp_path_factory.mktemp("sort_buffer")),
        [accuracy, format_reward, constant],
        reward_weights=[1.0, 0.5, 0.0],
        repair_update="joint",
    )


def deferred_cases(trainer) -> list[int]:
    trainer.repair.buffer = RepairBuffer()
    trainer._generate_and_score_completions([_row(c) for c in range(len(CASES)) for _ in range(G)])
    return [int(item.reference.split("+")[0]) for item in trainer.repair.buffer.items]


def test_classify_groups_rules():
    nan = float("nan")
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, nan, 0.0, nan, nan, 0.5, 2.0])
    all_wrong, all_right = classify_groups(rewards, 2)
    assert all_wrong.tolist() == [True, False, False, False, False]
    assert all_right.tolist() == [False, False, False, False, True]
    with pytest.raises(ValueError, match="num_generations=3"):
        classify_groups(rewards, 3)
    # correct = score above the threshold: at 0.5, the group (0.5, 2.0) is neither; (0, 1) stays neither
    all_wrong, all_right = classify_groups(rewards, 2, threshold=0.5)
    assert all_wrong.tolist() == [True, False, False, False, False]
    assert all_right.tolist() == [False, False, False, False, False]
    # {-1, 1} rewards: -1 is wrong at the default threshold 0
    all_wrong, all_right = classify_groups(torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]), 2)
    assert (all_wrong.tolist(), all_right.tolist()) == ([True, False, False], [False, False, True])


def test_all_wrong_detection_with_several_reward_functions(trainer):
    trainer.repair.buffer = RepairBuffer()
    trainer._metrics["train"].clear()
    rows = [_row(c) for c in range(len(CASES)) for _ in range(G)]
    trainer._generate_and_score_completions(rows)
    assert [item.prompt for item in trainer.repair.buffer.items] == [rows[0]["prompt"], rows[2 * G]["prompt"]]
    assert [item.reference for item in trainer.repair.buffer.items] == ["0+1=1", "2+1=3"]
    assert trainer._metrics["train"]["sort/all_wrong_frac"] == [pytest.approx(2 / 5)]
    assert trainer._metrics["train"]["sort/all_right_frac"] == [pytest.approx(1 / 5)]

    # The same prompts failing again are not held twice.
    trainer._generate_and_score_completions(rows)
    assert len(trainer.repair.buffer) == 2


def test_names_match_trl_and_default_is_every_function(trainer):
    assert reward_func_names([accuracy, format_reward, constant]) == trainer.reward_func_names
    assert trainer.repair.correctness_funcs == [0, 1, 2]


def test_correctness_functions_leave_a_format_bonus_out(tiny_model_path, tmp_path):
    """With the format bonus deciding too, case 1 (a wrong answer in good format) is never deferred; with accuracy
    alone it is, and case 2 (accuracy unscorable) is not: nothing that decides correctness scored it."""
    funcs = [accuracy, format_reward]
    assert deferred_cases(make_trainer(tiny_model_path, str(tmp_path / "all"), funcs)) == [0, 2]
    for selection in (["accuracy"], [0], ["0"]):
        only = make_trainer(tiny_model_path, str(tmp_path / "acc"), funcs, correctness_reward_funcs=selection)
        assert only.repair.correctness_funcs == [0]
        assert deferred_cases(only) == [0, 1]


def test_signed_rewards_are_wrong_below_the_threshold(tiny_model_path, tmp_path):
    """Rewards in {-1, 1}: -1 is wrong at the default threshold 0 (before: only an exact 0 was)."""
    assert deferred_cases(make_trainer(tiny_model_path, str(tmp_path / "a"), [signed_accuracy])) == [0, 1]
    lenient = make_trainer(tiny_model_path, str(tmp_path / "b"), [signed_accuracy], correct_threshold=-2.0)
    assert deferred_cases(lenient) == []


def test_empty_or_missing_references_are_skipped_and_counted(trainer):
    trainer.repair.buffer = RepairBuffer()
    rows = [r for r in (_row(0, solution=""), _row(2, solution=None)) for _ in range(G)]
    trainer._generate_and_score_completions(rows)
    assert len(trainer.repair.buffer) == 0
    assert trainer.repair.buffer.counters["empty_references"] == 2


def test_missing_reference_key_in_a_row_names_the_column(trainer):
    rows = [{"prompt": [{"role": "user", "content": "Compute 0+1 ="}], "case": 0}] * G
    with pytest.raises(ValueError, match="'solution'.*reference_column"):
        trainer._generate_and_score_completions(rows)


def test_deduplication_and_fifo_pop():
    buffer = RepairBuffer()
    question = [{"role": "user", "content": "q1"}]
    assert buffer.add(question, "r1")
    assert not buffer.add([{"content": "q1", "role": "user"}], "other reference")  # same prompt, other key order
    assert buffer.add("q2", "r2")
    assert buffer.add("q3", "r3")
    assert [i.reference for i in buffer.pop(2)] == ["r1", "r2"]
    assert len(buffer) == 1
    assert buffer.add(question, "r1")  # once repaired, a prompt may be deferred again
    assert [i.prompt for i in buffer.items] == ["q3", question]


def test_repair_flushes_at_exactly_repair_batch_size(trainer):
    trainer.repair.buffer = RepairBuffer()
    rows = [_row(c) for c in range(len(CASES)) for _ in range(G)]
    inputs = trainer._generate_and_score_completions(rows)  # defers 2 prompts; repair_batch_size is 3

    def extra_loss():
        """What SORT adds to the GRPO loss of this micro-batch."""
        grpo = super(WithReferenceRepair, trainer)._compute_loss(trainer.model, inputs).item()
        return trainer._compute_loss(trainer.model, inputs).item() - grpo

    assert extra_loss() == pytest.approx(0.0, abs=1e-9)
    assert (len(trainer.repair.buffer), trainer.repair.buffer.counters["repairs"]) == (2, 0)

    trainer.repair.buffer.add(_row(5)["prompt"], "5+1=6")
    trainer.repair.buffer.add(_row(6)["prompt"], "6+1=7")
    trainer._step, trainer.current_gradient_accumulation_steps = 1, 2  # second micro-batch: never repairs
    assert extra_loss() == pytest.approx(0.0, abs=1e-9)
    assert len(trainer.repair.buffer) == 4

    trainer._step, trainer.current_gradient_accumulation_steps = 0, 1
    assert extra_loss() > 0.0  # -sum(w * log p) / n with 0 < w < 1 and log p < 0
    assert trainer.repair.buffer.counters["repairs"] == 1
    assert [i.reference for i in trainer.repair.buffer.items] == ["6+1=7"]  # the oldest three were used


def test_state_round_trip_through_json():
    buffer = RepairBuffer()
    buffer.add([{"role": "system", "content": "be brief"}, {"role": "user", "content": "Compute 2+2 ="}], "2+2=4 é")
    buffer.add("plain prompt {with braces}", "\\boxed{1}")
    buffer.counters.update(repairs=3, empty_references=1, truncated_references=2)
    saved = json.loads(json.dumps(buffer.state_dict(), ensure_ascii=False))  # as the checkpoint holds it
    assert saved["counters"]["repairs"] == 3

    restored = RepairBuffer()
    restored.load_state_dict(saved)
    assert restored.items == buffer.items
    assert restored.counters == buffer.counters
    assert not restored.add("plain prompt {with braces}", "again")  # de-duplication survives the round trip
