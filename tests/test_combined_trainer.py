"""MInTRLSORTTrainer on the tiny model: prompts that fail every rollout, interventions included, are deferred and
repaired (separate and joint updates), prompts an intervention rescued are not; both methods' metrics are logged;
checkpoints restore MInTRL's state and the repair buffer; the config is the union of both parents with both checks."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
from pathlib import Path

import pytest
from conftest import params_changed, run_on_two_processes, snapshot
from mintrl_helpers import CORRECTION, revise_first_step_judge
from transformers import TrainerCallback
from trl import GRPOConfig

from trl_mintrl import MInTRLConfig, MInTRLSORTConfig, MInTRLSORTTrainer, SORTConfig
from trl_mintrl.combined.trainer import STATE_FILE
from trl_mintrl.mintrl.trainer import MInTRLTrainer

HARD = {f"Compute {a}+{(a * 3) % 7} =" for a in range(4)}  # toy prompts that fail even with the judge's help
REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "trl_mintrl"
CPU_RECIPE = "recipes/cpu/mintrl-sort.yaml"


def question(prompt) -> str:
    return prompt[-1]["content"]


class RescueReward:
    """1 for a rollout that carries the judge's correction, 0 otherwise, and always 0 on the HARD prompts: the
    tiny model's controls never write the correction, so an easy prompt scores only through an intervention.
    Records every reward per question."""

    __name__ = "rescue_reward"

    def __init__(self):
        self.seen: dict[str, list[float]] = {}

    def __call__(self, prompts, completions, **kwargs):
        rewards = []
        for prompt, completion in zip(prompts, completions, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            reward = 0.0 if question(prompt) in HARD else float(CORRECTION.strip() in text)
            self.seen.setdefault(question(prompt), []).append(reward)
            rewards.append(reward)
        return rewards


def combined_args(cpu_args, **overrides) -> MInTRLSORTConfig:
    """2 controls + 2 intervened rollouts per prompt, 4 prompts per step, interventions for the whole run."""
    args = {k: v for k, v in cpu_args.items() if k != "num_generations"}
    args.update(num_control_generations=2, num_intervened_generations=2, chunk_size=6, max_reviews=2,
                max_correction_tokens=8, max_completion_length=24, intervention_steps=100,
                per_device_train_batch_size=16, max_steps=3, repair_batch_size=2, max_plan_tokens=8)  # fmt: skip
    args.update(overrides)
    return MInTRLSORTConfig(**args)


def make_trainer(model_path, args, dataset, reward=None, callbacks=None) -> MInTRLSORTTrainer:
    return MInTRLSORTTrainer(
        model_path,
        reward_funcs=reward or RescueReward(),
        args=args,
        train_dataset=dataset,
        judge=revise_first_step_judge(),
        callbacks=callbacks,
    )


def record_deferrals(trainer) -> list[str]:
    """Every question the trainer adds to its buffer, in order."""
    added, add = [], trainer.repair.buffer.add

    def recording_add(prompt, reference, **kwargs):
        added.append(question(prompt))
        return add(prompt, reference, **kwargs)

    trainer.repair.buffer.add = recording_add
    return added


class StepSpy(TrainerCallback):
    """Passed to the constructor, so it runs before the trainer's repair callback at `on_optimizer_step`: the
    weights after the main (MInTRL) step, and after the whole step (repair included), with the repairs so far."""

    def __init__(self):
        self.trainer, self.after_main, self.after_step, self.repairs = None, [], [], []

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.after_main.append(snapshot(model))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after_step.append(snapshot(model))
        self.repairs.append(self.trainer.repair.buffer.counters["repairs"])


# ---- training --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("repair_update", ["separate", "joint"])
def test_groups_that_fail_with_interventions_are_repaired_rescued_ones_are_not(
    tiny_model_path, cpu_args, toy_dataset, repair_update
):
    reward, spy = RescueReward(), StepSpy()
    args = combined_args(cpu_args, repair_update=repair_update)
    trainer = make_trainer(tiny_model_path, args, toy_dataset, reward, callbacks=[spy])
    spy.trainer = trainer
    deferred = record_deferrals(trainer)
    before = snapshot(trainer.model)
    trainer.train()

    rescued = {q for q, rewards in reward.seen.items() if max(rewards) > 0}
    failed = {q for q, rewards in reward.seen.items() if max(rewards) == 0}
    assert rescued and rescued.isdisjoint(HARD)  # interventions rescued easy prompts (their controls all score 0)
    assert failed == HARD & set(reward.seen)  # every hard prompt trained on failed every rollout
    assert set(deferred) == failed  # deferred: exactly the prompts whose controls and interventions all failed
    assert trainer.repair.buffer.counters["repairs"] >= 1
    assert params_changed(before, trainer.model) > 0

    logged = {key for log in trainer.state.log_history for key in log}
    for name in ["reward_control", "reward_intervened", "reward_gap", "intervention_rate", "judge_token_frac",
                 "regression_residual"]:  # fmt: skip
        assert f"mintrl/{name}" in logged, name
    for name in ["all_wrong_frac", "all_right_frac", "buffer_size", "repairs", "repair_loss", "mean_weight",
                 "salience_mean"]:  # fmt: skip
        assert f"sort/{name}" in logged, name
    assert all(log["mintrl/reward_gap"] > 0 for log in trainer.state.log_history if "mintrl/reward_gap" in log)
    if repair_update == "separate":  # the repair step itself moves the weights, after the MInTRL step
        assert "sort/repair_grad_norm" in logged
        repaired = [i for i, n in enumerate(spy.repairs) if n > (spy.repairs[i - 1] if i else 0)]
        assert repaired
        for i in repaired:
            assert any(not spy.after_main[i][n].equal(spy.after_step[i][n]) for n in spy.after_main[i])


def test_joint_repair_adds_the_weighted_repair_loss_to_the_regression_loss(tiny_model_path, cpu_args, toy_dataset):
    args = combined_args(cpu_args, repair_update="joint", repair_loss_weight=0.5)
    trainer = make_trainer(tiny_model_path, args, toy_dataset)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by `train()`; the pieces are called directly here
    hard = [row for row in toy_dataset if question(row["prompt"]) in HARD]
    inputs = trainer._generate_and_score_completions([row for row in hard[:2] for _ in range(4)])
    assert len(trainer.repair.buffer) == 2  # both groups failed every rollout: the buffer is full

    regression = MInTRLTrainer._compute_loss(trainer, trainer.model, inputs).item()
    total = trainer._compute_loss(trainer.model, inputs).item()
    repair_loss = trainer._metrics["train"]["sort/repair_loss"][-1]
    assert repair_loss > 0 and trainer.repair.buffer.counters["repairs"] == 1 and len(trainer.repair.buffer) == 0
    assert total - regression == pytest.approx(0.5 * repair_loss, rel=1e-4)


@pytest.mark.slow
def test_two_process_ddp_defers_by_the_whole_group_across_processes(tiny_model_path, tmp_path):
    """Each process holds half of every group: rank 0 the controls, rank 1 the intervened rollouts. Rank 0 sees only
    failures, yet a prompt that rank 1's interventions rescued is not deferred, and both ranks defer, buffer, repair
    and end with the same weights."""
    ranks = run_on_two_processes("combined_ddp_script.py", tiny_model_path, str(tmp_path), out=tmp_path)
    assert [r["world"] for r in ranks] == [2, 2]
    for key in ("deferred", "buffer", "repairs_after_step", "weights"):
        assert ranks[0][key] == ranks[1][key], key
    seen = {q: ranks[0]["rewards_seen"][q] + ranks[1]["rewards_seen"][q] for q in ranks[0]["rewards_seen"]}
    rescued = {q for q, rewards in seen.items() if max(rewards) > 0}
    assert rescued and all(max(ranks[0]["rewards_seen"][q]) == 0 for q in rescued)  # rank 0 saw only failures
    assert set(ranks[0]["deferred"]) == {q for q, rewards in seen.items() if max(rewards) == 0}
    assert ranks[0]["repairs_after_step"][-1] >= 1


# ---- checkpoints -----------------------------------------------------------------------------------------------------


class BufferAtStart(TrainerCallback):
    def __init__(self):
        self.trainer, self.buffer, self.reward_gap_ema = None, None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.buffer = self.trainer.repair.buffer.state_dict()
        self.reward_gap_ema = self.trainer.schedule.reward_gap_ema


def test_resume_restores_mintrl_state_and_the_repair_buffer(tiny_model_path, cpu_args, toy_dataset):
    settings = dict(save_strategy="steps", save_steps=1, intervention_stop_gap=-1.0)  # the gap's EMA is state
    first = make_trainer(
        tiny_model_path, combined_args(cpu_args, max_steps=1, repair_batch_size=100, **settings), toy_dataset
    )
    first.train()
    saved = json.loads(Path(first.args.output_dir, "checkpoint-1", STATE_FILE).read_text())
    assert saved == first._extra_state()
    assert saved["sort_buffer"]["items"] and saved["mintrl"]["reward_gap_ema"] is not None

    # Resume with a repair batch exactly the size of the saved buffer: the first step repairs the restored items.
    spy = BufferAtStart()
    args = combined_args(
        cpu_args,
        max_steps=2,
        repair_batch_size=len(saved["sort_buffer"]["items"]),
        max_repairs_per_step=1,  # the step's own deferrals would be a second repair
        **settings,
    )
    second = make_trainer(tiny_model_path, args, toy_dataset, callbacks=[spy])
    spy.trainer = second
    second.train(resume_from_checkpoint=True)
    assert spy.buffer == saved["sort_buffer"]
    assert spy.reward_gap_ema == saved["mintrl"]["reward_gap_ema"]
    assert second.repair.buffer.counters["repairs"] == saved["sort_buffer"]["counters"]["repairs"] + 1


def test_resume_refuses_a_checkpoint_without_the_combined_state(tiny_model_path, cpu_args, toy_dataset):
    args = combined_args(cpu_args, max_steps=1, save_strategy="steps", save_steps=1)
    make_trainer(tiny_model_path, args, toy_dataset).train()
    state = Path(args.output_dir, "checkpoint-1", STATE_FILE)
    state.write_text(json.dumps({"mintrl": json.loads(state.read_text())["mintrl"]}))
    resumed = make_trainer(tiny_model_path, combined_args(cpu_args, max_steps=2), toy_dataset)
    with pytest.raises(ValueError, match=r"lacks the keys \['sort_buffer'\]"):
        resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-1"))


# ---- config and construction -----------------------------------------------------------------------------------------


def test_config_is_the_union_of_both_parents_with_their_defaults(cpu_args):
    names = {f.name for f in dataclasses.fields(MInTRLSORTConfig)}
    assert names == {f.name for f in dataclasses.fields(MInTRLConfig)} | {
        f.name for f in dataclasses.fields(SORTConfig)
    }
    args = combined_args(cpu_args)
    assert args.num_generations == 4  # derived, as in MInTRL
    assert (args.beta, args.vllm_importance_sampling_correction, args.reference_column) == (0.0, False, "solution")
    grpo = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert (args.epsilon, args.epsilon_high) == (grpo["epsilon"], grpo["epsilon_high"])  # unused: no clipping
    defaults = MInTRLSORTConfig(output_dir=cpu_args["output_dir"], use_cpu=True, per_device_train_batch_size=16)
    assert (defaults.num_control_generations, defaults.num_intervened_generations) == (4, 4)  # GRPOConfig's 8
    for config in (MInTRLConfig, SORTConfig):  # every field of a parent's own keeps that parent's default
        for f in dataclasses.fields(config):
            if f.name not in grpo and f.name not in ("num_control_generations", "num_intervened_generations"):
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                assert getattr(defaults, f.name) == default, f.name


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("repair_beta", 1.5, "`repair_beta`"),  # SORTConfig's checks
        ("remove_unused_columns", True, "remove_unused_columns=False"),
        ("anchor", "ratio", "anchor='ratio'"),  # MInTRLConfig's checks
        ("beta", 0.1, "no KL term"),
        ("num_generations", 5, "num_generations=5 conflicts"),
    ],
)
def test_config_runs_both_parents_checks(cpu_args, field, value, match):
    with pytest.raises(ValueError, match=match):
        combined_args(cpu_args, **{field: value})


def test_trainer_refuses_other_configs_and_names_both_methods(tiny_model_path, cpu_args, toy_dataset):
    mintrl = MInTRLConfig(**{k: v for k, v in cpu_args.items() if k != "num_generations"}, num_control_generations=2,
                          num_intervened_generations=2)  # fmt: skip
    with pytest.raises(TypeError, match="MInTRLSORTConfig"):
        MInTRLSORTTrainer("no/such-model", reward_funcs=RescueReward(), args=mintrl, train_dataset=toy_dataset)
    with pytest.raises(ValueError, match="`correctness_reward_funcs` names 'accuracy'"):  # before the model loads
        make_trainer("no/such-model", combined_args(cpu_args, correctness_reward_funcs=["accuracy"]), toy_dataset)
    trainer = make_trainer(tiny_model_path, combined_args(cpu_args), toy_dataset)
    trainer.create_model_card(model_name="tiny-mintrl-sort")
    card = Path(trainer.args.output_dir, "README.md").read_text()
    assert "MInTRL + SORT" in card and "chen2026mintrl" in card and "sort2026" in card
    assert {"trl", "mintrl", "sort"} <= set(trainer.model.model_tags)


def imported_packages(package: str) -> set[str]:
    """The `trl_mintrl` sub-packages that the modules of `package` import (relative or absolute)."""
    found = set()
    for path in (PACKAGE / package).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 2:
                    module = f"trl_mintrl.{module}"
                found.add(module.removeprefix("trl_mintrl.").split(".")[0])
            elif isinstance(node, ast.Import):
                found |= {alias.name.removeprefix("trl_mintrl.").split(".")[0] for alias in node.names}
    return found


@pytest.mark.parametrize("name", ["tools", "environment_factory"])
def test_tools_reach_the_rollout_and_the_repair(tiny_model_path, cpu_args, toy_dataset, name):
    """Taken as `GRPOTrainer` takes them (trained in tests/test_combined_tools.py): the intervention rollout's tools
    are the trainer's, and the repair's prompts show them."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    def get(name: str) -> str:
        """Read a register.

        Args:
            name: The register's name.
        """
        return name

    class Env:
        def reset(self, **row):
            return None

        def get(self, name: str) -> str:
            """Read a register.

            Args:
                name: The register's name.
            """
            return name

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = qwen3_chat_template  # TRL refuses tools with a template that cannot render them
    value = [get] if name == "tools" else Env
    trainer = MInTRLSORTTrainer(tiny_model_path, reward_funcs=RescueReward(), args=combined_args(cpu_args),
                                train_dataset=toy_dataset, processing_class=tokenizer, judge=revise_first_step_judge(),
                                **{name: value})  # fmt: skip
    assert [tool.__name__ for tool in trainer.tools] == ["get"]
    assert [tool.__name__ for tool in trainer.repair.renderer.tools_of(None)] == ["get"]
    (ids,) = trainer.repair.renderer.base_prompt_ids([toy_dataset[0]["prompt"]])
    assert '"name": "get"' in tokenizer.decode(ids)


def test_mintrl_and_sort_packages_do_not_import_each_other():
    assert "sort" not in imported_packages("mintrl") and "combined" not in imported_packages("mintrl")
    assert "mintrl" not in imported_packages("sort") and "combined" not in imported_packages("sort")
    assert {"mintrl", "sort"} <= imported_packages("combined")


def test_toy_benchmark_builds_and_steps_the_combined_method(tmp_path):
    """`mintrl-sort` of benchmarks/tasks/toy/training.py: MInTRL's toy settings (const anchor, rule judge) plus SORT's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy import WARM_START_DIR
    from benchmarks.tasks.toy.training import REGIMES, SORT_REPAIR, build_trainer, rl_config

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(WARM_START_DIR),
        AutoTokenizer.from_pretrained(WARM_START_DIR),
    )
    args = rl_config("mintrl-sort", tmp_path, steps=1, regime="unreachable", per_device_train_batch_size=16)
    assert isinstance(args, MInTRLSORTConfig) and args.anchor == "const"
    assert (args.repair_batch_size, args.max_plan_tokens) == (SORT_REPAIR["repair_batch_size"], 64)
    trainer = build_trainer("mintrl-sort", model, tokenizer, REGIMES["unreachable"].dataset(8, seed=5), args)
    assert isinstance(trainer, MInTRLSORTTrainer)
    trainer.train()
    logs = next(entry for entry in trainer.state.log_history if "reward" in entry)
    assert logs["mintrl/intervention_rate"] > 0 and logs["mintrl/judge_failures"] == 0
    assert "sort/all_wrong_frac" in logs and "sort/buffer_size" in logs


def test_cpu_recipe_runs_through_the_cli_interventions_first_then_repairs(tmp_path, tiny_model_path, monkeypatch):
    """`trl-mintrl train mintrl-sort` on the CPU recipe: while the rule judge intervenes it rescues every group (no
    deferral); once interventions stop, the all-wrong groups are repaired. Checkpoint and card name both methods."""
    from trl_mintrl.cli.recipe import check_environment, parse_recipe
    from trl_mintrl.cli.train import main

    monkeypatch.chdir(REPO)  # the recipe's judge_function and reward resolve from the repository root
    check_environment(parse_recipe(["mintrl-sort", "--config", CPU_RECIPE]))  # nothing from the Hub
    out = tmp_path / "out"
    main(["mintrl-sort", "--config", CPU_RECIPE, "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
          "--max_steps", "3", "--intervention_steps", "1", "--repair_batch_size", "2", "--save_steps", "3"])  # fmt: skip
    checkpoint = out / "checkpoint-3"
    assert (checkpoint / STATE_FILE).is_file()
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "loss" in h]
    assert [h["mintrl/interventions_active"] for h in steps] == [1.0, 0.0, 0.0]
    assert steps[0]["sort/all_wrong_frac"] == 0.0 and steps[0]["mintrl/reward_gap"] > 0  # the judge rescued them
    assert steps[-1]["sort/all_wrong_frac"] > 0 and steps[-1]["sort/repairs"] >= 1
    card = (out / "README.md").read_text()
    assert "Method: **MInTRL + SORT**" in card and f"trl-mintrl train mintrl-sort --config {CPU_RECIPE}" in card
