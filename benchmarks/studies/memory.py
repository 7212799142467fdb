"""Peak memory of each phase of a MInTRL / SORT training step, and what it grows with: the micro-batch
(`per_device_train_batch_size`), or the number of references a repair takes (`repair_batch_size`), or the number
of items the buffer holds.

    python -m benchmarks.studies.memory            # scaled paper shapes (see MODES["full"]); one fresh process per config
    python -m benchmarks.studies.memory --quick    # tiny shapes, a smoke run (about a minute)
    python -m benchmarks.studies.memory --configs mb1-r8 --out /tmp/mem   # one configuration of the mode

Model: a randomly initialised Qwen3 (`Qwen3ForCausalLM`, built offline at run time from a config: no download) of
real architecture (GQA, head_dim 64, SwiGLU MLP, RMSNorm, tied embeddings) with tens of millions of parameters in
full mode, in fp32 on the CPU. Tokenizer: the package's tiny byte-level BPE tokenizer (`trl_mintrl.tiny`), so the
vocabulary is small (1,024 tokens): logits are a small share of the activations here, whereas with Qwen3's 151,936
tokens the logits of long sequences are a large one. The growth ratios carry over; the absolute MiB do not.

Phases, each through the trainers' own code (nothing re-implemented):
- generation, GRPO: `SORTTrainer._generate_and_score_completions` on one generation batch (TRL's transformers
  `generate`, rewards, advantages);
- generation, MInTRL: `MInTRLTrainer._generate_and_score_completions` (the chunked intervention rollout, with a
  judge that keeps every chunk);
- GRPO loss: `SORTTrainer.compute_loss` (TRL's clipped GRPO loss, SORT's main update) on one prepared micro-batch of
  long completions, plus its backward;
- MInTRL loss: `MInTRLTrainer.compute_loss` (the advantage regression, judge tokens included) on the same
  micro-batch, plus its backward;
- optimizer step: gradient clipping and the AdamW step after either loss (its state already exists: one zero-gradient
  step is taken before the measured phases, for the main optimizer and for the repair's own state);
- repair update: `trainer.repair.separate_repair_step()` with the buffer filled (SORT's own repair step: plan,
  teacher pass, base pass, backward, clipping, optimizer step); inside it, by wrapping the repair component's
  methods: plan (`_write_plans`: the policy writes the plans), teacher pass (`_reference_logps` without gradients)
  and base pass (`_reference_logps` with gradients, forward only).
The prepared micro-batch is TRL's own output of the generation phase, cut to the micro-batch's rows, with its
completions replaced by random token ids of the configured length (generating thousands of tokens per row would
take minutes on a CPU and measure the same thing as the loss phase's forward).

Memory. CPU: each configuration runs in a fresh process with glibc told to hand every allocation of 128 KiB or more
back to the system when it is freed (`MALLOC_MMAP_THRESHOLD_`, which also stops glibc from raising that threshold),
so the resident set tracks live memory. Before a phase: `gc.collect()`, `malloc_trim(0)`, then the peak-RSS counter
is reset (`/proc/self/clear_refs`, Linux) and the RSS noted; after it, the peak RSS (`VmHWM`). Reported: the phase's
working memory (peak minus the RSS at its start: activations, gradients, KV caches, temporaries) and the absolute peak
(weights, AdamW state and the Python runtime included). This is the process's whole resident memory, not torch's
tensors alone; a nested phase (e.g. the teacher pass inside the repair update) starts from whatever the enclosing
phase holds at that moment. CUDA (`scripts/gpu_check.py` runs the same phases, `benchmarks.lib.memory_phases`):
`torch.cuda.max_memory_allocated` after `torch.cuda.reset_peak_memory_stats`, and `memory_allocated` at the start,
per phase. Every phase also records the largest forward pass it made (rows x tokens, with and without gradients),
from a hook on the model: that is what "the repair is micro-batched" means in numbers.

Time: each configuration's wall time is recorded (the full mode's total is the sum).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib import harness
from benchmarks.lib.memory_phases import (
    build_model,
    build_tokenizer,
    build_trainers,
    checkpointing_state,
    measure_phases,
)
from benchmarks.lib.phase_meter import MIB, PhaseMeter, status_kib
from benchmarks.lib.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"


# Written before any full run: what the numbers should show (rendered at the top of memory.md).
HYPOTHESES = """\
Hypotheses (written before the run):
1. GRPO and MInTRL loss: working memory grows with the micro-batch (about linearly in its activations; the gradient
   buffers, the size of the model, are the same at every micro-batch, so 1 -> 4 rows gives less than x4) and does not
   depend on `repair_batch_size` or on the items the buffer holds.
2. Repair update and its base pass: with the repair micro-batched (at most `per_device_train_batch_size` rows per
   forward with gradients) the working memory follows the micro-batch like the loss does, and stays flat (ratio
   about 1) from 8 to 16 (or 32) references per repair and from 8 to 64 buffered items. Without micro-batching (the
   repair as it was first written: all `repair_batch_size` rows in one forward) it grows about linearly with
   `repair_batch_size` (8 -> 16 references: about x2) and the largest forward with gradients has
   `repair_batch_size` rows.
3. Teacher pass: no gradients, so smaller than the base pass; flat in `repair_batch_size` once micro-batched.
4. Plan: the policy writes all plans of a repair in one generate call, whose prompts hold the whole reference, so
   unless plan writing is micro-batched too its KV cache grows with `repair_batch_size` (the next thing to batch).
   (After the run, plan writing was batched: `plan_batch_size` prompts a generate call, so the call's KV cache is
   bounded by `plan_batch_size`, not by the training micro-batch; docs/sort.md, "Plan generation".)
5. Generation: follows the generation batch and the completion length (the same in every configuration here), not
   the micro-batch, `repair_batch_size` or the buffer.
6. Items held in the buffer cost nothing measurable (a prompt and a reference string each)."""

# A mode: the model, the shapes shared by its configurations, and the configurations. A configuration:
# micro-batch (per_device_train_batch_size), repair_batch_size, and the items put in the buffer before the repair.
MODES = {
    "quick": {
        "model": {"hidden": 128, "layers": 2, "intermediate": 384, "heads": 4, "kv_heads": 2, "head_dim": 32},
        "reference_tokens": 256,
        "completion_tokens": 256,
        "generation_tokens": 16,
        "generation_batch": 4,
        "num_generations": 2,
        "plan_tokens": 8,
        "gradient_checkpointing": True,
        "configs": {
            "mb1-r4": {"micro_batch": 1, "repair_batch_size": 4, "buffer_items": 4},
            "mb2-r4": {"micro_batch": 2, "repair_batch_size": 4, "buffer_items": 4},
            "mb1-r8": {"micro_batch": 1, "repair_batch_size": 8, "buffer_items": 8},
        },
        "comparisons": [
            ("micro-batch 1 -> 2 (4 references)", "mb1-r4", "mb2-r4"),
            ("repair_batch_size 4 -> 8 (micro-batch 1)", "mb1-r4", "mb1-r8"),
        ],
    },
    "full": {
        "model": {"hidden": 512, "layers": 6, "intermediate": 1536, "heads": 8, "kv_heads": 4, "head_dim": 64},
        "reference_tokens": 2048,
        "completion_tokens": 2048,
        "generation_tokens": 128,
        "generation_batch": 8,
        "num_generations": 4,
        "plan_tokens": 32,
        "gradient_checkpointing": True,
        "configs": {
            "mb1-r8": {"micro_batch": 1, "repair_batch_size": 8, "buffer_items": 8},
            "mb2-r8": {"micro_batch": 2, "repair_batch_size": 8, "buffer_items": 8},
            "mb4-r8": {"micro_batch": 4, "repair_batch_size": 8, "buffer_items": 8},
            "mb1-r16": {"micro_batch": 1, "repair_batch_size": 16, "buffer_items": 16},
            "mb1-r8-b64": {"micro_batch": 1, "repair_batch_size": 8, "buffer_items": 64},
            # not run by default (about 6 more minutes): `--configs mb1-r8 mb1-r32`
            "mb1-r32": {"micro_batch": 1, "repair_batch_size": 32, "buffer_items": 32},
        },
        "default_configs": ["mb1-r8", "mb2-r8", "mb4-r8", "mb1-r16", "mb1-r8-b64"],
        "comparisons": [
            ("micro-batch 1 -> 4 (8 references)", "mb1-r8", "mb4-r8"),
            ("repair_batch_size 8 -> 16 (micro-batch 1)", "mb1-r8", "mb1-r16"),
            ("repair_batch_size 8 -> 32 (micro-batch 1)", "mb1-r8", "mb1-r32"),
            ("buffer 8 -> 64 items (repair 8, micro-batch 1)", "mb1-r8", "mb1-r8-b64"),
        ],
    },
}

PHASES = [
    "generation (GRPO)",
    "generation (MInTRL)",
    "GRPO loss",
    "MInTRL loss",
    "optimizer step",
    "repair update",
    "repair: plan",
    "repair: teacher pass",
    "repair: base pass",
]


# ---- one configuration, in this process ----------------------------------------------------------------------------


def run_config(settings: dict, name: str) -> dict:
    """Build the model and the trainers and measure every phase of configuration `name` (in this process)."""
    import torch

    torch.set_num_threads(int(os.environ.get("MEMORY_BENCH_THREADS", "1")))
    config = settings["configs"][name]
    start = time.perf_counter()
    meter = PhaseMeter("cpu")
    max_positions = 2 * max(settings["reference_tokens"], settings["completion_tokens"]) + 1024
    tokenizer = build_tokenizer(max_positions)
    model = build_model(tokenizer, settings["model"], max_positions=max_positions)
    parameters = sum(p.numel() for p in model.parameters())
    meter.watch(model)
    with tempfile.TemporaryDirectory(prefix="memory_bench_") as out:
        sort, mintrl = build_trainers(model, tokenizer, settings, config, out, "cpu")
        meter.settle()
        baseline = meter.current()
        facts = measure_phases(sort, mintrl, model, tokenizer, settings, config, meter)
    return {
        "name": name,
        "config": config,
        "parameters": parameters,
        "vocab": model.vocab_size,
        "baseline_bytes": baseline,
        "phases": meter.records,
        "facts": facts,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": _cpu_seconds(),
    }


def _cpu_seconds() -> float:
    """User + system CPU time of this process: with other jobs on the machine, a truer measure of the work."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_rss_kib(pid: int) -> int:
    try:
        return status_kib("VmRSS", pid)
    except (OSError, StopIteration):
        return 0


def run_child(settings: dict, name: str, max_rss_gib: float, threads: int) -> dict:
    """`run_config` in a fresh process (glibc returns freed memory at once), killed if its RSS passes the cap."""
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="131072",
        MALLOC_TRIM_THRESHOLD_="131072",
        MEMORY_BENCH_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
    )
    with tempfile.TemporaryDirectory(prefix="memory_child_") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps({"settings": settings, "name": name}))
        log = open(Path(tmp) / "log.txt", "w+")  # noqa: SIM115
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.studies.memory", "--child", str(spec), str(result)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
        over = None
        while child.poll() is None:
            rss = _process_rss_kib(child.pid)
            if rss * 1024 > max_rss_gib * 2**30:
                over = rss * 1024
                child.kill()
            time.sleep(0.2)
        log.seek(0)
        tail = log.read()[-3000:]
        log.close()
        if result.exists():
            return json.loads(result.read_text())
        reason = f"killed at {over / MIB:,.0f} MiB RSS (cap {max_rss_gib} GiB)" if over else f"exit {child.returncode}"
        return {"name": name, "config": settings["configs"][name], "error": reason, "log_tail": tail,
                "seconds": time.perf_counter() - start}  # fmt: skip


# ---- results -------------------------------------------------------------------------------------------------------


def _mib(value) -> str:
    return f"{value / MIB:,.0f}"


def _cell(record: dict | None) -> str:
    if record is None:
        return "-"
    return f"{_mib(record['working_bytes'])} ({_mib(record['peak_bytes'])})"


def _rows_cell(record: dict | None) -> str:
    if record is None:
        return "-"
    grad, no_grad = record.get("max_rows_grad"), record.get("max_rows_no_grad")
    tokens = record.get("max_tokens_grad") or record.get("max_tokens_no_grad") or 0
    return f"{grad if grad is not None else '-'} / {no_grad if no_grad is not None else '-'} ({tokens:,})"


def render(saved: dict) -> str:
    """memory.md from the content of memory.json: the hypotheses, what ran, and the tables."""
    prov, settings, runs = saved["provenance"], saved["settings"], saved["runs"]
    model = settings["model"]
    ok = [r for r in runs if "error" not in r]
    params = f"{ok[0]['parameters'] / 1e6:.1f}M parameters, vocabulary {ok[0]['vocab']:,}" if ok else "-"
    phases = [p for p in PHASES if any(p in r.get("phases", {}) for r in ok)]
    changed = prov.get("changed_files_that_matter") or []
    lines = [
        "# Memory per phase (written by benchmarks/studies/memory.py from memory.json; do not edit)",
        "",
        HYPOTHESES,
        "",
        f"Command: `{prov['command']}` at commit `{prov['commit'][:12]}`"
        + (f" (changed: {', '.join(changed)})" if changed else "")
        + f". Mode `{saved['mode']}`, {saved['threads']} thread(s).",
        "",
        f"Model: random Qwen3 ({model['layers']} layers, hidden {model['hidden']}, MLP {model['intermediate']}, "
        f"{model['heads']} heads / {model['kv_heads']} KV heads of {model['head_dim']}, tied embeddings; {params}: "
        "the package's tiny tokenizer, so the logits are a small share of the memory), fp32 on the CPU, "
        f"gradient checkpointing {checkpointing_state(settings['gradient_checkpointing'], ok)} (TRL's default is on). "
        f"References of {settings['reference_tokens']:,} tokens, plans of up to {settings['plan_tokens']} tokens; "
        f"loss micro-batches of {settings['completion_tokens']:,}-token completions; generation batch "
        f"{settings['generation_batch']} rollouts x {settings['generation_tokens']} tokens.",
        "",
        "Cells: working memory of the phase, MiB (the peak above the memory held when it started), and in brackets "
        "the absolute peak, MiB. CPU: resident set of a fresh process per configuration (see the script's "
        "docstring); nested repair phases start from what the repair update holds at that point.",
        "",
        *_phase_table(runs, phases),
        *_growth_table(ok, phases, settings["comparisons"]),
        *_repair_forwards_table(ok, phases),
        "",
        f"Total {saved['wall_seconds'] / 60:.1f} min ({sum(r.get('cpu_seconds', 0) for r in ok) / 60:.1f} CPU min "
        "in the configurations' processes). Baseline RSS after building the model and both trainers: "
        + ", ".join(f"{r['name']} {_mib(r['baseline_bytes'])} MiB" for r in ok)
        + ".",
    ]
    return "\n".join(lines)


def _phase_table(runs: list[dict], phases: list[str]) -> list[str]:
    """Each configuration's working memory (and peak) per phase; a failed one's error."""
    lines = [
        "| configuration | micro-batch | repair_batch_size | buffer items | " + " | ".join(phases) + " |",
        "|---|---|---|---|" + "---|" * len(phases),
    ]
    for run in runs:
        c = run["config"]
        head = f"| {run['name']} | {c['micro_batch']} | {c['repair_batch_size']} | {c['buffer_items']} | "
        if "error" in run:
            lines.append(head + f"failed: {run['error']} |" + " |" * (len(phases) - 1))
            continue
        lines.append(head + " | ".join(_cell(run["phases"].get(p)) for p in phases) + " |")
    return lines


def _growth_table(ok: list[dict], phases: list[str], comparisons: list) -> list[str]:
    """Per comparison of two configurations that both ran, the ratio of their working memory in each phase."""
    lines = ["", "Growth of the working memory (ratio of the second configuration's to the first's):", ""]
    lines += ["| comparison | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
    by_name = {r["name"]: r for r in ok}
    for label, a, b in comparisons:
        if a not in by_name or b not in by_name:
            continue
        cells = []
        for p in phases:
            ra, rb = by_name[a]["phases"].get(p), by_name[b]["phases"].get(p)
            cells.append(
                f"{rb['working_bytes'] / max(ra['working_bytes'], 1):.2f}"
                if ra is not None and rb is not None
                else "-"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _repair_forwards_table(ok: list[dict], phases: list[str]) -> list[str]:
    """Per configuration, the largest forward pass of each repair phase and its calls, and the configuration's
    seconds."""
    repair_phases = [p for p in phases if p.startswith("repair")]
    lines = [
        "",
        "Largest forward pass per repair phase: rows with gradients / rows without (largest rows x tokens), and calls:",
        "",
        "| configuration | " + " | ".join(repair_phases) + " | seconds (CPU seconds) |",
        "|---|" + "---|" * (len(repair_phases) + 1),
    ]
    for run in ok:
        cells = [
            f"{_rows_cell(run['phases'].get(p))}, {run['phases'][p]['calls']} call(s)" if p in run["phases"] else "-"
            for p in repair_phases
        ]
        cpu = f" ({run['cpu_seconds']:.0f})" if "cpu_seconds" in run else ""
        lines.append(f"| {run['name']} | " + " | ".join(cells) + f" | {run['seconds']:.0f}{cpu} |")
    return lines


def write_report(saved: dict, out: Path, plots: bool = True) -> str:
    """memory.md in `out` (`render`)."""
    return harness.write_report(saved, out, "memory.md", lambda results: render(results) + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":  # internal: one configuration in this fresh process
        spec = json.loads(Path(argv[1]).read_text())
        Path(argv[2]).write_text(json.dumps(run_config(spec["settings"], spec["name"])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run")
    parser.add_argument("--configs", nargs="+", default=None, help="only these configurations of the mode")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results[/quick])")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per configuration")
    parser.add_argument("--max-rss-gib", type=float, default=12.0, help="kill a configuration above this RSS")
    parser.add_argument("--replot", type=Path, default=None, help="re-render memory.md from a memory.json")
    args = parser.parse_args(argv)
    if harness.replot_from(args, write_report):
        return
    mode = "quick" if args.quick else "full"
    settings = MODES[mode]
    names = args.configs or settings.get("default_configs") or list(settings["configs"])
    unknown = sorted(set(names) - set(settings["configs"]))
    if unknown:
        parser.error(f"unknown configurations {unknown}; {mode} mode has {list(settings['configs'])}")
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs = []
    for name in names:
        run = run_child(settings, name, args.max_rss_gib, args.threads)
        runs.append(run)
        status = run.get("error") or f"repair update {_cell(run['phases'].get('repair update'))} MiB"
        print(f"[memory] {name}: {run['seconds']:.0f} s, {status}", flush=True)
    saved = {
        "provenance": provenance("-m benchmarks.studies.memory", argv),
        "mode": mode,
        "threads": args.threads,
        "settings": settings,
        "wall_seconds": time.perf_counter() - start,
        "runs": runs,
    }
    harness.write_results(saved, out, "memory.json", write_report)
    if any("error" in r for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
