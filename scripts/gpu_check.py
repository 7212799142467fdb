"""A vLLM-free GPU check: one MInTRL and one SORT step at the papers' lengths on a random model of Qwen3-1.7B's
shapes in bf16, peak GPU memory per phase, and tokens/s of the transformers generation engine. Run by
`scripts/gpu_check.sh` (which installs the carried wheels first); see that file's header for the device invocation
and for what has and has not been run on a GPU.

    python -m scripts.gpu_check                  # on a CUDA GPU (about 8 minutes on an H200, estimated)
    python -m scripts.gpu_check --cpu-dry-run    # the same code paths on the CPU at tiny shapes (under a minute)
    python -m scripts.gpu_check --out DIR        # also write gpu_check.json and gpu_check.md there

Model: `Qwen3ForCausalLM` built at run time from a config of Qwen3-1.7B's shapes (28 layers, hidden 2048, MLP 6144,
16 heads / 8 KV heads of 128, vocabulary 151,936, tied embeddings; about 1.7B parameters), randomly initialised in
bf16 directly on the GPU: nothing is downloaded. Tokenizer: the package's tiny byte-level BPE tokenizer (1,024
tokens); the embedding keeps Qwen3's 151,936 rows, so the logits have their real size, and sampled ids the tokenizer
does not know decode to nothing (plans are mostly empty text; their token ids still take their place in the KV
cache).

Shapes (the papers'): MInTRL and GRPO loss on completions of 16,384 tokens (prepared random token ids: generating
16k tokens with `transformers` would take most of the time limit and measure the same forward), SORT's repair of 16
references of 4,096 tokens with plans of up to 256 tokens, generation of 16 rollouts x 512 tokens through the
trainers' own rollouts and the transformers engine. Configurations: micro-batch 4, 2 and 1 with repairs of 16 (does each
phase's memory follow the micro-batch?); the default runs micro-batch 4 only (all three ran on the H200 at 1b40831;
`--configs mb4-r16 mb2-r16 mb1-r16` runs them again, `--configs` with no value none).

Plans (first, after the model is built): SORT's plan writing (`ReferenceRepair._write_plans`, the policy through the
transformers engine, greedy) of the same 16 references on the same weights with `plan_batch_size=None` (the default:
one generate call), then 4 (calls of the micro-batch, as plans were written before `plan_batch_size`; the H200
run in scripts/gpu_check.sh's header measured 34 s for those, and 114 s at micro-batch 1: `--plan-batches none 4 1`):
seconds, generate calls, peak and working memory, and how many plans are token for token those of the one-call run.
`--plan-batches` picks the settings (`none` for None; the flag with no value skips the phase).

Rollout (second): MInTRL's chunked intervention rollout (`InterventionRollout`, lock-step) through
`TransformersEngine`, greedy, on the same weights: 8 prompts, chunks of 512 tokens, every chunk reviewed by a scripted
`FunctionJudge` (`scripted_judge`: it keeps every other chunk of a row and cuts the others 1/2 to 7/8 into the chunk,
inserting a fixed 8-token correction; rows alternate, so each call continues kept and cut rows together), EOS
suppressed so that every row runs to the length, timed once with the engine's kept KV caches (`kv_cache=True`) and
once re-reading every request (`kv_cache=False`). Completions of 4,096 tokens by default (11 generate calls, 4,916
decode steps, 178k tokens of prompt and completion re-read without the cache); `--rollout-lengths 4096 16384` adds
the papers' 16k (39 calls, 19,362 decode steps, 2.5M tokens re-read: over one run's limit on the H200, see
scripts/gpu_check.sh), the flag with no value skips the phase, `--rollout-kv on` / `off` runs one setting, and
`--rollout-prefix 12288` starts every row from 12,288 prepared tokens (random ids, as if written and kept), so that
`--rollout-lengths 16384` times the last 4,096 tokens of a 16k completion (11 calls, 4,916 steps, 1.2M re-read).
Recorded per setting: seconds, generate calls and decode steps, the engine's prefill (read) / reused / generated
tokens, judge tokens and cuts, peak and working memory, the largest forward, rows that reached the length, and
whether the trajectories are token for token the length's first setting's (bf16 may break greedy ties differently
in a prefill and in a decode step), with each generate call's rows, cap, tokens and seconds (saved every 30 s during
a setting: a setting stopped at the run's limit keeps its calls, and the table compares the calls both settings
finished). The random model's ids mostly decode to nothing
with the tiny tokenizer, so the rollout decodes each id as a line of its own (`TokenLines`): a step is a token.

The phases and their measurement are the memory study's (`benchmarks/lib/memory_phases.py`, `PhaseMeter`): on CUDA,
`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, and `memory_allocated` at each phase's start.
A "MInTRL step" here is one micro-batch's loss, backward and optimizer step; a "SORT step" is the same with GRPO's
loss, then the repair step (`separate_repair_step`: plan, teacher pass, base pass, backward, optimizer step).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# import name -> what provides it (the wheel `scripts/gpu_check.sh --build-wheels` puts in .gpu_wheels/, or the image)
NEEDED = {
    "torch": "the machine's image",
    "transformers": "the machine's image",
    "accelerate": "the machine's image",
    "tokenizers": "the machine's image",
    "pyarrow": "the machine's image (datasets needs >= 21)",
    "dill": "carried wheel",
    "multiprocess": "carried wheel",
    "datasets": "carried wheel",
    "trl": "carried wheel",
    "latex2sympy2_extended": "carried wheel",
    "math_verify": "carried wheel",
    "trl_mintrl": "this checkout (PYTHONPATH)",
}

GPU = {
    "model": {"hidden": 2048, "layers": 28, "intermediate": 6144, "heads": 16, "kv_heads": 8, "head_dim": 128,
              "vocab": 151936},
    "reference_tokens": 4096,
    "completion_tokens": 16384,
    "generation_tokens": 512,
    "generation_batch": 16,
    "num_generations": 8,
    "plan_tokens": 256,
    "gradient_checkpointing": True,
    "engine_rows": 16,
    "engine_tokens": 512,
    # plan writing: one call (None) against calls of micro-batch 4 (about 10 s and 34 s, estimated from the
    # configurations' plan phases of the H200 run); `--plan-batches none 4 1` adds micro-batch 1 (114 s there)
    "plans": {"rows": 16, "batches": [None, 4]},
    # the chunked MInTRL rollout with and without the kept KV caches: 8 rows, chunks of 512 tokens,
    # completions of 4,096 tokens (about 4,600 decode steps a setting); `--rollout-lengths 4096 16384` adds the
    # papers' 16k (about 19,000 decode steps a setting: more than one run's limit, see scripts/gpu_check.sh)
    "rollout": {"rows": 8, "chunk_size": 512, "lengths": [4096], "kv_cache": [True, False],
                "max_correction_tokens": 16},
    # fastest first, so that a run cut short still brings results back; the default runs mb4-r16 only (mb2 and mb1
    # ran on the H200, 1b40831; `--configs mb4-r16 mb2-r16 mb1-r16` runs all three)
    "default_configs": ["mb4-r16"],
    "configs": {
        "mb4-r16": {"micro_batch": 4, "repair_batch_size": 16, "buffer_items": 16},
        "mb2-r16": {"micro_batch": 2, "repair_batch_size": 16, "buffer_items": 16},
        "mb1-r16": {"micro_batch": 1, "repair_batch_size": 16, "buffer_items": 16},
    },
}  # fmt: skip
CPU_DRY_RUN = {
    "model": {"hidden": 128, "layers": 2, "intermediate": 384, "heads": 4, "kv_heads": 2, "head_dim": 32,
              "vocab": 4096},
    "reference_tokens": 256,
    "completion_tokens": 512,
    "generation_tokens": 16,
    "generation_batch": 4,
    "num_generations": 2,
    "plan_tokens": 8,
    "gradient_checkpointing": True,
    "engine_rows": 4,
    "engine_tokens": 16,
    "plans": {"rows": 4, "batches": [None, 1]},
    # the GPU's 8 and 32 chunks a completion (4,096 and 16,384 tokens in chunks of 512), in chunks of 16
    "rollout": {"rows": 4, "chunk_size": 16, "lengths": [128, 512], "kv_cache": [True, False],
                "max_correction_tokens": 16},
    "configs": {
        "mb1-r4": {"micro_batch": 1, "repair_batch_size": 4, "buffer_items": 4},
        "mb2-r4": {"micro_batch": 2, "repair_batch_size": 4, "buffer_items": 4},
    },
}  # fmt: skip


def check_imports() -> dict[str, str]:
    """Import everything the check needs; on a failure, say which package, where it should come from, and exit."""
    versions, failed = {}, []
    for name, source in NEEDED.items():
        try:
            module = importlib.import_module(name)
            versions[name] = getattr(module, "__version__", "?")
        except Exception as err:  # noqa: BLE001 -- any import failure is reported the same way
            failed.append(f"  {name} ({source}): {type(err).__name__}: {err}")
    if not failed:
        try:  # the trainers pull in the rest of TRL
            from trl_mintrl import MInTRLTrainer, SORTTrainer  # noqa: F401
        except Exception as err:  # noqa: BLE001
            failed.append(f"  trl_mintrl trainers: {type(err).__name__}: {err}")
    if failed:
        print("gpu_check: imports failed:\n" + "\n".join(failed), file=sys.stderr)
        print(
            "gpu_check: the carried wheels are installed by scripts/gpu_check.sh from .gpu_wheels/ (built here with "
            "`scripts/gpu_check.sh --build-wheels`, carried with carry=['.gpu_wheels']); PYTHONPATH must hold the "
            "checkout. Versions found: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
            file=sys.stderr,
        )
        sys.exit(2)
    return versions


def engine_tokens_per_second(trainer, tokenizer, rows: int, new_tokens: int, meter) -> dict:
    """The trainer's transformers engine (`trainer.policy_engine`), sampling `new_tokens` after each of `rows`
    prompts (one warm-up call of 8 tokens first): generated tokens per second."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Problem {i}: compute {i} + {2 * i} step by step."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for i in range(rows)
    ]
    engine = trainer.policy_engine
    engine.generate(prompts, 8, temperature=1.0)
    with meter.phase("generation (engine)") as frame:
        generations = engine.generate(prompts, new_tokens, temperature=1.0)
    seconds = meter.records["generation (engine)"]["seconds"]
    tokens = sum(len(g.token_ids) for g in generations)
    del frame
    return {"rows": rows, "new_tokens": new_tokens, "generated": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds}  # fmt: skip


def time_plans(model, tokenizer, settings: dict, device: str, meter, record, checkpoint=None) -> None:
    """SORT's plan writing (`ReferenceRepair._write_plans`: the policy writes the plans through the trainer's
    transformers engine, greedily, `plan_temperature=0`) of the same `settings["plans"]["rows"]` references on the
    same weights, once per `plan_batch_size` of `settings["plans"]["batches"]` (None: one generate call), each in a
    phase of `meter`. Appends one entry per setting to `record` (seconds, generate calls and their rows, generated
    tokens, peak and working memory, plans whose token ids are those of the first setting's), calling
    `checkpoint()` after each, so that a run cut short keeps the settings it finished."""
    from benchmarks.lib.memory_phases import build_trainers, prompts_and_references
    from trl_mintrl.sort import RepairItem

    rows = settings["plans"]["rows"]
    config = {"micro_batch": 1, "repair_batch_size": rows, "buffer_items": rows}
    with tempfile.TemporaryDirectory(prefix="gpu_check_plans_") as out:
        sort, _ = build_trainers(model, tokenizer, settings, config, out, device, with_mintrl=False)
        repair, engine = sort.repair, sort.policy_engine
        data = prompts_and_references(rows, settings["reference_tokens"], tokenizer, offset=30_000)
        items = [RepairItem(row["prompt"], row["solution"]) for row in data]
        references = [repair.renderer.reference(item.reference) for item in items]
        prompts = repair.renderer.plan_prompt_ids([item.prompt for item in items], references)
        engine.generate(prompts[:2], 8, temperature=0.0)  # warm-up (CUDA kernels, allocator)
        generate, calls, token_ids = engine.generate, [], []

        def recorded(prompt_ids, *args, **kwargs):
            generations = generate(prompt_ids, *args, **kwargs)
            calls.append(len(prompt_ids))
            token_ids.extend(g.token_ids for g in generations)
            return generations

        engine.generate = recorded
        first = None
        for size in settings["plans"]["batches"]:
            sort.args.plan_batch_size = size
            calls.clear()
            token_ids.clear()
            name = f"plans: plan_batch_size={size}"
            with meter.phase(name):
                repair._write_plans(items, references)
            first = first or list(token_ids)
            phase = meter.records[name]
            record.append({
                "plan_batch_size": size, "rows": rows, "calls": list(calls), "seconds": phase["seconds"],
                "generated_tokens": sum(map(len, token_ids)), "peak_bytes": phase["peak_bytes"],
                "working_bytes": phase["working_bytes"],
                "same_plans_as_first": sum(a == b for a, b in zip(first, token_ids, strict=True)),
            })  # fmt: skip
            print(f"gpu_check: {name}: {phase['seconds']:.1f} s in {len(calls)} generate calls", flush=True)
            if checkpoint is not None:
                checkpoint()
        del sort


# the judge's fixed correction: 8 tokens of the tiny tokenizer
CORRECTION = " so 2 + 3 = 5.\n"


class TokenLines:
    """The tokenizer as the rollout of the `rollout` phase sees it: every token id decodes to a line of its own
    ("<id>\\n"), so each chunk splits into one step a token (`step_split="line"`) and a cut after step k keeps k
    tokens, whatever ids the random model picks (the tiny tokenizer knows 1,024 of its ids and decodes the others to
    nothing, which would leave chunks with no steps to review). Corrections are tokenised by the real tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"{i}\n" for i in ids)

    def __call__(self, text, add_special_tokens: bool = False):
        return self.tokenizer(text, add_special_tokens=add_special_tokens)


def scripted_judge():
    """A `FunctionJudge` that keeps every other chunk of a row and revises the others at one step between half and
    seven eighths into the chunk (so most of a revised chunk is kept too), with the fixed `CORRECTION`. Rows
    alternate (row i is revised at its reviews 2, 4, ... when i is even, 1, 3, ... when odd), so each policy call
    continues rows the judge kept and rows it cut, with caches of different lengths in one batch."""
    from trl_mintrl.judges import FunctionJudge

    reviews: dict[str, int] = {}

    def review(question, prefix, steps, reference):
        row = int(question.rsplit(" ", 1)[-1])
        n = reviews[question] = reviews.get(question, 0) + 1
        if (n + row) % 2:
            return None
        return len(steps) * (4 + (n // 2 + row) % 4) // 8

    return FunctionJudge(review, lambda question, prefix, reference: CORRECTION)


def counters(engine) -> tuple[int, int, int]:
    """The transformers engine's prefill (read), reused and generated token counters."""
    return engine.prefill_tokens, engine.reused_tokens, engine.generated_tokens


def record_calls(engine, calls: list, checkpoint=None, every_seconds: float = 30.0) -> None:
    """Wrap `engine.generate` so that each call appends its rows, largest cap (its decode steps: no row stops early
    when EOS is suppressed), tokens read / reused / generated and seconds to `calls` and prints them, and calls
    `checkpoint()` when `every_seconds` have passed since it last did."""
    generate, saved = engine.generate, [time.perf_counter()]

    def timed(prompt_ids, max_new_tokens, *args, **kwargs):
        before = counters(engine)
        start = time.perf_counter()
        out = generate(prompt_ids, max_new_tokens, *args, **kwargs)
        seconds = time.perf_counter() - start
        read, reused, generated = (b - a for a, b in zip(before, counters(engine), strict=True))
        caps = [max_new_tokens] * len(prompt_ids) if isinstance(max_new_tokens, int) else max_new_tokens
        calls.append({"rows": len(prompt_ids), "max_cap": max(caps, default=0), "read": read, "reused": reused,
                      "generated": generated, "seconds": seconds})  # fmt: skip
        print(f"gpu_check:   call {len(calls)}: {len(prompt_ids)} rows, up to {max(caps, default=0)} new tokens, read "
              f"{read:,} reused {reused:,}: {seconds:.2f} s", flush=True)  # fmt: skip
        if checkpoint is not None and time.perf_counter() - saved[0] > every_seconds:
            checkpoint()
            saved[0] = time.perf_counter()
        return out

    engine.generate = timed


def time_rollouts(model, tokenizer, settings: dict, device: str, meter, record, checkpoint=None) -> None:
    """MInTRL's chunked intervention rollout (`InterventionRollout`, lock-step, through the transformers engine,
    greedy) of `settings["rollout"]["rows"]` prompts to each completion length of `settings["rollout"]["lengths"]`,
    in chunks of `chunk_size`, every chunk reviewed by `scripted_judge`, once per `kv_cache` setting of the engine
    (True: each row's KV cache kept across the calls; False: every call re-reads prompt and completion so far).
    The engine's generation config suppresses EOS (`suppress_tokens`; a random model rarely samples it anyway, and
    the engine stops a row at EOS), so every row runs to the full length; with `prefix_tokens`, every row starts
    from that many prepared tokens. Each setting is a phase of `meter`; appends one entry per setting to `record`
    (seconds, the engine's prefill / reused / generated tokens, decode steps, calls, judge tokens and cuts, peak and
    working memory, the largest forward, and for the settings after a length's first whether their trajectories are
    token for token the first's), with each generate call's rows, cap, tokens and seconds. `checkpoint()` is called
    after each setting and, during one, at most every 30 s, so a run stopped at its limit keeps what it timed."""
    import gc

    import torch
    from transformers import GenerationConfig

    from trl_mintrl.engines import TransformersEngine
    from trl_mintrl.mintrl import InterventionRollout, RolloutSettings, Trajectory

    r = settings["rollout"]
    prompts = []
    for i in range(r["rows"]):
        messages = [{"role": "user", "content": f"Problem {i}: Tom has {i + 3} apples and buys {2 * i + 1} more."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        prompts.append(list(ids["input_ids"]))
    # each row's prepared start of the completion (`prefix_tokens` random ids of the tokenizer, none special), as if
    # the policy had written it and the judge had kept it: a rollout to L then times the last L - prefix tokens
    special = set(tokenizer.all_special_ids)
    known = [i for i in range(len(tokenizer)) if i not in special]
    starts = [random.Random(i).choices(known, k=r.get("prefix_tokens", 0)) for i in range(r["rows"])]
    was_training = model.training
    model.eval()  # generate keeps its cache: transformers drops it while training with checkpointing on
    lines = TokenLines(tokenizer)
    try:
        for length in r["lengths"]:
            first = None
            for kv_cache in r["kv_cache"]:
                engine = TransformersEngine(
                    model,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_ids=[tokenizer.eos_token_id],
                    generation_config=GenerationConfig(do_sample=False, suppress_tokens=[tokenizer.eos_token_id]),
                    kv_cache=kv_cache,
                )
                # warm-up outside the timed phase (CUDA kernels, allocator): a short rollout through the same paths
                warm = [Trajectory(prompt_ids=p, question=f"row {i}", review_budget=8) for i, p in enumerate(prompts)]
                InterventionRollout(
                    engine,
                    scripted_judge(),
                    lines,
                    RolloutSettings(chunk_size=8, max_reviews=8, max_correction_tokens=4, max_completion_length=24),
                ).run(warm)
                prepared = f" from {len(starts[0])}" if starts[0] else ""
                name = f"rollout: {length} tokens{prepared}, kv_cache={kv_cache}"
                entry = {"length": length, "kv_cache": kv_cache, "rows": r["rows"], "chunk_size": r["chunk_size"],
                         "prefix_tokens": len(starts[0]), "finished": False, "calls": []}  # fmt: skip
                record.append(entry)
                record_calls(engine, entry["calls"], checkpoint)
                trajectories = [
                    Trajectory(prompt_ids=p, question=f"row {i}", reference=None, review_budget=length,
                               completion_ids=list(start), env_mask=[1] * len(start), judge_mask=[0] * len(start),
                               logprobs=None)
                    for i, (p, start) in enumerate(zip(prompts, starts, strict=True))
                ]  # fmt: skip
                rollout = InterventionRollout(
                    engine,
                    scripted_judge(),
                    lines,
                    RolloutSettings(
                        chunk_size=r["chunk_size"],
                        max_reviews=length,
                        max_correction_tokens=r["max_correction_tokens"],
                        max_completion_length=length,
                    ),
                )
                start_counters = counters(engine)
                with meter.phase(name):
                    counts = rollout.run(trajectories)
                phase = meter.records[name]
                read, reused, generated = (b - a for a, b in zip(start_counters, counters(engine), strict=True))
                completions = [t.completion_ids for t in trajectories]
                entry.update({
                    "finished": True, "seconds": phase["seconds"], "rounds": counts.rounds,
                    "policy_calls": counts.policy_calls, "review_calls": counts.review_calls,
                    "correction_calls": counts.correction_calls,
                    "decode_steps": sum(c["max_cap"] for c in entry["calls"]),
                    "prefill_tokens": read, "reused_tokens": reused, "generated_tokens": generated,
                    "prompt_tokens": sum(map(len, prompts)),
                    "completion_tokens": sum(map(len, completions)),
                    "judge_tokens": sum(t.judge_tokens for t in trajectories),
                    "reviews": sum(t.reviews for t in trajectories),
                    "revisions": sum(t.revisions for t in trajectories),
                    "judge_failures": sum(t.judge_failures for t in trajectories),
                    "rows_at_length": sum(len(c) == length for c in completions),
                    "peak_bytes": phase["peak_bytes"], "working_bytes": phase["working_bytes"],
                    "max_forward_tokens": phase.get("max_tokens_no_grad", 0),
                    "generated_per_second": generated / phase["seconds"],
                })  # fmt: skip
                if first is None:
                    first = (kv_cache, completions, [t.judge_mask for t in trajectories])
                else:
                    entry["compared_with_kv_cache"] = first[0]
                    entry["same_trajectories"] = sum(
                        a == b and ma == t.judge_mask
                        for a, b, ma, t in zip(first[1], completions, first[2], trajectories, strict=True)
                    )
                    entry["first_difference"] = [
                        next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                             None if len(a) == len(b) else min(len(a), len(b)))
                        for a, b in zip(first[1], completions, strict=True)
                    ]  # fmt: skip
                print(
                    f"gpu_check: {name}: {phase['seconds']:.1f} s, {entry['decode_steps']:,} decode steps in "
                    f"{entry['policy_calls']} calls, read {read:,} reused {reused:,} generated {generated:,} tokens, "
                    f"{entry['revisions']} cuts, {entry['rows_at_length']}/{r['rows']} rows at {length:,}"
                    + (f", {entry['same_trajectories']}/{r['rows']} trajectories as kv_cache={first[0]}'s"
                       if "same_trajectories" in entry else ""),
                    flush=True,
                )  # fmt: skip
                if checkpoint is not None:
                    checkpoint()
                del engine, rollout, trajectories
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
    finally:
        model.train(was_training)


def run(settings: dict, device: str, checkpoint=None) -> dict:
    """Every configuration of `settings` on one model; `checkpoint(results)` is called after each one."""
    import gc

    import torch

    from benchmarks.lib.memory_phases import build_model, build_tokenizer, build_trainers, measure_phases
    from benchmarks.lib.phase_meter import PhaseMeter

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    longest = max([settings["completion_tokens"] + 2 * settings["reference_tokens"], *settings["rollout"]["lengths"]])
    max_positions = longest + 1024
    tokenizer = build_tokenizer(max_positions)
    start = time.perf_counter()
    model = build_model(tokenizer, settings["model"], max_positions=max_positions, device=device, dtype=dtype)
    built = time.perf_counter() - start
    parameters = sum(p.numel() for p in model.parameters())
    print(f"gpu_check: model built in {built:.1f} s: {parameters / 1e9:.2f}B parameters, {dtype}", flush=True)
    results = {"parameters": parameters, "dtype": str(dtype), "build_seconds": built, "runs": []}
    meter = PhaseMeter(device)
    meter.watch(model)
    if settings["plans"]["batches"]:
        results["plans"] = []
        time_plans(model, tokenizer, settings, device, meter, results["plans"],
                   checkpoint=None if checkpoint is None else lambda: checkpoint(results))  # fmt: skip
        meter.records = {}
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    if settings["rollout"]["lengths"] and settings["rollout"]["kv_cache"]:
        results["rollout"] = []
        time_rollouts(model, tokenizer, settings, device, meter, results["rollout"],
                      checkpoint=None if checkpoint is None else lambda: checkpoint(results))  # fmt: skip
        meter.records = {}
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    for name, config in settings["configs"].items():
        meter.records = {}  # this configuration's phases
        with tempfile.TemporaryDirectory(prefix="gpu_check_") as out:
            sort, mintrl = build_trainers(model, tokenizer, settings, config, out, device)
            engine = None
            if not results["runs"]:
                engine = engine_tokens_per_second(sort, tokenizer, settings["engine_rows"], settings["engine_tokens"],
                                                  meter)  # fmt: skip
            start = time.perf_counter()
            facts = measure_phases(sort, mintrl, model, tokenizer, settings, config, meter)
            seconds = time.perf_counter() - start
        run_record = {"name": name, "config": config, "phases": meter.records, "facts": facts, "seconds": seconds}
        if engine is not None:
            run_record["engine"] = engine
        results["runs"].append(run_record)
        print(f"gpu_check: {name} done in {seconds:.0f} s", flush=True)
        print(table([run_record]), flush=True)
        if checkpoint is not None:
            checkpoint(results)
        del sort, mintrl
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def table(runs: list[dict]) -> str:
    from benchmarks.lib.phase_meter import MIB

    lines = [
        "| configuration | phase | calls | seconds | peak GiB | working GiB | largest forward: rows grad / no grad "
        "(rows x tokens) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for phase, r in run["phases"].items():
            tokens = r.get("max_tokens_grad") or r.get("max_tokens_no_grad") or 0
            lines.append(
                f"| {run['name']} | {phase} | {r['calls']} | {r['seconds']:.2f} | {r['peak_bytes'] / MIB / 1024:.2f} "
                f"| {r['working_bytes'] / MIB / 1024:.2f} | {r.get('max_rows_grad', '-')} / "
                f"{r.get('max_rows_no_grad', '-')} ({tokens:,}) |"
            )
    return "\n".join(lines)


def plans_table(plans: list[dict]) -> str:
    from benchmarks.lib.phase_meter import MIB

    lines = [
        "| plan_batch_size | generate calls (rows) | seconds | generated tokens | peak GiB | working GiB | plans as "
        "the first setting's |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in plans:
        lines.append(
            f"| {p['plan_batch_size']} | {len(p['calls'])} ({', '.join(map(str, p['calls']))}) | {p['seconds']:.2f} "
            f"| {p['generated_tokens']:,} | {p['peak_bytes'] / MIB / 1024:.2f} | {p['working_bytes'] / MIB / 1024:.2f} "
            f"| {p['same_plans_as_first']} / {p['rows']} |"
        )
    return "\n".join(lines)


def _length(entry: dict) -> str:
    prefix = entry.get("prefix_tokens", 0)
    return f"{entry['length']:,}" + (f" (from {prefix:,} prepared)" if prefix else "")


def rollout_table(rollout: list[dict]) -> str:
    from benchmarks.lib.phase_meter import MIB

    lines = [
        "| completion tokens | kv_cache | seconds | generate calls | decode steps | prefill read | reused | generated "
        "| judge tokens (cuts) | peak GiB | working GiB | largest forward (rows x tokens) | rows at the length "
        "| trajectories as the length's first setting's |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in rollout:
        if not e["finished"]:
            calls = e["calls"]
            lines.append(
                f"| {_length(e)} | {e['kv_cache']} | stopped after {sum(c['seconds'] for c in calls):.1f} "
                f"| {len(calls)} | {sum(c['max_cap'] for c in calls):,} | {sum(c['read'] for c in calls):,} "
                f"| {sum(c['reused'] for c in calls):,} | {sum(c['generated'] for c in calls):,} "
                "| - | - | - | - | - | - |"
            )
            continue
        same = f"{e['same_trajectories']} / {e['rows']}" if "same_trajectories" in e else "(first)"
        lines.append(
            f"| {_length(e)} | {e['kv_cache']} | {e['seconds']:.2f} | {e['policy_calls']} | {e['decode_steps']:,} "
            f"| {e['prefill_tokens']:,} | {e['reused_tokens']:,} | {e['generated_tokens']:,} "
            f"| {e['judge_tokens']:,} ({e['revisions']}) | {e['peak_bytes'] / MIB / 1024:.2f} "
            f"| {e['working_bytes'] / MIB / 1024:.2f} | {e['max_forward_tokens']:,} "
            f"| {e['rows_at_length']} / {e['rows']} | {same} |"
        )
    speedups = []
    for length in dict.fromkeys(e["length"] for e in rollout):
        runs = {e["kv_cache"]: e for e in rollout if e["length"] == length}
        if True not in runs or False not in runs:
            continue
        on, off = runs[True], runs[False]
        if on["finished"] and off["finished"]:
            speedups.append(f"{length:,} tokens: {off['seconds'] / on['seconds']:.2f}x")
        elif k := min(len(on["calls"]), len(off["calls"])):  # a setting stopped at the run's limit: the same calls
            on_s, off_s = (sum(c["seconds"] for c in e["calls"][:k]) for e in (on, off))
            speedups.append(f"{length:,} tokens, the first {k} generate calls of each (a setting did not finish): "
                            f"{off_s:.1f} s / {on_s:.1f} s = {off_s / on_s:.2f}x")  # fmt: skip
    if speedups:
        lines += ["", "Seconds without the cache / with it: " + "; ".join(speedups) + "."]
    return "\n".join(lines)


def render(saved: dict) -> str:
    from benchmarks.lib.memory_phases import checkpointing_state

    s = saved["settings"]
    lines = [
        f"# GPU check on {saved['device_name']} ({'CPU dry run, tiny shapes' if saved['cpu_dry_run'] else 'bf16'})",
        "",
        f"Versions: {', '.join(f'{k} {v}' for k, v in saved['versions'].items())}.",
        "",
        f"Random Qwen3 ({s['model']['layers']} layers, hidden {s['model']['hidden']}, vocabulary "
        f"{s['model']['vocab']:,}; {saved['result']['parameters'] / 1e9:.3f}B parameters, "
        f"{saved['result']['dtype']}), gradient checkpointing "
        + (
            checkpointing_state(s["gradient_checkpointing"], saved["result"]["runs"])
            if saved["result"]["runs"]
            else "not used (no configuration ran)"
        )
        + f"; losses on {s['completion_tokens']:,}-token completions, repairs of {s['reference_tokens']:,}-token "
        f"references with plans of up to {s['plan_tokens']} tokens, generation batch {s['generation_batch']} x "
        f"{s['generation_tokens']} tokens.",
        "",
    ]
    for run in saved["result"]["runs"]:
        if "engine" in run:
            e = run["engine"]
            lines.append(
                f"Transformers engine: {e['rows']} rows x {e['new_tokens']} new tokens: {e['generated']:,} tokens "
                f"in {e['seconds']:.2f} s = {e['tokens_per_second']:,.0f} tokens/s."
            )
    if saved["result"].get("plans"):
        lines += ["", f"SORT plans of {s['plans']['rows']} references ({s['reference_tokens']:,} tokens), up to "
                  f"{s['plan_tokens']} tokens each, greedy, by `plan_batch_size`:", "",
                  plans_table(saved["result"]["plans"])]  # fmt: skip
    if saved["result"].get("rollout"):
        r = s["rollout"]
        lines += ["", f"MInTRL's chunked rollout, {r['rows']} rows, chunks of {r['chunk_size']} tokens, greedy, "
                  "EOS suppressed (every row runs to the length), a scripted judge cutting every other chunk of a "
                  f"row at a step 1/2 to 7/8 into it and inserting a fixed correction (at most "
                  f"{r['max_correction_tokens']} tokens), with the engine's KV caches kept across calls (kv_cache "
                  "True) and without:", "", rollout_table(saved["result"]["rollout"])]  # fmt: skip
    if saved["result"]["runs"]:
        lines += ["", table(saved["result"]["runs"])]
    lines += ["", f"Total {saved['wall_seconds']:.0f} s."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU (no GPU needed)")
    parser.add_argument("--out", type=Path, default=None, help="write gpu_check.json and gpu_check.md here")
    parser.add_argument(
        "--configs",
        nargs="*",
        default=None,
        help="only these configurations (default: the settings' default_configs, else all); with no value, none",
    )
    parser.add_argument(
        "--plan-batches",
        nargs="*",
        default=None,
        help="plan_batch_size settings of the plan phase ('none' for None); with no value, no plan phase",
    )
    parser.add_argument(
        "--rollout-lengths",
        nargs="*",
        type=int,
        default=None,
        help="completion lengths of the rollout phase (GPU default 4096; 16384 is the papers' long one); with no "
        "value, no rollout phase",
    )
    parser.add_argument(
        "--rollout-prefix",
        type=int,
        default=None,
        help="each row's completion starts with this many prepared tokens (random ids, as if written and kept), so "
        "that a rollout to L times its last L - N tokens: --rollout-lengths 16384 --rollout-prefix 12288 times the "
        "last 4,096 tokens of a 16k completion",
    )
    parser.add_argument(
        "--rollout-kv",
        nargs="+",
        choices=["on", "off"],
        default=None,
        help="the engine's kv_cache settings the rollout phase runs, in this order (default: on off)",
    )
    cli = parser.parse_args()
    versions = check_imports()
    import torch

    if cli.cpu_dry_run:
        settings, device = dict(CPU_DRY_RUN), "cpu"
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        device_name = "CPU"
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device (torch.cuda.is_available() is False); use --cpu-dry-run", file=sys.stderr)
            sys.exit(1)
        settings, device = dict(GPU), "cuda"
        device_name = torch.cuda.get_device_name()
        total = torch.cuda.get_device_properties(0).total_memory
        print(f"gpu_check: {device_name}, {total / 2**30:.0f} GiB; {versions}", flush=True)
    if cli.plan_batches is not None:
        batches = [None if b.lower() == "none" else int(b) for b in cli.plan_batches]
        settings["plans"] = {**settings["plans"], "batches": batches}
    if cli.rollout_lengths is not None:
        settings["rollout"] = {**settings["rollout"], "lengths": cli.rollout_lengths}
    if cli.rollout_prefix is not None:
        if any(length <= cli.rollout_prefix for length in settings["rollout"]["lengths"]) or cli.rollout_prefix < 0:
            parser.error(f"--rollout-prefix {cli.rollout_prefix}: must be >= 0 and below every rollout length")
        settings["rollout"] = {**settings["rollout"], "prefix_tokens": cli.rollout_prefix}
    if cli.rollout_kv is not None:
        settings["rollout"] = {**settings["rollout"], "kv_cache": [kv == "on" for kv in cli.rollout_kv]}
    chosen = cli.configs if cli.configs is not None else settings.get("default_configs")
    if chosen is not None:
        unknown = sorted(set(chosen) - set(settings["configs"]))
        if unknown:
            parser.error(f"--configs: no configuration {unknown}; there are {sorted(settings['configs'])}")
        settings["configs"] = {k: v for k, v in settings["configs"].items() if k in chosen}
    start = time.perf_counter()

    def save(result: dict) -> str:
        """Write what has been measured so far (every configuration's end), so that a run cut short brings it back."""
        saved = {
            "command": " ".join(["python", "-m", "scripts.gpu_check", *sys.argv[1:]]),
            "device_name": device_name,
            "cpu_dry_run": cli.cpu_dry_run,
            "versions": versions,
            "settings": settings,
            "result": result,
            "wall_seconds": time.perf_counter() - start,
        }
        text = render(saved)
        if cli.out:
            cli.out.mkdir(parents=True, exist_ok=True)
            (cli.out / "gpu_check.json").write_text(json.dumps(saved, indent=1))
            (cli.out / "gpu_check.md").write_text(text + "\n")
        return text

    print("\n" + save(run(settings, device, checkpoint=save)))


if __name__ == "__main__":
    main()
