"""Beyond the papers, measured on MInTRL's in-band regime of the toy task (fallible judges, in band).

    python -m benchmarks.studies.beyond --workers 2   # full: 13 arms x 3 seeds = 39 runs of 48 steps (~1 h on 2 free cores)
    python -m benchmarks.studies.beyond --quick       # 1 seed, 4 steps, 7 runs (a few minutes)
    python -m benchmarks.studies.beyond --replot benchmarks/results/beyond.json   # tables and plot from the JSON

1. Fallible judges. The rule judge (`benchmarks.tasks.toy.rule_judge`) errs in one of three ways, each alone, at rates 0.1
   and 0.3: `false_revise` (a chunk the rule finds right is flagged at a random step: a false REVISE),
   `missed_error` (a chunk the rule finds wrong is passed) and `wrong_correction` (the correction carries a wrong
   number, the paper's Figure 9). MInTRL-const with each, against GRPO and against the plain judge (no errors).
2. Votes: MInTRL-const with `judge_votes=3, judge_min_agree=2` at each kind's 0.3, against the single review with the
   same errors. Voting covers the review only: each chunk gets 3 reviews and is cut where 2 flag a step at or before
   the cut; the correction of a cut chunk is one judge call, not voted on.
3. Confidence gate: not measured. No judge here reports a confidence (a review is a step index or KEEP,
   `trl_mintrl.judges.base.Verdict`), and nothing in trl_mintrl gates on one.
4. Budget controller: `judge_token_target` with the reward-gap stop rule, free to review throughout the run, against
   the fixed schedule (every intervened slot reviewed for the first 40% of the steps) at about the same total judge
   tokens.
5. MInTRL + SORT in one run (`mintrl-sort`, `trl_mintrl.combined`): a row against GRPO and MInTRL-const.

Every run is the toy task's `main_job` (`benchmarks.tasks.toy.arms`) with learning.py's full mode's steps, prompts per step, held-out and curve problems on
the in-band regime: the `grpo` and plain `mintrl-const` jobs at seed s are learning.json's in-band jobs at seed s
but for their name and an empty `judge_errors`. 3 seeds (enough for the error grid); every comparison is
a paired difference over seeds with a 95% t-interval. `beyond.json` records the command, the commit, the settings
and one record per run and is rewritten after every run; `beyond.md` and `beyond_noise.png` are rendered from it.

Hypotheses, written before the full run (it tests them; nothing is tuned after it). Mechanism: in band the warm start
writes `a+b` for each of the two `a~b` steps, so a rescued rollout needs about two corrections; the step reward
scores 0 once any rule step is wrong; and MInTRL's loss trains judge tokens too, with the rollout's advantage.
- H0 the exact judge: mintrl-const - GRPO ~ +10 points, as learning.json's in-band runs at these seeds (the same
  jobs: their pass@1 was 12.1 / 10.0 / 12.0 against GRPO's 0.4 / 0.1 / 0.1).
- H1 false REVISE costs nothing measurable: cutting a right chunk, the judge writes the right next step in the
  policy's own notation, so the rollout stays right; only the judge-token share rises. pass@1 - plain ~ 0 at 0.1 and
  0.3.
- H2 missed errors shrink the gain over GRPO: a passed wrong step stays in the rollout (later reviews flag each next
  chunk and the judge writes the rest, but the reward is lost), so a rollout is rescued only if neither wrong step
  is missed: about (1 - p)^2 of the plain judge's rescues (0.81 at 0.1, 0.49 at 0.3); expect the gain at 0.3 near
  half the plain judge's.
- H3 wrong corrections cost at least as much as missed errors at the same rate: each correction is wrong with
  probability p, a rollout needs two or more (so about the same (1 - p)^2 survive), and a ruined rollout's later
  chunks are all re-corrected, so right judge steps are trained with a low advantage; the largest loss of the three
  kinds at 0.3, possibly to GRPO's level.
- H4 voting recovers little: 3 reviews with 2 to agree lower the chance that a fired error decides a chunk from 0.3
  to 0.216, which helps missed errors (survival 0.49 -> 0.61) and false REVISE (which costs nothing to begin with),
  and cannot touch wrong corrections (the correction is one call, not voted on): votes - single review ~ 0 for wrong
  corrections, small and positive for missed errors, neither expected to resolve at 3 seeds.
- H5 the budget controller, at about the fixed schedule's total judge tokens, ends within the fixed schedule's
  interval (no direction predicted); H6 MInTRL + SORT ends where MInTRL-const ends.
At 3 seeds the paired intervals against GRPO are tight (MInTRL-const - GRPO at seeds 0-2 in learning.json: sd ~1
point, half-width ~3), those between two MInTRL arms are not (sd ~2.6 per arm over 10 seeds: half-width ~8-9 points).
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.harness import verdict_cell, versus
from benchmarks.lib.plots import interval_errorbar, pyplot, save
from benchmarks.lib.readme import markers
from benchmarks.lib.records import (
    log_values,
    logged_per_run,
    output_folder,
    runs_with_error,
    total_judge_tokens,
)
from benchmarks.lib.stats import format_interval, format_mean_std, format_ratio, mean_interval
from benchmarks.tasks.toy.arms import LOGGED, main_job, mode_sizes
from benchmarks.tasks.toy.run import baseline, execute, run_job
from benchmarks.tasks.toy.tables import log_mean
from benchmarks.tasks.toy.task import JUDGE_ERRORS

REGIME = "in-band"
ROLLOUTS = 8  # per prompt, every method here (learning.py's default)
KIND_NAMES = {"false_revise": "false REVISE", "missed_error": "missed error", "wrong_correction": "wrong correction"}
# Derived before the run from learning.json's in-band mintrl-const runs, seeds 0-2 (48 steps, 8 prompts x 8
# rollouts): the fixed schedule reviews for 19 steps at a judge-token share of ~17.4% of ~38-token completions,
# 7772 / 7852 / 8283 judge tokens (mean ~7970, ~124.5 per rollout row). The controller starts from full review
# (~20% share at ~36 tokens) and settles on its target within ~4 steps (the 3% sweep point held 3.1% from step 4),
# then reviews all 48 steps at ~44-token completions (the 3% point's and the later steps' lengths): per row
# 48 x 44 x t + ~8.6 (the descent's excess) = 124.5 gives t = 0.055. The stop rule (learning.py's adaptive arm's
# gap, 0.1) may end reviews early, and then the controller spends less: the report gives both totals and their ratio.
BUDGET_TARGET, BUDGET_STOP_GAP = 0.055, 0.1
# label -> (method of benchmarks.tasks.toy.training, config overrides)
LABELS = {
    "grpo": ("grpo", {}),
    "mintrl-const": ("mintrl-const", {}),
    "mintrl-vote": ("mintrl-const", {"judge_votes": 3, "judge_min_agree": 2}),
    "mintrl-budget": ("mintrl-const", {"judge_token_target": BUDGET_TARGET, "intervention_stop_gap": BUDGET_STOP_GAP}),
    "mintrl-sort": ("mintrl-sort", {}),
}
GRPO, PLAIN = ("grpo", None, 0.0), ("mintrl-const", None, 0.0)  # PLAIN: MInTRL-const, no errors, the fixed schedule
# the trainer's metrics this benchmark reads, beyond those learning.py keeps in a run's logs
EXTRA_LOGGED = (
    "mintrl/vote_agreement",
    "mintrl/vetoed_revisions",
    "mintrl/intervention_share",
    "mintrl/interventions_active",
    "mintrl/judge_failures",
)


def _grid(rates, vote_rates) -> list[tuple[str, str | None, float]]:
    """GRPO, the plain judge, MInTRL-const with each kind alone at each rate, votes with each kind at `vote_rates`."""
    return [
        GRPO,
        PLAIN,
        *(("mintrl-const", kind, p) for kind in JUDGE_ERRORS for p in rates),
        *(("mintrl-vote", kind, p) for kind in JUDGE_ERRORS for p in vote_rates),
    ]


MODES = {
    # learning.py's run sizes of the mode (steps, seeds, held-out / curve problems, curve points, prompts per step),
    # error rates, (label, kind, rate) arms
    "full": dict(
        mode_sizes("full", seeds=[0, 1, 2]),
        error_rates=[0.0, 0.1, 0.3],
        plan=[*_grid((0.1, 0.3), (0.3,)), ("mintrl-budget", None, 0.0), ("mintrl-sort", None, 0.0)],
    ),
    "quick": dict(
        mode_sizes("quick", steps=4, curve_prompts=8, curve_points=1),
        error_rates=[0.0, 0.3],
        plan=[*_grid((0.3,), ()), ("mintrl-vote", "false_revise", 0.3), ("mintrl-budget", None, 0.0)],
    ),
    "smoke": dict(  # the test: seconds
        mode_sizes("smoke"),
        error_rates=[0.0, 0.3],
        plan=[
            GRPO,
            PLAIN,
            ("mintrl-const", "false_revise", 0.3),
            ("mintrl-vote", "false_revise", 0.3),
            ("mintrl-budget", None, 0.0),
            ("mintrl-sort", None, 0.0),
        ],
    ),
}


def settings_for(mode: str) -> dict:
    """The mode's settings as the JSON holds them."""
    return {"mode": mode, "regime": REGIME, **MODES[mode], "plan": [list(arm) for arm in MODES[mode]["plan"]]}


# the toy task's `run_job`, keeping the vote and budget metrics in the run's logs too
run_beyond_job = functools.partial(run_job, logged=tuple(dict.fromkeys((*LOGGED, *EXTRA_LOGGED))))


def plan_jobs(settings: dict) -> list[dict]:
    """One job per (arm, seed), seed-major so that a partial run has every arm on its first seeds: learning.py's
    `main_job` on the in-band regime, named apart, with the arm's judge errors (`judge_errors`, one kind or none)."""
    jobs = []
    for seed in settings["seeds"]:
        for label, kind, rate in settings["plan"]:
            if (kind is None) != (rate == 0.0) or (kind is not None and kind not in JUDGE_ERRORS):
                raise ValueError(f"arm {label!r}: error kind {kind!r} at rate {rate!r}")
            method, overrides = LABELS[label]
            if label == "mintrl-budget":  # the controller may review throughout; the stop rule ends it
                overrides = {**overrides, "intervention_steps": settings["steps"]}
            job = main_job(settings, REGIME, label, method, overrides, seed)
            job["name"] = f"beyond-{REGIME}-{label}-{kind or 'exact'}{rate:g}-s{seed}"
            job["judge_errors"] = {kind: rate} if kind else {}
            jobs.append(job)
    return jobs


# ----------------------------------------------------------------------------------------------------------- report


def plain_of(label: str, kind: str | None, rate: float) -> tuple[str, str | None, float] | None:
    """The arm without its feature: the plain judge for a judge error, the budget controller and MInTRL + SORT; the
    single review with the same error for votes; none for GRPO and the plain judge itself."""
    if label == "mintrl-vote":
        return ("mintrl-const", kind, rate)
    if label == "grpo" or (label, kind, rate) == PLAIN:
        return None
    return PLAIN


def arm_name(label: str, kind: str | None, rate: float) -> str:
    return label if kind is None else f"{label}, {KIND_NAMES[kind]} {rate:g}"


def _phase_means(runs: list[dict], key: str) -> str:
    return format_mean_std([v for r in runs if (v := log_mean(r, key, True)) is not None])


def _diff(results: dict, runs: list[dict], other: tuple | None, key: str = "pass@1"):
    """`runs` - the runs of arm `other` (label, kind, rate), paired by seed; None without `other` or its runs."""
    if other is None:
        return None
    return versus(runs, runs_with_error(results, *other), key)


def _arms(settings: dict, labels: tuple[str, ...]) -> list[tuple[str, str | None, float]]:
    return [tuple(arm) for arm in settings["plan"] if arm[0] in labels]


def report(results: dict) -> str:
    settings, prov = results["settings"], results["provenance"]
    changed = prov["changed_files_that_matter"]
    lines = [
        "# Beyond the papers (written by benchmarks/studies/beyond.py from beyond.json; do not edit)",
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`"
        f"{' (files under benchmarks/ or trl_mintrl/ differed: ' + ', '.join(changed) + ')' if changed else ''}. "
        f"Regime `{settings.get('regime', REGIME)}`, {settings['steps']} optimizer steps x "
        f"{settings['prompts_per_step']} prompts x {ROLLOUTS} rollouts, held-out {settings['final_prompts']} problems "
        f"x 8 samples at temperature 1, seeds {settings['seeds']}. Values in %: mean ± std over seeds; differences "
        "are paired by seed with a 95% t-interval; **resolved** = the interval excludes 0.",
    ]
    base = next(iter(results["baselines"]), None)
    if base is not None:
        lines += [
            "",
            f"Warm start: pass@1 {100 * base['final']['pass@1']:.1f}, pass@8 {100 * base['final']['pass@8']:.1f}.",
        ]
    lines += [
        "",
        "## 1. Fallible judges and votes",
        "",
        "One kind of judge error at a time: **false REVISE** = a chunk the rule finds right is flagged at a random "
        "step; **missed error** = a chunk the rule finds wrong is passed; **wrong correction** = the correction "
        "carries a wrong number (its first result off by 1 or 2). mintrl-vote = mintrl-const with judge_votes=3, "
        "judge_min_agree=2 (the reviews are voted on, the correction is not). Plain = the arm without its feature: "
        "mintrl-const with the exact judge, and for a vote arm mintrl-const with the same error. Revised share and "
        "judge-token share are over the intervention phase.",
        "",
        "| method | judge error | rate | seeds | pass@1 | pass@8 | pass@1 - GRPO [95% CI] | resolved "
        "| pass@8 - GRPO [95% CI] | pass@1 - plain [95% CI] | resolved | pass@8 - plain [95% CI] "
        "| revised share of intervened | judge-token share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_error_row(results, *arm) for arm in _arms(settings, ("grpo", "mintrl-const", "mintrl-vote"))]
    lines += _votes_section(results, settings)
    lines += [
        "",
        "## 3. Confidence gate",
        "",
        "Not measured: no judge here reports a confidence (a review is a step index or KEEP), so there is no gate to "
        "compare against the same judge without it.",
    ]
    lines += _budget_section(results, settings)
    lines += _mintrl_sort_section(results, settings)
    wall = results.get("wall_seconds")
    lines += ["", f"{len(results['runs'])} runs" + (f", {wall / 60:.1f} min wall time" if wall else "") + "."]
    return "\n".join(lines) + "\n"


README_START, README_END = markers("-m benchmarks.studies.beyond", "beyond-results")


def readme_block(results: dict) -> str:
    """The summary block (docs/benchmarks.md), one row per arm: its pass@1 and the paired differences to GRPO and to
    the arm without its feature; every other number is in the .md."""
    settings, prov = results["settings"], results["provenance"]
    lines = [
        "Beyond the papers (`benchmarks/studies/beyond.py`: fallible judges, voting judges, the judge-token budget "
        f"controller, MInTRL + SORT in one run; every feature off by default): {settings.get('regime', REGIME)} "
        f"regime, {settings['steps']} steps, {len(settings['seeds'])} seeds, held-out pass@1 in % (mean ± std); "
        "differences paired by seed with a 95% t-interval, one that contains 0 is no evidence either way. No judge "
        "here reports a confidence, so no confidence gate is measured. From `benchmarks/results/beyond.json` "
        f"(commit `{prov['commit'][:12]}`); pass@8 and the judge's measures in `benchmarks/results/beyond.md`.",
        "",
        "| arm | plain (the arm without its feature) | seeds | pass@1 | - GRPO [95% CI] | - plain [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    grpo = runs_with_error(results, "grpo")
    if grpo:
        lines.append(
            f"| grpo (no judge) | - | {len(grpo)} | {format_mean_std([r['final']['pass@1'] for r in grpo])} | - | - |"
        )
    names = {"mintrl-budget": f"budget controller (target {BUDGET_TARGET:g})", "mintrl-sort": "MInTRL + SORT"}
    for arm in map(tuple, settings["plan"]):
        runs = runs_with_error(results, *arm)
        if not runs or arm[0] == "grpo":
            continue
        plain = plain_of(*arm)
        plain_name = "fixed schedule" if arm[0] == "mintrl-budget" else arm_name(*plain) if plain else "-"
        vs_plain = format_interval(_diff(results, runs, plain)) if plain else "-"
        lines.append(
            f"| {names.get(arm[0], arm_name(*arm))} | {plain_name} | {len(runs)} "
            f"| {format_mean_std([r['final']['pass@1'] for r in runs])} "
            f"| {format_interval(_diff(results, runs, GRPO))} | {vs_plain} |"
        )
    return "\n".join(lines)


def _error_row(results: dict, label: str, kind: str | None, rate: float) -> str:
    """Section 1's row of an arm: its scores, paired against GRPO and against the arm without its feature, and its
    judge's revised share and judge-token share over the intervention phase."""
    runs = runs_with_error(results, label, kind, rate)
    error = KIND_NAMES[kind] if kind else "-"
    if not runs:
        return f"| {label} | {error} | {rate:g} | 0 | (not run yet) ||||||||||"
    vs_grpo = [_diff(results, runs, GRPO if label != "grpo" else None, k) for k in ("pass@1", "pass@8")]
    vs_plain = [_diff(results, runs, plain_of(label, kind, rate), k) for k in ("pass@1", "pass@8")]
    judged = label != "grpo"
    return (
        f"| {label} | {error} | {rate:g} | {len(runs)} "
        f"| {format_mean_std([r['final']['pass@1'] for r in runs])} "
        f"| {format_mean_std([r['final']['pass@8'] for r in runs])} | {format_interval(vs_grpo[0])} "
        f"| {verdict_cell(vs_grpo[0])} | {format_interval(vs_grpo[1])} | {format_interval(vs_plain[0])} "
        f"| {verdict_cell(vs_plain[0])} | {format_interval(vs_plain[1])} "
        f"| {_phase_means(runs, 'mintrl/intervention_rate') if judged else '-'} "
        f"| {_phase_means(runs, 'mintrl/judge_token_frac') if judged else '-'} |"
    )


def _votes_section(results: dict, settings: dict) -> list[str]:
    arms = _arms(settings, ("mintrl-vote",))
    if not arms:
        return []
    lines = [
        "",
        "## 2. Votes (mintrl-vote: 3 reviews per chunk, revise when at least 2 flag a step at or before the cut)",
        "",
        "Voting covers the review only: a cut chunk's correction is one judge call. Agreement = share of the usable "
        "votes that back the decision taken on their chunk; vetoed = chunks some review flagged but fewer than 2 "
        "agreed on, per intervention step (the trainer's `mintrl/vote_agreement` and `mintrl/vetoed_revisions`). "
        "Revised share = revised intervened rollouts, with votes and with a single review (mintrl-const with the "
        "same error).",
        "",
        "| judge error | rate | seeds | vote agreement | vetoed revisions / step | revised share, votes | revised "
        "share, single review | pass@1 votes - single [95% CI] | resolved | pass@8 votes - single [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, kind, rate in arms:
        votes, single = (
            runs_with_error(results, label, kind, rate),
            runs_with_error(results, "mintrl-const", kind, rate),
        )
        error = KIND_NAMES[kind] if kind else "-"
        if not votes:
            lines.append(f"| {error} | {rate:g} | 0 | (not run yet) |||||||")
            continue
        diff = [_diff(results, votes, ("mintrl-const", kind, rate), k) for k in ("pass@1", "pass@8")]
        lines.append(
            f"| {error} | {rate:g} | {len(votes)} | {format_mean_std(logged_per_run(votes, 'mintrl/vote_agreement'))} "
            f"| {format_mean_std(logged_per_run(votes, 'mintrl/vetoed_revisions'), scale=1)} "
            f"| {_phase_means(votes, 'mintrl/intervention_rate')} | {_phase_means(single, 'mintrl/intervention_rate')} "
            f"| {format_interval(diff[0])} | {verdict_cell(diff[0])} | {format_interval(diff[1])} |"
        )
    return lines


def _budget_section(results: dict, settings: dict) -> list[str]:
    if not _arms(settings, ("mintrl-budget",)):
        return []
    budget, fixed = runs_with_error(results, "mintrl-budget"), runs_with_error(results, *PLAIN)
    lines = [
        "",
        "## 4. Budget controller (exact judge)",
        "",
        f"controller = `judge_token_target={BUDGET_TARGET}`, `intervention_stop_gap={BUDGET_STOP_GAP}`, reviewing "
        f"for up to all {settings['steps']} steps; fixed = the default schedule (every intervened slot reviewed for "
        "the first 40% of the steps: mintrl-const). Matched quantity: the total judge tokens of the run (what a judge "
        "budget buys), not the per-step share or the number of reviewed steps; the target was derived from "
        "learning.json's in-band mintrl-const runs before this run (beyond.py's comment). Judge tokens per run = sum "
        "over steps of judge-token share x mean completion length x rollouts.",
        "",
        "| arm | seeds | total judge tokens | judge-token share while reviewing | steps with interventions "
        "| final review share | pass@1 | pass@8 | pass@1 - GRPO [95% CI] | resolved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, runs in (("controller", budget), ("fixed", fixed)):
        if not runs:
            lines.append(f"| {arm} | 0 | (not run yet) ||||||||")
            continue
        vs_grpo = _diff(results, runs, GRPO)
        reviewing = [
            statistics.fmean(v)
            for r in runs
            if (v := [e["mintrl/judge_token_frac"] for e in r["logs"] if e.get("mintrl/interventions_active")])
        ]
        active = [sum(log_values(r, "mintrl/interventions_active")) for r in runs]
        share = logged_per_run(runs, "mintrl/intervention_share", reduce=lambda v: v[-1])
        lines.append(
            f"| {arm} | {len(runs)} | {format_mean_std([total_judge_tokens(r, ROLLOUTS) for r in runs], scale=1, digits=0)} "
            f"| {format_mean_std(reviewing)} | {format_mean_std(active, scale=1)} "
            f"| {format_mean_std(share) if share else '-'} | {format_mean_std([r['final']['pass@1'] for r in runs])} "
            f"| {format_mean_std([r['final']['pass@8'] for r in runs])} | {format_interval(vs_grpo)} "
            f"| {verdict_cell(vs_grpo)} |"
        )
    if budget and fixed:
        tokens = {r["seed"]: total_judge_tokens(r, ROLLOUTS) for r in budget}
        ratio = mean_interval(
            [tokens[r["seed"]] / max(total_judge_tokens(r, ROLLOUTS), 1.0) for r in fixed if r["seed"] in tokens]
        )
        diff = [_diff(results, budget, PLAIN, k) for k in ("pass@1", "pass@8")]
        lines += [
            "",
            f"Controller - fixed, paired by seed: pass@1 {format_interval(diff[0])} "
            f"({verdict_cell(diff[0])}), pass@8 {format_interval(diff[1])}; judge tokens controller / fixed "
            f"{format_ratio(ratio)}.",
        ]
    return lines


def _mintrl_sort_section(results: dict, settings: dict) -> list[str]:
    lines = ["", "## 5. MInTRL + SORT in one run", ""]
    runs = runs_with_error(results, "mintrl-sort")
    if not runs:
        return lines + ["Not measured in this mode (the full and smoke modes run `mintrl-sort`)."]
    diffs = [_diff(results, runs, other, k) for other in (GRPO, PLAIN) for k in ("pass@1", "pass@8")]
    return lines + [
        "| method | seeds | pass@1 | pass@8 | pass@1 - GRPO [95% CI] | resolved | pass@8 - GRPO [95% CI] "
        "| pass@1 - mintrl-const [95% CI] | resolved | pass@8 - mintrl-const [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| mintrl-sort | {len(runs)} | {format_mean_std([r['final']['pass@1'] for r in runs])} "
        f"| {format_mean_std([r['final']['pass@8'] for r in runs])} | {format_interval(diffs[0])} "
        f"| {verdict_cell(diffs[0])} | {format_interval(diffs[1])} | {format_interval(diffs[2])} "
        f"| {verdict_cell(diffs[2])} | {format_interval(diffs[3])} |",
    ]


# ------------------------------------------------------------------------------------------------------------- plot


def plot(results: dict, out: Path) -> Path:
    """MInTRL-const's pass@1 - GRPO (paired by seed, 95% t-interval) against the judge's error rate, one line per kind
    of error (rate 0: the exact judge, shared by the three lines); the vote arms as open markers at their rate."""
    plt, settings = pyplot(), results["settings"]
    rates = settings["error_rates"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axhline(0, color="grey", lw=0.8, ls="--", label="grpo (no judge)")
    plain = runs_with_error(results, *PLAIN)
    arms = {tuple(arm) for arm in settings["plan"]}

    def draw(points, n, **style):
        kept = [(x, v) for x, v in points if v is not None]
        if kept:
            interval_errorbar(ax, [x for x, _ in kept], [v for _, v in kept], color=f"C{n}", **style)

    for n, kind in enumerate(JUDGE_ERRORS):
        shift = (n - 1) * 0.02 * max(rates)  # side by side at each rate
        points = [(shift, _diff(results, plain, GRPO))] if plain else []
        points += [
            (p + shift, _diff(results, runs, GRPO))
            for p in rates
            if p > 0 and (runs := runs_with_error(results, "mintrl-const", kind, p))
        ]
        draw(points, n, marker="o", label=f"mintrl-const, {KIND_NAMES[kind]}")
        votes = [
            (p + shift + 0.01 * max(rates), _diff(results, runs, GRPO))
            for p in rates
            if ("mintrl-vote", kind, p) in arms and (runs := runs_with_error(results, "mintrl-vote", kind, p))
        ]
        draw(votes, n, marker="o", mfc="none", ls="none", label=f"mintrl-vote, {KIND_NAMES[kind]}")
    ax.set_xlabel("judge error rate (one kind at a time)")
    ax.set_ylabel("held-out pass@1 - GRPO, paired by seed (points)")
    ax.set_xticks(rates)
    ax.set_title(
        f"{settings.get('regime', REGIME)}, {settings['steps']} steps, {len(settings['seeds'])} seeds: "
        "mean and 95% t-interval",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    return save(fig, out / "beyond_noise.png", 110)


# ------------------------------------------------------------------------------------------------------------- main


def render(results: dict, out: Path, plots: bool = True) -> str:
    """Write beyond.md (and the PNG) from `results`, the content of beyond.json."""
    return harness.write_report(results, out, "beyond.md", report, plot, plots)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    modes = {
        "smoke": "1 step, 2 prompts, 2 seeds, 6 runs per seed (the test)",
        "quick": "1 seed, 4 steps, GRPO, each kind at 0.3, votes, budget",
    }
    parser = harness.study_parser(__doc__, modes, replot_help="re-render beyond.md and the plot from a JSON")
    args = parser.parse_args(argv)
    if harness.replot_from(args, render, readme_block, (README_START, README_END)):
        return
    mode = harness.mode_of(args, modes)
    out = output_folder(args.out, mode)
    settings = settings_for(mode)
    results = harness.new_results("-m benchmarks.studies.beyond", argv, settings)
    base_job = {k: settings[k] for k in ("final_prompts", "curve_prompts")}
    baselines = [(baseline, {"regime": REGIME, **base_job})]
    execute(results, out, "beyond.json", render, baselines, run_beyond_job, plan_jobs(settings), args.workers,
            args.resume)  # fmt: skip


if __name__ == "__main__":
    main()
