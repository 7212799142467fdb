"""Bad input, before the expensive part: one test per row of the table in docs/reliability.md.

Data problems fail in `trl-mintrl train` before the model loads (the model folder here has no weights, so reaching
the model would fail differently) and in the trainers' `__init__` before training starts. Reward functions and
judges that fail during training are counted and skipped, or stop the run at its first batch with a clear message.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import digit_count_reward
from datasets import Dataset
from mintrl_helpers import mintrl_args, revise_first_step_judge

from trl_mintrl.cli.train import main
from trl_mintrl.input_checks import InputError, RewardFunctionError
from trl_mintrl.judges import FunctionJudge
from trl_mintrl.mintrl import MInTRLTrainer
from trl_mintrl.sort import SORTConfig, SORTTrainer

REPO = Path(__file__).resolve().parent.parent
ROWS = [json.loads(line) for line in (REPO / "recipes/cpu/data/arithmetic.jsonl").read_text().splitlines()[:8]]
LONG = "Compute " + "1+" * 3000 + "1 ="  # ~6000 tokens: more than the tiny model's 4096 positions


def with_row(index: int, **changes) -> list[dict]:
    return [{**row, **changes} if i == index else row for i, row in enumerate(ROWS)]


def with_all(**changes) -> list[dict]:
    return [{**row, **changes} for row in ROWS]


# (method, rows, flags, message): each a row of the docs table, via the CLI
CLI_CASES = {
    "missing reference column": ("sort", ROWS, ["--reference_column", "reference"], "no column 'reference'"),
    "missing reference column (judge=self)": ("mintrl", ROWS, ["--reference_column", "reference"], "no column 'reference'"),
    "empty reference column": ("sort", with_all(solution=" "), [], "'solution' \\(reference_column\\) is empty in all 8"),
    "non-string reference": ("mintrl", with_all(solution=14), [], "must hold strings, but rows 0, 1, 2, 3, 4, ... hold int"),
    "empty prompt": ("grpo", with_row(2, prompt=[{"role": "user", "content": " "}]), [], "1 empty prompt\\(s\\) \\(row 2\\)"),
    "empty plain-text prompt": ("sort", with_all(prompt=""), [], "8 empty prompt\\(s\\) \\(rows 0, 1, 2, 3, 4, \\.\\.\\.\\)"),
    "prompt too long": (
        "mintrl", with_row(5, prompt=[{"role": "user", "content": LONG}]), [],
        "1 prompt\\(s\\) \\(row 5\\) are longer than the 4048 tokens that fit \\(context of 4096 tokens minus "
        "max_completion_length=48\\); the longest has \\d+",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_refuses_bad_data_before_loading_the_model(case, model_without_weights, tmp_path, monkeypatch):
    method, rows, flags, message = CLI_CASES[case]
    recipe = tmp_path / "recipe.yaml"
    lines = (REPO / f"recipes/cpu/{method}.yaml").read_text().splitlines(keepends=True)
    if "judge=self" in case:  # the recipe's rule judge replaced by judge='self' (the policy, shown the reference)
        lines = [line for line in lines if not line.startswith("judge_function:")]
    recipe.write_text("".join(lines))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main([method, "--config", str(recipe), "--model_name_or_path", model_without_weights,
              "--dataset_name", str(data), "--output_dir", str(out), *flags])  # fmt: skip
    assert str(exit_info.value.code).startswith("trl-mintrl train: error: ")  # not a failed load of the model
    assert re.search(message, str(exit_info.value.code)), exit_info.value.code
    assert not out.exists()


def arithmetic(**changes) -> Dataset:
    return Dataset.from_list(with_all(**changes))


@pytest.mark.parametrize(
    "trainer, dataset, message",
    [
        ("sort", arithmetic(solution=7), "must hold strings"),
        ("mintrl", arithmetic(solution=""), "is empty in all 8 rows"),
        ("mintrl", Dataset.from_list(with_row(3, prompt=[{"role": "user", "content": ""}])), "empty prompt.*row 3"),
        ("sort", Dataset.from_list(with_row(1, prompt=[{"role": "user", "content": LONG}])), "row 1\\) are longer"),
    ],
)
def test_trainers_refuse_bad_data_before_training(trainer, dataset, message, tiny_model_path, cpu_args):
    with pytest.raises(InputError, match=message):
        if trainer == "sort":
            SORTTrainer(tiny_model_path, digit_count_reward, SORTConfig(**cpu_args), train_dataset=dataset)
        else:
            judge = revise_first_step_judge()
            MInTRLTrainer(
                tiny_model_path, digit_count_reward, mintrl_args(cpu_args), train_dataset=dataset, judge=judge
            )


def test_trainers_refuse_code_sandbox_isolation_they_cannot_give_before_training(
    tiny_model_path, cpu_args, monkeypatch
):
    """`code_reward` builds its sandbox at its first call; the trainer builds it at construction instead."""
    from trl_mintrl.rewards import code, code_reward, sandbox

    monkeypatch.setattr(sandbox, "_namespace_prefix", lambda: None)  # no user namespaces here
    monkeypatch.setattr(code, "_default_sandbox", None)
    monkeypatch.setenv(sandbox.ISOLATION_ENV, "namespaces")
    with pytest.raises(InputError, match=r"sandbox cannot start here with \$TRL_MINTRL_SANDBOX_ISOLATION=namespaces"):
        SORTTrainer(tiny_model_path, code_reward, SORTConfig(**cpu_args), train_dataset=arithmetic())


def test_some_empty_references_only_warn(tiny_model_path, cpu_args, caplog):
    dataset = Dataset.from_list(with_row(4, solution=None))
    SORTTrainer(tiny_model_path, digit_count_reward, SORTConfig(**cpu_args), train_dataset=dataset)
    assert "'solution' (reference_column) is empty in 1 of 8 rows (row 4)" in caplog.text


# ----- reward functions and judges during training -----


def odd_length_raises(completions, **kwargs):
    """Raises on a batch holding a completion of odd length; scores the others."""
    texts = [c[0]["content"] for c in completions]
    if any(len(t) % 2 for t in texts):
        raise ZeroDivisionError("odd length")
    return [1.0] * len(texts)


def make_trainer(method: str, tiny_model_path, cpu_args, reward, **overrides):
    judge = overrides.pop("judge", None) or revise_first_step_judge()
    args = {**cpu_args, "per_device_train_batch_size": 8, "max_steps": 1, **overrides}
    dataset = Dataset.from_list(ROWS)
    if method == "sort":
        return SORTTrainer(tiny_model_path, reward, SORTConfig(**args), train_dataset=dataset)
    return MInTRLTrainer(tiny_model_path, reward, mintrl_args(args), train_dataset=dataset, judge=judge)


@pytest.mark.parametrize("method", ["mintrl", "sort"])
def test_reward_raising_on_some_completions_is_counted_and_skipped(method, tiny_model_path, cpu_args):
    trainer = make_trainer(method, tiny_model_path, cpu_args, [odd_length_raises, digit_count_reward])
    scored, score_batch = [], trainer._score_batch
    trainer._score_batch = lambda output, batch: (scored.append(batch), score_batch(output, batch))
    trainer.train()
    assert trainer.state.global_step == 1
    failures = trainer.state.log_history[0]["rewards/odd_length_raises/failures"]
    rewards = scored[-1].rewards_per_func
    assert 0 < failures < 8 and failures == rewards[:, 0].isnan().sum().item()  # exactly the rows it raised on
    assert rewards[:, 1].isnan().sum() == 0 and (rewards[~rewards[:, 0].isnan(), 0] == 1.0).all()
    assert trainer.state.log_history[0]["rewards/digit_count_reward/failures"] == 0


@pytest.mark.parametrize(
    "reward, message",
    [
        (lambda completions, **kw: 1 / 0, "'<lambda>' raised on every one of the 8 completions of its first batch"),
        (lambda completions, **kw: [0.0] * 3, "'<lambda>' returned 3 values for 8 completions"),
        (lambda completions, **kw: ["1"] * len(completions), "returned '1' \\(str\\)"),
        (lambda completions, **kw: 0.5, "returned float for 8 completions"),
    ],
)
def test_broken_reward_function_stops_at_its_first_batch(reward, message, tiny_model_path, cpu_args):
    trainer = make_trainer("mintrl", tiny_model_path, cpu_args, reward)
    with pytest.raises(RewardFunctionError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0  # no optimizer step on a batch it could not score


def test_judge_function_that_raises_is_counted(tiny_model_path, cpu_args):
    def review(question, prefix, steps, reference):
        raise KeyError("judge bug")

    judge = FunctionJudge(review, lambda question, prefix, reference: "x")
    trainer = make_trainer("mintrl", tiny_model_path, cpu_args, digit_count_reward, judge=judge)
    trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.state.log_history[0]["mintrl/judge_failures"] > 0


def test_rewards_as_arrays_tensors_and_bools_pass_the_guard():
    from collections import defaultdict
    from types import SimpleNamespace

    import numpy as np
    import torch

    from trl_mintrl.input_checks import RewardFunctionGuard

    trainer = SimpleNamespace(model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)})
    for value in (np.array([0.5, 1.0]), torch.tensor([0.5, 1.0]), [np.float32(0.5), True], [0.5, None]):
        guard = RewardFunctionGuard(lambda prompts, completions, completion_ids, v=value, **kw: v, "r", trainer)
        rewards = guard(prompts=["a", "b"], completions=["x", "y"], completion_ids=[[1], [2]])
        assert rewards[0] == 0.5 and rewards[1] in (1.0, None)
    assert trainer._metrics["train"]["rewards/r/failures"] == [0.0] * 4
