"""Fail loudly when a TRL private method or attribute that trl-mintrl relies on changes.

TRL's GRPOTrainer is subclassed by wrapping its private seams. They change between minor versions, which is why
pyproject pins `trl>=1.16,<1.17`. If this test fails after an upgrade, read the new signature, adapt the wrapper
that uses it (named in each entry), then update the expectation here.
"""

import inspect
import re
from pathlib import Path

import pytest
import trl
from accelerate import Accelerator
from transformers import Trainer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

import trl_mintrl

# method -> (parameter names after self, where trl-mintrl uses it)
EXPECTED_SIGNATURES = {
    "_generate_and_score_completions": (["inputs"], "MInTRL/SORT: stash the batch rows, rewrite advantages"),
    "_calculate_rewards": (["inputs", "prompts", "completions", "completion_ids_list"], "MInTRL/SORT: capture rewards"),
    "_compute_loss": (["model", "inputs"], "MInTRL: regression loss; SORT: add the repair loss"),
    "_get_per_token_logps_and_entropies": (
        ["model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
         "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
         "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"],
        "MInTRL loss and SORT scoring passes",
    ),
    "_generate": (["prompts"], "rollout_func seam (env_mask -> tool_mask)"),
    "_tokenize_prompts": (["prompts"], "MInTRL rollout: prompt ids exactly as TRL templates them"),
    "_get_output_dir": (["trial"], "checkpoint folder for extra state"),
    "_save_checkpoint": (["model", "trial"], "SORT buffer / MInTRL schedule state"),
    "_load_optimizer_and_scheduler": (["checkpoint"], "restore extra state on resume"),
    "__init__": (
        ["model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class",
         "reward_processing_classes", "callbacks", "optimizers"],
        "MInTRLTrainer/SORTTrainer.__init__ (SORT passes model, reward_funcs, args, train_dataset by position)",
    ),
    "train": (["resume_from_checkpoint"], "GRPOTrainerBase.train: resume_from_checkpoint=True -> last complete one"),
    "training_step": (["model", "inputs", "num_items_in_batch"], "SORT joint repair: first micro-batch via _step"),
    "compute_loss_context_manager": ([], "SORT's separate repair step (autocast around the repair forward)"),
    "create_model_card": (["model_name", "dataset_name", "tags"], "model_card.ModelCardMixin.create_model_card"),
}  # fmt: skip


def test_trl_minor_version_is_the_pinned_one():
    assert trl.__version__.startswith("1.16."), f"trl-mintrl is written against TRL 1.16, found {trl.__version__}"


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_private_signature_unchanged(name):
    expected, used_by = EXPECTED_SIGNATURES[name]
    method = getattr(GRPOTrainer, name, None)
    assert method is not None, f"GRPOTrainer.{name} is gone in TRL {trl.__version__}; it is used by {used_by}"
    params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    names = [p.name for p in params]
    # new parameters may follow ours, but only with defaults: our calls do not pass them
    required = [p.name for p in params[len(expected) :] if p.default is p.empty and p.kind <= p.KEYWORD_ONLY]
    assert names[: len(expected)] == expected and not required, (
        f"GRPOTrainer.{name} changed signature in TRL {trl.__version__}: expected {expected}, got {names}. "
        f"Adapt {used_by}."
    )


def test_optimizer_step_callback_runs_between_the_step_and_the_schedule():
    """SORT's separate repair step runs in `on_optimizer_step`: after `optimizer.step()` (the main update is done),
    before the scheduler step and `global_step += 1` (same learning rate, not a step of the schedule)."""
    expected = ["args", "state", "control", "kwargs"]
    assert list(inspect.signature(TrainerCallback.on_optimizer_step).parameters)[1:] == expected
    source = inspect.getsource(Trainer._run_epoch)
    order = [
        "self.current_gradient_accumulation_steps = ",
        "self.optimizer.step()",
        "self.callback_handler.on_optimizer_step(",
        "self.lr_scheduler.step()",
        "self.state.global_step += 1",
    ]
    positions = [source.find(line) for line in order]
    assert -1 not in positions and positions == sorted(positions), (
        f"Trainer._run_epoch no longer runs {order} in this order ({positions}): adapt "
        "sort/repair.py's separate_repair_step (and MInTRL's GA scaling)."
    )


def test_micro_batch_counter_and_loss_scaling_we_rely_on():
    """SORT's joint repair adds its loss on the first micro-batch of an optimizer step: `_step % GA == 0` inside the
    loss, so GRPOTrainer must count `_step` after `Trainer.training_step`. MInTRL divides its loss by the GA steps
    itself, as GRPOTrainer does (`loss_is_scaled_for_ga = True` makes the Trainer skip it). Under DeepSpeed the
    Trainer backwards with `scale_wrt_gas=False`, which SORT's separate repair step mirrors."""
    grpo_step = inspect.getsource(GRPOTrainer.training_step)
    assert 0 <= grpo_step.find("super().training_step(") < grpo_step.find("self._step += 1"), (
        "GRPOTrainer.training_step no longer counts `_step` after the micro-batch: adapt SORT's with_joint_repair"
    )
    assert "self._step = 0" in inspect.getsource(GRPOTrainer.__init__), "GRPOTrainer no longer sets self._step"
    assert GRPOTrainer.loss_is_scaled_for_ga is True, "GRPOTrainer's loss GA scaling changed: adapt MInTRL's loss"
    trainer_step = inspect.getsource(Trainer.training_step)
    assert "if self.loss_is_scaled_for_ga is not None:" in trainer_step
    assert 'kwargs["scale_wrt_gas"] = False' in trainer_step
    backward = inspect.getsource(Accelerator.backward)
    assert "self.deepspeed_engine_wrapped.backward(loss, sync_gradients=self.sync_gradients, **kwargs)" in backward


def test_every_config_field_we_read_exists():
    """Every `self.args.<name>`, `trainer.args.<name>` and `training_args.<name>` the package reads is a field (or
    property) of GRPOConfig or of one of our configs."""
    configs = [getattr(trl_mintrl, name) for name in trl_mintrl.__all__ if name.endswith("Config")]
    known = set(GRPOConfig.__dataclass_fields__) | {f for config in configs for f in config.__dataclass_fields__}
    root = Path(trl_mintrl.__file__).parent
    read = {}
    for path in root.rglob("*.py"):
        for match in re.finditer(r"\b(?:self\.args|trainer\.args|training_args)\.([a-z_]\w*)", path.read_text()):
            read.setdefault(match.group(1), path.relative_to(root.parent))
    assert len(read) > 20  # the pattern still finds what the trainers read
    missing = {name: str(path) for name, path in read.items() if name not in known and not hasattr(GRPOConfig, name)}
    assert not missing, f"config fields read but gone in TRL {trl.__version__}: {missing}"


def test_rollout_func_contract_in_source():
    """`_generate` must still call `rollout_func(prompts, self)` and turn `env_mask` into the tool mask."""
    source = inspect.getsource(GRPOTrainer._generate)
    assert "self.rollout_func(prompts, self)" in source
    assert 'extra_fields.pop("env_mask", None)' in source
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters


def test_attributes_and_config_fields_we_read():
    fields = GRPOConfig.__dataclass_fields__
    for field in [
        "num_generations",
        "max_completion_length",
        "temperature",
        "epsilon",
        "epsilon_high",
        "beta",
        "mask_truncated_completions",
        "steps_per_generation",
        "use_vllm",
        "vllm_mode",
        "vllm_enable_sleep_mode",
        "ds3_gather_for_generation",
    ]:
        assert field in fields, f"GRPOConfig.{field} is gone"
    for attr in ["_name", "_paper", "_tag_names", "loss_is_scaled_for_ga"]:
        assert hasattr(GRPOTrainer, attr), f"GRPOTrainer.{attr} is gone"
    init_source = inspect.getsource(GRPOTrainer.__init__)
    for attr in [
        "self.generation_config",
        "self.generation_kwargs",
        "self._dist",
        "self.eos_token_ids",
        "self.reward_weights",
        "self._metrics",
        "self.rollout_func",
        "self._tokenizer",
        "self.num_generations",
        "self.num_generations_eval",
        "self.reward_func_names",
    ]:
        assert attr in init_source, f"GRPOTrainer no longer sets {attr}"
