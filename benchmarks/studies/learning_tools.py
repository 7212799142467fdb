"""Do interventions help when the decisive step is a tool call? GRPO, MInTRL and the reference arms on the tool task.

    python -m benchmarks.studies.learning_tools            # full run (5 seeds, both regimes; needs free cores)
    python -m benchmarks.studies.learning_tools --quick    # 1 seed, 4 steps, in-band, every arm (minutes)
    python -m benchmarks.studies.learning_tools --fresh    # the in-band headline on fresh seeds 5-9 (H5)
    python -m benchmarks.studies.learning_tools --replot benchmarks/results/learning_tools.json [--readme docs/benchmarks.md]

The task (`benchmarks.tasks.toy.tool_task`): `Compute 4+a-b+2 =` where the registers' values are only in the
environment (`RegisterEnv`, TRL's `environment_factory`); the reward (`tool_reward`) is 1 for the right answer with
every register read through the `get` tool, so a guess earns nothing. Two regimes of one warm start
(`benchmarks/tasks/toy/warm_start_tools/`), calibrated before any method ran (`benchmarks/results/tools_calibration.md`):
"in-band" (`Compute`: the warm start rarely calls, pass@64 0%, the rule judge's correction is the call at ~10 nats)
and "reachable" (`Evaluate`: it calls in ~10% of rollouts, pass@8 28%), the control.

Arms (every arm from the warm start, same prompts per seed, same optimiser and schedule as `benchmarks/studies/learning.py`,
TRL's tool loop with at most 3 tool-calling iterations and 128 completion tokens):
- `grpo`: TRL's `GRPOTrainer` with `environment_factory=RegisterEnv`, 8 rollouts a prompt;
- `grpo-2x`: the same with 16 rollouts a prompt (twice MInTRL's rollouts: it also pays for the judge);
- `mintrl-const`: `MInTRLTrainer` with the same environment, 4 control + 4 intervened rollouts, the rule judge
  (`tool_judge`: the first wrong or missing call flagged, the next call written in the policy's format), chunks of 16
  tokens, 6 reviews, const anchor, interventions for the first 40% of steps;
- `sft-grpo` (in-band): one epoch of SFT on the training prompts' reference transcripts (the calls, TRL's result
  tokens without loss, the computation; `tool_chat.sft_example`), then `grpo`;
- `sort` (in-band): `SORTTrainer` with the reference transcripts as its reference column (conversations: the
  repair learns the assistant turns, tool results weight 0), the policy writing the plans (SORT's default).
Held-out pass@1 and pass@8 (8 samples at temperature 1, 96 problems, the tool loop on: MInTRL's rollout without a
judge, the same parser and result tokens as TRL's loop) at the end and on a curve (32 problems); each arm against
GRPO by the paired difference over seeds with a 95% t-interval.

Hypotheses (written before the full run, from the calibration):
- H1 (in-band): mintrl-const beats grpo and grpo-2x on pass@1 and pass@8 (intervals above 0): GRPO's groups are
  all-wrong on almost every prompt (warm-start pass@64 0%), while one correction per intervened rollout makes a
  rewarded trajectory (45% of intervened rollouts at the warm start).
- H2 (reachable): mintrl-const is within the interval of grpo (no gain): GRPO already has signal.
- H3 (in-band): sft-grpo reaches the calling habit fastest and ends at least as high as mintrl-const (it is shown the
  calls on every training prompt); sort ends between grpo and sft-grpo.
- H4: mintrl-const's judge-token share starts near the calibration's ~33% and falls during the intervention phase as
  the policy calls by itself, and the judge tokens' NLL falls with it (else the ~10-nat correction is not absorbed).
- H5 (written after 11 of the full run's 40 runs had finished, before its tables): on fresh seeds 5-9 (`--fresh`:
  in-band grpo, mintrl-const, sft-grpo) each difference to GRPO has the sign it has on seeds 0-4, and is resolved
  on the fresh seeds if it is on seeds 0-4.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.harness import select, versus
from benchmarks.lib.provenance import command_line
from benchmarks.lib.readme import markers
from benchmarks.lib.records import RESULTS
from benchmarks.lib.stats import format_interval, format_mean_std
from benchmarks.tasks.toy.arms import LABELS as TOY_LABELS
from benchmarks.tasks.toy.arms import common_job_fields, mode_sizes
from benchmarks.tasks.toy.run import execute
from benchmarks.tasks.toy.tool_run import run_job

# label -> (method of benchmarks.tasks.toy.training, config overrides): the toy task's arms (`_` keys are job settings,
# `benchmarks.tasks.toy.arms.LABELS`), SORT with the reference transcripts as its reference column
LABELS = {
    **{label: TOY_LABELS[label] for label in ("grpo", "grpo-2x", "mintrl-const", "sft-grpo")},
    "sort": ("sort", {"reference_column": "reference"}),
}

MODES = {
    "full": dict(
        mode_sizes("full"),
        plan={
            "in-band": ["grpo", "grpo-2x", "mintrl-const", "sft-grpo", "sort"],
            "reachable": ["grpo", "grpo-2x", "mintrl-const"],
        },
    ),
    # the headline on fresh seeds (written before the full run's results were seen): seeds 5-9, the in-band regime's
    # GRPO, MInTRL and SFT arms, the full mode's settings
    "fresh": dict(mode_sizes("full", seeds=[5, 6, 7, 8, 9]), plan={"in-band": ["grpo", "mintrl-const", "sft-grpo"]}),
    "quick": dict(
        mode_sizes("quick", steps=4, prompts_per_step=4, final_prompts=16, curve_prompts=8),
        plan={"in-band": list(LABELS)},
    ),
    "smoke": dict(mode_sizes("smoke"), plan={"in-band": ["grpo", "mintrl-const", "sft-grpo", "sort"]}),
}
README_START, README_END = markers("-m benchmarks.studies.learning_tools", "learning-tools")


def plan_jobs(settings: dict) -> list[dict]:
    """One job per (regime, label, seed), in plan order."""
    jobs = []
    for regime, labels in settings["plan"].items():
        for seed in settings["seeds"]:
            for label in labels:
                method, overrides = LABELS[label]
                jobs.append(
                    {
                        **common_job_fields(settings),
                        "name": f"tools-{regime}-{label}-s{seed}",
                        "regime": regime,
                        "label": label,
                        "method": method,
                        "overrides": overrides,
                        "seed": seed,
                    }
                )
    return jobs


# ----- the report -----


def runs_of(results: dict, regime: str, label: str) -> list[dict]:
    return select(results["runs"], regime=regime, label=label)


def phase_means(run: dict, key: str) -> tuple[float | None, float | None]:
    """Mean of a logged metric over the first and the last quarter of the intervention phase's steps."""
    values = [e[key] for e in run["logs"] if key in e and e.get("mintrl/interventions_active", 0) > 0]
    if len(values) < 4:
        return None, None
    q = len(values) // 4
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


def score_rows(results: dict) -> list[str]:
    lines = ["| regime | arm | runs | pass@1 | pass@8 | read all | pass@1 - grpo | pass@8 - grpo | train s |",
             "|---" * 9 + "|"]  # fmt: skip
    for regime, labels in results["settings"]["plan"].items():
        grpo = runs_of(results, regime, "grpo")
        for label in labels:
            runs = runs_of(results, regime, label)
            if not runs:
                continue
            cells = [format_mean_std([r["final"][k] for r in runs]) for k in ("pass@1", "pass@8", "read_all")]
            for k in ("pass@1", "pass@8"):
                diff = None if label == "grpo" else versus(runs, grpo, k)
                cells.append(format_interval(diff))
            cells.append(f"{statistics.fmean(r['train_seconds'] for r in runs):.0f}")
            lines.append(f"| {regime} | {label} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def pair_rows(results: dict) -> list[str]:
    """The hypotheses' other pairs: each arm against mintrl-const, paired over seeds."""
    lines = ["| regime | pair | pass@1 | pass@8 |", "|---|---|---|---|"]
    for regime, labels in results["settings"]["plan"].items():
        mintrl = runs_of(results, regime, "mintrl-const")
        for label in labels:
            runs = runs_of(results, regime, label)
            if label == "mintrl-const" or not runs or not mintrl:
                continue
            cells = [format_interval(versus(mintrl, runs, k)) for k in ("pass@1", "pass@8")]
            lines.append(f"| {regime} | mintrl-const - {label} | " + " | ".join(cells) + " |")
        sft = [r for r in runs_of(results, regime, "sft-grpo") if "sft_end" in r]
        if sft:
            cells = [format_mean_std([r["sft_end"][k] for r in sft]) for k in ("pass@1", "pass@8")]
            lines.append(f"| {regime} | sft-grpo after SFT alone (mean ± std) | " + " | ".join(cells) + " |")
    return lines


def judge_rows(results: dict) -> list[str]:
    """H4: mintrl-const's judge-token share and judge-token NLL, first vs last quarter of the intervention phase."""
    lines = ["| regime | seed | judge-token share first → last quarter | judge-token NLL first → last quarter |",
             "|---|---|---|---|"]  # fmt: skip
    for regime in results["settings"]["plan"]:
        for run in runs_of(results, regime, "mintrl-const"):
            cells = []
            for key, scale in (("mintrl/judge_token_frac", 100), ("mintrl/judge_token_nll", 1)):
                first, last = phase_means(run, key)
                cells.append("-" if first is None else f"{scale * first:.2f} → {scale * last:.2f}")
            lines.append(f"| {regime} | {run['seed']} | " + " | ".join(cells) + " |")
    return lines


def report(results: dict) -> str:
    s = results["settings"]
    lines = ["# Learning on the tool task", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}; held-out pass@k in "
             f"% ({s['final_prompts']} problems x 8 samples, temperature 1, tool loop on); mean ± std over seeds; "
             "differences paired over seeds with 95% t-intervals (points). Calibration of the warm start: "
             "benchmarks/results/tools_calibration.md.", "", *score_rows(results), "", *pair_rows(results), "",
             "Judge tokens during MInTRL's intervention phase (share in %, NLL in nats per token):", "",
             *judge_rows(results), "", "Per-run final pass@1 (%):", "",
             *harness.per_run_lines(results, runs_of, digits=2)]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> list[Path]:
    """Held-out pass@1 curves (mean over seeds) per regime and arm."""

    def curves(regime: str, label: str) -> list[dict[int, float]]:
        return [{int(k): point["pass@1"] for k, point in r["curve"].items()} for r in runs_of(results, regime, label)]

    return [harness.plot_curves(results, out / f"{file_name(results)}.png", "tool task", curves)]


def file_name(results: dict) -> str:
    """learning_tools, or learning_tools_fresh for the fresh-seed mode's files."""
    return "learning_tools_fresh" if results["settings"]["mode"] == "fresh" else "learning_tools"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, f"{file_name(results)}.md", report, plot if results["runs"] else None,
                                plots)  # fmt: skip


def readme_block(results: dict) -> str:
    """The summary block's lines: where they come from, then each arm against GRPO per regime, paired 95% intervals."""
    s = results["settings"]
    lines = [
        f"{s['steps']} optimizer steps x {s['prompts_per_step']} prompts, seeds {s['seeds']}; held-out pass@1 and "
        f"pass@8 in % ({s['final_prompts']} problems x 8 samples, tool loop on); differences paired by seed with 95% "
        f"t-intervals. From `benchmarks/results/{file_name(results)}.json` (commit "
        f"`{results['provenance']['commit'][:12]}`); every arm, the judge tokens and each seed in "
        f"`benchmarks/results/{file_name(results)}.md`.",
        "",
    ]
    for regime, labels in results["settings"]["plan"].items():
        grpo = runs_of(results, regime, "grpo")
        cells = []
        for label in labels[1:]:
            runs = runs_of(results, regime, label)
            diffs = [format_interval(versus(runs, grpo, k)) for k in ("pass@1", "pass@8")]
            cells.append(f"{label} − GRPO {diffs[0]} pass@1, {diffs[1]} pass@8")
        grpo_mean = format_mean_std([r["final"]["pass@1"] for r in grpo])
        lines.append(f"- {regime} (GRPO pass@1 {grpo_mean}): " + "; ".join(cells) + ".")
    return "\n".join(lines)


CLI_MODES = {  # the flags of the modes besides full, the first given wins
    "smoke": "1 step, 2 prompts, 2 seeds, 4 arms (the test)",
    "quick": "1 seed, 4 steps, every arm on in-band",
    "fresh": "the in-band headline on fresh seeds 5-9",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render the tables and plot from a JSON")
    args = parser.parse_args(argv)
    if harness.replot_from(args, render, readme_block, (README_START, README_END)):
        return
    mode = harness.mode_of(args, CLI_MODES)
    out = args.out or (RESULTS if mode in ("full", "fresh") else RESULTS / "quick")
    out.mkdir(parents=True, exist_ok=True)
    settings = {"mode": mode, **MODES[mode]}
    results = harness.new_results("-m benchmarks.studies.learning_tools", argv, settings)
    execute(results, out, f"{file_name(results)}.json", render, [], run_job, plan_jobs(settings), args.workers,
            args.resume)  # fmt: skip


if __name__ == "__main__":
    main()
