"""When references are far from the student: SFT on them against MInTRL's corrections.

    python -m benchmarks.studies.references --workers 2   # full: 50 runs of learning.py's in-band jobs (~40 min, 2 free cores)
    python -m benchmarks.studies.references --quick       # 1 seed, 6 steps (~3 min)
    python -m benchmarks.studies.references --replot benchmarks/results/references.json

The in-band regime's reference solutions are rewritten at increasing distance from the student
(`benchmarks.tasks.toy.reference_styles`: its own notation, the rule's symbol, a teacher's spacing, a word of prose per
step), the distance measured as their mean NLL per token under the warm start. At each distance the methods that
learn from references train on them: SFT on the references for one epoch and then GRPO (the paper's SFT+GRPO,
`sft-grpo`; its score after SFT alone is recorded too), SFT on the references of all-wrong groups mixed into GRPO
(`sort-uniform`) and SORT. GRPO reads no reference, and MInTRL-const's rule judge writes its corrections in the
student's notation from the problem whatever the reference looks like (what a strong judge does): their runs are the
same at every distance, so they come from learning.json's in-band runs at the same seeds (same jobs, checked),
and so do the own-style runs of sort and sort-uniform.

Hypotheses, written before the full run (the paper: "SFT sees too many answers it cannot learn"): (h1) sft-grpo's and
sort-uniform's gain over GRPO falls as the references' NLL rises, and at the farthest style is below MInTRL-const's,
resolved; (h2) MInTRL-const - sort-uniform, about 0 with the student's own references (-0.2 [-2.4, +1.9] over 10
seeds), turns positive at the far styles; (h3) SORT, whose weights sqrt(p_base * p_plan) discount tokens the student
finds unlikely, loses less of its gain with distance than the uniform weighting does.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.plots import interval_errorbar, pyplot, save
from benchmarks.lib.provenance import command_line
from benchmarks.lib.readme import markers
from benchmarks.lib.records import RESULTS, output_folder, split_recorded
from benchmarks.lib.stats import format_interval, format_mean_std, paired_difference
from benchmarks.tasks.toy.arms import LABELS, MODE_SETTINGS, main_job
from benchmarks.tasks.toy.reference_styles import STYLES
from benchmarks.tasks.toy.run import execute, run_job
from benchmarks.tasks.toy.training import HELDOUT_SEED

REGIME = "in-band"
# arms that read the references: label -> (method, overrides) at the student's own style (`sft-grpo`: SFT on them,
# `benchmarks.tasks.toy.arms.SFT_FIRST`, then GRPO); the other styles add `_reference_style` (label `arm@style`)
REFERENCE_ARMS = {arm: LABELS[arm] for arm in ("sft-grpo", "sort-uniform", "sort")}
GRPO, MINTRL = "grpo", "mintrl-const"  # read no reference: one run per seed serves every style
MODES = {  # seeds, learning.py's mode whose jobs run, reference styles
    "full": dict(seeds=[0, 1, 2, 3, 4], learning_mode="full", styles=list(STYLES)),
    "quick": dict(seeds=[0], learning_mode="quick", styles=list(STYLES)),
    "smoke": dict(seeds=[0], learning_mode="smoke", styles=["own", "spaced"]),  # the test: 8 runs of seconds
}
README_START, README_END = markers("-m benchmarks.studies.references", "reference-distance")


def arm_label(arm: str, style: str) -> str:
    return arm if style == "own" else f"{arm}@{style}"


def planned_jobs(settings: dict) -> list[dict]:
    """learning.py's main jobs: GRPO and MInTRL-const once per seed, every reference arm at every style."""
    learning_settings = MODE_SETTINGS[settings["learning_mode"]]
    jobs = []
    for seed in settings["seeds"]:
        for label in (GRPO, MINTRL):
            jobs.append(main_job(learning_settings, REGIME, label, *LABELS[label], seed))
        for style in settings["styles"]:
            for arm, (method, overrides) in REFERENCE_ARMS.items():
                styled = overrides if style == "own" else {**overrides, "_reference_style": style}
                jobs.append(main_job(learning_settings, REGIME, arm_label(arm, style), method, styled, seed))
    return jobs


def reference_distance(job: dict) -> dict:
    """Per style: the mean NLL per token (and its std over references) of the held-out problems' references written
    in it, under the warm start, answer line and end token included: how far each is from what the student writes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy.reference_styles import write_reference
    from benchmarks.tasks.toy.training import REGIMES
    from benchmarks.tasks.toy.warm_start import sft_batch

    torch.set_num_threads(1)
    regime = REGIMES[job["regime"]]
    tokenizer = AutoTokenizer.from_pretrained(regime.warm_start)
    model = AutoModelForCausalLM.from_pretrained(regime.warm_start).eval()
    problems = regime.problems(job["final_prompts"], seed=HELDOUT_SEED)
    distance = {}
    for style in job["styles"]:
        per_reference = []
        for problem in problems:
            batch = sft_batch(tokenizer, [(problem.row()["prompt"], write_reference(problem, style))])
            with torch.no_grad():
                per_reference.append(model(**batch).loss.item())  # mean over the reference's tokens
        distance[style] = {"nll_per_token": statistics.fmean(per_reference), "std": statistics.stdev(per_reference)}
    return {"regime": job["regime"], "kind": "reference_distance", "styles": distance}


# ----------------------------------------------------------------------------------------------------------- report


def _by_seed(results: dict, label: str, key: str = "pass@1", where: str = "final") -> dict[int, float]:
    return harness.by_seed(harness.select(results["runs"], label=label), key, where)


def _distance(results: dict) -> dict:
    return next(b["styles"] for b in results["baselines"] if b.get("kind") == "reference_distance")


def styles_by_distance(results: dict) -> list[str]:
    distance = _distance(results)
    return sorted(distance, key=lambda style: distance[style]["nll_per_token"])


def rows(results: dict, key: str = "pass@1") -> list[dict]:
    """Per style (nearest first) and arm: its mean score, its difference to GRPO and MInTRL-const - it, paired by
    seed; SFT alone (sft-grpo's score after SFT) as its own arm."""
    grpo, mintrl = _by_seed(results, GRPO, key), _by_seed(results, MINTRL, key)
    out = []
    for style in styles_by_distance(results):
        arms = {arm: _by_seed(results, arm_label(arm, style), key) for arm in REFERENCE_ARMS}
        arms["sft-only"] = _by_seed(results, arm_label("sft-grpo", style), key, where="sft_end")
        for arm, scores in arms.items():
            if scores:
                out.append(
                    dict(
                        style=style,
                        arm=arm,
                        scores=scores,
                        minus_grpo=paired_difference(scores, grpo),
                        mintrl_minus=paired_difference(mintrl, scores),
                    )
                )
    return out


def report(results: dict) -> str:
    prov, distance = results["provenance"], _distance(results)
    lines = [
        "# References far from the student (written by benchmarks/studies/references.py from references.json; do not edit)",
        "",
        command_line(prov, results.get("recorded_provenance")),
        "",
        "In-band regime, learning.py's jobs; held-out pass@1 / pass@8 in %, mean ± std over seeds; differences paired "
        "by seed with 95% t-intervals. GRPO and MInTRL-const read no reference (one run per seed serves every "
        "style). `sft-only`: sft-grpo's model after its SFT epoch, before GRPO.",
        "",
    ]
    grpo, mintrl = _by_seed(results, GRPO), _by_seed(results, MINTRL)
    lines.append(
        f"GRPO {format_mean_std(list(grpo.values()))} ({len(grpo)} seeds); MInTRL-const "
        f"{format_mean_std(list(mintrl.values()))}, - GRPO {format_interval(paired_difference(mintrl, grpo))}."
    )
    lines += [
        "",
        "| style | NLL / token | arm | seeds | pass@1 | pass@1 - GRPO [95% CI] | MInTRL-const - arm [95% CI] |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for row in rows(results):
        d = distance[row["style"]]
        lines.append(
            f"| {row['style']} | {d['nll_per_token']:.3f} ± {d['std']:.3f} | {row['arm']} | {len(row['scores'])} | "
            f"{format_mean_std(list(row['scores'].values()))} | {format_interval(row['minus_grpo'])} | "
            f"{format_interval(row['mintrl_minus'])} |"
        )
    lines += ["", "pass@8:", "", "| style | arm | pass@8 | pass@8 - GRPO [95% CI] | MInTRL-const - arm [95% CI] |"]
    lines.append("|---|---|---|---|---|")
    for row in rows(results, "pass@8"):
        lines.append(
            f"| {row['style']} | {row['arm']} | {format_mean_std(list(row['scores'].values()))} | "
            f"{format_interval(row['minus_grpo'])} | {format_interval(row['mintrl_minus'])} |"
        )
    lines += ["", "Per run (final held-out pass@1 / pass@8, %; train seconds, SFT included):", ""]
    for run in sorted(results["runs"], key=lambda r: (r["label"], r["seed"])):
        sft = (
            f"; after SFT {100 * run['sft_end']['pass@1']:.2f} / {100 * run['sft_end']['pass@8']:.2f}"
            if "sft_end" in run
            else ""
        )
        lines.append(
            f"- {run['name']}: {100 * run['final']['pass@1']:.2f} / {100 * run['final']['pass@8']:.2f}; "
            f"{run['train_seconds']:.0f} s{sft}"
        )
    return "\n".join(lines) + "\n"


def readme_block(results: dict) -> str:
    """The summary block's lines: per style, the reference arms' pass@1 - GRPO and MInTRL-const - arm."""
    lines = [
        "References rewritten farther from the student (`benchmarks/studies/references.py`, in-band, "
        f"{len(results['settings']['seeds'])} seeds, pass@1 points, paired 95% t-intervals; MInTRL-const's judge "
        "writes in the student's notation at every distance; spaced and worded use characters the warm start never "
        "produced, and one SFT epoch on them breaks the toy model). From `benchmarks/results/references.json` (commit "
        f"`{results['provenance']['commit'][:12]}`).",
        "",
        "| references (NLL / token under the warm start) | arm | - GRPO | MInTRL-const - arm |",
        "|---|---|---|---|",
    ]
    distance = _distance(results)
    for row in rows(results):
        lines.append(
            f"| {row['style']} ({distance[row['style']]['nll_per_token']:.2f}) | {row['arm']} | "
            f"{format_interval(row['minus_grpo'])} | {format_interval(row['mintrl_minus'])} |"
        )
    return "\n".join(lines)


def plot(results: dict, out: Path) -> Path:
    """pass@1 - GRPO against the references' NLL per token, one line per arm, MInTRL-const as a band."""
    distance = _distance(results)
    fig, ax = pyplot().subplots(figsize=(6.4, 4.2))
    mintrl = paired_difference(_by_seed(results, MINTRL), _by_seed(results, GRPO))
    if mintrl is not None and mintrl.low is not None:
        ax.axhspan(100 * mintrl.low, 100 * mintrl.high, color="tab:green", alpha=0.15, label="MInTRL-const (95% CI)")
    for offset, arm in enumerate(["sft-grpo", "sort-uniform", "sort", "sft-only"]):
        points = [r for r in rows(results) if r["arm"] == arm and r["minus_grpo"] is not None]
        xs = [distance[r["style"]]["nll_per_token"] + 0.01 * (offset - 1.5) for r in points]
        interval_errorbar(ax, xs, [r["minus_grpo"] for r in points], capsize=3, label=arm)
    for style in distance:
        ax.annotate(style, (distance[style]["nll_per_token"], 0), textcoords="offset points", xytext=(0, -12),
                    ha="center", fontsize=8)  # fmt: skip
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("references' mean NLL per token under the warm start")
    ax.set_ylabel("held-out pass@1 - GRPO (points)")
    ax.set_title("In-band: learning from references as they move away from the student")
    ax.legend(fontsize=8)
    return save(fig, out / "references_distance.png", 120)


def render(results: dict, out: Path, plots: bool = True) -> str:
    """Write references.md (and the PNG) from `results`, the content of references.json."""
    if not any(b.get("kind") == "reference_distance" for b in results["baselines"]):
        return ""  # the distance is measured first; nothing to render before it
    return harness.write_report(results, out, "references.md", report, plot, plots)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    modes = {"smoke": "1 seed, 1 step, 2 prompts (the test)", "quick": "1 seed, learning.py's quick jobs"}
    parser = harness.study_parser(__doc__, modes, replot_help="re-render references.md and the plot from a JSON")
    parser.add_argument(
        "--learning",
        type=Path,
        default=RESULTS / "learning.json",
        help="recorded runs to reuse where the job is the same",
    )
    args = parser.parse_args(argv)
    if harness.replot_from(args, render, readme_block, (README_START, README_END)):
        return
    mode = harness.mode_of(args, modes)
    out = output_folder(args.out, mode)
    settings = {"mode": mode, **MODES[mode]}
    recorded_file = json.loads(args.learning.read_text()) if args.learning.exists() else None
    jobs, recorded, recorded_prov = split_recorded(planned_jobs(settings), recorded_file)
    results = harness.new_results(
        "-m benchmarks.studies.references", argv, settings, runs=recorded, recorded_provenance=recorded_prov
    )
    base_job = {
        "regime": REGIME,
        "final_prompts": MODE_SETTINGS[settings["learning_mode"]]["final_prompts"],
        "styles": settings["styles"],
    }
    execute(results, out, "references.json", render, [(reference_distance, base_job)], run_job, jobs, args.workers,
            args.resume)  # fmt: skip


if __name__ == "__main__":
    main()
