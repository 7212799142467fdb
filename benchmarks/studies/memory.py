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
phase holds at that moment. CUDA (`scripts/gpu_check.py` uses this module): `torch.cuda.max_memory_allocated` after
`torch.cuda.reset_peak_memory_stats`, and `memory_allocated` at the start, per phase. Every phase also records the
largest forward pass it made (rows x tokens, with and without gradients), from a hook on the model: that is what
"the repair is micro-batched" means in numbers.

Time: each configuration's wall time is recorded (the full mode's total is the sum).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.lib.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"
MIB = 2**20

# Written before any full run: what the numbers should show (rendered at the top of memory.md).
HYPOTHESES = """\
Hypotheses (written before the run):
1. GRPO and MInTRL loss: working memory grows with the micro-batch (about linearly in its activations; the gradient
   buffers, the size of the model, are the same at every micro-batch, so 1 -> 4 rows gives less than x4) and does not
   depend on `repair_batch_size` or on the items the buffer holds.
2. Repair update and its base pass: with the repair micro-batched (issue 29: at most `per_device_train_batch_size`
   rows per forward with gradients) the working memory follows the micro-batch like the loss does, and stays flat
   (ratio about 1) from 8 to 16 (or 32) references per repair and from 8 to 64 buffered items. Without
   micro-batching (the repair before issue 29: all `repair_batch_size` rows in one forward) it grows about linearly
   with `repair_batch_size` (8 -> 16 references: about x2) and the largest forward with gradients has
   `repair_batch_size` rows.
3. Teacher pass: no gradients, so smaller than the base pass; flat in `repair_batch_size` once micro-batched.
4. Plan: the policy writes the plans of a repair without gradients, `plan_batch_size` prompts a generate call
   (default: all of them in one call), and each prompt holds the whole reference, so the call's KV cache grows with
   the plans in it: bounded by `plan_batch_size`, not by the training micro-batch (docs/sort.md, "Plan generation").
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


# ---- memory per phase ----------------------------------------------------------------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PhaseMeter:
    """Peak memory per named phase (nested phases allowed), on the CPU (the process's RSS high-water mark) or on a
    CUDA device (`max_memory_allocated`), plus the largest forward pass of each phase (from `watch(model)`).

    A phase entered several times (e.g. one teacher pass per micro-batch) keeps its largest peak and working memory,
    the sum of its seconds, and its number of calls."""

    def __init__(self, device=None):
        import torch

        self.torch = torch
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.records: dict[str, dict] = {}
        self._stack: list[dict] = []

    # the two counters
    def current(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else _status_bytes("VmRSS")

    def _peak(self) -> int:
        return self.torch.cuda.max_memory_allocated() if self.cuda else _status_bytes("VmHWM")

    def _reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux)

    def settle(self) -> None:
        """Release what can be released, so that a phase starts from live memory only."""
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
        else:
            _malloc_trim()

    @contextlib.contextmanager
    def phase(self, name: str):
        if self._stack:  # the enclosing phase's peak so far, before this phase resets the counter
            self._stack[-1]["peak"] = max(self._stack[-1]["peak"], self._peak())
        else:
            self.settle()
        frame = {"name": name, "before": self.current(), "peak": 0, "forwards": {}}
        self._reset_peak()
        self._stack.append(frame)
        start = time.perf_counter()
        try:
            yield frame
        finally:
            if self.cuda:
                self.torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            peak = max(frame["peak"], self._peak())
            self._stack.pop()
            if self._stack:
                self._stack[-1]["peak"] = max(self._stack[-1]["peak"], peak)
            record = self.records.setdefault(
                name, {"calls": 0, "seconds": 0.0, "peak_bytes": 0, "working_bytes": 0, "before_bytes": None}
            )
            record["calls"] += 1
            record["seconds"] += seconds
            if peak - frame["before"] >= record["working_bytes"]:
                record["before_bytes"] = frame["before"]
            record["peak_bytes"] = max(record["peak_bytes"], peak)
            record["working_bytes"] = max(record["working_bytes"], peak - frame["before"])
            for key, value in frame["forwards"].items():
                record[key] = max(record.get(key, 0), value)

    def watch(self, model) -> None:
        """Record, in every open phase, the largest forward pass of `model`: rows and tokens, with / without grad."""

        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")
            if ids is None or not self._stack:
                return
            grad = "grad" if self.torch.is_grad_enabled() else "no_grad"
            rows, tokens = int(ids.shape[0]), int(ids.shape[1]) if ids.dim() > 1 else 1
            for frame in self._stack:
                forwards = frame["forwards"]
                for key, value in ((f"max_rows_{grad}", rows), (f"max_tokens_{grad}", rows * tokens)):
                    forwards[key] = max(forwards.get(key, 0), value)
                forwards["forwards"] = forwards.get("forwards", 0) + 1

        model.register_forward_pre_hook(hook, with_kwargs=True)

    def wrap(self, obj, method: str, phase_name) -> bool:
        """Run `obj.method` inside a phase (`phase_name`: a name, or a function of no arguments giving one at call
        time); False when `obj` has no such method (the seam moved)."""
        original = getattr(obj, method, None)
        if original is None:
            return False

        def wrapped(*args, **kwargs):
            with self.phase(phase_name() if callable(phase_name) else phase_name):
                return original(*args, **kwargs)

        setattr(obj, method, wrapped)
        return True


# ---- the model, the data and the trainers --------------------------------------------------------------------------


def build_tokenizer(max_length: int):
    from trl_mintrl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(vocab_size=1024)
    tokenizer.model_max_length = max_length
    return tokenizer


def build_model(tokenizer, shape: dict, *, max_positions: int, device="cpu", dtype=None, seed: int = 0):
    """A randomly initialised Qwen3 causal LM of `shape` (hidden, layers, intermediate, heads, kv_heads, head_dim;
    optional vocab, larger than the tokenizer's to give the embedding a real size: ids the tokenizer does not know
    decode to nothing), built on `device` in `dtype` without downloading anything."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=max(shape.get("vocab", 0), len(tokenizer)),
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=max_positions,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    dtype = dtype or torch.float32
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def prompts_and_references(n: int, reference_tokens: int, tokenizer, offset: int = 0) -> list[dict]:
    """`n` dataset rows: a conversational prompt and a reference solution of at least `reference_tokens` tokens (the
    repair cuts it to exactly that many with `max_reference_tokens`)."""
    import random

    words = "so we get step first then compute check add subtract multiply total value therefore".split()
    rows = []
    for i in range(offset, offset + n):
        rng = random.Random(i)
        parts, length = [], 0
        while length < reference_tokens:
            chunk = " ".join(rng.choice(words) + f" {rng.randrange(1000)}" for _ in range(64)) + "\n\n"
            parts.append(chunk)
            length += len(tokenizer(chunk, add_special_tokens=False)["input_ids"])
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Problem {i}: compute {i % 97} + {i % 89} step by step."}],
                "solution": "".join(parts),
            }
        )
    return rows


def constant_reward(completions, **kwargs):
    """Every rollout correct: no prompt is deferred by the generation phase, the buffer holds what we put in."""
    return [1.0] * len(completions)


def _keep_judge():
    from trl_mintrl.judges import FunctionJudge

    return FunctionJudge(lambda question, prefix, steps, reference: None, lambda question, prefix, reference: "")


def trainer_args(settings: dict, config: dict, output_dir: str, device: str) -> dict:
    """The `GRPOConfig` fields shared by both trainers."""
    on_gpu = device == "cuda"
    return dict(
        output_dir=output_dir,
        use_cpu=not on_gpu,
        bf16=on_gpu,
        gradient_checkpointing=settings["gradient_checkpointing"],
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        max_steps=10,
        per_device_train_batch_size=config["micro_batch"],
        generation_batch_size=settings["generation_batch"],
        max_completion_length=settings["generation_tokens"],
        temperature=1.0,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        remove_unused_columns=False,
    )


def _supported(config_class, overrides: dict) -> dict:
    """The overrides that `config_class` has fields for (fields added by later versions of the repair)."""
    from dataclasses import fields

    names = {f.name for f in fields(config_class)}
    return {k: v for k, v in overrides.items() if k in names}


def build_trainers(model, tokenizer, settings: dict, config: dict, output_dir: str, device: str, with_mintrl=True):
    """A `SORTTrainer` and a `MInTRLTrainer` on the same model object (one copy of the weights)."""
    from datasets import Dataset

    from trl_mintrl import MInTRLConfig, MInTRLTrainer, SORTConfig, SORTTrainer

    common = trainer_args(settings, config, output_dir, device)
    data = Dataset.from_list(prompts_and_references(8, 16, tokenizer, offset=10_000))
    sort_overrides = {
        "num_generations": settings["num_generations"],
        "repair_batch_size": config["repair_batch_size"],
        "max_reference_tokens": settings["reference_tokens"],
        "max_plan_tokens": settings["plan_tokens"],
        # fields of the micro-batched repair (issue 29), set where this version has them: one repair per step, a
        # buffer large enough for the configuration's items
        **_supported(
            SORTConfig,
            {"max_repairs_per_step": 1, **dict.fromkeys(BUFFER_CAPACITY_FIELDS, max(64, config["buffer_items"]))},
        ),
    }
    sort = SORTTrainer(
        model,
        reward_funcs=constant_reward,
        args=SORTConfig(**common, **sort_overrides),
        train_dataset=data,
        processing_class=tokenizer,
    )
    mintrl = None
    if with_mintrl:
        half = settings["num_generations"] // 2
        mintrl = MInTRLTrainer(
            model,
            reward_funcs=constant_reward,
            args=MInTRLConfig(
                **{**common, "output_dir": output_dir + "/mintrl"},
                num_control_generations=half,
                num_intervened_generations=settings["num_generations"] - half,
                chunk_size=max(settings["generation_tokens"] // 2, 1),
                max_reviews=1,
                max_correction_tokens=8,
                intervention_steps=100,
            ),
            train_dataset=data,
            processing_class=tokenizer,
            judge=_keep_judge(),
        )
    return sort, mintrl


# the buffer's capacity field of the micro-batched repair (issue 29), where this version has it
BUFFER_CAPACITY_FIELDS = ("repair_buffer_size",)


def prepared_micro_batch(output: dict, rows: int, completion_tokens: int, vocab: int, seed: int = 0) -> dict:
    """TRL's generation output cut to a micro-batch of `rows` rows, with completions of `completion_tokens` random
    token ids (none of them EOS or padding), as `_prepare_inputs` hands `compute_loss` one micro-batch. A judge
    token mask (`tool_mask`, 0 on 3% of the tokens) is added for MInTRL's loss."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    device = output["prompt_ids"].device
    total = output["prompt_ids"].shape[0]
    batch = {}
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == total:
            if value.dim() == 1:
                batch[key] = value[:rows]  # per-row values: advantages and the like
            elif key.startswith("prompt"):
                batch[key] = value[:rows]
            # per-token tensors of the short generated completions are replaced below or dropped
        elif key not in ("completion_ids", "completion_mask"):
            batch[key] = value
    batch["completion_ids"] = torch.randint(4, vocab, (rows, completion_tokens), generator=generator).to(device)
    batch["completion_mask"] = torch.ones(rows, completion_tokens, dtype=torch.long, device=device)
    batch["advantages"] = torch.randn(rows, generator=generator).to(device)
    if "num_items_in_batch" in output:  # tokens of the whole generation batch (DAPO's normaliser)
        batch["num_items_in_batch"] = torch.tensor(total * completion_tokens, device=device)
    judge = torch.rand(rows, completion_tokens, generator=generator) < 0.03
    batch["tool_mask"] = (~judge).long().to(device)
    return batch


def warm_optimizer(trainer) -> bool:
    """Create the trainer's optimizer and its state (AdamW's moments) with a zero-gradient step, as the first training
    step would, so that no measured phase allocates optimizer state; the same for the repair's own optimizer state
    (`repair_optimizer="own"`), stepped as the separate repair steps step it (`repair.optimizer.stepping()`).
    Returns whether a repair state of its own was warmed (False with `repair_optimizer="shared"`)."""
    import torch

    def zero_step():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        trainer.optimizer.step()
        trainer.model.zero_grad(set_to_none=True)

    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    zero_step()
    if trainer.repair.optimizer.own_state is None:
        return False
    with trainer.repair.optimizer.stepping():
        zero_step()
    return True


def enable_checkpointing(model, args) -> bool:
    """Turn activation checkpointing on as `Trainer.train` does when `args.gradient_checkpointing` is set (the phases
    run the trainers' code without `train()`, which is where transformers turns it on); returns whether it is on.
    transformers 5.18+ names it `activation_checkpointing_enable`, earlier versions `gradient_checkpointing_enable`."""
    if not args.gradient_checkpointing:
        return False
    kwargs = args.gradient_checkpointing_kwargs or None
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        return model.is_activation_checkpointing
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model.is_gradient_checkpointing


def measure_phases(sort, mintrl, model, tokenizer, settings: dict, config: dict, meter: PhaseMeter) -> dict:
    """Run every phase once through the trainers' code, inside `meter`'s phases. Returns facts about the run."""
    import torch

    facts = {}
    model.train()
    facts["activation_checkpointing"] = enable_checkpointing(model, sort.args)
    for trainer in (sort, mintrl):
        if trainer is not None and not getattr(trainer, "current_gradient_accumulation_steps", None):
            trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    gen_rows = settings["generation_batch"]
    group = settings["num_generations"]
    rows = [r for r in prompts_and_references(gen_rows // group, 16, tokenizer, offset=20_000) for _ in range(group)]

    with meter.phase("generation (GRPO)"):
        output = sort._generate_and_score_completions(rows)
    facts["generated_tokens_grpo"] = int(output["completion_mask"].sum())
    if mintrl is not None:
        with meter.phase("generation (MInTRL)"):
            mintrl_output = mintrl._generate_and_score_completions(rows)
        facts["generated_tokens_mintrl"] = int(mintrl_output["completion_mask"].sum())
        del mintrl_output

    batch = prepared_micro_batch(output, config["micro_batch"], settings["completion_tokens"], model.vocab_size)
    facts["loss_batch"] = list(batch["completion_ids"].shape)
    del output
    facts["repair_optimizer_warmed"] = warm_optimizer(sort)  # optimizer states exist before the steps, as in training
    for name, trainer in (("GRPO loss", sort), ("MInTRL loss", mintrl)):
        if trainer is None:
            continue
        inputs = batch if name == "MInTRL loss" else {k: v for k, v in batch.items() if k != "tool_mask"}
        with meter.phase(name):
            loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)
        facts[f"{name} value"] = float(loss.detach())
        del loss
        with meter.phase("optimizer step"):  # the step that follows either loss: clipping and AdamW
            sort.accelerator.clip_grad_norm_(model.parameters(), sort.args.max_grad_norm)
            sort.optimizer.step()
        model.zero_grad(set_to_none=True)
    del batch

    repair = sort.repair
    for row in prompts_and_references(config["buffer_items"], settings["reference_tokens"], tokenizer):
        repair.buffer.add(row["prompt"], row["solution"])
    facts["buffer_before_repair"] = len(repair.buffer)
    facts["wrapped"] = {
        "_write_plans": meter.wrap(repair, "_write_plans", "repair: plan"),
        "_reference_logps": meter.wrap(
            repair,
            "_reference_logps",
            lambda: "repair: base pass" if torch.is_grad_enabled() else "repair: teacher pass",
        ),
    }
    with meter.phase("repair update"):
        repair.separate_repair_step()
    facts["buffer_after_repair"] = len(repair.buffer)
    facts["repairs"] = repair.buffer.counters.get("repairs")
    return facts


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
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
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
            [sys.executable, __file__, "--child", str(spec), str(result)], env=env, stdout=log, stderr=log
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


def checkpointing_state(asked: bool, runs: list[dict]) -> str:
    """Whether the runs measured with activation checkpointing, as their facts record it: runs before that fact was
    recorded asked for it but never turned it on (`Trainer.train` does, and the phases run without it)."""
    if not asked:
        return "off"
    if runs and all(r["facts"].get("activation_checkpointing") for r in runs):
        return "on"
    return (
        "asked for but NOT on in these runs (they predate `enable_checkpointing`: `Trainer.train` turns it on and the "
        "phases run without `train()`, so every layer's activations were kept; rerun the script for checkpointed "
        "numbers)"
    )


def render(saved: dict) -> str:
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
    lines += ["", "Growth of the working memory (ratio of the second configuration's to the first's):", ""]
    lines += ["| comparison | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
    by_name = {r["name"]: r for r in ok}
    for label, a, b in settings["comparisons"]:
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
    repair_phases = [p for p in phases if p.startswith("repair")]
    lines += [
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
    lines += [
        "",
        f"Total {saved['wall_seconds'] / 60:.1f} min ({sum(r.get('cpu_seconds', 0) for r in ok) / 60:.1f} CPU min "
        "in the configurations' processes). Baseline RSS after building the model and both trainers: "
        + ", ".join(f"{r['name']} {_mib(r['baseline_bytes'])} MiB" for r in ok)
        + ".",
    ]
    return "\n".join(lines)


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
    if args.replot:
        saved = json.loads(args.replot.read_text())
        text = render(saved)
        (args.replot.parent / "memory.md").write_text(text + "\n")
        print(text)
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
        "provenance": provenance("benchmarks/studies/memory.py", argv),
        "mode": mode,
        "threads": args.threads,
        "settings": settings,
        "wall_seconds": time.perf_counter() - start,
        "runs": runs,
    }
    (out / "memory.json").write_text(json.dumps(saved, indent=1))
    text = render(saved)
    (out / "memory.md").write_text(text + "\n")
    print(text)
    if any("error" in r for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
