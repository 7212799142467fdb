"""`trl-mintrl train {grpo,mintrl,sort,mintrl-sort} --config RECIPE.yaml [--field value ...]`: run a TRL-style YAML recipe.

cli/recipe.py parses the recipe and checks it before anything is loaded; this module runs the checked `Recipe`:
the tiny model if asked for, the data (checked with only the tokenizer and the model's config loaded), training,
the saved model with its card, the push. Works the same under `accelerate launch ... -m trl_mintrl.cli train METHOD
--config X`.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

from ..cpu import exit_launched_process
from ..input_checks import InputError, RewardFunctionError
from ..resume import finished_run
from .recipe import (
    METHODS,
    OPTIONS_HELP,
    REPAIRED,
    Recipe,
    RecipeError,
    TrainScriptArguments,
    check_environment,
    import_dotted,
    looks_local,
    parse_recipe,
    recipe_folders,
)

# what `trl-mintrl train --help` prints
USAGE = f"""usage: trl-mintrl train {{{",".join(METHODS)}}} [--config RECIPE.yaml] [--accelerate_config NAME|PATH]
                        [--num_processes N] [--FIELD VALUE ...]

Train with TRL's GRPO, MInTRL or SORT from a TRL-style YAML recipe.

methods:
  grpo          TRL's GRPOTrainer (GRPOConfig), the baseline
  mintrl        MInTRLTrainer (MInTRLConfig): judge interventions and advantage regression
  sort          SORTTrainer (SORTConfig): GRPO plus repair from reference solutions
  mintrl-sort   MInTRLSORTTrainer (MInTRLSORTConfig): both

{OPTIONS_HELP}

examples:
  trl-mintrl train mintrl --config recipes/cpu/mintrl.yaml
  trl-mintrl train sort --config recipes/cpu/sort.yaml --accelerate_config cpu_ddp2
  trl-mintrl train mintrl --config recipes/cpu/mintrl.yaml --resume_from_checkpoint true"""


def _load_split(script_args: TrainScriptArguments, split: str, limit: int | None):
    from .. import data

    extra = {"name": script_args.dataset_config} if script_args.dataset_config else {}
    loader = data.LOADERS[script_args.dataset_loader]
    return loader(script_args.dataset_name, split, script_args.prompt_template, limit, **extra)


def _check_train_data(recipe: Recipe, train_dataset) -> None:
    """The trainers' data checks (empty or too-long prompts, bad references), here with only the tokenizer and the
    model's config loaded, so that bad data fails before the model does."""
    from transformers import AutoConfig, AutoTokenizer

    from ..input_checks import check_train_dataset, max_prompt_tokens
    from ..sort.length_checks import check_repair_lengths_before_loading
    from ..text import prompt_token_ids

    args, model_args = recipe.training_args, recipe.model_args
    options = {"revision": model_args.model_revision}
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, **options)
    model_config = AutoConfig.from_pretrained(model_args.model_name_or_path, **options)
    limit, context = max_prompt_tokens(model_config, args)
    judge_self = recipe.script_args.judge_function is None and getattr(args, "judge", None) == "self"
    check_train_dataset(
        train_dataset,
        reference_column=getattr(args, "reference_column", None),
        reference_required=recipe.method in REPAIRED or (judge_self and getattr(args, "intervention_steps", 0) > 0),
        tokenize=lambda prompts: [
            prompt_token_ids(tokenizer, p, **(args.chat_template_kwargs or {})) for p in prompts
        ],
        max_prompt_tokens=limit,
        context=context,
    )
    if recipe.method in REPAIRED:
        check_repair_lengths_before_loading(tokenizer, model_config, args, train_dataset)


def _prepare_model(recipe: Recipe) -> None:
    """Build the tiny model or prepare SmolLM2 if the recipe asks for it and it is missing, then its warm start
    (`warm_start_function`: model_name_or_path becomes the folder it returns); pass ModelConfig's loading options on."""
    from accelerate import PartialState

    script_args, training_args, model_args = recipe.script_args, recipe.training_args, recipe.model_args
    # TRL's generation calls transformers' deprecated `is_gradient_checkpointing` every step: nothing a user can change
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    if script_args.build_tiny_model:
        with PartialState().main_process_first():
            if not os.path.isfile(os.path.join(model_args.model_name_or_path, "config.json")):
                from ..tiny import build_tiny_model

                build_tiny_model(model_args.model_name_or_path)
    if script_args.prepare_smollm2:
        with PartialState().main_process_first():
            from ..smollm2 import prepare_smollm2

            prepare_smollm2(model_args.model_name_or_path)
    if script_args.warm_start_function is not None:
        warm_start = import_dotted(script_args.warm_start_function, recipe_folders(recipe.config_path))
        with PartialState().main_process_first():
            model_args.model_name_or_path = str(warm_start(model_args.model_name_or_path))

    # as TRL's scripts do: ModelConfig's loading options reach the trainer through model_init_kwargs
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }


def _load_datasets(recipe: Recipe):
    """(train, eval) datasets, the train split checked to fill at least one generation batch."""
    script_args, training_args = recipe.script_args, recipe.training_args
    try:
        train_dataset = _load_split(script_args, script_args.dataset_train_split, script_args.dataset_limit)
    except ValueError as err:  # the loader's message names the columns or file it cannot use
        raise RecipeError(f"dataset_name={script_args.dataset_name!r}: {err}") from None
    prompts_per_batch = training_args.generation_batch_size // training_args.num_generations
    if hasattr(train_dataset, "__len__") and len(train_dataset) < prompts_per_batch:
        # TRL's sampler drops incomplete batches: training would silently stop at step 0
        raise RecipeError(
            f"the train split has {len(train_dataset)} prompts but one generation batch takes {prompts_per_batch} "
            f"(per_device_train_batch_size={training_args.per_device_train_batch_size} x {training_args.world_size} "
            f"processes x steps_per_generation={training_args.steps_per_generation} / num_generations="
            f"{training_args.num_generations}): use more data or a smaller per_device_train_batch_size."
        )
    _check_train_data(recipe, train_dataset)
    eval_dataset = None
    if training_args.eval_strategy != "no":
        eval_dataset = _load_split(script_args, script_args.dataset_test_split, None)
    return train_dataset, eval_dataset


def build_trainer(recipe: Recipe):
    """The recipe's trainer, model and data loaded and checked, not trained: what `run` trains and `trl-mintrl
    judge-check` rolls out with."""
    from trl import get_peft_config, get_quantization_config

    from ..trainer_base import with_trainer_extras

    script_args, training_args, model_args = recipe.script_args, recipe.training_args, recipe.model_args
    _prepare_model(recipe)
    train_dataset, eval_dataset = _load_datasets(recipe)
    module, _, trainer_name = METHODS[recipe.method]
    trainer_cls = with_trainer_extras(getattr(importlib.import_module(module), trainer_name))
    extra = {}
    if script_args.judge_function is not None:
        extra["judge"] = import_dotted(script_args.judge_function, recipe_folders(recipe.config_path))()
    trainer = trainer_cls(
        model=model_args.model_name_or_path,
        reward_funcs=recipe.reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        **extra,
    )
    trainer.recipe = {"path": recipe.config_path, "command": recipe.command}
    return trainer


def run(recipe: Recipe):
    """Build the trainer, train, save (with the model card) and push if asked; returns the trainer."""
    from .. import data

    script_args, training_args = recipe.script_args, recipe.training_args
    trainer = build_trainer(recipe)
    dataset_id = script_args.dataset_name or data.LOADERS[script_args.dataset_loader].source.hub
    dataset_id = None if looks_local(dataset_id) else dataset_id  # the card links Hub datasets only
    if training_args.resume_from_checkpoint is not None:
        trainer.accelerator.print(f"resuming from {training_args.resume_from_checkpoint}")
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.create_model_card(dataset_name=dataset_id)
    processes = trainer.accelerator.num_processes
    trainer.accelerator.print(
        f"model and card saved to {training_args.output_dir} (trained on {processes} process"
        f"{'es' if processes > 1 else ''})"
    )
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=dataset_id)
        trainer.accelerator.print(f"pushed to https://huggingface.co/{trainer.hub_model_id}")
    trainer.accelerator.wait_for_everyone()  # end_training destroys the process group: no rank leaves before the rest
    trainer.accelerator.end_training()
    return trainer


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit(f"{USAGE}\n\ntrl-mintrl train: error: name the method, one of {list(METHODS)}.")
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    try:
        recipe = parse_recipe(argv)
        check_environment(recipe)
    except ValueError as err:  # RecipeError and the configs' own __post_init__ checks
        sys.exit(f"trl-mintrl train: error: {err}")
    args = recipe.training_args
    if args.resume_from_checkpoint is not None:  # for every method, plain `grpo` (TRL's GRPOTrainer) included
        finished = finished_run(args.resume_from_checkpoint, args.max_steps, args.num_train_epochs)
        if finished:
            if os.environ.get("RANK", "0") == "0":  # one line, not one per process
                print(f"trl-mintrl train: {finished}")
            return
    from ..mintrl.judge_watch import JudgeOutageError  # the judge stopped answering: stopped with a checkpoint

    try:
        trainer = run(recipe)
    except (RecipeError, InputError, RewardFunctionError, JudgeOutageError) as err:
        sys.exit(f"trl-mintrl train: error: {err}")
    exit_launched_process(trainer)  # a multi-process (gloo) launch ends without the native teardown
