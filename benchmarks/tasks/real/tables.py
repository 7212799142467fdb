"""The real-model comparison's tables, read from its recorded runs (`run.run_job`'s records, the warm start's
`run.measure_warm_start`): per regime and arm, the held-out scores, the time to GRPO's final accuracy, the cost paired
by seed, training health over the logged steps, and the warm start itself."""

from __future__ import annotations

import statistics

from benchmarks.lib.harness import select, verdict_cell, versus
from benchmarks.lib.provenance import conditions_text
from benchmarks.lib.stats import Interval, format_amount, format_interval, format_mean_std, format_ratio, mean_interval


def runs_of(results: dict, regime: str, arm: str) -> list[dict]:
    return select(results["runs"], regime=regime, arm=arm)


def baseline_of(results: dict, regime: str) -> dict | None:
    return next((b for b in results.get("baselines", []) if b.get("regime") == regime), None)


def curve_of(results: dict, run: dict) -> dict[int, float]:
    """step -> curve-set pass@1 of a run, step 0 from its regime's warm start."""
    curve = {int(step): point["pass@1"] for step, point in run.get("curve", {}).items()}
    base = baseline_of(results, run["regime"])
    if base is not None:
        curve.setdefault(0, base["scores"]["curve"]["pass@1"])
    return dict(sorted(curve.items()))


def mean_pass1(results: dict, regime: str, arms: list[str], seeds: list[int]) -> dict[str, float]:
    """arm -> its mean held-out pass@1 over the runs of `seeds` recorded so far (arms without one left out)."""
    return {arm: statistics.fmean(r["final"]["pass@1"] for r in runs) for arm in arms
            if (runs := [r for r in runs_of(results, regime, arm) if r["seed"] in seeds])}  # fmt: skip


def best_arm(results: dict, regime: str, arms: list[str], seeds: list[int]) -> str | None:
    """Of `arms`, the one with the highest mean held-out pass@1 over `seeds` (a tie: the first in `arms`); None until
    every arm has a run of every seed."""
    if any(not set(seeds) <= {r["seed"] for r in runs_of(results, regime, arm)} for arm in arms):
        return None
    means = mean_pass1(results, regime, arms, seeds)
    return max(arms, key=means.get)


def mean_steps(run: dict) -> float:
    return statistics.fmean(run["step_seconds"]) if run.get("step_seconds") else float("nan")


SCORE_KEYS = (("pass@1", "pass@1"), ("pass@8", "pass@8"), ("longer pass@1", "longer_pass@1"),
              ("longer pass@8", "longer_pass@8"))  # fmt: skip


def score_rows(results: dict) -> list[str]:
    """Per regime and arm: mean ± std over seeds of the held-out scores, the chat NLL change, the KL, s/step."""
    head = [label for label, _ in SCORE_KEYS] + ["chat NLL change (nats/token)", "KL to warm start (nats/token)"]
    lines = ["| regime | arm | seeds | " + " | ".join(head) + " | s/step |", "|---" * (len(head) + 4) + "|"]
    for regime, arms in results["settings"]["plan"].items():
        base = baseline_of(results, regime)
        if base is not None:
            s = base["scores"]
            cells = [
                f"{100 * s[split][k]:.1f}" for split in ("heldout", "heldout_longer") for k in ("pass@1", "pass@8")
            ]
            lines.append(f"| {regime} | warm start | - | " + " | ".join(cells) + " | 0 | 0 | - |")
        for arm in arms:
            runs = runs_of(results, regime, arm)
            if not runs:
                continue
            cells = [format_mean_std([r["final"][k] for r in runs]) for _, k in SCORE_KEYS]
            cells += [format_mean_std([r["final"][k] for r in runs], 1, 3) for k in ("chat_nll_change", "kl")]
            cells.append(format_mean_std([mean_steps(r) for r in runs], 1, 0))
            lines.append(f"| {regime} | {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def pair_rows(results: dict, pairs: list[tuple[str, str, str]]) -> list[str]:
    """Paired differences over seeds with 95% t-intervals (points for pass@k, nats/token for chat NLL and KL), one
    row per (regime, arm, other arm) of `pairs`: arm − other."""
    head = [label for label, _ in SCORE_KEYS] + ["chat NLL change", "KL", "pass@1 resolved?"]
    lines = ["| regime | pair | " + " | ".join(head) + " |", "|---" * (len(head) + 2) + "|"]
    for regime, arm, other in pairs:
        runs, base = runs_of(results, regime, arm), runs_of(results, regime, other)
        if not runs or not base:
            continue
        cells = [format_interval(versus(runs, base, k)) for _, k in SCORE_KEYS]
        cells += [format_interval(versus(runs, base, k), 1, 3) for k in ("chat_nll_change", "kl")]
        cells.append(verdict_cell(versus(runs, base, "pass@1")))
        lines.append(f"| {regime} | {arm} − {other} | " + " | ".join(cells) + " |")
    return lines


def time_to_target(results: dict, run: dict, target: float) -> tuple[int, float] | None:
    """The first curve step whose pass@1 reaches `target` and the training seconds to it (the steps' own seconds,
    SFT included), else None."""
    step = next((s for s, value in curve_of(results, run).items() if value >= target), None)
    if step is None:
        return None
    return step, sum(run["step_seconds"][:step]) + run.get("sft", {}).get("seconds", 0.0)


def time_rows(results: dict) -> list[str]:
    """Time to GRPO's final curve-set pass@1 (its mean over seeds), per regime and arm."""
    lines = ["| regime | target (GRPO's final curve pass@1, %) | arm | reach it | steps to it | seconds to it |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for regime, arms in results["settings"]["plan"].items():
        grpo = runs_of(results, regime, "grpo")
        if not grpo:
            continue
        target = statistics.fmean(list(curve_of(results, r).values())[-1] for r in grpo)
        for arm in arms:
            runs = runs_of(results, regime, arm)
            reached = [t for r in runs if (t := time_to_target(results, r, target)) is not None]
            steps = format_amount(mean_interval([float(s) for s, _ in reached]) if reached else None)
            seconds = format_amount(mean_interval([s for _, s in reached]) if reached else None)
            lines.append(f"| {regime} | {100 * target:.1f} | {arm} | {len(reached)} of {len(runs)} | {steps} | "
                         f"{seconds} |")  # fmt: skip
    return lines


def cost_rows(results: dict) -> list[str]:
    """Seconds per optimizer step of each arm / GRPO's, paired by seed (the mean of the per-seed ratios with its 95%
    t-interval), and the whole run's training seconds (SFT included) likewise."""
    lines = ["| regime | arm | s/step ÷ grpo | training s ÷ grpo | mean s/step | load (1 min, mean during) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for regime, arms in results["settings"]["plan"].items():
        grpo = runs_of(results, regime, "grpo")
        seeds = {r["seed"] for r in grpo}
        for arm in arms:
            runs = [r for r in runs_of(results, regime, arm) if r["seed"] in seeds]
            if not runs:
                continue
            step, total = paired_ratio(runs, grpo, mean_steps), paired_ratio(runs, grpo, lambda r: r["train_seconds"])
            load = statistics.fmean(r["machine_during"]["load_during_mean"] for r in runs)
            lines.append(f"| {regime} | {arm} | {format_ratio(step)} | {format_ratio(total)} | "
                         f"{statistics.fmean(mean_steps(r) for r in runs):.0f} | {load:.2f} |")  # fmt: skip
    return lines


def intervention_logs(run: dict) -> list[dict]:
    """The per-step logs of MInTRL's intervention steps (none for other trainers)."""
    return [e for e in run.get("logs", []) if e.get("mintrl/interventions_active")]


def last_quarter_logs(run: dict) -> list[dict]:
    """The per-step logs of the last quarter of the steps (at least one)."""
    logs = run.get("logs", [])
    return logs[-max(1, len(logs) // 4) :]


def mean_logged(entries: list[dict], key: str) -> float | None:
    """The mean of `key` over the entries that log it; None where none does."""
    values = [e[key] for e in entries if e.get(key) is not None]
    return statistics.fmean(values) if values else None


def paired_ratio(runs: list[dict], base: list[dict], measure) -> Interval | None:
    """`measure(run) / measure(base run)` per seed both have, with its 95% t-interval; None without such a seed."""
    by_seed = {r["seed"]: r for r in base}
    ratios = [measure(r) / measure(by_seed[r["seed"]]) for r in runs if r["seed"] in by_seed]
    return mean_interval(ratios) if ratios else None


EVERY_TOKEN_LENGTH = "length, every token"  # derived per step (`logged`), not a logged key


def logged(entry: dict, key: str) -> float | None:
    """A step's value of `key`; for `EVERY_TOKEN_LENGTH`, the mean completion tokens with the judge's: TRL's
    `completions/mean_length` counts the policy's only, 1 - f of them at judge-token share f."""
    if key != EVERY_TOKEN_LENGTH:
        return entry.get(key)
    if entry.get("completions/mean_length") is None:
        return None
    return entry["completions/mean_length"] / (1 - (entry.get("mintrl/judge_token_frac") or 0.0))


def phase_means(run: dict, key: str) -> tuple[float | None, float | None]:
    """Mean of a logged metric (`logged`) over the first and the last quarter of the steps that log it (at least one
    step each)."""
    values = [value for e in run.get("logs", []) if (value := logged(e, key)) is not None]
    if not values:
        return None, None
    q = max(1, len(values) // 4)
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


# "length": every completion token, the judge's included; "at the cap %": completions that reached
# max_completion_length; "IS clip ratio": TRL's importance-sampling clip (GRPO's; MInTRL has none); "after correction":
# the policy's tokens after the judge's last one per revised rollout
HEALTH = (("entropy", "entropy", 1), ("length", EVERY_TOKEN_LENGTH, 1), ("reward", "reward", 1),
          ("at the cap %", "completions/clipped_ratio", 100), ("IS clip ratio", "clip_ratio/region_mean", 1),
          ("judge share %", "mintrl/judge_token_frac", 100), ("judge NLL", "mintrl/judge_token_nll", 1),
          ("after correction", "mintrl/policy_tokens_after_correction", 1))  # fmt: skip


def health_rows(results: dict) -> list[str]:
    """Training health per run: each metric's mean over the first → the last quarter of the steps that log it;
    SORT's repairs by the end."""
    head = [label for label, _, _ in HEALTH]
    lines = ["| regime | arm | seed | " + " | ".join(f"{h} first → last" for h in head) + " | repairs |",
             "|---" * (len(head) + 4) + "|"]  # fmt: skip
    for regime, arms in results["settings"]["plan"].items():
        for arm in arms:
            for run in runs_of(results, regime, arm):
                cells = []
                for _, key, scale in HEALTH:
                    first, last = phase_means(run, key)
                    cells.append("-" if first is None else f"{scale * first:.2f} → {scale * last:.2f}")
                repairs = [e["sort/repairs"] for e in run.get("logs", []) if "sort/repairs" in e]
                cells.append(f"{repairs[-1]:.0f}" if repairs else "-")
                lines.append(f"| {regime} | {arm} | {run['seed']} | " + " | ".join(cells) + " |")
    return lines


LEAD_STEPS = 3  # the intervention steps whose intervened rollouts `lead_rows` sets against the controls' later length


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def lead_rows(labelled_runs: list[tuple[str, dict]]) -> list[str]:
    """Per MInTRL run, the controls' length (every token) at the first, the `LEAD_STEPS + 1`-th and the last
    intervention step against the intervened rollouts' mean length over the first `LEAD_STEPS` (steps that reviewed
    no slot skipped), with each half's mean reward over the intervention steps: does the policy grow to the length of
    what the judge completed? Runs with too few intervention steps are left out."""
    lines = ["| run | controls, step 1 | controls, step 4 | controls, last iv step | intervened, steps 1-3 "
             "| reward controls (iv) | reward intervened (iv) |", "|---" * 7 + "|"]  # fmt: skip
    for label, run in labelled_runs:
        steps = [e for e in run.get("logs", []) if e.get("mintrl/interventions_active")]
        if len(steps) <= LEAD_STEPS:
            continue
        control = [e.get("mintrl/length_control") for e in steps]
        intervened = [v for e in steps[:LEAD_STEPS] if (v := e.get("mintrl/length_intervened")) is not None]
        lengths = [control[0], control[LEAD_STEPS], control[-1], statistics.fmean(intervened) if intervened else None]
        rewards = [statistics.fmean(v) if (v := [e[key] for e in steps if e.get(key) is not None]) else None
                   for key in ("mintrl/reward_control", "mintrl/reward_intervened")]  # fmt: skip
        cells = [_cell(v, 1) for v in lengths] + [_cell(v, 2) for v in rewards]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else [f"No MInTRL run has more than {LEAD_STEPS} intervention steps."]


def warm_start_lines(results: dict) -> list[str]:
    base = next(iter(results.get("baselines", [])), None)
    if base is None:
        return ["Warm start: not measured yet."]
    built = base["built"]
    s = built["settings"]
    first = s.get("after")  # a chained warm-up's first epoch (`warm_start.build_warm_start`)
    before = f" after one on {first['problems']} {first['num_steps']}-step problems" if first else ""
    return [
        f"Warm start (`benchmarks.tasks.real.warm_start`, hash `{built['hash']}`): one SFT epoch on {s['problems']} "
        f"{s['num_steps']}-step problems of no split{before}, batches of {s['batch_size']}, learning rate "
        f"{s['learning_rate']:g}: {built['steps']} steps in {built['sft_seconds']:.0f} s "
        f"({conditions_text(built['machine'])}); loss {built['losses'][0]:.3f} → {built['losses'][-1]:.3f}; chat "
        f"NLL {base['chat']['nats_per_token']:.3f} nats per token; its held-out samples drawn by "
        f"{base.get('sampled_by', 'transformers')}."
    ]
