"""A vLLM-free GPU check: one MInTRL and one SORT step at the papers' lengths on a random model of Qwen3-1.7B's
shapes in bf16, peak GPU memory per phase, and tokens/s of the transformers generation engine. Run by
`scripts/gpu_check.sh` (which installs the carried wheels first); see that file's header for the device invocation
and for what has and has not been run on a GPU.

    python scripts/gpu_check.py                  # on a CUDA GPU (3-7 minutes on an H200, estimated)
    python scripts/gpu_check.py --cpu-dry-run    # the same code paths on the CPU at tiny shapes (about a minute)
    python scripts/gpu_check.py --out DIR        # also write gpu_check.json and gpu_check.md there

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
phase's memory follow the micro-batch?).

Plans (first, after the model is built): SORT's plan writing (`ReferenceRepair._write_plans`, the policy through the
transformers engine, greedy) of the same 16 references on the same weights with `plan_batch_size=None` (the default:
one generate call), then 4 and 1 (calls of the micro-batch, as plans were written before `plan_batch_size`; the H200
run in scripts/gpu_check.sh's header measured 34 s and 114 s for those): seconds, generate calls, peak and working
memory, and how many plans are token for token those of the one-call run. `--plan-batches` picks the settings
(`none` for None; the flag with no value skips the phase).

The phases and their measurement are `benchmarks/memory.py`'s (`measure_phases`, `PhaseMeter`): on CUDA,
`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, and `memory_allocated` at each phase's start.
A "MInTRL step" here is one micro-batch's loss, backward and optimizer step; a "SORT step" is the same with GRPO's
loss, then the repair step (`separate_repair_step`: plan, teacher pass, base pass, backward, optimizer step).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
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
    # plan writing: one call (None) against calls of micro-batch 4 and 1 (about 10 s, 34 s and 114 s, estimated
    # from the configurations' plan phases of the H200 run)
    "plans": {"rows": 16, "batches": [None, 4, 1]},
    # fastest first, so that a run cut short still brings results back: at micro-batch 1 the repair writes its 16
    # plans in 16 generate calls of 256 tokens (about 2 minutes, estimated)
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
    from benchmarks.memory import build_trainers, prompts_and_references
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


def run(settings: dict, device: str, checkpoint=None) -> dict:
    """Every configuration of `settings` on one model; `checkpoint(results)` is called after each one."""
    import gc

    import torch

    from benchmarks.memory import PhaseMeter, build_model, build_tokenizer, build_trainers, measure_phases

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    max_positions = settings["completion_tokens"] + 2 * settings["reference_tokens"] + 1024
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
    from benchmarks.memory import MIB

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
    from benchmarks.memory import MIB

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


def render(saved: dict) -> str:
    from benchmarks.memory import checkpointing_state

    s = saved["settings"]
    lines = [
        f"# GPU check on {saved['device_name']} ({'CPU dry run, tiny shapes' if saved['cpu_dry_run'] else 'bf16'})",
        "",
        f"Versions: {', '.join(f'{k} {v}' for k, v in saved['versions'].items())}.",
        "",
        f"Random Qwen3 ({s['model']['layers']} layers, hidden {s['model']['hidden']}, vocabulary "
        f"{s['model']['vocab']:,}; {saved['result']['parameters'] / 1e9:.3f}B parameters, "
        f"{saved['result']['dtype']}), gradient checkpointing "
        f"{checkpointing_state(s['gradient_checkpointing'], saved['result']['runs'])}; "
        f"losses on {s['completion_tokens']:,}-token completions, repairs of {s['reference_tokens']:,}-token "
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
    lines += ["", table(saved["result"]["runs"]), "", f"Total {saved['wall_seconds']:.0f} s."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU (no GPU needed)")
    parser.add_argument("--out", type=Path, default=None, help="write gpu_check.json and gpu_check.md here")
    parser.add_argument("--configs", nargs="+", default=None, help="only these configurations")
    parser.add_argument(
        "--plan-batches",
        nargs="*",
        default=None,
        help="plan_batch_size settings of the plan phase ('none' for None); with no value, no plan phase",
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
    if cli.configs:
        settings["configs"] = {k: v for k, v in settings["configs"].items() if k in cli.configs}
    start = time.perf_counter()

    def save(result: dict) -> str:
        """Write what has been measured so far (every configuration's end), so that a run cut short brings it back."""
        saved = {
            "command": " ".join(["python", "scripts/gpu_check.py", *sys.argv[1:]]),
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
