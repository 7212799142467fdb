"""Build the tool task's warm start: `python -m benchmarks.tasks.toy.warm_start_tools_build [OUT_DIR] [--design NAME]`.

The committed arithmetic warm start (`benchmarks/tasks/toy/warm_start/`), trained the design's `build_steps` more steps
(`benchmarks.tasks.toy.tool_task.DESIGNS`) on the register task's transcripts: per batch, `plain_fraction` plain
arithmetic problems (the base toy's stream, so the arithmetic is kept) and register problems, half of each regime;
a transcript reads the registers with the tool (the calls, TRL's result tokens, the computation with the values) in
the design's `call_rates[regime]` of the cases, and otherwise guesses a value for each register. Fixed seed, one CPU
thread: the same checkpoint every time (~4 min on a free core, ~9 min on a loaded one). Defaults write the committed
design (`tool_task.DESIGN`) to `benchmarks/tasks/toy/warm_start_tools/` with the tool tokenizer (`tool_tokenizer`: chat
template and response template).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WARM_START_TOOLS_DIR = Path(__file__).parent / "warm_start_tools"
TOOLS_BUILD = dict(batch_size=32, learning_rate=1e-3, warmup_steps=30, plain_fraction=0.125)


def build_tool_warm_start(
    out_dir: str | Path = WARM_START_TOOLS_DIR,
    *,
    seed: int = 0,
    steps: int | None = None,
    batch_size: int = TOOLS_BUILD["batch_size"],
    learning_rate: float = TOOLS_BUILD["learning_rate"],
    warmup_steps: int = TOOLS_BUILD["warmup_steps"],
    plain_fraction: float = TOOLS_BUILD["plain_fraction"],
    call_rates: dict[str, float] | None = None,
    design: str | None = None,
    init_dir: str | Path | None = None,
    log_every: int = 100,
) -> Path:
    """Train the warm start (AdamW, linear warm-up, cosine decay to 10%, grad clip 1.0; one CPU thread)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .task import make_problem
    from .tool_chat import sft_example, tool_tokenizer
    from .tool_task import DESIGN, DESIGNS, REGIMES, draw_tool_problem
    from .warm_start import (
        SFT_MAX_OPS,
        SFT_MIN_OPS,
        SFT_OPS_DECAY,
        WARM_START_DIR,
        pad_batch,
        sft_optimizer,
        sft_step,
        warmup_cosine_schedule,
    )

    design = design or DESIGN
    steps = steps or DESIGNS[design].build_steps
    rates = {**DESIGNS[design].call_rates, **(call_rates or {})}
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = tool_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(init_dir or WARM_START_DIR)
    model.train()
    optimizer = sft_optimizer(model, learning_rate)

    scheduler = warmup_cosine_schedule(optimizer, warmup_steps, steps)
    ops = list(range(SFT_MIN_OPS, SFT_MAX_OPS + 1))
    ops_weights = [SFT_OPS_DECAY**i for i in range(len(ops))]
    eos = tokenizer.eos_token_id
    start, running, n_calls = time.time(), None, {name: 0 for name in REGIMES}
    for step in range(steps):
        rows = []
        n_plain = round(plain_fraction * batch_size)
        for _ in range(n_plain):
            problem = make_problem(rng, rng.choices(ops, ops_weights)[0])
            from trl_mintrl.text import prompt_token_ids

            prompt = prompt_token_ids(tokenizer, problem.row()["prompt"])
            turn = tokenizer(problem.solution, add_special_tokens=False)["input_ids"] + [eos]
            rows.append((prompt + turn, [-100] * len(prompt) + turn))
        for i in range(batch_size - n_plain):
            regime = REGIMES[i % 2]
            problem = draw_tool_problem(rng, regime, design)
            read = rng.random() < rates[regime]
            n_calls[regime] += read
            rows.append(sft_example(tokenizer, problem, read, rng))
        loss = sft_step(model, optimizer, pad_batch(tokenizer, rows))
        scheduler.step()
        running = loss if running is None else 0.98 * running + 0.02 * loss
        if log_every and (step + 1) % log_every == 0:
            print(
                f"step {step + 1}/{steps}  loss {running:.4f}  calls {n_calls}  {time.time() - start:.0f}s", flush=True
            )
    model.eval()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    print(f"built in {time.time() - start:.0f}s; transcripts that read the registers: {n_calls}", flush=True)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tasks.toy.warm_start_tools_build", description=__doc__)
    parser.add_argument("out_dir", nargs="?", default=str(WARM_START_TOOLS_DIR))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="default: the design's build_steps")
    parser.add_argument("--design", default=None, help="a tool_task.DESIGNS name (default: tool_task.DESIGN)")
    parser.add_argument("--in-band-rate", type=float, default=None, help="default: the design's")
    parser.add_argument("--reachable-rate", type=float, default=None, help="default: the design's")
    args = parser.parse_args(argv)
    rates = {k: v for k, v in (("in-band", args.in_band_rate), ("reachable", args.reachable_rate)) if v is not None}
    path = build_tool_warm_start(args.out_dir, seed=args.seed, steps=args.steps, call_rates=rates, design=args.design)
    print(f"tool warm start written to {path}")


if __name__ == "__main__":
    main()
