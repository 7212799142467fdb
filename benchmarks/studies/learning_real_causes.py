"""What made MInTRL's completions grow to the cap on SmolLM2-135M-Instruct? `mintrl-const`, the in-band arm of
`benchmarks/studies/learning_real.py`, against four arms that each change one factor (`benchmarks.tasks.real.arms`): the judge
never writes the answer line (`mintrl-no-answer`), completions cut at the cap leave the regression
(`mintrl-masked`), the judge-token share is held near the paper's 3% (`mintrl-target`), and every correction is the
answer line, so that a judge-completed rollout is no longer than the policy's own (`mintrl-answer-only`, added after
the first three arms' runs, from their logs: C5 below), and the reward pays only a completion that ends at its answer
line (`mintrl-answer-last`, added after two of C5's seeds, from their logs: C6), and scores -1 one that does not
(`mintrl-answer-penalty`, added after two of C6's seeds, from their logs: C7), and a correction that writes the answer
line ends the rollout (`mintrl-end-answer`, added after every other arm's runs: C8). Everything else is
`learning_real.py`'s full mode: the same warm start, problems, seeds 0-2, 20 steps of 4 prompts, 64-token completions,
interventions for the first 8 steps, vLLM rollouts, the same held-out measures.

    .venv-vllm/bin/python -m benchmarks.studies.learning_real_causes --resume --workers 2 [--max_runs 4] [--arms A ..]
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
- C5 (`mintrl-answer-only`; written on 2026-12-06 after 8 runs of the arms above, from their logs, before any run of
  this arm): supported. In every run so far the controls grew, by the fourth intervention step, to about the length
  of the intervened rollouts of the first three (22 tokens to 35-52, against 39-45), whatever the share, the answer
  line or the masking; in band the warm start writes one line and stops, so a correction adds the missing step and an
  intervened rollout is about twice a control, with every nonzero advantage (+1) on it. In the comparison's reachable
  runs a correction replaced a step, the intervened rollouts were as long as the controls, and nothing grew. Here the
  judge replaces the wrong answer line with the right one and adds no step: the intervened rollouts stay about as
  long as the controls (the policy's line, the judge's answer line), still rewarded about +1 against controls at
  about 0, so the arm keeps the in-band advantages and changes the length of what they reward. If the lead is right
  the controls do not grow (secondary: the controls' length at the fourth intervention step within 5 tokens of the
  first's); if they grow anyway, the lead is wrong. The arm is no teacher a user would run (it teaches answers without
  their steps, and may shorten the completions or lower pass@k): it asks what the length of the rewarded rollouts does.
- C6 (`mintrl-answer-last`; written on 2026-12-07 after two of C5's three seeds, from their logs, before any run of
  this arm): supported. In those two runs the intervened rollouts were about as long as the controls over the first
  three intervention steps (21.8-27.9 tokens against 20.8-22.5) and the controls had not grown by the fourth (23.2 and
  23.5 tokens: C5's secondary held), yet both grew after it (controls 54-61 tokens at the eighth step) and the last
  quarter was 90% and 92.5% at the cap. What grew first is what the policy writes after the judge's answer line: 14-16
  tokens at the first intervention step, 35-40 by the sixth or seventh (`mintrl/policy_tokens_after_correction`).
  `math_reward` reads the first answer line, so those tokens are free: each shares its rollout's +1 advantage, and with
  the controls scoring about 0 nothing pays for them. In mintrl-const the same tail was 4.5-6.2 tokens at the first
  step and 16-20 by the eighth; in mintrl-no-answer the policy writes the answer line itself and can run on after it
  the same way. Here, with mintrl-const's judge, the reward pays only a completion whose last line is its one answer
  line (`arms.answer_last_math_reward`), so a tail costs the +1. If the free tail is the cause, the blow-up goes (the
  rule's supported). Secondary, fixed now: the intervened rollouts' reward stays above the controls' over the
  intervention steps; if it does not, the arm removed the blow-up by removing the signal, and the report says so. The
  reward changes what the rollouts are paid for, not only their length: a user would write it as a format reward.
- C7 (`mintrl-answer-penalty`; written on 2026-12-07 after two of C6's three seeds, from their logs, before any run of
  this arm): supported. C6 left the growth as it was (97% and 77% at the cap in the last quarter; controls 42-50
  tokens at the fourth intervention step, as in mintrl-const) and its tail did not shrink (11.2 tokens after the last
  correction over the intervention steps, mintrl-const's 11.2), while the intervened rollouts' reward fell from
  0.81-0.88 to 0.00-0.19 by the eighth step. In band the controls score about 0, so the baseline is 0 and a rollout
  the reward refuses has advantage 0: the regression holds it where it was and pushes only the rewarded ones up;
  nothing pushes text down, in any arm so far, and no reachable run (controls rewarded 0.06-0.62) grew. Here a
  completion that does not end at its one answer line (a tail, a second answer line, none: cut at the cap) scores -1
  instead of 0, so running on has a negative advantage whatever the controls score. One factor from C6, two from
  mintrl-const (the rule reads it against mintrl-const as for every arm). If the missing push down is the cause, the
  blow-up goes (the rule's supported). Secondaries, fixed now: its last-quarter share at the cap is below C6's, paired
  by seed, with the interval below 0 (the report's contrast row); the intervened rollouts' reward stays above the
  controls' over the intervention steps (reward gap > 0). The arm is a format reward a user could write; it also pays
  a wrong answer that ends (0) over one that runs on (-1), so held-out pass@k may move either way: reported, not
  predicted.
- C8 (`mintrl-end-answer`; written on 2026-12-08 after all 21 runs above, before any run of this arm): partial. In
  every arm so far the rollouts the judge completed carried the positive advantages and none of them ended at the
  judge's answer line: the policy wrote on after it (11.2 tokens after the last correction over the intervention
  steps in mintrl-const), and C6-C7's rewards, which refuse that tail, took the reward from those very rollouts
  (reward gap 0.33-0.46) without stopping the growth. Here the judge's answer line is followed by its EOS
  (`end_at_judge_answer=True`, a library option), so a judge-completed rollout ends at its answer and keeps its
  reward: the first arm whose rewarded rollouts show the policy where to stop. One factor from mintrl-const. Predicted
  partial, not supported: the tail goes from the rollouts where the judge wrote the answer, but the judge's step
  still makes an intervened rollout longer than the policy's own (C5's lead: 50.6 against 41.9 tokens in
  mintrl-const), which C5 showed the controls follow. Secondaries, fixed now: its policy tokens after the last
  correction over the intervention steps are below mintrl-const's, paired, with the interval below 0 (the option
  acts); its reward gap stays above 0.5 over the intervention steps (the signal kept, unlike C6-C7).
Where this differs from the paper's regime: a correction is a whole reference sentence inside a ~22-token answer, so
a reviewed rollout is about half judge text, against the paper's <= 64 tokens in rollouts of thousands; this study
asks what made the run grow, not whether MInTRL helps at the paper's share.

Sizing: the sizes of learning_real.py's in-band runs, so that each arm is compared with the blow-up as it happened
there (a cause that removes it moves the last-quarter share at the cap by tens of points, which 3 seeds resolve):
24 runs (8 arms x 3 seeds) at about 45-75 minutes each with two workers, sittings of about 4 runs
(`--resume --workers 2 --max_runs 4`).
Plan order is seed-major: every arm's seed 0 first; runs already recorded are kept, so the arms added later
(`mintrl-answer-only`, then `mintrl-answer-last`, then `mintrl-answer-penalty`, then `mintrl-end-answer`) run their
three seeds after the earlier arms'.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.provenance import command_line
from benchmarks.lib.sittings import execute_sitting, sitting_output, sitting_parser
from benchmarks.lib.stats import format_interval, format_mean_std
from benchmarks.tasks.real import tables
from benchmarks.tasks.real.arms import CAUSE_ARMS, ENGINES
from benchmarks.tasks.real.run import FULL, SMOKE, describe, measure_warm_start, plan_jobs, run_job

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"

BASELINE = "mintrl-const"
ARMS = (BASELINE, *CAUSE_ARMS)
# (arm, other arm): paired rows besides arm − BASELINE, for an arm one factor away from another cause arm
CONTRASTS = (("mintrl-answer-penalty", "mintrl-answer-last"),)
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
    ("reward gap (iv)", "reward_gap_iv", 1, 2),
    ("pass@1", "pass@1", 100, 1),
    ("pass@8", "pass@8", 100, 1),
    ("KL", "kl", 1, 3),
)


def derived(run: dict) -> dict:
    """A run's `MEASURES` from its per-step logs and final scores (None where nothing logged it)."""
    intervention, last, mean = tables.intervention_logs(run), tables.last_quarter_logs(run), tables.mean_logged
    return {
        "clipped_last": mean(last, "completions/clipped_ratio"),
        "length_last": mean(last, "mintrl/length"),
        "clipped_control_iv": mean(intervention, "mintrl/clipped_ratio_control"),
        "clipped_intervened_iv": mean(intervention, "mintrl/clipped_ratio_intervened"),
        "length_control_iv": mean(intervention, "mintrl/length_control"),
        "length_intervened_iv": mean(intervention, "mintrl/length_intervened"),
        "after_correction_iv": mean(intervention, "mintrl/policy_tokens_after_correction"),
        "judge_share_iv": mean(intervention, "mintrl/judge_token_frac"),
        "reward_gap_iv": mean(intervention, "mintrl/reward_gap"),
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
        cells = pair_cells(runs, base)
        clipped = [r["derived"]["clipped_last"] for r in runs if r["derived"]["clipped_last"] is not None]
        cause = verdict_of(paired(runs, base, "clipped_last"), statistics.fmean(clipped) if clipped else None)
        lines.append(f"| {arm} − {BASELINE} | " + " | ".join(cells) + f" | {cause} |")
    for arm, other in CONTRASTS:
        runs, base = runs_of(results, arm), runs_of(results, other)
        if runs and base:
            lines.append(f"| {arm} − {other} | " + " | ".join(pair_cells(runs, base)) + " | (contrast) |")
    return lines


def pair_cells(runs: list[dict], base: list[dict]) -> list[str]:
    return [format_interval(paired(runs, base, key), scale, digits) for _, key, scale, digits in MEASURES]


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
             "completion token, the judge's included; reward gap: the intervened rollouts' mean reward minus the "
             "controls'. Held-out pass@k in %, KL to the warm start in nats a token. "
             "Mean ± std over seeds:", "",
             *measure_rows(results), "",
             f"Paired by seed, arm − {BASELINE}, with 95% t-intervals (cause?: the rule the hypotheses fixed, on the "
             "last-quarter share at the cap; a contrast pairs an arm with the cause arm one factor away):", "",
             *pair_rows(results), "", "Per run:", "", *per_run_rows(results), "",
             "The controls against the rollouts the judge completed, per run (lengths count every completion token; "
             "an intervened rollout's step 1-3 mean skips steps that reviewed no slot):", "",
             *tables.lead_rows([(f"{arm} s{r['seed']}", r) for arm in ARMS for r in runs_of(results, arm)])]  # fmt: skip
    return "\n".join(lines) + "\n"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, "learning_real_causes.md", report)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    parser = sitting_parser(
        __doc__, CLI_MODES, ARMS, ENGINES, "only these arms' runs (a sitting for one arm's remaining seeds)"
    )
    args = parser.parse_args(argv)
    if harness.replot_from(args, render):
        return None
    mode = harness.mode_of(args, CLI_MODES)
    out = sitting_output(args.out, mode, RESULTS)
    engine = args.engine or ("vllm" if mode == "full" else "transformers")
    settings = {"mode": mode, **MODES[mode], "engine": engine}
    baselines, jobs = plan_jobs(settings, args.arms)
    results = harness.new_results("benchmarks/studies/learning_real_causes.py", argv, settings)
    return execute_sitting(results, out, "learning_real_causes.json", args, baselines=baselines, jobs=jobs,
                           measure=measure_warm_start, run=run_job, describe=describe, render=render)  # fmt: skip


if __name__ == "__main__":
    main()
