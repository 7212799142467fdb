"""When does guidance help? GRPO, MInTRL and SORT arms on regimes of the toy task, each defined by a measured
precondition.

    python -m benchmarks.studies.learning             # full run (see MODES["full"]; needs free cores)
    python -m benchmarks.studies.learning --quick     # 1 seed, 6 steps, 4 arms on the in-band regime (~1.5 min idle)
    python -m benchmarks.studies.learning --replot benchmarks/results/learning.json   # tables and plots from the JSON
    python -m benchmarks.studies.learning --recheck in-band:mintrl-const:0   # rerun a recorded run here, compare its scores

Regimes (`benchmarks.tasks.toy.training.REGIMES`), each with its calibration (warm-start pass@1 / pass@8 / pass@64, the
judge's corrections' NLL under the warm start `correction_nats`, and pass@1 / pass@8 on the same problems in familiar
notation) computed in every run and printed with its results: "in-band" = MInTRL's regime: chains of 3-6
operations, two of them `a~b = a+b-1` (stated nowhere), every rule step checked by the reward (`step_reward`), so the
whole solution is out of sampling's reach while each correction is merely unlikely for the warm start; "distance-3" ..
"distance+2" = the same design with the rule's offset moved (the judge's distance swept, `BAND_OPERATORS`);
"out-of-reach" = short chains ending in `a@b = a+b-7` (answers uniform over 0-12, the `@` step checked), too far for
both sampling and training; "reachable" = long chains of familiar operations; "sort-hint" = SORT's regime, the
out-of-reach problems from the hint warm start (`benchmarks/tasks/toy/warm_start_hint/`: it applies a rule stated in its
prompt), with references in the policy's notation and the toy's rule planner writing SORT's plan
(`benchmarks.tasks.toy.hint`). ("unreachable", `a#b = a+b+2`, is the older benchmarks' regime, `beyond.py`'s.)
A MInTRL label's `-near` / `-far` suffix picks the rule judge's notation: the policy's (`14+3=10`) or the
reference's (`14@3=10`); without one, the regime's own (near on the in-band family, far elsewhere). Every arm starts
from its regime's committed warm start, trains for the same optimizer steps on the same prompts (per seed) with the
same optimiser and lr schedule (chosen for GRPO), and is evaluated on the same held-out problems (pass@1 and pass@8 from 8 samples at temperature 1). Each arm is
compared to GRPO by the paired difference over seeds with a 95% t-interval. The arms are the toy task's
(`benchmarks.tasks.toy.arms.LABELS`), each run its `benchmarks.tasks.toy.run.run_job`. `learning.json` records the
command, the commit, the settings and one record per run (regime, label, seed, final scores, curve of held-out pass@1 /
pass@8, per-step logs), and is rewritten after every run; `learning.md` and the PNGs are rendered from it.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.plots import curve_grid, interval_errorbar, log_grid, pyplot, save
from benchmarks.lib.provenance import provenance
from benchmarks.lib.readme import markers
from benchmarks.lib.records import (
    RESULTS,
    arm_key,
    arm_provenance,
    final_by_seed,
    output_folder,
    provenance_lines,
    run_provenance,
    runs_of,
)
from benchmarks.lib.stats import format_interval, format_mean_std, mean_interval, paired_difference
from benchmarks.tasks.toy import tables
from benchmarks.tasks.toy.arms import LABELS, MODE_SETTINGS, default_notation, main_job, sweep_job
from benchmarks.tasks.toy.run import baseline, execute, rerun_recorded, run_job
from benchmarks.tasks.toy.training import DISTANCE_REGIMES

# intervention-intensity sweep (MInTRL-const on the in-band regime, its near judge), from the fewest judge tokens to
# the most: point -> job fields (config overrides, steps per correction, judge revises every rollout from its first
# step). "off" and "default" are the main runs mintrl-off and mintrl-const; the targets hold the judge-token share
# near 1% / 3% (the paper's sweet spot is 2-4%); "whole-solution" is the off-policy extreme (the judge writes every
# intervened rollout from the start: about half of all tokens).
SWEEP_REGIME = "in-band"
SWEEP = {
    "off": None,
    "target-1%": dict(overrides={"judge_token_target": 0.01}, judge_steps=1),
    "target-3%": dict(overrides={"judge_token_target": 0.03}, judge_steps=1),
    "default": None,
    "all-steps": dict(overrides={"max_correction_tokens": 96}, judge_steps=8),
    "whole-solution": dict(overrides={"max_correction_tokens": 96}, judge_steps=8, judge_from_start=True),
}
SWEEP_MAIN = {"off": "mintrl-off", "default": "mintrl-const"}
REACHABLE_ARMS = ["grpo", "mintrl-const", "mintrl-const-full", "sort", "sort-uniform"]
NOTATION_ARMS = ["mintrl-const-near", "mintrl-const-far", "mintrl-proxy-near", "mintrl-proxy-far"]
BAND_ARMS = ["grpo", "grpo-2x", "mintrl-const", "mintrl-proxy", "mintrl-off", "sort", "sort-uniform"]
RETENTION_ARMS = ["mintrl-const-adaptive", "mintrl-const-decay", "grpo-lowlr", "mintrl-const-lowlr"]
DISTANCE_ARMS = ["grpo", "mintrl-const"]
# the full run in parts of at most ~90 minutes on 2 cores each (`--part`), merged into one learning.json: a part
# reruns its regimes' arms (all, or the labels it names) and the sweep if it says so, and keeps every other record
_SORT_ARMS = ["sort", "sort-uniform"]
PARTS = {
    "band": dict(regimes={"in-band": [a for a in BAND_ARMS + RETENTION_ARMS if a not in _SORT_ARMS]}, sweep=False),
    "distance": dict(regimes={regime: None for regime in DISTANCE_REGIMES[1:]}, sweep=True),
    "sort": dict(regimes={"in-band": _SORT_ARMS, "sort-hint": None}, sweep=False),
    # the controls on either side of the band, one part each (together 70 runs: over two hours on 2 cores)
    "out-of-reach": dict(regimes={"out-of-reach": None}, sweep=False),
    "reachable": dict(regimes={"reachable": None}, sweep=False),
}
MODES = {
    # the mode's run sizes (`benchmarks.tasks.toy.arms.MODE_SETTINGS`), regimes -> labels, seeds per regime where
    # fewer than the mode's, sweep seeds
    "full": dict(
        MODE_SETTINGS["full"],
        plan={
            # MInTRL's regime, with the retention arms
            "in-band": BAND_ARMS + RETENTION_ARMS,
            # the judge's distance: the in-band design with the rule's offset moved
            **{regime: DISTANCE_ARMS for regime in DISTANCE_REGIMES[1:]},
            # the controls on either side: too far (the near and far judge) and within reach
            "out-of-reach": ["grpo", "grpo-2x", *NOTATION_ARMS, "mintrl-off", "sort", "sort-uniform"],
            "reachable": REACHABLE_ARMS,
            # SORT's regime: hint warm start, rule planner, references in the near notation
            "sort-hint": ["grpo", "sort", "sort-uniform", "sort-beta0", "sort-beta1", "sort-shared"],
        },
        seeds_per_regime={regime: 3 for regime in DISTANCE_REGIMES[1:]},
        sweep_seeds=3,
    ),
    "quick": dict(
        MODE_SETTINGS["quick"],
        plan={"in-band": ["grpo", "mintrl-const", "mintrl-off", "sort-uniform"]},
        seeds_per_regime={},
        sweep_seeds=0,
    ),
    "horizon": dict(  # how long GRPO keeps improving on each regime: the steps the full mode needs
        MODE_SETTINGS["full"],
        steps=96,
        seeds=[0, 1, 2],
        curve_points=8,
        plan={"out-of-reach": ["grpo"], "reachable": ["grpo"], "sort-hint": ["grpo"]},
        seeds_per_regime={},
        sweep_seeds=0,
    ),
    "smoke": dict(
        MODE_SETTINGS["smoke"], plan={"in-band": ["grpo", "mintrl-const"]}, seeds_per_regime={}, sweep_seeds=0
    ),
}


def plan_jobs(settings: dict, parts: list[str] | None = None) -> list[dict]:
    """One job per (regime, label, seed), then the sweep's extra points, in plan order; with `parts` (full mode), only
    the regimes (and the sweep) of those `PARTS`."""
    scope, sweep = _part_scope(settings, parts)
    jobs = []
    for regime, labels in scope.items():
        seeds = settings["seeds"][: settings["seeds_per_regime"].get(regime, len(settings["seeds"]))]
        for seed in seeds:
            for label in labels:
                jobs.append(main_job(settings, regime, label, *LABELS[label], seed))
    for seed in settings["seeds"][: settings["sweep_seeds"] if sweep else 0]:
        for point, spec in SWEEP.items():
            if spec is None:
                continue
            jobs.append(sweep_job(settings, SWEEP_REGIME, point, spec, seed))
    return jobs


def _part_scope(settings: dict, parts: list[str] | None) -> tuple[dict[str, list[str]], bool]:
    """The labels per regime and whether the sweep run: everything planned without `parts`, else the parts'."""
    if not parts:
        return dict(settings["plan"]), True
    scope: dict[str, list[str]] = {}
    for part in parts:
        for regime, labels in PARTS[part]["regimes"].items():
            scope[regime] = list(dict.fromkeys(scope.get(regime, []) + (labels or settings["plan"][regime])))
    return scope, any(PARTS[part]["sweep"] for part in parts)


def merge_previous(results: dict, previous: dict, parts: list[str]) -> dict:
    """`results` (a part's fresh run) with every record of `previous` (learning.json before it) that the parts do not
    rerun: other arms' runs, other regimes' calibrations, and the sweep unless a part reruns it. Each regime's
    calibration keeps the provenance of the last run that wrote it (`regime_provenance`), each arm (regime and
    label) that of the run that wrote its runs (`arm_provenance`; a file without them: its top-level provenance)."""
    scope, sweep = _part_scope(results["settings"], parts)

    seeds = set(results["settings"]["seeds"])

    def kept(run: dict) -> bool:
        if run.get("group") == "sweep":  # a sweep of another regime is the previous design's: in git history
            return not sweep and run["regime"] == SWEEP_REGIME
        # a part reruns its arms at the design seeds; runs merged from reproduce.py at other seeds stay
        return run["label"] not in scope.get(run["regime"], []) or run["seed"] not in seeds

    old_provenance = previous.get("regime_provenance") or {
        b["regime"]: previous["provenance"] for b in previous["baselines"]
    }
    results["baselines"] = [b for b in previous["baselines"] if b["regime"] not in scope] + results["baselines"]
    kept_runs = [r for r in previous["runs"] if kept(r)]
    results["arm_provenance"] = {
        **{arm_key(r): arm_provenance(previous, r["regime"], r["label"]) for r in kept_runs},
        **results.get("arm_provenance", {}),
    }
    results["runs"] = kept_runs + results["runs"]
    results["regime_provenance"] = {**old_provenance, **{r: results["provenance"] for r in scope}}
    if not sweep and previous["settings"].get("sweep", {}).get("regime") == SWEEP_REGIME:
        results["settings"]["sweep"] = previous["settings"]["sweep"]
    return results


# ----------------------------------------------------------------------------------------------------------- report


def sweep_runs(results: dict, point: str) -> list[dict]:
    sweep = sweep_settings(results)
    main = {**SWEEP_MAIN, "default": sweep["default"]}
    return runs_of(results, sweep["regime"], main.get(point, f"sweep:{point}"))


def sweep_settings(results: dict) -> dict:
    """The sweep's regime, judge notation and main-run label for its "default" point, as `normalise` set them
    (this version's SWEEP_REGIME, near judge and SWEEP_MAIN when absent)."""
    return results["settings"].get(
        "sweep", {"regime": SWEEP_REGIME, "judge": "near", "default": SWEEP_MAIN["default"]}
    )


def _as_point(value) -> dict:
    """A curve point: the previous version recorded a float, held-out pass@1 only (no pass@8 to invent)."""
    return value if isinstance(value, dict) else {"pass@1": value}


def normalise(results: dict) -> dict:
    """`results` (learning.json's content) in this version's shape, as a copy; records written by the previous
    version (24 steps, regimes unreachable / reachable) read as well: their float curve points and float `curve0` are
    pass@1 only (pass@8 points stay missing; tables and plots skip them), a missing calibration entry (pass@64) is
    reported as "not recorded" by `calibration_text`, and the sweep's regime, judge and "default" run are taken from
    the sweep runs themselves (there: unreachable, the unsuffixed = far judge, mintrl-const)."""
    results = copy.deepcopy(results)
    for run in results["runs"]:
        run["curve"] = {step: _as_point(v) for step, v in run["curve"].items()}
    for base in results["baselines"]:
        if "curve0" in base:
            base["curve0"] = _as_point(base["curve0"])
    settings = results["settings"]
    if "sweep" not in settings:
        sweep = [r for r in results["runs"] if r.get("group") == "sweep"]
        regime = sweep[0]["regime"] if sweep else SWEEP_REGIME
        judge = sweep[0]["overrides"].get("_judge_notation", default_notation(regime)) if sweep else "near"
        default = (
            SWEEP_MAIN["default"] if SWEEP_MAIN["default"] in settings["plan"].get(regime, []) else "mintrl-const"
        )
        settings["sweep"] = {"regime": regime, "judge": judge, "default": default}
    return results


def report(results: dict) -> str:
    settings = results["settings"]
    lines = [
        "# Learning benchmark (written by benchmarks/studies/learning.py from learning.json; do not edit)",
        "",
        f"{settings['steps']} optimizer steps x {settings['prompts_per_step']} prompts x 8 rollouts (grpo-2x: 16), "
        f"held-out {settings['final_prompts']} problems x 8 samples at temperature 1. Values in %: mean ± std over "
        "seeds; differences to GRPO are paired by seed, with a 95% t-interval; **resolved** = the interval excludes 0.",
        "",
        "Written by:",
        *provenance_lines(results),
        "",
        "## Calibration: where each regime stands against MInTRL's two preconditions",
        "",
        *tables.calibration_table(results),
    ]
    for regime, labels in settings["plan"].items():
        lines += tables.regime_section(results, regime, labels)
    lines += tables.distance_table(results)
    points, sweep = sweep_table(results), sweep_settings(results)
    if points:
        lines += [
            "",
            f"## Intervention intensity (MInTRL-const with the {sweep['judge']} judge, {sweep['regime']} regime)",
            "",
            "Judge-token share = judge tokens / completion tokens during the intervention phase. Gains are paired by "
            "seed against the same trainer without interventions (mintrl-off) and against GRPO.",
            "",
            "| point | settings | seeds | judge-token share | pass@1 | gain over no intervention [95% CI] "
            "| pass@1 - GRPO [95% CI] |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in points:
            lines.append(
                f"| {p['point']} | {p['settings']} | {p['n']} | {format_mean_std(p['share'])} "
                f"| {format_mean_std(p['p1'])} | {format_interval(p['gain'])} | {format_interval(p['vs_grpo'])} |"
            )
        best = max(points, key=lambda p: statistics.fmean(p["p1"]))
        lines += ["", f"Highest mean pass@1: {best['point']} ({format_mean_std(best['share'])}% judge tokens)."]
    wall = results.get("wall_seconds")
    lines += [
        "",
        f"{len(results['runs'])} runs" + (f"; the last run's wall time {wall / 60:.1f} min" if wall else "") + ".",
    ]
    return "\n".join(lines) + "\n"


README_START, README_END = markers("-m benchmarks.studies.learning", "learning-results")


README_REGIMES = ["in-band", "out-of-reach", "reachable", "sort-hint"]  # summary block's columns; distance: a line
# the summary block's rows (the retention and notation variants are in learning.md), those with runs
README_LABELS = ["grpo", "grpo-2x", "mintrl-const", "mintrl-const-full", "mintrl-const-near", "mintrl-const-far",
                 "mintrl-proxy", "mintrl-off", "sort", "sort-uniform", "sort-shared", "sort-beta0", "sort-beta1"]  # fmt: skip


def readme_block(results: dict) -> str:
    """The summary block (docs/benchmarks.md), compact: per main regime, each method's pass@1 difference to GRPO;
    the calibrations, the judge's distance and the intensity sweep in a line each. The full tables: learning.md."""
    results = normalise(results)
    settings = results["settings"]
    regimes = [r for r in README_REGIMES if r in settings["plan"] and runs_of(results, r, "grpo")]
    commits = sorted({run_provenance(results, r)["commit"][:12] for r in results["runs"]})
    lines = [
        f"{settings['steps']} optimizer steps; held-out pass@1 in %, difference to GRPO paired by seed with a 95% "
        f"t-interval (**bold**: resolved). From `benchmarks/results/learning.json` (commits {', '.join(commits)}); "
        "every arm, pass@8, retention and calibration in `benchmarks/results/learning.md`.",
        "",
        "| method | " + " | ".join(f"{r} ({len(runs_of(results, r, 'grpo'))} seeds)" for r in regimes) + " |",
        "|---|" + "---|" * len(regimes),
    ]
    planned = {label for r in regimes for label in settings["plan"][r] if runs_of(results, r, label)}
    for label in (label for label in README_LABELS if label in planned):
        cells = []
        for regime in regimes:
            runs, grpo = runs_of(results, regime, label), runs_of(results, regime, "grpo")
            if not runs:
                cells.append("")
            elif label == "grpo":
                cells.append(format_mean_std([r["final"]["pass@1"] for r in runs]))
            else:
                diff = paired_difference(final_by_seed(runs), final_by_seed(grpo))
                text = format_interval(diff)
                text = f"**{text}**" if diff.resolved else text
                cells.append(text if diff.n == len(grpo) else f"{text} ({diff.n} seeds)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += tables.warm_start_line(results, regimes) + tables.distance_line(results)
    sweep_points, sweep = sweep_table(results), sweep_settings(results)
    if sweep_points:
        gains = ", ".join(
            f"{p['point']} {format_mean_std(p['share'])}%: {format_interval(p['gain'])}" for p in sweep_points
        )
        lines += ["", f"Intensity ({sweep['regime']}, judge-token share: pass@1 gain over no intervention): {gains}."]
    return "\n".join(lines)


def sweep_table(results: dict) -> list[dict]:
    regime = sweep_settings(results)["regime"]
    if regime not in results["settings"]["plan"]:
        return []
    grpo = final_by_seed(runs_of(results, regime, "grpo"))
    off = final_by_seed(runs_of(results, regime, "mintrl-off"))
    sweep_seeds = set(results["settings"]["seeds"][: results["settings"]["sweep_seeds"]])
    points = []
    for point, spec in SWEEP.items():
        runs = [r for r in sweep_runs(results, point) if r["seed"] in sweep_seeds]
        if not runs or not sweep_seeds:
            continue
        p1 = final_by_seed(runs)
        overrides = {k: v for k, v in (spec["overrides"] if spec else {}).items() if not k.startswith("_")}
        settings = "intervention_steps=0" if point == "off" else json.dumps(overrides)  # the judge: in the heading
        if spec is not None and spec["judge_steps"] > 1:
            settings += f", judge writes {spec['judge_steps']} steps"
        if spec is not None and spec.get("judge_from_start"):
            settings += ", from the first step of every intervened rollout"
        points.append(
            {
                "point": point,
                "settings": "the regime's defaults (1 step per correction)" if point == "default" else settings,
                "n": len(runs),
                "share": [tables.log_mean(r, "mintrl/judge_token_frac", True) or 0.0 for r in runs],
                "p1": list(p1.values()),
                "gain": paired_difference(p1, off),
                "vs_grpo": paired_difference(p1, grpo),
            }
        )
    return points


# ------------------------------------------------------------------------------------------------------------ plots


# the logged metrics learning_interventions.png draws: a panel each, (title, the first of these keys a step logged)
LOG_PANELS = [
    ("training reward (controls for MInTRL)", ("mintrl/reward_control", "reward")),
    ("reward of intervened rollouts", ("mintrl/reward_intervened",)),
    ("judge-token NLL under the policy (nats)", ("mintrl/judge_token_nll",)),
    ("policy entropy on completion tokens (nats)", ("entropy",)),
    ("SORT mean repair weight", ("sort/mean_weight",)),
]


def plot(results: dict, out: Path) -> list[Path]:
    plt = pyplot()
    paths = [
        curve_grid(results, out / "learning_curves.png"),
        log_grid(results, LOG_PANELS, out / "learning_interventions.png"),
    ]

    points = sweep_table(results)
    if points:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        xs = [100 * statistics.fmean(p["share"]) for p in points]
        ys = interval_errorbar(ax, xs, [p["gain"] or mean_interval([0.0]) for p in points])
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(p["point"], (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("judge-token share (%, intervention phase)")
        ax.set_ylabel("pass@1 gain over no intervention (points)")
        ax.set_title(f"Intervention intensity (near judge), {SWEEP_REGIME} (95% t-interval)")
        paths.append(save(fig, out / "learning_sweep.png", 110))

    distance = tables.distance_points(results)
    if distance:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for n, key in enumerate(("diff1", "diff8")):
            xs = [p["nats"] + 0.08 * n for p in distance]
            interval_errorbar(ax, xs, [p[key] for p in distance], label=key.replace("diff", "pass@"))
        for p in distance:
            ax.annotate(f"k={p['k']:+d}", (p["nats"], 100 * p["diff1"].mean), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")  # fmt: skip
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvline(tables.BAND_NATS, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("correction_nats: NLL of the judge's corrections under the warm start")
        ax.set_ylabel("MInTRL-const - GRPO (points)")
        ax.set_title("The judge's distance (95% t-interval over seeds)")
        ax.legend(fontsize=8)
        paths.append(save(fig, out / "learning_distance.png", 110))
    return paths


# ------------------------------------------------------------------------------------------------------------- main


def render(results: dict, out: Path, plots: bool = True) -> str:
    """Write learning.md (and the PNGs) from `results`, the content of learning.json (either version's records)."""
    return harness.write_report(normalise(results), out, "learning.md", report, plot, plots)


CLI_MODES = {  # the flags of the modes besides full, the first given wins
    "smoke": "1 step, 2 prompts, 2 seeds, 2 methods (the test)",
    "quick": "1 seed, 6 steps, 4 arms on in-band, no sweep (~1.5 min on 2 idle cores)",
    "horizon": "GRPO alone, 96 steps, 3 seeds, every regime: when its curve flattens",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render learning.md and plots from a JSON")
    parser.add_argument(
        "--part",
        nargs="+",
        choices=sorted(PARTS),
        default=None,
        help="full mode in parts: run only these parts' regimes (and the sweep) and merge them into the existing "
        "learning.json, keeping every other record",
    )
    parser.add_argument(
        "--recheck",
        nargs="+",
        metavar="REGIME:LABEL:SEED",
        default=None,
        help="rerun these runs of the output folder's learning.json at this checkout and compare their final "
        "pass@1 / pass@8 with the recorded ones (writes learning_recheck.json; exit status 1 if any differs)",
    )
    args = parser.parse_args(argv)
    load = lambda path: normalise(json.loads(path.read_text()))  # noqa: E731
    if harness.replot_from(args, render, readme_block, (README_START, README_END), load):
        return
    if args.recheck:
        sys.exit(0 if recheck(args.recheck, args.out or RESULTS, argv, args.workers) else 1)
    mode = harness.mode_of(args, CLI_MODES)
    out = output_folder(args.out, mode)
    settings = {"mode": mode, **MODES[mode]}
    results = harness.new_results("-m benchmarks.studies.learning", argv, settings)
    parts = args.part if mode == "full" else None
    if parts and (out / "learning.json").exists():
        results = merge_previous(results, load(out / "learning.json"), parts)
    jobs = plan_jobs(settings, parts)
    base_jobs = [
        {"regime": r, **{k: settings[k] for k in ("final_prompts", "curve_prompts", "calibration_samples")}}
        for r in _part_scope(settings, parts)[0]
    ]
    baselines = [(baseline, job) for job in base_jobs]
    execute(results, out, "learning.json", render, baselines, run_job, jobs, args.workers, args.resume)


def recheck(keys: list[str], out: Path, argv: list[str], workers: int) -> bool:
    """Rerun the runs `keys` (`regime:label:seed`) of `out/learning.json` with its settings at this checkout and
    compare their final pass@1 / pass@8 with the recorded ones: the parts of a full run are written at different
    commits, and this shows whether the code since then changes them. Writes `out/learning_recheck.json`; True when
    every rerun matches."""
    prov = provenance("-m benchmarks.studies.learning", argv)  # the checkout the reruns start from
    results = normalise(json.loads((out / "learning.json").read_text()))
    plan = {(j["regime"], j["label"], str(j["seed"])): j for j in plan_jobs(results["settings"])}
    jobs = []
    for key in keys:
        if tuple(key.rsplit(":", 2)) not in plan:
            raise SystemExit(f"--recheck {key}: not a run of {out / 'learning.json'}'s plan (regime:label:seed)")
        jobs.append(plan[tuple(key.rsplit(":", 2))])
    rows = rerun_recorded(results, jobs, workers)
    (out / "learning_recheck.json").write_text(json.dumps({"provenance": prov, "runs": rows}, indent=1))
    return all(row["same"] for row in rows)


if __name__ == "__main__":
    main()
