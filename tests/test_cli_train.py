"""`trl-mintrl train`: TrlParser recipes, command-line overrides, errors raised before the model loads, model cards."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trl_mintrl.cli.recipe import RecipeError, _masked_command, check_environment, parse_recipe
from trl_mintrl.cli.train import main

REPO = Path(__file__).resolve().parent.parent
CPU_RECIPES = {method: str(REPO / "recipes" / "cpu" / f"{method}.yaml") for method in ("grpo", "mintrl", "sort")}
ARITHMETIC = str(REPO / "recipes" / "cpu" / "data" / "arithmetic.jsonl")


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    """Recipes name data and output folders relative to the repository root, where users run them."""
    monkeypatch.chdir(REPO)


def recipe_file(tmp_path, body: str, base: str = "mintrl") -> str:
    """A CPU recipe with `body` appended (later YAML keys replace earlier ones)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(Path(CPU_RECIPES[base]).read_text() + "\n" + body)
    return str(path)


def test_yaml_sets_fields_and_command_line_overrides_it():
    flags = [
        "--learning_rate",
        "5e-4",
        "--chunk_size",
        "4",
        "--reward_funcs",
        "benchmarks.tasks.toy.task.toy_reward",
        "math",
    ]
    recipe = parse_recipe(["mintrl", "--config", CPU_RECIPES["mintrl"], *flags])
    args = recipe.training_args
    assert args.learning_rate == 5e-4 and args.chunk_size == 4  # flags beat the YAML (1e-3 and 8)
    assert recipe.script_args.reward_funcs == ["benchmarks.tasks.toy.task.toy_reward", "math"]
    assert [f.__name__ for f in recipe.reward_funcs] == ["toy_reward", "math_reward"]
    # untouched YAML values (all differ from the config defaults)
    assert (args.max_steps, args.intervention_steps, args.max_completion_length, args.bf16) == (12, 8, 48, False)
    assert args.num_generations == 8  # derived from 4 controls + 4 intervened
    assert recipe.model_args.model_name_or_path == "outputs/tiny-model"
    assert recipe.script_args.judge_function == "benchmarks.tasks.toy.task.rule_judge"
    assert recipe.method == "mintrl" and recipe.config_path == CPU_RECIPES["mintrl"]


def test_yaml_values_are_converted_like_flags(tmp_path):
    path = recipe_file(
        tmp_path,
        'reward_funcs: benchmarks.tasks.toy.task.toy_reward\nmax_steps: "3"\nbf16: "false"\nlearning_rate: 2e-4\n',
    )
    recipe = parse_recipe(["mintrl", "--config", path])
    assert recipe.script_args.reward_funcs == [
        "benchmarks.tasks.toy.task.toy_reward"
    ]  # a scalar for a list field becomes a one-item list
    assert recipe.training_args.max_steps == 3 and recipe.training_args.bf16 is False
    assert recipe.training_args.learning_rate == 2e-4  # YAML reads `2e-4` as a string


def test_unknown_recipe_key_is_named_with_a_suggestion(tmp_path):
    with pytest.raises(RecipeError, match=r"'learning_rat' \(did you mean 'learning_rate'\?\)"):
        parse_recipe(["mintrl", "--config", recipe_file(tmp_path, "learning_rat: 0.1\n")])


@pytest.mark.parametrize(
    "flags, key",
    [
        (["--no_such_flag", "1"], "--no_such_flag"),
        (["--kapa", "1"], r"'--kapa' \(did you mean '--kappa'\?\)"),
        (["--learning_rat", "0.1"], "--learning_rat"),  # argparse would otherwise accept the abbreviation
        (["--learning_rate", "abc"], "--learning_rate"),
        (["--anchor", "linear"], "--anchor"),
    ],
)
def test_bad_command_line_is_named(flags, key):
    with pytest.raises(RecipeError, match=key):
        parse_recipe(["mintrl", "--config", CPU_RECIPES["mintrl"], *flags])


@pytest.mark.parametrize(
    "body, base, message",
    [
        ("max_steps: many\n", "mintrl", r"'max_steps': invalid value 'many'"),
        ("max_steps: 2.5\n", "mintrl", r"'max_steps': invalid value 2.5 \(expected int\)"),
        ("bf16: maybe\n", "mintrl", r"'bf16': invalid value 'maybe' \(expected true or false\)"),
        ("anchor: linear\n", "mintrl", r"'anchor': 'linear' is not one of \['const', 'proxy'\]"),
        ("num_generations: 6\n", "mintrl", "num_generations=6 conflicts"),
        ("reward_funcs: [nope]\n", "mintrl", "reward_funcs: unknown reward 'nope'"),
        ("reward_funcs: [no_module.fn]\n", "mintrl", "reward_funcs: cannot import 'no_module.fn'"),
        ("reward_weights: [1.0, 2.0]\n", "mintrl", "reward_weights has 2 entries"),
        ("dataset_loader: nope\n", "grpo", "dataset_loader='nope' is not one of"),
        (
            "dataset_loader: mintrl_code\nreward_funcs: [math]\n",
            "grpo",
            "reward_funcs has 'math'.*use reward_funcs: \\[code\\]",
        ),
        ("prompt_template: 'no placeholder'\ndataset_loader: mintrl_math\n", "grpo", "prompt_template"),
        ("judge_function: benchmarks.tasks.toy.task.rule_judge\n", "sort", "judge_function is a MInTRL setting"),
        ("judge_function: benchmarks.tasks.toy.task.no_judge\n", "mintrl", "judge_function: cannot import"),
        ("warm_start_function: benchmarks.tasks.real.warm_start.nope\n", "grpo", "warm_start_function: cannot import"),
        ("push_to_hub: true\n", "grpo", "push_to_hub=true needs hub_model_id"),
        ("repair_beta: 2.0\n", "sort", "repair_beta"),
        ("max_steps: -3\n", "sort", r"max_steps=-3: give a positive number of steps, or -1 to train for num_train"),
    ],
)
def test_bad_recipe_values_are_named(tmp_path, body, base, message):
    with pytest.raises(ValueError, match=message):
        parse_recipe([base, "--config", recipe_file(tmp_path, body, base)])


def test_max_steps_minus_one_means_epochs_and_other_negatives_stop_before_loading(tmp_path):
    assert parse_recipe(["grpo", "--config", CPU_RECIPES["grpo"], "--max_steps", "-1"]).training_args.max_steps == -1
    with pytest.raises(SystemExit, match=r"^trl-mintrl train: error: max_steps=-3: give a positive number"):
        main(["mintrl", "--config", CPU_RECIPES["mintrl"], "--max_steps", "-3", "--output_dir", str(tmp_path)])


@pytest.mark.parametrize(
    "body, where, problem",
    [
        ("max_steps: 3\nreward_funcs: [toy\n", ":3:1", "while parsing a flow sequence, expected ',' or ']'"),
        ("max_steps: 3\n  seed: 1\n", ":2:7", "mapping values are not allowed here"),
    ],
)
def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path, body, where, problem):
    path = tmp_path / "broken.yaml"
    path.write_text(body)
    with pytest.raises(SystemExit) as exit_info:
        main(["mintrl", "--config", str(path)])
    message = str(exit_info.value.code)
    assert message.startswith(f"trl-mintrl train: error: --config {path}{where}: YAML syntax error ({problem}")
    assert "\n" not in message


def test_data_without_our_columns_names_the_loader_flag_train_takes(tmp_path, tiny_model_path):
    data = tmp_path / "raw.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["grpo", "--config", CPU_RECIPES["grpo"], "--model_name_or_path", tiny_model_path, "--dataset_name",
              str(data), "--output_dir", str(tmp_path / "out")])  # fmt: skip
    message = str(exit_info.value.code)
    assert "dataset has columns ['answer', 'problem']: expected `prompt` plus `solution`" in message
    assert "`--dataset_loader NAME` (recipe key `dataset_loader`) for `trl-mintrl train`" in message


def test_method_and_config_file_are_checked():
    with pytest.raises(RecipeError, match="one of \\['grpo', 'mintrl', 'sort', 'mintrl-sort'\\]"):
        parse_recipe(["ppo", "--config", CPU_RECIPES["grpo"]])
    with pytest.raises(RecipeError, match="no such file"):
        parse_recipe(["grpo", "--config", "recipes/cpu/missing.yaml"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--dataset_name", "recipes/cpu/data/missing.jsonl"],
            "dataset_name='recipes/cpu/data/missing.jsonl': no such",
        ),
        (["--build_tiny_model", "false", "--model_name_or_path", "outputs/no-model-here"], "model_name_or_path="),
        (["--build_tiny_model", "false", "--model_name_or_path", "someone/not-cached"], "HF_HUB_OFFLINE=1"),
        (["--push_to_hub", "true", "--hub_model_id", "me/tiny"], "Hub is offline"),
    ],
)
def test_environment_is_checked_before_loading(flags, message):
    recipe = parse_recipe(["grpo", "--config", CPU_RECIPES["grpo"], *flags])
    with pytest.raises(RecipeError, match=message):
        check_environment(recipe)


def test_push_without_token_fails_up_front(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    recipe = parse_recipe(["grpo", "--config", CPU_RECIPES["grpo"], "--push_to_hub", "true", "--hub_model_id", "me/x"])
    with pytest.raises(RecipeError, match="needs a Hugging Face token"):
        check_environment(recipe)
    recipe = parse_recipe(
        [
            "grpo",
            "--config",
            CPU_RECIPES["grpo"],
            "--push_to_hub",
            "true",
            "--hub_model_id",
            "me/x",
            "--hub_token",
            "t",
        ]
    )
    check_environment(recipe)  # a token given in the recipe or on the command line is enough


def test_missing_logging_integration_fails_up_front():
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    missing = next(name for name in INTEGRATION_TO_CALLBACK if name not in get_available_reporting_integrations())
    recipe = parse_recipe(["grpo", "--config", CPU_RECIPES["grpo"], "--report_to", missing])
    with pytest.raises(RecipeError, match=f"report_to=.*{missing}.* not installed"):
        check_environment(recipe)


def test_main_exits_with_the_message_and_loads_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["grpo", "--config", CPU_RECIPES["grpo"], "--output_dir", str(out), "--push_to_hub", "true"])
    assert "trl-mintrl train: error: push_to_hub=true needs hub_model_id" in str(exit_info.value.code)
    assert not out.exists()


def test_help_names_the_methods_and_the_flags_that_are_no_config_fields(capsys):
    from trl_mintrl.cli import main as cli_main
    from trl_mintrl.cli.launch import resolve_accelerate_config
    from trl_mintrl.cli.recipe import OPTIONS_HELP

    cli_main(["train", "--help"])  # through the dispatcher, which takes launcher flags off first
    usage = capsys.readouterr().out
    assert usage.startswith("usage: trl-mintrl train {grpo,mintrl,sort,mintrl-sort} [--config RECIPE.yaml]")
    for expected in ("--accelerate_config NAME|PATH", "--num_processes N", "--main_process_port", "mintrl-sort   "):
        assert expected in usage, expected
    for name in re.search(r"\(e\.g\. ([\w, ]+)\)", OPTIONS_HELP).group(1).split(", "):
        resolve_accelerate_config(name)  # every config name the help offers exists
    with pytest.raises(SystemExit) as exit_info:
        main(["sort", "--help"])
    assert exit_info.value.code == 0
    fields = capsys.readouterr().out
    assert OPTIONS_HELP in fields  # the command line's own flags, after the fields
    assert re.search(r"--repair_beta REPAIR_BETA.*\(default: 0.5\)", fields, flags=re.S)  # fields show defaults


def test_train_without_arguments_prints_usage_and_fails():
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert str(exit_info.value.code).startswith("usage: trl-mintrl train {grpo,mintrl,sort,mintrl-sort}")
    assert str(exit_info.value.code).endswith(
        "error: name the method, one of ['grpo', 'mintrl', 'sort', 'mintrl-sort']."
    )


def test_too_little_data_for_one_batch_fails_instead_of_training_zero_steps(tmp_path, tiny_model_path):
    small = tmp_path / "three.jsonl"
    small.write_text("".join(Path(ARITHMETIC).read_text().splitlines(keepends=True)[:3]))
    with pytest.raises(SystemExit, match="the train split has 3 prompts but one generation batch takes 4"):
        main(["grpo", "--config", CPU_RECIPES["grpo"], "--model_name_or_path", tiny_model_path, "--dataset_name",
              str(small), "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_secrets_stay_out_of_the_card_command():
    command = _masked_command(
        "grpo", ["--config", "r.yaml", "--hub_token", "hf_abc", "--hub_token=hf_def", "--seed", "1"]
    )
    assert command == "trl-mintrl train grpo --config r.yaml --hub_token *** --hub_token=*** --seed 1"


def test_sort_recipe_trains_and_cards_name_method_base_model_and_recipe(tmp_path, tiny_model_path):
    from safetensors.torch import load_file

    out = tmp_path / "out"
    main(["sort", "--config", CPU_RECIPES["sort"], "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
          "--max_steps", "2", "--save_steps", "2"])  # fmt: skip
    card = (out / "README.md").read_text()
    for expected in (
        "Method: **SORT** (Selective Off-Policy Reference Tuning with Plan Guidance)",
        f"Base model: `{tiny_model_path}`",
        f"fine-tuned version of `{tiny_model_path}` (a local model)",
        f"Recipe: `{CPU_RECIPES['sort']}`",
        f"trl-mintrl train sort --config {CPU_RECIPES['sort']} --model_name_or_path {tiny_model_path}",
        "@inproceedings{sort2026",  # the method's citation (TRL's mechanism, from SORTTrainer._paper)
        "huggingface.co/papers/2605.11505",
        f'model="{out}"',  # quick start loads the saved folder when there is no hub_model_id
    ):
        assert expected in card, expected
    assert "None" not in card.split("### Framework versions")[0]
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "README.md").read_text().count("Method: **SORT**") == 1
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "sort_buffer.json"):
        assert (checkpoint / name).is_file(), name
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "loss" in h] == [1, 2]
    assert history[-1]["sort/repairs"] >= 1  # the random model gets everything wrong: prompts were repaired
    before, after = load_file(f"{tiny_model_path}/model.safetensors"), load_file(out / "model.safetensors")
    assert any(not after[name].equal(before[name]) for name in before)


def copied_warm_start(model_dir: str) -> str:
    """A recipe's `warm_start_function` for the test: the model copied to $WARM_START_TEST_DIR, its argument noted."""
    import shutil

    out = Path(os.environ["WARM_START_TEST_DIR"])
    shutil.copytree(model_dir, out)
    (out / "warmed_from.txt").write_text(model_dir)
    return str(out)


def test_a_warm_start_function_is_called_on_the_model_and_training_starts_from_its_folder(
    tmp_path, tiny_model_path, monkeypatch
):
    warm = tmp_path / "warm"
    monkeypatch.setenv("WARM_START_TEST_DIR", str(warm))
    out = tmp_path / "out"
    main(["grpo", "--config", CPU_RECIPES["grpo"], "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
          "--warm_start_function", "tests.test_cli_train.copied_warm_start", "--max_steps", "1", "--save_steps", "1"])  # fmt: skip
    assert (warm / "warmed_from.txt").read_text() == tiny_model_path
    assert f"Base model: `{warm}`" in (out / "README.md").read_text()


def test_model_card_mixin_is_added_once_and_first():
    from trl import GRPOTrainer

    from trl_mintrl.trainer_base import TrainerExtras, with_trainer_extras

    trainer_cls = with_trainer_extras(GRPOTrainer)
    assert trainer_cls.__name__ == "GRPOTrainer" and trainer_cls.__mro__[1:3] == (TrainerExtras, GRPOTrainer)
    assert with_trainer_extras(trainer_cls) is trainer_cls


def test_resume_true_picks_the_last_complete_checkpoint_before_loading(tmp_path):
    out = tmp_path / "out"
    flags = ["--output_dir", str(out), "--resume_from_checkpoint", "true"]
    recipe = parse_recipe(["sort", "--config", CPU_RECIPES["sort"], *flags])
    with pytest.raises(RecipeError, match=r"resume_from_checkpoint=true: no complete checkpoint-N folder"):
        check_environment(recipe)  # nothing to resume: refused, not started afresh
    for step in (1, 2):
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # an empty safetensors file
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (out / "checkpoint-1" / "sort_buffer.json").write_text("{}")  # checkpoint-2 lacks SORT's state: cut short
    recipe = parse_recipe(["sort", "--config", CPU_RECIPES["sort"], *flags])
    check_environment(recipe)
    assert recipe.training_args.resume_from_checkpoint == str(out / "checkpoint-1")
    recipe = parse_recipe(
        ["sort", "--config", CPU_RECIPES["sort"], "--resume_from_checkpoint", str(out / "checkpoint-2")]
    )
    with pytest.raises(RecipeError, match="checkpoint-2' is incomplete: sort_buffer.json is missing"):
        check_environment(recipe)
    recipe = parse_recipe(
        ["grpo", "--config", CPU_RECIPES["grpo"], "--resume_from_checkpoint", str(out / "checkpoint-2")]
    )
    check_environment(recipe)  # plain GRPO has no extra state file
    recipe = parse_recipe(["sort", "--config", CPU_RECIPES["sort"], "--resume_from_checkpoint", "false"])
    check_environment(recipe)
    assert recipe.training_args.resume_from_checkpoint is None


@pytest.mark.parametrize("method", ["grpo", "sort"])  # plain GRPO is TRL's GRPOTrainer: the CLI guards it too
def test_resuming_a_finished_run_trains_nothing_and_loads_nothing(tmp_path, capsys, monkeypatch, method):
    out = tmp_path / "out"
    folder = out / "checkpoint-12"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 12, "epoch": 0.75}))
    (folder / "sort_buffer.json").write_text("{}")
    started = []
    monkeypatch.setattr("trl_mintrl.cli.train.run", started.append)
    flags = ["--output_dir", str(out), "--resume_from_checkpoint", "true"]
    main([method, "--config", CPU_RECIPES[method], *flags])  # the recipe's max_steps: 12
    assert started == [] and folder.is_dir()
    assert f"trl-mintrl train: Nothing to resume: {folder} is at step 12 (epoch 0.75), the end of the run " in (
        capsys.readouterr().out
    )
    main([method, "--config", CPU_RECIPES[method], *flags, "--max_steps", "13"])  # more steps: it does resume
    assert [recipe.training_args.resume_from_checkpoint for recipe in started] == [str(folder)]


@pytest.mark.parametrize(
    "recipe_of, command, keys",
    [
        ("mintrl", "grpo", "'num_control_generations'"),
        ("sort", "grpo", "'repair_beta'"),
        ("sort", "mintrl", "'repair_beta'"),
        ("mintrl", "sort", "'kappa'"),
    ],
)
def test_another_methods_recipe_names_the_command_to_use(recipe_of, command, keys):
    with pytest.raises(
        RecipeError, match=f"{keys}.*this looks like a {recipe_of} recipe.*`trl-mintrl train {recipe_of}"
    ):
        parse_recipe([command, "--config", CPU_RECIPES[recipe_of]])


def test_another_methods_flag_names_the_command_to_use():
    with pytest.raises(RecipeError, match=r"command-line argument\(s\) \['--kappa'\].*`trl-mintrl train mintrl"):
        parse_recipe(["grpo", "--config", CPU_RECIPES["grpo"], "--kappa", "0.5"])


def test_dataset_loader_defaults_to_prepared_when_only_dataset_name_is_set(tmp_path):
    from trl_mintrl.cli.train import _load_split

    recipe = parse_recipe(["grpo", "--config", recipe_file(tmp_path, "dataset_loader: null\n", "grpo")])
    assert recipe.script_args.dataset_loader == "prepared"
    rows = _load_split(recipe.script_args, "train", 2)  # what `run` loads
    assert {"prompt", "solution"} <= set(rows.column_names) and len(rows) == 2
    with pytest.raises(RecipeError, match="no data: set `dataset_name`"):
        parse_recipe(["grpo", "--config", recipe_file(tmp_path, "dataset_loader: null\ndataset_name: null\n", "grpo")])


@pytest.mark.parametrize(
    "body, message",
    [
        ("dataset_streaming: true\n", "dataset_streaming=true is not supported.*dataset_limit"),
        ("datasets:\n  - path: trl-lib/tldr\n", r"\['datasets'\]: TRL's dataset mixtures .* are not supported"),
        ("streaming: true\ntest_split_size: 0.1\n", r"\['streaming', 'test_split_size'\]: TRL's dataset mixtures"),
    ],
)
def test_streaming_and_dataset_mixtures_are_refused_not_ignored(tmp_path, body, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe(["grpo", "--config", recipe_file(tmp_path, body, "grpo")])


def test_dotted_reward_path_resolves_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "my_cwd_rewards.py").write_text(
        "def correctness(completions, **kwargs):\n    return [0.5 for _ in completions]\n"
    )
    monkeypatch.chdir(tmp_path)  # as a user runs it: the rewards file beside the recipe, not installed
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    recipe = parse_recipe(["grpo", "--config", CPU_RECIPES["grpo"], "--reward_funcs", "my_cwd_rewards.correctness"])
    (reward,) = recipe.reward_funcs
    assert reward.__module__ == "my_cwd_rewards" and reward(completions=["a", "b"]) == [0.5, 0.5]
    monkeypatch.delitem(__import__("sys").modules, "my_cwd_rewards")


def test_a_repository_recipe_resolves_its_names_and_data_from_any_folder(tmp_path):
    """recipes/cpu/mintrl.yaml names `benchmarks.tasks.toy.task.*` (the repository's toy task, not installed) and
    `recipes/cpu/data/arithmetic.jsonl`, both relative to the repository: run from another folder, in a fresh
    interpreter without the repository on its path, they resolve relative to the recipe's repository."""
    script = (
        "import json, sys\n"
        "from trl_mintrl.cli.recipe import check_environment, parse_recipe\n"
        f"recipe = parse_recipe(['mintrl', '--config', {CPU_RECIPES['mintrl']!r}])\n"
        "check_environment(recipe)\n"
        "print(json.dumps([recipe.script_args.dataset_name, recipe.reward_funcs[0].__module__]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    dataset, reward_module = json.loads(done.stdout.strip().splitlines()[-1])
    assert dataset == ARITHMETIC and reward_module == "benchmarks.tasks.toy.task"


@pytest.fixture
def machine_without_namespaces(monkeypatch):
    """`unshare --net --pid` refused (a container without user namespaces), and `code_reward`'s sandbox not built yet
    in this process, as at the start of `trl-mintrl train`."""
    from trl_mintrl.rewards import code, sandbox

    monkeypatch.setattr(sandbox, "_namespace_prefix", lambda: None)
    monkeypatch.setattr(sandbox, "interpreter_hidden_paths", lambda: [])  # as root, nobody must read Python
    monkeypatch.setattr(sandbox, "_fallback_warned", False)
    monkeypatch.setattr(code, "_default_sandbox", None)
    return code


@pytest.mark.parametrize("method", ["mintrl", "sort"])
@pytest.mark.parametrize(
    "isolation, message",
    [
        ("namespaces", r"\$TRL_MINTRL_SANDBOX_ISOLATION=namespaces: .*not permitted here.*CAP_SYS_ADMIN.*=auto\)"),
        ("vm", r"\$TRL_MINTRL_SANDBOX_ISOLATION=vm: .*must be 'auto', 'namespaces' or 'process'"),
    ],
    ids=["strict", "unknown"],
)
def test_sandbox_isolation_it_cannot_give_fails_before_the_model_loads(
    method, isolation, message, machine_without_namespaces, monkeypatch, tmp_path
):
    monkeypatch.setenv("TRL_MINTRL_SANDBOX_ISOLATION", isolation)
    monkeypatch.setattr("trl_mintrl.cli.train.run", lambda recipe: pytest.fail("reached run(): the model would load"))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main([method, "--config", CPU_RECIPES[method], "--reward_funcs", "code", "--output_dir", str(out)])
    error = str(exit_info.value.code)
    assert error.startswith("trl-mintrl train: error: reward_funcs has code_reward, whose sandbox cannot start here")
    assert re.search(message, error) and "\n" not in error, error
    assert not out.exists()


def test_code_reward_sandbox_is_built_before_the_model_loads(machine_without_namespaces, monkeypatch, caplog):
    """Default isolation: the fallback (no network isolation) is taken and warned about at start, not mid-step."""
    monkeypatch.delenv("TRL_MINTRL_SANDBOX_ISOLATION", raising=False)
    check_environment(
        parse_recipe(
            ["sort", "--config", CPU_RECIPES["sort"], "--reward_funcs", "code", "benchmarks.tasks.toy.task.toy_reward"]
        )
    )
    assert machine_without_namespaces._default_sandbox.isolation == "process"
    assert "WITHOUT network isolation" in caplog.text
    machine_without_namespaces._default_sandbox = None
    check_environment(parse_recipe(["sort", "--config", CPU_RECIPES["sort"]]))  # no code reward: no sandbox
    assert machine_without_namespaces._default_sandbox is None


def test_a_reward_module_whose_strict_sandbox_cannot_start_is_named(machine_without_namespaces, tmp_path, monkeypatch):
    """`make_code_reward(isolation="namespaces")` in the user's reward module fails when the recipe is parsed."""
    (tmp_path / "strict_rewards.py").write_text(
        "from trl_mintrl.rewards import make_code_reward\n\nstrict = make_code_reward(isolation='namespaces')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RecipeError, match=r"reward_funcs: cannot import 'strict_rewards.strict': isolation='namespac"):
        parse_recipe(["sort", "--config", CPU_RECIPES["sort"], "--reward_funcs", "strict_rewards.strict"])
    monkeypatch.delitem(__import__("sys").modules, "strict_rewards", raising=False)
