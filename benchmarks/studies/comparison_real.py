"""MInTRL at its best judge-token share on SmolLM2-135M-Instruct, against what a user would train instead: the chain
family at 12 steps with the intensity ablation's settings (`run.CHAIN`, `intensity_real.py`). The MInTRL arm is the
ablation's, chosen by a rule written before its results: the highest mean held-out pass@1 over seeds 0-2 among
`mintrl-const`, `mintrl-lines4` and `mintrl-rest` (`tables.best_arm`; a tie goes to the lower share). Against `grpo`,
`sft-grpo` (one SFT epoch on the training references, then GRPO) and `sort` (its references up to 320 tokens: chain
solutions are about 210, over `arms.SORT`'s 96). Seeds 0-2 and fresh seeds 3-5: the arm was chosen on seeds 0-2, so
the confirmation is read on 3-5 alone. The ablation's runs of the same jobs (grpo's and the MInTRL arm's seeds 0-2, the
warm start's measure) are taken from `intensity_real.json`, not run again.

    .venv-vllm/bin/python -m benchmarks.studies.comparison_real --resume --workers 2 --max_runs 2 [--arms A ..]
    .venv-vllm/bin/python -m benchmarks.studies.comparison_real --cost --engine transformers --workers 2
    python -m benchmarks.studies.comparison_real --smoke     # 1 step of each arm on tiny sizes: they train
    python -m benchmarks.studies.comparison_real --replot benchmarks/results/comparison_real.json

`--cost`: 2 steps (one with interventions) of `grpo` and the MInTRL arm at the full per-step sizes on `--engine`, for
the step's cost on each engine (the full runs roll out with vLLM). Sittings, resume and checkpoints as in
`intensity_real.py`.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.provenance import command_line
from benchmarks.lib.sittings import execute_sitting, sitting_output, sitting_parser
from benchmarks.lib.stats import format_interval, format_ratio
from benchmarks.tasks.real import tables
from benchmarks.tasks.real.arms import ENGINES, INTENSITY_ARMS
from benchmarks.tasks.real.run import CHAIN, FULL, SMOKE, describe, measure_warm_start, plan_jobs, run_job

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
ABLATION = RESULTS / "intensity_real.json"
REGIME = "chain"
SELECTION_SEEDS, FRESH_SEEDS = [0, 1, 2], [3, 4, 5]
MINTRL_ARMS = ["mintrl-const", *INTENSITY_ARMS]  # the ablation's, lowest share first
ARMS = ("grpo", "mintrl", "sft-grpo", "sort")  # "mintrl": the ablation's best share (`chosen_arm`)
# SORT trains on the reference's tokens: up to the completion cap here
ARM_OVERRIDES = {"sort": {"max_reference_tokens": 320}}
MODES = {
    "full": {**FULL, **CHAIN, "seeds": SELECTION_SEEDS + FRESH_SEEDS, "arm_overrides": ARM_OVERRIDES},
    "cost": {**FULL, **CHAIN, "steps": 2, "seeds": [0], "final_problems": 8, "curve_problems": 8, "curve_points": 1,
             "arm_overrides": ARM_OVERRIDES},
    "smoke": {**SMOKE, "micro_batch": 4, "arm_overrides": ARM_OVERRIDES},
}  # fmt: skip
CLI_MODES = {
    "cost": "2 steps of grpo and the MInTRL arm at the full sizes on --engine: a step's cost",
    "smoke": "1 step of each arm on tiny sizes, 1 seed (mintrl-const as the MInTRL arm): they train",
}


def chosen_arm(ablation: dict) -> tuple[str | None, dict[str, float]]:
    """The MInTRL arm by the rule (module docstring), None until the ablation has every seed of each; and the mean
    pass@1 of each MInTRL arm recorded so far."""
    means = tables.mean_pass1(ablation, REGIME, MINTRL_ARMS, SELECTION_SEEDS)
    return tables.best_arm(ablation, REGIME, MINTRL_ARMS, SELECTION_SEEDS), means


def split_reused(jobs: list[dict], records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(jobs to run, the recorded runs of the others): a record of the very job (`harness.find_record`) is reused."""
    found = [(job, harness.find_record(job, records)) for job in jobs]
    return [job for job, record in found if record is None], [record for _, record in found if record is not None]


def pairs(mintrl: str) -> list[tuple[str, str, str]]:
    return [(REGIME, mintrl, other) for other in ("grpo", "sft-grpo", "sort")] + [
        (REGIME, arm, "grpo") for arm in ("sft-grpo", "sort")
    ]


def on_seeds(results: dict, seeds: list[int]) -> dict:
    return {**results, "runs": [r for r in results["runs"] if r["seed"] in seeds]}


CHAT_LIMIT, CAP_LIMIT = 0.1, 0.10  # C4: chat NLL change under 0.1 nats a token; last-quarter share at the cap
COST_LIMITS = {"mintrl": 1.3, "sort": 1.2}  # C5 on vLLM: s/step ÷ grpo's, paired by seed (mean)
STEP_LIMIT = 1.5  # C5 on `--cost`: the MInTRL arm's first step (with interventions) ÷ grpo's first step


def hypothesis_lines(results: dict) -> list[str]:
    """C1-C5 (docs/benchmarks.md), each by the rule written with it: C1-C4 on the fresh seeds alone, C5 on every
    seed. A verdict is "open" while a pair lacks 2 shared fresh seeds."""
    mintrl = results["settings"]["mintrl_arm"]
    fresh = on_seeds(results, FRESH_SEEDS)
    runs = lambda arm, res=fresh: tables.runs_of(res, REGIME, arm)  # noqa: E731
    d = {(a, b, k): harness.versus(runs(a), runs(b), k) for a, b in ((mintrl, "grpo"), ("sft-grpo", "grpo"),
         (mintrl, "sft-grpo"), ("sort", "grpo"), ("sort", "sft-grpo")) for k in ("pass@1", "pass@8")}  # fmt: skip

    def read(*checks) -> str:
        """'holds' / 'does not hold (what failed)' for (label, interval, sign) checks: sign +1 wants the mean above 0,
        -1 below 0, 0 at or below 0; "open" while an interval is missing."""
        if any(i is None or i.low is None for _, i, _ in checks):
            return "open (fewer than 2 paired fresh seeds)"
        failed = [label for label, i, sign in checks if not (i.mean > 0 if sign > 0 else i.mean < 0 if sign < 0
                  else i.mean <= 0)]  # fmt: skip
        return "holds" if not failed else f"does not hold ({', '.join(failed)})"

    c1 = d[(mintrl, "grpo", "pass@1")]
    c1_text = read(("mean", c1, 1)) + ("" if c1 is None or c1.low is None else (
        ", resolved (interval above 0)" if c1.low > 0 else ", not resolved"))  # fmt: skip
    chat = [r["final"]["chat_nll_change"] for r in fresh["runs"]]
    caps = {f"{mintrl} s{r['seed']}": tables.mean_logged(tables.last_quarter_logs(r), "completions/clipped_ratio")
            for r in runs(mintrl)}  # fmt: skip
    kl = {arm: statistics.fmean(r["final"]["kl"] for r in rs) for arm in results["settings"]["plan"][REGIME]
          if (rs := runs(arm))}  # fmt: skip
    over_cap = [name for name, cap in caps.items() if cap is None or cap >= CAP_LIMIT]
    c4 = ("open (no fresh run yet)" if not chat else
          f"largest chat NLL change {max(chat):+.3f} ({'under' if max(chat) < CHAT_LIMIT else 'not under'} "
          f"{CHAT_LIMIT}); MInTRL runs at the cap under {100 * CAP_LIMIT:.0f}% in the last quarter: "
          f"{len(caps) - len(over_cap)} of {len(caps)}{'' if not over_cap else ' (not ' + ', '.join(over_cap) + ')'}; "
          f"highest mean KL: {max(kl, key=kl.get) if kl else '-'} (predicted sft-grpo)")  # fmt: skip
    cost = {arm: tables.paired_ratio(runs(label, results), runs("grpo", results), tables.mean_steps) for arm, label in
            (("mintrl", mintrl), ("sort", "sort"))}  # fmt: skip
    c5 = "; ".join(f"{label} s/step ÷ grpo {'-' if r is None else format_ratio(r)} (predicted within "
                   f"{COST_LIMITS[arm]}x: {'-' if r is None else 'yes' if r.mean <= COST_LIMITS[arm] else 'no'})"
                   for (arm, r), label in zip(cost.items(), (mintrl, "sort"), strict=True))  # fmt: skip
    return [
        f"- C1 ({mintrl} above grpo, pass@1): {format_interval(c1)} points: {c1_text}.",
        f"- C2 (sft-grpo above grpo, {mintrl} not above sft-grpo): sft-grpo − grpo pass@1 "
        f"{format_interval(d[('sft-grpo', 'grpo', 'pass@1')])}, pass@8 {format_interval(d[('sft-grpo', 'grpo', 'pass@8')])}"
        f"; {mintrl} − sft-grpo pass@1 {format_interval(d[(mintrl, 'sft-grpo', 'pass@1')])}: "
        + read(("sft-grpo − grpo pass@1", d[("sft-grpo", "grpo", "pass@1")], 1),
               ("sft-grpo − grpo pass@8", d[("sft-grpo", "grpo", "pass@8")], 1),
               (f"{mintrl} − sft-grpo pass@1", d[(mintrl, "sft-grpo", "pass@1")], 0)) + ".",
        f"- C3 (sort above grpo, below sft-grpo, pass@1): sort − grpo {format_interval(d[('sort', 'grpo', 'pass@1')])}, "
        f"sort − sft-grpo {format_interval(d[('sort', 'sft-grpo', 'pass@1')])}: "
        + read(("sort − grpo", d[("sort", "grpo", "pass@1")], 1), ("sort − sft-grpo", d[("sort", "sft-grpo", "pass@1")],
               -1)) + ".",
        f"- C4 (stability): {c4}.",
        f"- C5 (cost on {results['settings']['engine']}, every seed): {c5}.",
    ]  # fmt: skip


def step_cost_line(results: dict) -> str:
    """C5's `--cost` part: the MInTRL arm's first step, with interventions, against grpo's first step (one step each:
    a point, not an interval)."""
    mintrl, engine = results["settings"]["mintrl_arm"], results["settings"]["engine"]
    first = {arm: runs[0]["step_seconds"][0] for arm in ("grpo", mintrl) if (runs := tables.runs_of(results, REGIME,
             arm))}  # fmt: skip
    if len(first) < 2:
        return f"- C5 on {engine}: open (a first step of grpo and of {mintrl} is needed)."
    ratio = first[mintrl] / first["grpo"]
    return (f"- C5 on {engine}: {mintrl}'s first step (interventions) {first[mintrl]:.0f} s, grpo's {first['grpo']:.0f} "
            f"s: {ratio:.2f}x (predicted within {STEP_LIMIT}x: {'yes' if ratio <= STEP_LIMIT else 'no'}; one step "
            "each, a point, not an interval).")  # fmt: skip


def report(results: dict) -> str:
    s = results["settings"]
    mintrl = s["mintrl_arm"]
    means = ", ".join(f"{arm} {100 * mean:.1f}%" for arm, mean in s["ablation_pass1"].items())
    chosen = f"`{mintrl}`" if mintrl else "not chosen yet (the ablation's seeds are not all recorded)"
    lines = [f"# MInTRL at its best share ({mintrl or 'not chosen yet'}) against GRPO, SFT then GRPO, and SORT: the "
             "chain family", "", "Written by benchmarks/studies/comparison_real.py from its JSON; do not edit.", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"The MInTRL arm: {chosen}, by the rule written before the ablation's results (the highest mean "
             f"held-out pass@1 over seeds {SELECTION_SEEDS} in `{s['ablation']}`: {means or 'none recorded'}).", "",
             f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}, completions of at "
             f"most {s['max_completion_length']} tokens, MInTRL's chunks of {s['overrides'].get('chunk_size')} "
             f"tokens, SORT's references of at most {s['arm_overrides']['sort']['max_reference_tokens']} tokens, "
             f"rollouts by {s['engine']}; held-out sets of {s['final_problems']} problems x 8 samples. Held-out "
             "pass@k in %, mean ± std over seeds; differences paired by seed with 95% t-intervals (points; nats per "
             "token for chat NLL and KL).", "", *tables.warm_start_lines(results), "", *tables.score_rows(results),
             ""]  # fmt: skip
    if s["mode"] == "full":
        lines += [f"Paired differences on the fresh seeds {FRESH_SEEDS} (the confirmation: seeds {SELECTION_SEEDS} "
                  "chose the MInTRL arm):", "", *tables.pair_rows(on_seeds(results, FRESH_SEEDS), pairs(mintrl)), "",
                  f"On every seed (seeds {SELECTION_SEEDS} chose the MInTRL arm, so its rows there are the best of "
                  "three):", "", *tables.pair_rows(results, pairs(mintrl)), "", "The hypotheses (docs/benchmarks.md), "
                  "each against the rule written with it:", "", *hypothesis_lines(results), ""]  # fmt: skip
    if s["mode"] == "cost":
        lines += [step_cost_line(results), ""]
    lines += ["Cost, paired by seed:", "", *tables.cost_rows(results), "",
              "Training health (first → last quarter of the logged steps):", "", *tables.health_rows(results)]  # fmt: skip
    return "\n".join(lines) + "\n"


def file_name(results: dict) -> str:
    s = results["settings"]
    return {"full": "comparison_real", "cost": f"comparison_real_cost_{s['engine']}"}.get(
        s["mode"], f"comparison_real_{s['mode']}"
    )


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, f"{file_name(results)}.md", report)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    parser = sitting_parser(
        __doc__, CLI_MODES, ARMS, ENGINES, "only these arms' runs (mintrl: the ablation's best share)"
    )
    parser.add_argument("--ablation", type=Path, default=ABLATION,
                        help="the intensity ablation's results: the MInTRL arm, and runs to reuse")  # fmt: skip
    args = parser.parse_args(argv)
    if harness.replot_from(args, render):
        return None
    mode = harness.mode_of(args, CLI_MODES)
    out = sitting_output(args.out, mode, RESULTS)
    ablation = json.loads(args.ablation.read_text()) if args.ablation.is_file() else {"runs": [], "baselines": []}
    mintrl, means = ("mintrl-const", {}) if mode == "smoke" else chosen_arm(ablation)
    arms = args.arms or list(ARMS)
    if mintrl is None and "mintrl" in arms:
        raise SystemExit(f"--arms mintrl: the MInTRL arm is chosen from the intensity ablation's seeds "
                         f"{SELECTION_SEEDS} of {', '.join(MINTRL_ARMS)}, not all recorded in {args.ablation}; finish "
                         "benchmarks.studies.intensity_real first, or run --arms sft-grpo sort")  # fmt: skip
    labels = [label for arm in ARMS if mode != "cost" or arm in ("grpo", "mintrl")
              if (label := mintrl if arm == "mintrl" else arm) is not None]  # fmt: skip
    engine = args.engine or ("transformers" if mode == "smoke" else "vllm")
    settings = {"mode": mode, **MODES[mode], "engine": engine, "plan": {REGIME: labels}, "mintrl_arm": mintrl,
                "ablation_pass1": means, "ablation": str(args.ablation.relative_to(ROOT) if args.ablation.is_relative_to(
                    ROOT) else args.ablation)}  # fmt: skip
    baselines, jobs = plan_jobs(settings, [mintrl if arm == "mintrl" else arm for arm in arms])
    jobs, reused = split_reused(jobs, ablation["runs"]) if mode == "full" else (jobs, [])
    baselines, reused_baselines = split_reused(baselines, ablation["baselines"]) if mode == "full" else (baselines, [])
    baselines = [] if mode == "cost" else baselines  # a step's cost needs no warm-start measure
    results = harness.new_results("benchmarks/studies/comparison_real.py", argv, settings, runs=reused,
                                  baselines=reused_baselines)  # fmt: skip
    return execute_sitting(results, out, f"{file_name(results)}.json", args, baselines=baselines, jobs=jobs,
                           measure=measure_warm_start, run=run_job, describe=describe, render=render)  # fmt: skip


if __name__ == "__main__":
    main()
