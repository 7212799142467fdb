"""Every YAML under recipes/ loads into its config with no unknown key, and the paper recipes carry the papers'
hyperparameters (MInTRL Table 6, SORT's GRPO and repair settings)."""

import re
import warnings
from pathlib import Path

import pytest

from trl_mintrl.cli.recipe import check_environment, parse_recipe

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
ACCELERATE = sorted((RECIPES / "accelerate").glob("*.yaml"))
TRAINING = sorted(p for p in RECIPES.rglob("*.yaml") if p.parent.name != "accelerate")
LAUNCH = re.compile(r"(?:trl-mintrl|-m trl_mintrl\.cli) train ([\w-]+) --config (\S+)")

# accelerate config -> (distributed_type, num_processes, use_cpu)
ACCELERATE_EXPECTED = {
    "single_gpu": ("NO", 1, False),
    "multi_gpu": ("MULTI_GPU", 8, False),
    "zero2": ("DEEPSPEED", 8, False),
    "zero3": ("DEEPSPEED", 8, False),
    "fsdp2": ("FSDP", 8, False),
    "cpu": ("NO", 1, True),
    "cpu_ddp2": ("MULTI_GPU", 2, True),  # MULTI_CPU would silently run one process without mpirun
    "cpu_zero2": ("DEEPSPEED", 1, True),
    "zero2_6gpu_server": ("DEEPSPEED", 6, False),  # GPUs 0-1 left to vLLM servers
}


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def launch_commands(path: Path) -> list[tuple[str, str]]:
    """(method, recipe) of every launch command in the recipe's header comments."""
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    return LAUNCH.findall(header)


def parse(path: Path):
    """The recipe as its own header says to launch it; `--use_cpu` lets bf16 GPU recipes load on this machine."""
    (method, _), *_ = launch_commands(path)
    return parse_recipe([method, "--config", relative(path), "--use_cpu", "true"])


def test_accelerate_configs_load_with_no_unknown_key():
    from accelerate.commands.config.config_args import ClusterConfig

    assert {p.stem for p in ACCELERATE} == set(ACCELERATE_EXPECTED)
    for path in ACCELERATE:
        config = ClusterConfig.from_yaml_file(path)  # raises on keys accelerate does not know
        distributed, processes, use_cpu = ACCELERATE_EXPECTED[path.stem]
        assert (config.distributed_type.value, config.num_processes, config.use_cpu) == (
            distributed,
            processes,
            use_cpu,
        )
        assert config.mixed_precision == ("no" if use_cpu else "bf16"), path.stem
        if distributed == "DEEPSPEED":
            assert config.deepspeed_config["zero_stage"] == (3 if path.stem == "zero3" else 2)
        if distributed == "FSDP":
            assert config.fsdp_config["fsdp_version"] == 2


@pytest.mark.parametrize("path", TRAINING, ids=relative)
def test_training_recipe_parses_and_documents_its_own_launch(path):
    commands = launch_commands(path)
    assert commands, f"{relative(path)}: the header has no launch command"
    assert {recipe for _, recipe in commands} == {relative(path)}
    assert len({method for method, _ in commands}) == 1
    for config_file in re.findall(r"--config_file (\S+)", path.read_text()):
        assert (REPO / config_file).is_file(), config_file
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="`gradient_checkpointing` is deprecated")  # the old name warns
        recipe = parse(path)
    assert recipe.training_args.output_dir.startswith("outputs/")
    assert recipe.script_args.dataset_loader and recipe.reward_funcs


@pytest.mark.parametrize("method", ["grpo", "mintrl", "sort", "mintrl-sort"])
def test_cpu_recipes_need_nothing_from_the_hub(method):
    recipe = parse_recipe([method, "--config", f"recipes/cpu/{method}.yaml"])
    check_environment(recipe)  # data shipped in the repo, tiny model built on the fly, no report_to
    args = recipe.training_args
    assert recipe.script_args.build_tiny_model and args.use_cpu and not args.bf16 and args.report_to == []
    assert not args.disable_tqdm  # a user at a terminal sees the progress bar
    assert args.activation_checkpointing is False and args.ddp_find_unused_parameters is False  # no DDP warning


def paper_recipes(folder: str) -> list[Path]:
    return sorted((RECIPES / folder).glob("*.yaml"))


def test_mintrl_recipes_carry_table_6():
    recipes = {p.stem: parse(p) for p in paper_recipes("mintrl")}
    variants = {f"qwen3-{size}-{task}-{anchor}" for size in ("1.7b", "4b") for task in ("math", "code") for anchor in ("const", "proxy")}  # fmt: skip
    assert set(recipes) == variants | {"qwen3-4b-math-self"}
    for stem, recipe in recipes.items():
        args, task = recipe.training_args, stem.split("-")[2]
        assert (args.num_control_generations, args.num_intervened_generations) == (8, 8)
        # 32 prompts x 16 rollouts per optimizer step on the 8 GPUs of the launch command, one step per batch
        assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 8 == 32 * 16
        assert args.num_iterations == 1
        assert (args.temperature, args.top_p, args.max_completion_length) == (1.0, 1.0, 16384)
        assert (args.learning_rate, args.max_grad_norm, args.max_steps, args.optim.value) == (
            1e-6,
            1.0,
            500,
            "adamw_torch",
        )
        assert (args.intervention_steps, args.max_reviews, args.max_correction_tokens) == (200, 4, 64)
        assert args.chunk_size == {"math": 512, "code": 128}[task]
        assert args.step_split == "blank_line"  # the paper's steps; the package's default splits at lines
        assert args.kappa == {"math": -0.2, "code": -0.1}[task]
        assert args.regression_beta == 1e-3 and args.beta == 0.0
        assert recipe.script_args.reward_funcs == [task]
        assert recipe.script_args.dataset_loader == f"mintrl_{task}"
        assert args.judge_review_template == args.judge_correction_template == task
        if stem.endswith("self"):
            assert (args.judge, args.anchor) == ("self", "proxy")
        else:
            assert (args.judge, args.judge_model_name_or_path) == ("model", "Qwen/Qwen3-4B-Instruct-2507")
            assert args.judge_vllm_gpu_memory_utilization + args.vllm_gpu_memory_utilization <= 0.8
            assert args.anchor == stem.split("-")[-1]
        assert (
            recipe.model_args.model_name_or_path
            == {"1.7b": "Qwen/Qwen3-1.7B", "4b": "Qwen/Qwen3-4B"}[stem.split("-")[1]]
        )
        assert args.use_vllm and args.vllm_mode == "colocate" and args.bf16
        assert args.save_steps == 50 and args.report_to == ["wandb"]
        assert not args.push_to_hub and args.hub_model_id.startswith("your-name/")


def test_sort_recipes_carry_the_paper_settings():
    buffer = {"llama-3.2-3b-instruct-math": 64, "qwen2.5-7b-instruct-math": 16, "qwen3-4b-instruct-math": 8}
    models = {
        "llama-3.2-3b-instruct-math": "meta-llama/Llama-3.2-3B-Instruct",
        "qwen2.5-7b-instruct-math": "Qwen/Qwen2.5-7B-Instruct",
        "qwen3-4b-instruct-math": "Qwen/Qwen3-4B-Instruct-2507",
    }
    recipes = {p.stem: parse(p) for p in paper_recipes("sort")}
    assert set(recipes) == set(buffer)
    for stem, recipe in recipes.items():
        args = recipe.training_args
        assert (args.epsilon, args.epsilon_high, args.beta, args.learning_rate) == (0.2, 0.28, 0.0, 1e-6)
        assert (args.repair_batch_size, args.repair_beta) == (buffer[stem], 0.5)
        assert recipe.model_args.model_name_or_path == models[stem]
        assert (recipe.script_args.dataset_loader, recipe.script_args.reward_funcs) == ("sort_math", ["math"])
        assert recipe.script_args.dataset_limit == 15000


def test_grpo_baselines_match_their_method_recipes():
    pairs = {
        **{f"qwen3-{s}-{t}": f"mintrl/qwen3-{s}-{t}-const" for s in ("1.7b", "4b") for t in ("math", "code")},
        **{p.stem: f"sort/{p.stem}" for p in paper_recipes("sort")},
    }
    assert {p.stem for p in paper_recipes("grpo")} == set(pairs)
    for stem, other in pairs.items():
        grpo, method = parse(RECIPES / "grpo" / f"{stem}.yaml"), parse(RECIPES / f"{other}.yaml")
        a, b = grpo.training_args, method.training_args
        assert grpo.model_args.model_name_or_path == method.model_args.model_name_or_path
        for key in ("dataset_name", "dataset_loader", "dataset_limit", "reward_funcs"):
            assert getattr(grpo.script_args, key) == getattr(method.script_args, key), (stem, key)
        for key in ("learning_rate", "max_grad_norm", "max_steps", "num_train_epochs", "num_generations",
                    "generation_batch_size", "max_completion_length", "temperature", "beta"):  # fmt: skip
            assert getattr(a, key) == getattr(b, key), (stem, key)
        if other.startswith("sort/"):
            assert (a.epsilon, a.epsilon_high) == (0.2, 0.28)


def test_docs_table_lists_every_recipe_and_only_real_ones():
    """docs/training.md's recipe table has a row for every training recipe; no docs page (nor the README) names a
    recipe file that is not on disk."""
    table = set(re.findall(r"^\| `(recipes/[\w./-]+\.yaml)` \|", (REPO / "docs" / "training.md").read_text(), re.M))
    assert {relative(p) for p in TRAINING} <= table, {relative(p) for p in TRAINING} - table
    on_disk = {relative(p) for p in [*RECIPES.rglob("*.yaml"), *ACCELERATE]}  # recipes/accelerate is a link
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        mentioned = set(re.findall(r"recipes/[\w./-]+\.yaml", page.read_text()))
        assert mentioned <= on_disk, f"{page.name} names recipes that do not exist: {sorted(mentioned - on_disk)}"


def test_word_problem_data_is_what_the_real_task_generates():
    """recipes/cpu/data/word_problems.jsonl (the smollm2-*.yaml recipes' data) is the first 64 training problems
    of benchmarks/tasks/real/task.py at seed 0, as the recipes say."""
    import json

    from benchmarks.tasks.real.task import make_splits

    shipped = [
        json.loads(line) for line in (RECIPES / "cpu" / "data" / "word_problems.jsonl").read_text().splitlines()
    ]
    assert shipped == [p.row() for p in make_splits(seed=0)["train"][:64]]
    assert {row["num_steps"] for row in shipped} == {1, 2}
