"""What an optimizer step costs, measured on trainers that take turns in one process, and the tables of it.

`measure_time` trains several variants' trainers in threads of one process, one optimizer step each per round in a
balanced order that changes every round (`turn_order`), so that machine noise hits every variant alike; each step
records its wall and CPU seconds and what the counters of `benchmarks.lib.counters` counted in it. `measure_memory`
runs one variant alone (in a fresh process) for its peak RSS. `time_table`, `token_table` and `summary_rows` render
the records, each variant against GRPO of the same round."""

from __future__ import annotations

import statistics
import threading
import time

from benchmarks.lib.counters import CallCounter, GCTimer, LastRollout, VLLMCounter, thread_usage
from benchmarks.lib.phase_meter import reset_peak_rss, status_kib
from benchmarks.lib.stats import format_ratio, mean_interval

CPU_KEY = "process_cpu_seconds"  # every thread of the process during the step: only that variant's threads run


def instrument(trainer, model, tokens, on_vllm: bool) -> dict:
    """The counters of a trainer's step: its rollout (TRL's `_generate`: MInTRL's `rollout_func`, TRL's tool loop,
    weight sync) and that plus rewards and the log-prob pass (`_generate_and_score_completions`; the rest is
    training), the `generate` calls of its model or, on vLLM, of its colocated engine with the engine's own counts
    (and MInTRL's continuous-batching streams, one per rollout), `tokens` (a `TokenCounter` on `model`) and, for
    MInTRL, its last rollout and its judge's calls."""
    counters = {"generation": CallCounter(trainer, "_generate"),
                "generation_and_scoring": CallCounter(trainer, "_generate_and_score_completions")}  # fmt: skip
    if on_vllm:
        llm = trainer.vllm_generation.llm
        counters |= {"generate": CallCounter(llm, "generate"), "tokens": tokens, "vllm": VLLMCounter(llm)}
        if hasattr(trainer, "policy_engine"):  # MInTRL: continuous-batching streams, one per rollout
            counters["streams"] = CallCounter(trainer.policy_engine, "_open_stream")
    else:
        counters |= {"generate": CallCounter(model, "generate"), "tokens": tokens}
    judge = getattr(trainer, "judge", None)
    if hasattr(trainer, "judge"):  # MInTRL
        counters["rollout"] = LastRollout(trainer)
    if judge is not None:
        counters["review"] = CallCounter(judge, "review")
        counters["correct"] = CallCounter(judge, "correct")
    return counters


# --------------------------------------------------------------------------------------------------- taking turns


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


class Interleaving:
    """What `measure_time`'s trainer threads share: the trainers with their counters, whose turn it is, the step
    records, the garbage collector's timer, the set-up events and the errors."""

    def __init__(self, trainers: dict[str, tuple], steps: int):
        self.trainers = trainers
        self.turns = Turns(list(trainers), steps)
        self.records: dict[str, list[dict]] = {v: [] for v in trainers}
        self.gc_timer = GCTimer()
        self.set_up = {v: threading.Event() for v in trainers}
        self.all_set_up = threading.Event()
        self.errors: list[tuple[str, BaseException]] = []


class StepClock:
    """One variant's trainer callback (`measure_time` mixes in transformers' `TrainerCallback`): at each step's start
    it waits for its turn and snapshots the counters; at its end it records the differences."""

    def __init__(self, run: Interleaving, name: str):
        self.run, self.name, self.holding, self.start, self.calls, self.failures = run, name, False, 0.0, {}, 0

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        run = self.run
        run.set_up[self.name].set()
        run.all_set_up.wait()
        if self.holding:
            run.turns.pass_on(self.name)
        self.position = run.turns.wait(self.name)
        self.holding = True
        torch.manual_seed(10_000 + state.global_step)  # same sampling noise for every variant of a round
        counters = run.trainers[self.name][1]
        self.calls = {k: (c.calls, c.seconds) for k, c in counters.items() if isinstance(c, CallCounter)}
        self.counts = {k: c.snapshot() for k, c in counters.items() if hasattr(c, "snapshot")}
        self.failures = getattr(run.trainers[self.name][0], "judge_failures_total", 0)
        counters["tokens"].digest = 0
        self.usage = thread_usage(run.gc_timer)
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.start
        usage = thread_usage(self.run.gc_timer)
        trainer, counters = self.run.trainers[self.name]
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
        self.run.records[self.name].append(record)

    def on_train_end(self, args, state, control, **kwargs):
        self.run.turns.pass_on(self.name, finished=True)


def measure_time(variants: list[str], warmup: int, rounds: int, build_fn) -> dict:
    """Interleaved training: per variant, per measured step: seconds, CPU seconds, generation/judge calls, tokens,
    the rollouts' digest and the step's position in its round. `build_fn(variant, steps, rounds_of_repairs)`: the
    variant's trainer and its counters (`instrument`; tests: stand-ins)."""
    from transformers import TrainerCallback

    class StepTimer(StepClock, TrainerCallback):
        """`StepClock` as a trainer callback."""

    steps = warmup + rounds
    run = Interleaving({v: build_fn(v, steps, steps) for v in variants}, steps)

    def train(name: str):
        trainer = run.trainers[name][0]
        trainer.add_callback(StepTimer(run, name))
        try:
            trainer.train()
        except BaseException as err:  # surface in the main thread; let the others finish
            run.errors.append((name, err))
            run.turns.pass_on(name, finished=True)

    # one thread sets up at a time, and none steps before all have: a trainer's set-up converts its model
    # (`accelerator.prepare` -> `model.to`), which copies each parameter and replaces its storage, and --real's models
    # share their parameters (`real_model`): two set-ups at once crashed the process (a segmentation fault copying a
    # parameter in `Module._apply`, twice with --engine vllm)
    threads = [threading.Thread(target=train, args=(v,)) for v in variants]
    for name, t in zip(variants, threads, strict=True):
        t.start()
        while not run.set_up[name].wait(0.5) and t.is_alive():
            pass
    run.all_set_up.set()
    for t in threads:
        t.join()
    run.gc_timer.close()
    if run.errors:
        raise RuntimeError(f"{run.errors[0][0]} failed") from run.errors[0][1]
    trainers = {v: trainer for v, (trainer, _) in run.trainers.items()}
    repairs = {v: t.repair.buffer.counters["repairs"] for v, t in trainers.items() if hasattr(t, "repair")}
    return {"steps": {v: r[warmup:] for v, r in run.records.items()}, "repairs": repairs}


def measure_memory(variant: str, warmup: int, steps: int, build_fn) -> dict:
    """Run `variant` (`build_fn` builds it as for `measure_time`) alone in this (fresh) process; over the `steps`
    steps after `warmup` (lazy imports and first-step allocations done): peak RSS, and that peak above the RSS just
    before them, in MB."""
    from transformers import TrainerCallback

    trainer, _ = build_fn(variant, warmup + steps, warmup + steps)
    before = {}

    class ResetPeak(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                reset_peak_rss()
                before["kb"] = status_kib("VmRSS")

    trainer.add_callback(ResetPeak())
    trainer.train()
    peak = status_kib("VmHWM")
    return {"variant": variant, "transient_mb": (peak - before["kb"]) / 1024, "peak_mb": peak / 1024}


# --------------------------------------------------------------------------------------------------------- tables


def mean_of(records: list[dict], key: str) -> float:
    """The mean of `key` over the records."""
    return statistics.mean(r[key] for r in records)


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


def _judge_share(records: list[dict]) -> float | None:
    """The judge's tokens' share of the completion tokens over the records (MInTRL's); None for a method without."""
    if "judge_tokens" not in records[0]:
        return None
    return sum(r["judge_tokens"] for r in records) / max(sum(r["completion_tokens"] for r in records), 1)


def time_table(steps: dict[str, list[dict]], memory: dict[str, dict], on_vllm: bool) -> list[str]:
    """The time table: each variant's mean step, its time and CPU time paired with GRPO's, its generate and judge
    calls, and its memory (on vLLM, where the step's time went instead)."""
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
        ratio_text = _ratio_cell(name, _paired_ratio(records, steps["grpo"], "seconds"))
        cpu_text = _ratio_cell(name, _paired_ratio(records, steps["grpo"], CPU_KEY))
        step_s = f"{mean_of(records, 'seconds'):.2f}"
        if CPU_KEY in records[0]:
            step_s += f" ({mean_of(records, CPU_KEY):.2f})"
        gen = f"{mean_of(records, 'generate'):.1f} ({mean_of(records, 'generate_seconds'):.2f} s)"
        judge = "-"
        if "review" in records[0]:
            judge = (
                f"{mean_of(records, 'review'):.1f} / {mean_of(records, 'correct'):.1f} "
                f"({mean_of(records, 'review_seconds') + mean_of(records, 'correct_seconds'):.2f} s; "
                f"{mean_of(records, 'judge_failures'):.0f} failed)"
            )
        if on_vllm:
            gen, last = _engine_cells(records)
        else:
            last = _memory_cells(memory.get(name), memory.get("grpo"))
        lines.append(f"| {name} | {step_s} | {ratio_text} | {cpu_text} | {gen} | {judge} | {last} |")
    return lines


def _engine_cells(records: list[dict]) -> tuple[str, str]:
    """On vLLM: the generate calls and streams with the engine's requests and steps, and where the step's wall time
    went (rollout, with the engine's steps in it / rewards and log-probs / training)."""
    streams = mean_of(records, "streams") if "streams" in records[0] else 0
    gen = (f"{mean_of(records, 'generate'):.1f} + {streams:.1f}: {mean_of(records, 'requests'):,.0f} requests, "
           f"{mean_of(records, 'engine_steps'):,.0f} engine steps ({mean_of(records, 'engine_seconds'):.2f} s)")  # fmt: skip
    rollout, scored = mean_of(records, "generation_seconds"), mean_of(records, "generation_and_scoring_seconds")
    last = (f"{rollout:.2f} ({mean_of(records, 'engine_seconds'):.2f}) / {scored - rollout:.2f} / "
            f"{mean_of(records, 'seconds') - scored:.2f}")  # fmt: skip
    return gen, last


def _memory_cells(mem: dict | None, base_mem: dict | None) -> str:
    """A variant's step memory above the pre-step RSS and its peak RSS, each x GRPO's."""
    if not (mem and base_mem):
        return "- | -"
    return (
        f"{mem['transient_mb']:.0f} ({mem['transient_mb'] / max(base_mem['transient_mb'], 1e-9):.2f}) | "
        f"{mem['peak_mb']:.0f} ({mem['peak_mb'] / base_mem['peak_mb']:.2f})"
    )


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


def token_table(steps: dict[str, list[dict]], on_vllm: bool) -> list[str]:
    """The token table: on vLLM the engine's own counts (`VLLMCounter`) where `transformers` has the model's tokens
    and whether a variant's rollouts were GRPO's exactly."""
    grpo = steps["grpo"]
    columns = VLLM_TOKEN_COLUMNS if on_vllm else TOKEN_COLUMNS
    lines = [
        f"| variant | {' | '.join(columns.values())} | judge tokens (share of completion tokens) |"
        + ("" if on_vllm else " rounds with GRPO's exact rollouts |"),
        "|---|" + "---|" * (len(columns) + 1 + (not on_vllm)),
    ]
    for name, records in steps.items():
        cells = []
        for key in columns:
            value, base = mean_of(records, key), mean_of(grpo, key)
            if key == "cached_prompt_tokens":  # the hits' share of the prompt tokens asked
                cells.append(f"{value:,.0f} ({value / max(mean_of(records, 'prompt_tokens'), 1):.0%})")
            else:
                cells.append(f"{value:,.0f} ({value / base:.2f})" if base else f"{value:,.0f}")
        share = _judge_share(records)
        judge = "-" if share is None else f"{mean_of(records, 'judge_tokens'):.0f} ({100 * share:.1f}%)"
        digest = "" if on_vllm else f" {_same_rollouts(records, grpo)} |"
        lines.append(f"| {name} | {' | '.join(cells)} | {judge} |{digest}")
    return lines


def summary_rows(steps: dict[str, list[dict]]) -> list[str]:
    """The summary table: each variant's CPU and wall time paired with GRPO's, its policy and forward tokens over
    GRPO's and its judge-token share."""
    grpo = steps["grpo"]
    lines = [
        "| variant | x GRPO CPU time [95% CI] | x GRPO wall time [95% CI] | x GRPO policy tokens generated "
        "| x GRPO forward tokens | judge-token share |",
        "|---|---|---|---|---|---|",
    ]
    for name, records in steps.items():
        times = [_ratio_cell(name, _paired_ratio(records, grpo, key)) for key in (CPU_KEY, "seconds")]
        cells = [f"{mean_of(records, key) / mean_of(grpo, key):.2f}" for key in ("generated_tokens", "forward_tokens")]
        share = _judge_share(records)
        judge = "-" if share is None else f"{100 * share:.1f}%"
        lines.append(f"| {name} | {' | '.join(times)} | {' | '.join(cells)} | {judge} |")
    return lines
