"""What made MInTRL's completions grow to the cap on SmolLM2-135M-Instruct? `mintrl-const`, the in-band arm of
`benchmarks/studies/learning_real.py`, against three arms that each change one factor (`benchmarks.tasks.real.arms`): the judge
never writes the answer line (`mintrl-no-answer`), completions cut at the cap leave the regression
(`mintrl-masked`), and the judge-token share is held near the paper's 3% (`mintrl-target`). Everything else is
`learning_real.py`'s full mode: the same warm start, problems, seeds 0-2, 20 steps of 4 prompts, 64-token completions,
interventions for the first 8 steps, vLLM rollouts, the same held-out measures.

    .venv-vllm/bin/python -m benchmarks.studies.learning_real_causes --resume --workers 2 [--max_runs 4]   # a sitting
    python -m benchmarks.studies.learning_real_causes --smoke     # 1 step of every arm on tiny sizes (the test)
    python -m benchmarks.studies.learning_real_causes --replot benchmarks/results/learning_real_causes.json

Measured per run, besides learning_real.py's: from the per-step logs, over the intervention steps, the share of
completions cut at the cap per half (`mintrl/clipped_ratio_control`, `mintrl/clipped_ratio_intervened`), the length
per half counting every completion token, judge tokens included (`mintrl/length_control`, `mintrl/length_intervened`;
TRL's `completions/mean_length` counts the policy's only), the policy's tokens after the judge's last correction and
the judge-token share; over the last quarter of the steps (all controls then), the share cut at the cap (TRL's
`completions/clipped_ratio`, which counts whole completions) and the length of every completion token.

Hypotheses (written on 2026-12-06 before any run of this study, from the committed logs of learning_real.py's six
in-band mintrl-const seeds: last-quarter share at the cap 0.88-0.99, judge share 34-38% over the intervention steps,
intervened rollouts 37-42 tokens at step 1 against the controls' 22, every intervened rollout rewarded ~1, the
controls ~0). Each cause arm is compared with mintrl-const paired by seed (95% t-interval, 3 seeds). The rule, fixed
now: a factor is *supported* as a cause when its arm's last-quarter share at the cap is below mintrl-const's with the
interval below 0 and its mean under 0.5 (the blow-up mostly gone); *partial* when the interval is below 0 and the mean
is 0.5 or more; *not supported* when the interval includes 0.
- C1 (`mintrl-no-answer`): supported. The reward reads the first answer line, so once the judge writes `#### N` every
  policy token after it shares the rollout's advantage (+1 in band) without being checked; when the policy must write
  the answer, the tail after it is what a control's is.
- C2 (`mintrl-masked`): partial. Cut rows leave the regression, but in mintrl-const the length grew from 22 to 45-60
  tokens over the intervention steps while most rows still ended inside the cap, and those rows stay in.
- C3 (`mintrl-target`): supported. At 3% only about one intervened slot in 14 is reviewed (a reviewed rollout is
  ~40% judge text), so few rows carry the +1 advantage of a judge-completed rollout. The library's controller starts
  with every slot reviewed and takes its first step straight to the proportional share (`trl_mintrl.mintrl.budget`),
  so step 1 runs at the uncapped share; the report gives the share measured over the intervention steps.
- C4 (held-out): no cause arm's pass@1 is resolved above mintrl-const's (3 seeds, small effects), and mintrl-target's
  KL to the warm start ends below mintrl-const's (0.59-0.67 nats a token there).
Where this differs from the paper's regime: a correction is a whole reference sentence inside a ~22-token answer, so
a reviewed rollout is about half judge text, against the paper's <= 64 tokens in rollouts of thousands; this study
asks what made the run grow, not whether MInTRL helps at the paper's share.

Sizing: 12 runs at about 45-50 minutes each with two workers (learning_real.py's in-band runs), so three sittings
of about 4 runs (`--resume --workers 2 --max_runs 4`). Plan order is seed-major: every arm's seed 0 first.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.provenance import command_line
from benchmarks.lib.sittings import add_max_runs_argument, execute_sitting
from benchmarks.lib.stats import format_interval, format_mean_std
from benchmarks.tasks.real import tables
from benchmarks.tasks.real.arms import CAUSE_ARMS, ENGINES
from benchmarks.tasks.real.run import FULL, SMOKE, describe, measure_warm_start, plan_jobs, run_job

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"

BASELINE = "mintrl-const"
ARMS = (BASELINE, *CAUSE_ARMS)
MODES = {
    "full": {**FULL, "plan": {"in-band": list(ARMS)}},
    "smoke": {**SMOKE, "plan": {"in-band": list(ARMS)}},
}
CLI_MODES = {"smoke": "1 step of every arm on tiny sizes, 1 seed: the test"}
# derived per run: (label, key, scale, digits); "iv": mean over the intervention steps, "last": over the last quarter
MEASURES = (
    ("cap % last quarter", "clipped_last", 100, 0),
    ("length last quarter", "length_last", 1, 1),
    ("cap % controls (iv)", "clipped_control_iv", 100, 0),
    ("cap % intervened (iv)", "clipped_intervened_iv", 100, 0),
    ("length controls (iv)", "length_control_iv", 1, 1),
    ("length intervened (iv)", "length_intervened_iv", 1, 1),
    ("after correction (iv)", "after_correction_iv", 1, 1),
    ("judge share % (iv)", "judge_share_iv", 100, 1),
    ("pass@1", "pass@1", 100, 1),
    ("pass@8", "pass@8", 100, 1),
    ("KL", "kl", 1, 3),
)


def _mean(entries: list[dict], key: str) -> float | None:
    values = [e[key] for e in entries if e.get(key) is not None]
    return statistics.fmean(values) if values else None


def derived(run: dict) -> dict:
    """A run's `MEASURES` from its per-step logs and final scores (None where nothing logged it)."""
    logs = run.get("logs", [])
    intervention = [e for e in logs if e.get("mintrl/interventions_active")]
    last = logs[-max(1, len(logs) // 4) :]
    return {
        "clipped_last": _mean(last, "completions/clipped_ratio"),
        "length_last": _mean(last, "mintrl/length"),
        "clipped_control_iv": _mean(intervention, "mintrl/clipped_ratio_control"),
        "clipped_intervened_iv": _mean(intervention, "mintrl/clipped_ratio_intervened"),
        "length_control_iv": _mean(intervention, "mintrl/length_control"),
        "length_intervened_iv": _mean(intervention, "mintrl/length_intervened"),
        "after_correction_iv": _mean(intervention, "mintrl/policy_tokens_after_correction"),
        "judge_share_iv": _mean(intervention, "mintrl/judge_token_frac"),
        **{k: run["final"][k] for k in ("pass@1", "pass@8", "kl")},
    }


def runs_of(results: dict, arm: str) -> list[dict]:
    """The arm's in-band runs, each with its `derived` measures."""
    return [{**r, "derived": derived(r)} for r in tables.runs_of(results, "in-band", arm)]


def measure_rows(results: dict) -> list[str]:
    head = [label for label, *_ in MEASURES]
    lines = ["| arm | seeds | " + " | ".join(head) + " |", "|---" * (len(head) + 2) + "|"]
    for arm in ARMS:
        runs = runs_of(results, arm)
        if not runs:
            continue
        cells = []
        for _, key, scale, digits in MEASURES:
            values = [scale * r["derived"][key] for r in runs if r["derived"][key] is not None]
            cells.append(format_mean_std(values, 1, digits) if values else "-")
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def pair_rows(results: dict) -> list[str]:
    head = [label for label, *_ in MEASURES]
    lines = ["| pair | " + " | ".join(head) + " | cause? |", "|---" * (len(head) + 2) + "|"]
    base = runs_of(results, BASELINE)
    for arm in CAUSE_ARMS:
        runs = runs_of(results, arm)
        if not runs or not base:
            continue
        cells = [format_interval(paired(runs, base, key), scale, digits) for _, key, scale, digits in MEASURES]
        clipped = [r["derived"]["clipped_last"] for r in runs if r["derived"]["clipped_last"] is not None]
        cause = verdict_of(paired(runs, base, "clipped_last"), statistics.fmean(clipped) if clipped else None)
        lines.append(f"| {arm} − {BASELINE} | " + " | ".join(cells) + f" | {cause} |")
    return lines


def paired(runs: list[dict], base: list[dict], key: str):
    """`runs` - `base` on a derived measure, paired by the seeds where both logged it (None: no such seed)."""

    def logged(rs: list[dict]) -> list[dict]:
        return [r for r in rs if r["derived"][key] is not None]

    return harness.versus(logged(runs), logged(base), key, where="derived")


def verdict_of(diff, arm_mean: float | None) -> str:
    """The hypotheses' rule on the last-quarter share at the cap: `diff` is arm - mintrl-const, `arm_mean` the arm's
    own mean share."""
    if diff is None or diff.low is None or arm_mean is None:
        return "open (fewer than 2 seeds)"
    if diff.high >= 0:
        return "not supported"
    return "supported" if arm_mean < 0.5 else "partial"


def per_run_rows(results: dict) -> list[str]:
    head = [label for label, *_ in MEASURES]
    lines = ["| run | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for arm in ARMS:
        for run in runs_of(results, arm):
            d = run["derived"]
            cells = ["-" if d[key] is None else f"{scale * d[key]:.{digits}f}" for _, key, scale, digits in MEASURES]
            lines.append(f"| {arm} s{run['seed']} | " + " | ".join(cells) + " |")
    return lines


def report(results: dict) -> str:
    s = results["settings"]
    lines = ["# What made MInTRL's completions grow to the cap on SmolLM2-135M-Instruct", "",
             "Written by benchmarks/studies/learning_real_causes.py from its JSON; do not edit.", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"In band, {s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}, "
             f"completions of at most {s['max_completion_length']} tokens, rollouts by {s['engine']}. Each arm is "
             f"{BASELINE} with one factor changed (benchmarks/tasks/real/arms.py). (iv): mean over the intervention steps; "
             "last quarter: the last quarter of the steps (every rollout a control then). Lengths count every "
             "completion token, the judge's included. Held-out pass@k in %, KL to the warm start in nats a token. "
             "Mean ± std over seeds:", "",
             *measure_rows(results), "",
             f"Paired by seed, arm − {BASELINE}, with 95% t-intervals (cause?: the rule the hypotheses fixed, on the "
             "last-quarter share at the cap):", "",
             *pair_rows(results), "", "Per run:", "", *per_run_rows(results)]  # fmt: skip
    return "\n".join(lines) + "\n"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, "learning_real_causes.md", report)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render the tables from a JSON")
    parser.set_defaults(workers=1)
    parser.add_argument("--engine", choices=list(ENGINES), default=None,
                        help="the rollout engine (default: vllm for the full mode, transformers for --smoke)")  # fmt: skip
    add_max_runs_argument(parser)
    args = parser.parse_args(argv)
    if harness.replot_from(args, render):
        return None
    mode = harness.mode_of(args, CLI_MODES)
    out = args.out or (RESULTS if mode == "full" else RESULTS / "quick")
    out.mkdir(parents=True, exist_ok=True)
    engine = args.engine or ("vllm" if mode == "full" else "transformers")
    settings = {"mode": mode, **MODES[mode], "engine": engine}
    baselines, jobs = plan_jobs(settings)
    results = harness.new_results("benchmarks/studies/learning_real_causes.py", argv, settings)
    return execute_sitting(results, out, "learning_real_causes.json", args, baselines=baselines, jobs=jobs,
                           measure=measure_warm_start, run=run_job, describe=describe, render=render)  # fmt: skip


if __name__ == "__main__":
    main()
