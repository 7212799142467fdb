"""Does MInTRL / SORT learn where GRPO stalls? GRPO vs MInTRL-const vs MInTRL-proxy vs SORT on the toy task.

    python benchmarks/learning.py            # full run: 3 seeds, intensity sweep (~30 min on 2 free cores)
    python benchmarks/learning.py --quick    # 1 seed, fewer steps and eval prompts (~5 min)

Every method starts from the committed warm start (`trl_mintrl/toy/warm_start`), trains for the same number of
optimizer steps on the same prompts (per seed) with the same rollouts per step and optimiser, and is evaluated on
the same held-out problems (pass@1 and pass@8 from 8 samples at temperature 1). Writes `learning.md`,
`learning.json` and PNG plots to `--out` (default `benchmarks/results/`, `benchmarks/results/quick/` with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

RESULTS = Path(__file__).parent / "results"
TRAIN_SEED, HELDOUT_SEED = 1000, 999
LOGGED = (
    "reward",
    "frac_reward_zero_std",
    "step_time",
    "grad_norm",
    "entropy",
    "completions/mean_length",
    "mintrl/judge_token_frac",
    "mintrl/intervention_rate",
    "mintrl/reward_gap",
    "mintrl/reward_control",
    "mintrl/reward_intervened",
    "mintrl/judge_token_nll",
    "sort/all_wrong_frac",
    "sort/repairs",
    "sort/repair_loss",
    "sort/mean_weight",
)


def run_job(job: dict) -> dict:
    """Train one (method, seed, overrides) run in this process and return its curve, final scores and logs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    from trl_mintrl.toy import WARM_START_DIR, evaluate, make_dataset, make_problems
    from trl_mintrl.toy.training import RL_MAX_OPS, RL_MIN_OPS, build_trainer, rl_config

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    curve_problems = make_problems(job["curve_prompts"], RL_MIN_OPS, RL_MAX_OPS, seed=HELDOUT_SEED)
    final_problems = make_problems(job["final_prompts"], RL_MIN_OPS, RL_MAX_OPS, seed=HELDOUT_SEED)
    train = make_dataset(job["steps"] * 16, RL_MIN_OPS, RL_MAX_OPS, seed=TRAIN_SEED + job["seed"])
    curve, eval_seconds = {}, 0.0

    class CurveCallback(TrainerCallback):
        """Held-out pass@1 every `eval_every` steps (on the small curve set; not counted in training time)."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            nonlocal eval_seconds
            if state.global_step % job["eval_every"] == 0 and state.global_step < job["steps"]:
                start = time.perf_counter()
                curve[state.global_step] = evaluate(model, tokenizer, curve_problems, 8, ks=(1,))["pass@1"]
                eval_seconds += time.perf_counter() - start

    sort_weights = _record_sort_weights() if job["method"] == "sort" else None
    args = rl_config(
        job["method"], f"/tmp/trl_mintrl_bench/{job['name']}", steps=job["steps"], seed=job["seed"], **job["overrides"]
    )
    trainer = build_trainer(job["method"], model, tokenizer, train, args, callbacks=[CurveCallback()])
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start - eval_seconds
    final = evaluate(trainer.model, tokenizer, final_problems, 8, ks=(1, 8))
    curve[job["steps"]] = evaluate(trainer.model, tokenizer, curve_problems, 8, ks=(1,))["pass@1"]
    logs = [
        {"step": entry["step"], **{k: entry[k] for k in LOGGED if k in entry}}
        for entry in trainer.state.log_history
        if "reward" in entry
    ]
    result = {**job, "final": final, "curve": curve, "logs": logs, "train_seconds": train_seconds}
    if sort_weights is not None:
        result["sort_weights"] = {k: v / max(sort_weights["repairs"], 1) for k, v in sort_weights.items()}
    return result


def _record_sort_weights() -> dict:
    """Record how SORT's token weights w = sqrt(p_base * p_plan) spread each repair's learning signal.

    The gradient of `w * log p` through the target token's logit is `w * (1 - p)`, so `signal_vs_sft` =
    sum w(1-p) / sum (1-p) is the share of plain SFT's learning signal on the same references that the repair keeps,
    and `weight_hard` the mean weight on the tokens the policy gets wrong (p_base < 0.5). Wraps the function SORT's
    trainer calls for its metrics (padding has p_base = p_plan = 1 and adds nothing to either sum).
    """
    import torch

    import trl_mintrl.sort.trainer as sort_trainer

    stats = {"repairs": 0, "signal_vs_sft": 0.0, "weight_hard": 0.0, "hard_share": 0.0}
    original = sort_trainer.sort_repair_weights

    def recording(base_logps, plan_logps, beta):
        weights = original(base_logps, plan_logps, beta)
        p_base = base_logps.exp()
        real = (base_logps != 0) | (plan_logps != 0)
        hard = (p_base < 0.5) & real
        stats["repairs"] += 1
        stats["signal_vs_sft"] += ((weights * (1 - p_base)).sum() / (1 - p_base).sum().clamp(min=1e-9)).item()
        stats["weight_hard"] += (weights[hard].mean() if hard.any() else torch.tensor(1.0)).item()
        stats["hard_share"] += (hard.sum() / real.sum().clamp(min=1)).item()
        return weights

    sort_trainer.sort_repair_weights = recording
    return stats


def baseline(job: dict) -> dict:
    """The warm start's own held-out scores (step 0 of every curve)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_mintrl.toy import WARM_START_DIR, evaluate, make_problems
    from trl_mintrl.toy.training import RL_MAX_OPS, RL_MIN_OPS

    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    final = make_problems(job["final_prompts"], RL_MIN_OPS, RL_MAX_OPS, seed=HELDOUT_SEED)
    curve = make_problems(job["curve_prompts"], RL_MIN_OPS, RL_MAX_OPS, seed=HELDOUT_SEED)
    return {
        "final": evaluate(model, tokenizer, final, 8, ks=(1, 8)),
        "curve0": evaluate(model, tokenizer, curve, 8, ks=(1,))["pass@1"],
    }


def plan_jobs(args) -> list[dict]:
    common = dict(
        steps=args.steps,
        eval_every=max(1, args.steps // 3),
        curve_prompts=args.curve_prompts,
        final_prompts=args.final_prompts,
    )
    jobs = []
    for seed in args.seeds:
        for label, (method, overrides) in args.labels.items():
            jobs.append(
                dict(
                    common,
                    name=f"{label}-s{seed}",
                    group="main",
                    label=label,
                    method=method,
                    seed=seed,
                    overrides=overrides,
                )
            )
        for reviews in args.sweep_reviews if args.sweep and seed in args.seeds[: args.sweep_seeds] else ():
            overrides = {"intervention_steps": 0} if reviews == 0 else {"max_reviews": reviews}
            if reviews == 2 and "mintrl-const" in args.labels:
                continue  # the main mintrl-const run (max_reviews=2) is this sweep point
            jobs.append(
                dict(
                    common,
                    eval_every=args.steps + 1,  # final scores only
                    name=f"sweep-r{reviews}-s{seed}",
                    group="sweep",
                    method="mintrl-const",
                    seed=seed,
                    overrides=overrides,
                    max_reviews=reviews,
                )
            )
    return jobs


def mean_spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def log_mean(run: dict, key: str, until: int | None = None) -> float | None:
    values = [e[key] for e in run["logs"] if key in e and (until is None or e["step"] <= until)]
    return statistics.mean(values) if values else None


def report(results: list[dict], base: dict, args, out: Path, wall: float) -> str:
    main_runs = [r for r in results if r["group"] == "main"]
    by_method = {label: [r for r in main_runs if r["label"] == label] for label in args.labels}
    grpo_p1 = {r["seed"]: r["final"]["pass@1"] for r in by_method.get("grpo", [])}
    lines = [
        f"Held-out: {args.final_prompts} problems with {_ops()} operations, 8 samples each (temperature 1). "
        f"{args.steps} optimizer steps x 128 rollouts (16 prompts x 8), seeds {args.seeds}. Warm start: pass@1 "
        f"{100 * base['final']['pass@1']:.1f}, pass@8 {100 * base['final']['pass@8']:.1f}. "
        "Values in %, mean ± std over seeds.",
        "",
        "| method | pass@1 | pass@8 | pass@1 - GRPO (paired by seed) | too few / too many steps "
        "| judge-token share | intervention rate | reward gap (interv. - control) | judge-token NLL (nats) "
        "| train s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, runs in by_method.items():
        p1 = [r["final"]["pass@1"] for r in runs]
        p8 = [r["final"]["pass@8"] for r in runs]
        gains = [r["final"]["pass@1"] - grpo_p1[r["seed"]] for r in runs if r["seed"] in grpo_p1]
        cells = []
        for key in ("mintrl/judge_token_frac", "mintrl/intervention_rate", "mintrl/reward_gap"):
            vals = [v for r in runs if (v := log_mean(r, key, until=_interv_steps(r))) is not None]
            cells.append(mean_spread(vals) if vals else "-")
        nll = [v for r in runs if (v := log_mean(r, "mintrl/judge_token_nll", until=_interv_steps(r))) is not None]
        cells.append(f"{statistics.mean(nll):.2f}" if nll else "-")
        lines.append(
            f"| {method} | {mean_spread(p1)} | {mean_spread(p8)} | "
            f"{mean_spread(gains) if method != 'grpo' and gains else '-'} | {_step_errors(runs)} | "
            f"{' | '.join(cells)} | "
            f"{statistics.mean(r['train_seconds'] for r in runs):.0f} |"
        )
    sweep = sweep_points(results, args)
    if sweep:
        lines += [
            "",
            "Intervention-intensity sweep (MInTRL-const, chunk 16 tokens, varying max_reviews; gain = pass@1 minus "
            "the same trainer without interventions, paired by seed):",
            "",
            "| max_reviews | judge-token share | intervention rate | reward gap | pass@1 | gain over no intervention "
            "| too few / too many steps |",
            "|---|---|---|---|---|---|---|",
        ]
        for point in sweep:
            lines.append(
                f"| {point['max_reviews']} | {mean_spread(point['share'])} | {mean_spread(point['rate'])} | "
                f"{mean_spread(point['gap'])} | {mean_spread(point['p1'])} | {mean_spread(point['gain'])} | "
                f"{_step_errors(point['runs'])} |"
            )
    sort_runs = [r for r in main_runs if "sort_weights" in r]
    if sort_runs:
        mean = {k: statistics.mean(r["sort_weights"][k] for r in sort_runs) for k in ("signal_vs_sft", "weight_hard")}
        hard = statistics.mean(r["sort_weights"]["hard_share"] for r in sort_runs)
        lines += [
            "",
            f"SORT repairs ({', '.join(sorted({r['label'] for r in sort_runs}))}): tokens the policy gets wrong "
            f"(p_base < 0.5) are {100 * hard:.1f}% of reference tokens and get mean weight {mean['weight_hard']:.2f}; "
            f"the repair keeps {100 * mean['signal_vs_sft']:.0f}% of the learning signal (sum w(1-p) / sum (1-p)) "
            "that plain SFT on the same references would give.",
        ]
    lines += [
        "",
        f"Baseline (warm start) too few / too many steps: {_step_errors([base])}. "
        f"Total wall time {wall / 60:.1f} min with {args.workers} worker(s).",
    ]
    return "\n".join(lines)


def _step_errors(runs: list[dict]) -> str:
    """Share of held-out samples with fewer / more computation steps than operations (mean over runs)."""
    few = statistics.mean(r["final"]["too_few_steps"] for r in runs)
    many = statistics.mean(r["final"]["too_many_steps"] for r in runs)
    return f"{100 * few:.1f} / {100 * many:.1f}"


def _ops() -> str:
    from trl_mintrl.toy.training import RL_MAX_OPS, RL_MIN_OPS

    return f"{RL_MIN_OPS}-{RL_MAX_OPS}"


def _interv_steps(run: dict) -> int:
    return run["overrides"].get("intervention_steps", max(1, int(0.4 * run["steps"])))


def sweep_points(results: list[dict], args) -> list[dict]:
    """Per max_reviews: judge-token share, intervention rate, reward gap (intervention phase), pass@1 and gain."""
    if not args.sweep:
        return []
    runs = {}
    for r in results:
        if r["group"] == "sweep":
            runs[(r["max_reviews"], r["seed"])] = r
        elif r["label"] == "mintrl-const":
            runs[(2, r["seed"])] = r
    points = []
    for reviews in args.sweep_reviews:
        point = {"max_reviews": reviews, "share": [], "rate": [], "gap": [], "p1": [], "gain": [], "runs": []}
        for seed in args.seeds:
            run, none = runs.get((reviews, seed)), runs.get((0, seed))
            if run is None or none is None:
                continue
            until = _interv_steps(run)
            point["share"].append(log_mean(run, "mintrl/judge_token_frac", until) or 0.0)
            point["rate"].append(log_mean(run, "mintrl/intervention_rate", until) or 0.0)
            point["gap"].append(log_mean(run, "mintrl/reward_gap", until) or 0.0)
            point["p1"].append(run["final"]["pass@1"])
            point["runs"].append(run)
            point["gain"].append(run["final"]["pass@1"] - none["final"]["pass@1"])
        if point["p1"]:
            points.append(point)
    return points


def plot(results: list[dict], base: dict, args, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    main_runs = [r for r in results if r["group"] == "main"]

    fig, ax = plt.subplots(figsize=(6, 4))
    for label in args.labels:
        runs = [r for r in main_runs if r["label"] == label]
        steps = sorted({0, *(int(s) for r in runs for s in r["curve"])})
        per_step = [[base["curve0"] if s == 0 else r["curve"][s] for r in runs] for s in steps]
        means = [100 * statistics.mean(v) for v in per_step]
        ax.plot(steps, means, marker="o", label=label)
        if len(runs) > 1:
            lo = [100 * min(v) for v in per_step]
            hi = [100 * max(v) for v in per_step]
            ax.fill_between(steps, lo, hi, alpha=0.15)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"held-out pass@1 (%), {args.curve_prompts} problems")
    ax.set_title("Held-out accuracy (mean over seeds, band = min/max)")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "learning_curves.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    keys = [
        ("mintrl/judge_token_frac", "judge-token share"),
        ("mintrl/intervention_rate", "intervention rate"),
        ("mintrl/reward_gap", "reward gap (intervened - control)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (key, title) in zip(axes, keys, strict=True):
        for n, label in enumerate(label for label, (method, _) in args.labels.items() if method.startswith("mintrl")):
            for i, run in enumerate(r for r in main_runs if r["label"] == label):
                points = [(e["step"], e[key]) for e in run["logs"] if key in e and e["step"] <= _interv_steps(run)]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, color=f"C{n}", alpha=0.6, label=label if i == 0 else None)
        ax.set_title(title)
        ax.set_xlabel("optimizer step (intervention phase)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "learning_interventions.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    sweep = sweep_points(results, args)
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        for point in sweep:
            for share, gain in zip(point["share"], point["gain"], strict=True):
                ax.scatter(100 * share, 100 * gain, color="C0", alpha=0.4, s=14)
        xs = [100 * statistics.mean(p["share"]) for p in sweep]
        ys = [100 * statistics.mean(p["gain"]) for p in sweep]
        ax.plot(xs, ys, marker="o", color="C0")
        for point, x, y in zip(sweep, xs, ys, strict=True):
            ax.annotate(
                f"max_reviews={point['max_reviews']}", (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvspan(2, 4, color="C2", alpha=0.1, label="paper's sweet spot (2-4%)")
        ax.set_xlabel("judge-token share of completion tokens (%, intervention phase)")
        ax.set_ylabel("held-out pass@1 gain over no intervention (points)")
        ax.set_title("Intervention intensity (MInTRL-const)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "learning_sweep.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> None:
    from trl_mintrl.toy.training import METHODS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, fewer steps and prompts, no sweep (~5 min)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--sweep-reviews", type=int, nargs="+", default=[0, 1, 2, 4, 8], help="0 = no intervention")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=METHOD:JSON",
        help="an extra run per seed with config overrides, e.g. 'sort-dft=sort:{\"repair_beta\": 0}'",
    )
    parser.add_argument("--sweep-seeds", type=int, default=2, help="the sweep runs on the first N seeds")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument("--final-prompts", type=int, default=None, help="held-out problems for the final table")
    parser.add_argument("--curve-prompts", type=int, default=None, help="held-out problems for the curves")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="parallel runs (1 core each)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or ([0] if quick else [0, 1, 2])
    args.steps = args.steps or (12 if quick else 24)
    args.final_prompts = args.final_prompts or (128 if quick else 320)
    args.curve_prompts = args.curve_prompts or (64 if quick else 96)
    args.sweep = args.sweep and not quick
    args.out = args.out or (RESULTS / "quick" if quick else RESULTS)
    args.out.mkdir(parents=True, exist_ok=True)
    args.labels = {method: (method, {}) for method in args.methods}
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        method, _, overrides = rest.partition(":")
        if method not in METHODS:
            parser.error(f"--variant {spec!r}: method must be one of {METHODS}")
        args.labels[name] = (method, json.loads(overrides or "{}"))

    start = time.perf_counter()
    jobs = plan_jobs(args)
    print(f"{len(jobs)} runs of {args.steps} steps on {args.workers} worker(s)", flush=True)
    context = get_context("spawn")  # fresh interpreters: one torch thread each, no state shared with the parent
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
        base_future = pool.submit(baseline, {"final_prompts": args.final_prompts, "curve_prompts": args.curve_prompts})
        futures = [pool.submit(run_job, job) for job in jobs]
        results = []
        for future in futures:
            result = future.result()
            results.append(result)
            print(
                f"{result['name']}: pass@1 {100 * result['final']['pass@1']:.1f} pass@8 "
                f"{100 * result['final']['pass@8']:.1f} ({result['train_seconds']:.0f}s)",
                flush=True,
            )
        base = base_future.result()
    wall = time.perf_counter() - start
    table = report(results, base, args, args.out, wall)
    (args.out / "learning.md").write_text(table + "\n")
    (args.out / "learning.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "baseline": base, "runs": results}, indent=1)
    )
    paths = plot(results, base, args, args.out)
    print(table)
    print("wrote", args.out / "learning.md", *paths, sep="\n  ")


if __name__ == "__main__":
    sys.exit(main())
