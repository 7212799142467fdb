"""Drop-in for `GRPOConfig` users: `num_generations` is the group-size knob, every `GRPOConfig` field either works
(a short run on the tiny model) or is refused before any model loads with a message naming it, and
docs/grpo-fields.md, the table users read, matches `REFUSED_GRPO_FIELDS` and names tests that exist."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from conftest import digit_count_reward, params_changed, snapshot
from mintrl_helpers import RecordingTrainer, revise_first_step_judge, role_reward, scripted_trainer
from transformers import TrainingArguments
from trl import GRPOConfig

from trl_mintrl import MInTRLConfig, MInTRLSORTConfig, SORTConfig, SORTTrainer
from trl_mintrl.mintrl.config import REFUSED_GRPO_FIELDS

REPO = Path(__file__).resolve().parent.parent


def mintrl_config(cpu_args, **overrides) -> MInTRLConfig:
    """cpu_args as a GRPOConfig user writes them (`num_generations=4`, no split fields), small chunks, one step."""
    settings = dict(chunk_size=6, max_reviews=2, max_correction_tokens=8, max_completion_length=24,
                    intervention_steps=100, max_steps=1)  # fmt: skip
    return MInTRLConfig(**{**cpu_args, **settings, **overrides})


# ----- num_generations: the knob -----


@pytest.mark.parametrize(
    "given, split",
    [
        ({}, (8, 4, 4)),  # GRPOConfig's default group of 8
        ({"num_generations": 4}, (4, 2, 2)),
        ({"num_generations": 3}, (3, 2, 1)),  # odd: the extra rollout is a control
        ({"num_generations": 2}, (2, 1, 1)),
        ({"num_generations": 16}, (16, 8, 8)),  # the paper's 8 + 8
        ({"num_generations": 8, "num_control_generations": 6}, (8, 6, 2)),  # one split field: the other is the rest
        ({"num_generations": 8, "num_intervened_generations": 0}, (8, 8, 0)),
        ({"num_control_generations": 2, "num_intervened_generations": 6}, (8, 2, 6)),  # both: num_generations = sum
        ({"num_generations": 4, "num_control_generations": 3, "num_intervened_generations": 1}, (4, 3, 1)),
    ],
)
def test_num_generations_split(given, split):
    args = MInTRLConfig("out", use_cpu=True, per_device_train_batch_size=48, **given)
    assert (args.num_generations, args.num_control_generations, args.num_intervened_generations) == split


def test_defaults_construct_with_grpo_configs_batch_size():
    """`MInTRLConfig("out")` is as valid as `GRPOConfig("out")` (on CPU both need `use_cpu`), and the line a user
    changes from `GRPOConfig` works."""
    grpo = GRPOConfig("out", use_cpu=True)
    args = MInTRLConfig("out", use_cpu=True)
    assert (args.per_device_train_batch_size, args.num_generations) == (grpo.per_device_train_batch_size, 8)
    assert args.generation_batch_size == grpo.generation_batch_size
    args = MInTRLConfig("out", use_cpu=True, num_generations=8, per_device_train_batch_size=8)
    assert (args.num_control_generations, args.num_intervened_generations) == (4, 4)


@pytest.mark.parametrize(
    "given, message",
    [
        ({"num_generations": 1}, r"num_generations=1: .*at least 2 rollouts.*num_generations >= 2"),
        ({"num_control_generations": 1, "num_intervened_generations": 0}, r"num_generations=1: "),
        ({"num_generations": 6, "num_control_generations": 2, "num_intervened_generations": 2},
         r"num_generations=6 conflicts with num_control_generations=2 \+ num_intervened_generations=2 = 4"),
        ({"num_generations": 4, "num_intervened_generations": 4},
         r"num_control_generations=0 .*at least 1 is needed.*num_intervened_generations"),
        ({"num_generations": 4, "num_control_generations": 5},
         r"num_intervened_generations=-1: num_control_generations=5 exceeds num_generations=4"),
    ],
)  # fmt: skip
def test_group_refusals_name_the_fields(given, message):
    with pytest.raises(ValueError, match=message):
        MInTRLConfig("out", use_cpu=True, per_device_train_batch_size=48, **given)


@pytest.mark.parametrize("num_generations", [4, 3])
def test_num_generations_alone_trains_with_the_derived_split(tiny_model_path, cpu_args, toy_dataset, num_generations):
    """The first ceil(n/2) rollouts of each group are controls (their mean is the baseline), the rest intervened."""
    args = mintrl_config(cpu_args, num_generations=num_generations, per_device_train_batch_size=2 * num_generations)
    trainer = scripted_trainer(tiny_model_path, args, toy_dataset)
    trainer.train()
    controls = (num_generations + 1) // 2
    (record,) = trainer.records
    rewards = record["rewards"].view(-1, num_generations)
    assert torch.all(rewards[:, controls:] == 1.0)  # role_reward gives 1 to intervened rollouts only
    baseline = rewards[:, :controls].mean(dim=1, keepdim=True)
    torch.testing.assert_close(record["advantages"], (rewards - baseline).view(-1))


# ----- refused fields -----

# A value other than MInTRLConfig's default for each refused field (one that GRPOConfig itself would accept).
NON_DEFAULT = {
    "beta": 0.04,
    "sync_ref_model": True,
    "ref_model_mixup_alpha": 0.9,
    "ref_model_sync_steps": 64,
    "use_bias_correction_kl": False,
    "loss_type": "grpo",
    "epsilon": 0.3,
    "epsilon_high": 0.28,
    "delta": 2.0,
    "sapo_temperature_neg": 1.5,
    "sapo_temperature_pos": 0.5,
    "vespo_k_pos": 1.0,
    "vespo_lambda_pos": 1.0,
    "vespo_k_neg": 1.0,
    "vespo_lambda_neg": 1.0,
    "importance_sampling_level": "sequence",
    "off_policy_mask_threshold": 0.5,
    "scale_rewards": "none",
    "multi_objective_aggregation": "normalize_then_sum",
    "top_entropy_quantile": 0.2,
    "entropy_coef": 0.01,
    "use_adaptive_entropy": True,
    "entropy_coef_min": 0.1,
    "entropy_coef_max": 0.5,
    "entropy_coef_delta": 0.01,
    "entropy_target": 0.3,
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "token_truncate",
    "vllm_importance_sampling_clip_max": 2.0,
    "vllm_importance_sampling_clip_min": 0.5,
    "vllm_importance_sampling_cap": 2.0,
    "router_aux_loss_coef": 0.01,
    "use_transformers_continuous_batching": True,
    "transformers_continuous_batching_config": {"block_size": 64},
    "use_transformers_paged": True,
    "vllm_structured_outputs_regex": r"\d+",
    "ds3_gather_for_generation": False,
}


def test_every_refused_field_has_a_test_value():
    assert NON_DEFAULT.keys() == REFUSED_GRPO_FIELDS.keys()


@pytest.mark.parametrize("config", [MInTRLConfig, MInTRLSORTConfig], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(REFUSED_GRPO_FIELDS))
def test_refused_fields_name_the_field_why_and_instead(cpu_args, config, name):
    value = NON_DEFAULT[name]
    why, instead = REFUSED_GRPO_FIELDS[name]
    with pytest.raises(ValueError) as raised:
        config(**{**cpu_args, "num_generations": 4, name: value})
    message = str(raised.value)
    assert message.startswith(f"{name}=") and "refused by MInTRL" in message, message
    assert why in message and instead in message, message


def test_refused_fields_at_their_default_or_its_alias_pass(cpu_args):
    """GRPOConfig's aliases of a default (`scale_rewards=True` is "group") are the default."""
    args = MInTRLConfig(**cpu_args, scale_rewards=True, beta=0.0, loss_type="dapo", ds3_gather_for_generation=True)
    assert args.scale_rewards == "group"


def test_sort_accepts_every_field_mintrl_refuses(cpu_args):
    """SORT's main update is TRL's GRPO: nothing MInTRL refuses is refused by SORTConfig."""
    for name, value in NON_DEFAULT.items():
        assert getattr(SORTConfig(**{**cpu_args, name: value}), name) == value, name


# ----- settings that work with MInTRL: short runs -----


class LossSpy(RecordingTrainer):
    """Per `_compute_loss` call: the RMS advantage, the logged RMS regression residual, and whether TRL passed
    old log-probs."""

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self.losses = getattr(self, "losses", [])
        self.losses.append(
            (
                inputs["advantages"].pow(2).mean().sqrt().item(),
                self._metrics["train"]["mintrl/regression_residual"][-1],
                inputs.get("old_per_token_logps") is not None,
            )
        )
        return loss


@pytest.mark.parametrize("setting", [{"num_iterations": 2}, {"steps_per_generation": 2}])
def test_several_optimizer_steps_per_generation_anchor_at_pi_old(tiny_model_path, cpu_args, toy_dataset, setting):
    """With `anchor="proxy"` every anchor is log pi_old. The first step on a generation batch has pi_theta = pi_old,
    so the residual is exactly -A; the second step on the same batch, after an update, regresses
    sum(log pi_theta - log pi_old) != 0. Anchoring at the current (detached) log-probs would keep it at -A."""
    args = mintrl_config(cpu_args, anchor="proxy", regression_beta=1.0, max_steps=2, **setting)
    trainer = scripted_trainer(tiny_model_path, args, toy_dataset, LossSpy)
    trainer.train()
    assert len(trainer.records) == 1  # one generation batch for both optimizer steps
    (adv_first, residual_first, old_first), (adv_second, residual_second, old_second) = trainer.losses
    assert old_first and old_second
    assert residual_first == pytest.approx(adv_first, rel=1e-5)
    assert abs(residual_second - adv_second) > 1e-3


def test_mask_truncated_completions_take_no_gradient(tiny_model_path, cpu_args, toy_dataset):
    """Completions cut at `max_completion_length` (all of them here, too short to end) keep their rewards and
    advantages but move no weight."""
    args = mintrl_config(cpu_args, mask_truncated_completions=True, max_completion_length=4, chunk_size=2)
    trainer = scripted_trainer(tiny_model_path, args, toy_dataset)
    before = snapshot(trainer.model)
    trainer.train()
    (record,) = trainer.records
    eos = trainer.processing_class.eos_token_id
    assert not (record["completion_ids"] == eos).any()  # every rollout was truncated
    assert record["advantages"].abs().sum() > 0
    assert record["completion_mask"].sum() == 0
    assert params_changed(before, trainer.model) == 0


def prompt_reward(prompts, mintrl_intervened, **kwargs):
    """1 on intervened rollouts; a control scores a/10 for the prompt `Compute a+b =`, so each prompt's controls
    share one reward and differ from other prompts'."""
    return [1.0 if inter else int(p[-1]["content"].split()[1].split("+")[0]) / 10 for p, inter in
            zip(prompts, mintrl_intervened)]  # fmt: skip


def test_evaluation_runs_without_the_judge(tiny_model_path, cpu_args, toy_dataset):
    """An `eval_dataset` is evaluated with control rollouts only, in groups of `num_generations_eval`, and logs
    `eval_*` metrics; the judge is not called."""
    calls = {"review": 0, "correct": 0}
    args = mintrl_config(
        cpu_args, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4, num_generations_eval=2
    )
    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=prompt_reward,
        args=args,
        train_dataset=toy_dataset,
        eval_dataset=toy_dataset,
        judge=revise_first_step_judge(calls),
    )
    trainer.train()
    reviews = calls["review"]
    assert reviews > 0  # training intervened
    trainer.records = []
    metrics = trainer.evaluate()
    assert calls["review"] == reviews
    assert metrics["eval_mintrl/interventions_active"] == 0.0 and "eval_loss" in metrics
    assert len(trainer.records) == len(toy_dataset) * 2 // 4  # 8 prompts x 2 rollouts, 4 rows per batch
    for record in trainer.records:
        rewards = record["rewards"].view(-1, 2)  # two prompts per batch, two control rollouts each
        assert torch.all(rewards < 1.0) and rewards[0, 0] != rewards[1, 0]
        assert torch.equal(record["advantages"], torch.zeros(4))  # a group's controls share their reward
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert {"eval_loss", "eval_mintrl/reward_control"} <= logged


def test_grpo_settings_that_work_run(tiny_model_path, thinking_tokenizer, cpu_args, toy_dataset):
    """Sampling, prompt rendering, reward weights, model loading, data and logging fields of GRPOConfig in one run."""
    sampling = dict(temperature=0.9, top_p=0.9, top_k=20, min_p=0.01, repetition_penalty=1.1,
                    generation_kwargs={"no_repeat_ngram_size": 4}, cache_implementation="dynamic")  # fmt: skip
    args = mintrl_config(
        cpu_args,
        **sampling,
        chat_template_kwargs={"enable_thinking": False},
        reward_weights=[1.0, 0.0],
        model_init_kwargs={"dtype": "float32"},
        disable_dropout=True,
        cast_lm_head_to_fp32=True,
        shuffle_dataset=False,
        pad_to_multiple_of=8,
        log_completions=True,
        num_completions_to_print=1,
        log_unique_prompts=True,
    )
    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=[role_reward, digit_count_reward],
        args=args,
        train_dataset=toy_dataset,
        processing_class=thinking_tokenizer,
        judge=revise_first_step_judge(),
    )
    before = snapshot(trainer.model)
    trainer.train()
    assert params_changed(before, trainer.model) > 0
    config = trainer.policy_engine.generation_config
    assert (config.temperature, config.top_p, config.top_k, config.min_p) == (0.9, 0.9, 20, 0.01)
    assert (config.repetition_penalty, config.no_repeat_ngram_size) == (1.1, 4)
    assert config.cache_implementation == "dynamic"
    (record,) = trainer.records
    prompt = thinking_tokenizer.decode(record["prompt_ids"][0][record["prompt_mask"][0].bool()])
    assert prompt.endswith("<think>\n\n</think>\n\n")  # rendered with chat_template_kwargs
    # reward_weights: the digit reward has weight 0, so intervened rollouts (corrections are digits) score exactly 1
    assert torch.all(record["rewards"].view(-1, 4)[:, 2:] == 1.0)
    assert record["prompt_ids"].size(1) % 8 == 0 and record["completion_ids"].size(1) % 8 == 0
    assert trainer.model.config.dtype == torch.float32


# ----- settings that work with SORT: short runs -----

HARD = {f"Compute {a}+{(a * 3) % 7} =" for a in range(4)}


def hard_zero_reward(prompts, completions, **kwargs):
    """0 on half the prompts (their groups are all-wrong and get repaired), a dense positive reward elsewhere."""
    dense = digit_count_reward(completions)
    return [0.0 if p[-1]["content"] in HARD else 0.1 + d for p, d in zip(prompts, dense)]


def sort_config(cpu_args, **overrides) -> SORTConfig:
    settings = {**cpu_args, "per_device_train_batch_size": 8, "max_plan_tokens": 8, "repair_batch_size": 2}
    return SORTConfig(**{**settings, **overrides})


def test_sort_runs_with_grpo_loss_settings(tiny_model_path, cpu_args, toy_dataset):
    """The fields MInTRL refuses shape SORT's GRPO update (KL to a synced reference model, another loss type,
    sequence-level ratios, two-sided clipping, batch scaling, another reward aggregation, entropy masking and bonus,
    truncation masking, two iterations per generation batch) while repairs still run."""
    args = sort_config(
        cpu_args,
        max_steps=3,
        beta=0.04,
        sync_ref_model=True,
        ref_model_sync_steps=1,
        loss_type="grpo",
        importance_sampling_level="sequence",
        delta=2.0,
        scale_rewards="batch",
        multi_objective_aggregation="normalize_then_sum",
        top_entropy_quantile=0.5,
        entropy_coef=0.01,
        mask_truncated_completions=True,
        num_iterations=2,
    )
    trainer = SORTTrainer(tiny_model_path, reward_funcs=hard_zero_reward, args=args, train_dataset=toy_dataset)
    assert trainer.ref_model is not None
    before = snapshot(trainer.model)
    trainer.train()
    assert params_changed(before, trainer.model) > 0
    assert trainer.repair.buffer.counters["repairs"] >= 1
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert {"kl", "sort/repair_loss"} <= logged


def test_sort_evaluation_defers_nothing(tiny_model_path, cpu_args, toy_dataset):
    """Training on prompts that score defers nothing; evaluating on all-wrong prompts must not fill the buffer."""
    easy = toy_dataset.filter(lambda row: row["prompt"][-1]["content"] not in HARD)
    hard = toy_dataset.filter(lambda row: row["prompt"][-1]["content"] in HARD)
    args = sort_config(cpu_args, max_steps=1, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8,
                       num_generations_eval=2)  # fmt: skip
    trainer = SORTTrainer(tiny_model_path, reward_funcs=hard_zero_reward, args=args, train_dataset=easy,
                          eval_dataset=hard)  # fmt: skip
    trainer.train()
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and metrics["eval_reward"] == 0.0  # every evaluation group was all-wrong
    assert len(trainer.repair.buffer) == 0


# ----- the docs table -----


def table_rows() -> list[tuple[set[str], str, str, set[str]]]:
    """docs/grpo-fields.md's table: (fields, MInTRL cell, SORT cell, tests named) per row."""
    rows = []
    for line in (REPO / "docs" / "grpo-fields.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("Fields", "---"):
            continue
        names = set(re.findall(r"`(\w+)`", cells[0])) - {"TrainingArguments"}
        rows.append((names, cells[1], cells[2], set(re.findall(r"`(test_\w+)`", cells[3]))))
    return rows


def test_docs_table_covers_every_grpo_config_field_once_and_matches_the_refusals():
    rows = table_rows()
    listed = [name for names, *_ in rows for name in names]
    assert len(listed) == len(set(listed)), "a field is in two rows"
    training_arguments = {f.name for f in dataclasses.fields(TrainingArguments)}
    grpo_own = {f.name for f in dataclasses.fields(GRPOConfig)} - training_arguments
    assert grpo_own - set(listed) == set(), "GRPOConfig fields missing from docs/grpo-fields.md"
    assert set(listed) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    refused = {name for names, mintrl, _, _ in rows if mintrl.startswith("refused") for name in names}
    assert refused == set(REFUSED_GRPO_FIELDS)
    assert all(sort.startswith(("works", "same")) for _, _, sort, _ in rows)


def test_docs_table_names_tests_that_exist():
    sources = "".join(path.read_text() for path in (REPO / "tests").rglob("test_*.py"))
    named = {test for *_, tests in table_rows() for test in tests}
    assert named, "no test named in the table"
    missing = {test for test in named if not re.search(rf"^def {test}\(", sources, flags=re.M)}
    assert not missing, f"docs/grpo-fields.md names tests that do not exist: {sorted(missing)}"
