"""Fail loudly when a TRL private method or attribute that trl-mintrl relies on changes.

TRL's GRPOTrainer is subclassed by wrapping its private seams. They change between minor versions, which is why
pyproject pins `trl>=1.16,<1.17`. If this test fails after an upgrade, read the new signature, adapt the wrapper
that uses it (named in each entry), then update the expectation here.
"""

import inspect

import pytest
import trl
from trl import GRPOConfig, GRPOTrainer

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
}


def test_trl_minor_version_is_the_pinned_one():
    assert trl.__version__.startswith("1.16."), f"trl-mintrl is written against TRL 1.16, found {trl.__version__}"


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_private_signature_unchanged(name):
    expected, used_by = EXPECTED_SIGNATURES[name]
    method = getattr(GRPOTrainer, name, None)
    assert method is not None, f"GRPOTrainer.{name} is gone in TRL {trl.__version__}; it is used by {used_by}"
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    assert params[: len(expected)] == expected, (
        f"GRPOTrainer.{name} changed signature in TRL {trl.__version__}: expected {expected}, got {params}. "
        f"Adapt {used_by}."
    )


def test_rollout_func_contract_in_source():
    """`_generate` must still call `rollout_func(prompts, self)` and turn `env_mask` into the tool mask."""
    source = inspect.getsource(GRPOTrainer._generate)
    assert "self.rollout_func(prompts, self)" in source
    assert 'extra_fields.pop("env_mask", None)' in source
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters


def test_attributes_and_config_fields_we_read():
    fields = GRPOConfig.__dataclass_fields__
    for field in ["num_generations", "max_completion_length", "temperature", "epsilon", "epsilon_high", "beta",
                  "mask_truncated_completions", "steps_per_generation", "use_vllm", "vllm_mode",
                  "vllm_enable_sleep_mode", "ds3_gather_for_generation"]:
        assert field in fields, f"GRPOConfig.{field} is gone"
    for attr in ["_name", "_paper", "_tag_names", "loss_is_scaled_for_ga"]:
        assert hasattr(GRPOTrainer, attr), f"GRPOTrainer.{attr} is gone"
    init_source = inspect.getsource(GRPOTrainer.__init__)
    for attr in ["self.generation_config", "self.generation_kwargs", "self._dist", "self.eos_token_ids",
                 "self.reward_weights", "self._metrics", "self.rollout_func"]:
        assert attr in init_source, f"GRPOTrainer no longer sets {attr}"
