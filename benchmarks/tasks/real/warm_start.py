"""The format warm-up every arm of the real-model comparison starts from, and the regimes' splits it stays clear of.

SmolLM2-135M-Instruct rarely writes the task's `#### N` answer line (about 9% of samples: real_calibration.md), so a
method that only taught the answer format would win for the wrong reason. Every arm therefore starts from one short
SFT epoch (`WARMUP`: 256 ONE-step problems, their reference solutions written the model's way, one step per line then
`#### N`, batches of 8, AdamW at a constant rate, grad norm clipped at 1) on problems of none of the regimes' splits:

    python -m benchmarks.tasks.real.warm_start [--model DIR]   # builds it (once) and prints its folder
    python -m benchmarks.tasks.real.warm_start --family chain-easy [--decisive_share 0.03]   # the chain family's
    python -m benchmarks.tasks.real.warm_start --family chain-long   # a second epoch on longer chains after it

The checkpoint (538 MB, not committed) is cached beside the prepared model, in `smollm2-warm-<hash>` where the hash
covers the settings and the base model's GGUF SHA-256, and rebuilt the same way when missing (one CPU thread, no
randomness: the same problems in the same order). Its marker file (`warm_start.json`, written last) records the
settings, the loss of each step, the seconds it took and the machine's load.

Regimes (`REGIMES`): `in-band` trains on 2-step problems (held-out at 2, held-out-longer at 3 steps); `reachable`, the
control, on 1-step problems (longer: 2); `chain` (`CHAIN_REGIMES`, from `WARMUP_CHAIN_LONG`'s warm start) on 12-step
chains (longer: 14). Splits are drawn once per regime (`regime_splits`: `task.make_splits` at
`SPLIT_SEED`, the default sizes), so held-out sets are the same for every seed and mode; a run takes its training
prompts from the `train` split by its seed (`train_problems`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import time
from functools import cache
from pathlib import Path

from benchmarks.lib.provenance import MachineWatch

from .task import make_problems, make_splits

SPLIT_SEED = 0
# regime -> (train and held-out steps, held-out-longer steps)
REGIMES = {"in-band": ((2,), (3,)), "reachable": ((1,), (2,))}
# the chain family's regimes (MInTRL's own: `task.make_chain_problem`), from `WARMUP_CHAIN_LONG`'s warm start: 12 steps
# met every criterion of the fourth chain calibration (real_calibration_chain4.md). Kept out of `REGIMES`, whose
# splits every warm start's hash covers (the cached warm starts keep their names); a chain warm-up's easy chains
# cannot be a split's (every split chain has the decisive step), and its few decisive ones are drawn from a stream of
# their own (a test checks that none is a split's)
CHAIN_REGIMES = {"chain": ((12,), (14,))}
WARMUP = dict(problems=256, num_steps=1, seed="warmup/0", batch_size=8, learning_rate=3e-5)
# the warm-up for the `chain` family (MInTRL's own regime, `task.make_chain_problem`): long chains of the easy steps,
# the decisive step in a small share of them. The second calibration's warm-up (real_calibration_chain2.md) was
# this on easy chains alone starting at 20-60 (no `start_high`, no `decisive_share`: their defaults): it learned the
# easy steps (1024 problems; on 256 it read one easy sentence in five the wrong way round), but the decisive correction
# cost it 17-21 nats, and past 100 (where the decisive step leads) it slipped on the easy steps too. Hence chains
# starting up to 180 and the decisive operation in `decisive_share` of them (`--decisive_share` builds another share)
WARMUP_CHAIN = dict(problems=1024, num_steps=[7, 8, 9], seed="warmup-chain/0", batch_size=8, learning_rate=3e-5,
                    family="chain-easy", start_high=180, decisive_share=1 / 32)  # fmt: skip
# after it (`after`: a second SFT epoch that starts from that warm start), 1024 fresh chains of 10-12 steps: on
# WARMUP_CHAIN alone the easy steps were 86% right on the wider values (real_calibration_chain3.md), so a rollout
# needed about four corrections; and one correction (a sentence) is 12-13% of a 7-9-step rollout but about 8% of a
# 12-step one, the paper's local share
WARMUP_CHAIN_LONG = dict(after=WARMUP_CHAIN, problems=1024, num_steps=[10, 11, 12], seed="warmup-chain/1",
                         batch_size=8, learning_rate=3e-5, family="chain-easy", start_high=180,
                         decisive_share=1 / 32)  # fmt: skip
WARMUPS = {"mixed": WARMUP, "chain-easy": WARMUP_CHAIN, "chain-long": WARMUP_CHAIN_LONG}
MARKER = "warm_start.json"
DEFAULT_MODEL = Path(os.environ.get("TRL_MINTRL_SMOLLM2_DIR", Path.home() / ".cache" / "trl-mintrl" / "smollm2"))


@cache
def regime_splits(regime: str) -> dict:
    """`make_splits` of `regime` (`REGIMES`, or `CHAIN_REGIMES` of the chain family) at `SPLIT_SEED`: `heldout`,
    `heldout_longer`, `train`."""
    family = "chain" if regime in CHAIN_REGIMES else "mixed"
    train_steps, longer_steps = {**REGIMES, **CHAIN_REGIMES}[regime]
    return make_splits(train_steps=train_steps, longer_steps=longer_steps, seed=SPLIT_SEED, family=family)


def train_problems(regime: str, n: int, seed: int) -> list:
    """The `n` training problems of a run's seed: a seeded draw from the regime's `train` split (every arm of a seed
    gets the same ones, in the same order)."""
    train = regime_splits(regime)["train"]
    if n > len(train):
        raise ValueError(f"{n} training problems asked, the {regime} train split has {len(train)}")
    return random.Random(f"learning_real/train/{seed}").sample(train, n)


def warmup_problems(settings: dict) -> list:
    """The warm-up's problems: `settings["problems"]` problems of `num_steps` steps (of `settings["family"]`, by
    default the mixed one), none in any regime's split nor in the warm-up it continues (`after`)."""
    used = {p.key for regime in REGIMES for split in regime_splits(regime).values() for p in split}
    if "after" in settings:
        used |= {p.key for p in warmup_problems(settings["after"])}
    steps = settings["num_steps"]
    steps = tuple(steps) if isinstance(steps, list) else steps
    family = settings.get("family", "mixed")
    chain = {k: settings[k] for k in ("start_high", "decisive_share") if k in settings}
    return make_problems(settings["problems"], steps, seed=settings["seed"], exclude=used, family=family, **chain)


def settings_hash(settings: dict, base: Path) -> str:
    """12 hex digits over the settings and the base model's source (its GGUF's SHA-256, else its folder name)."""
    marker = base / "trl_mintrl_source.json"
    source = json.loads(marker.read_text()).get("sha256") if marker.is_file() else base.name
    canonical = json.dumps({"settings": settings, "base": source, "splits": REGIMES, "split_seed": SPLIT_SEED},
                           sort_keys=True)  # fmt: skip
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def warm_start_dir(base: str | Path, settings: dict | None = None) -> Path:
    """Where the warm start of `settings` (default `WARMUP`) from the model at `base` lives (built or not)."""
    settings = WARMUP if settings is None else settings
    base = Path(base)
    return base.parent / f"{base.name}-warm-{settings_hash(settings, base)}"


def sft_rows(tokenizer, problems) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per problem: its prompt through the chat template (no loss), then its reference solution
    and the end-of-turn token (the loss)."""
    from trl_mintrl.text import prompt_token_ids

    rows = []
    for problem in problems:
        prompt = prompt_token_ids(tokenizer, problem.prompt)
        answer = tokenizer(problem.solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    return rows


def pad(tokenizer, rows: list[tuple[list[int], list[int]]]) -> dict:
    """Right-padded `input_ids`, `attention_mask` and `labels` (-100: no loss) of `(ids, labels)` rows."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    batch = {
        "input_ids": torch.full((len(rows), width), tokenizer.pad_token_id),
        "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
        "labels": torch.full((len(rows), width), -100),
    }
    for i, (ids, labels) in enumerate(rows):
        batch["input_ids"][i, : len(ids)] = torch.tensor(ids)
        batch["attention_mask"][i, : len(ids)] = 1
        batch["labels"][i, : len(labels)] = torch.tensor(labels)
    return batch


def sft_epoch(model, tokenizer, problems, *, batch_size: int, learning_rate: float) -> list[float]:
    """One epoch of next-token loss on `problems`' reference solutions, in order, `batch_size` a step: AdamW at a
    constant `learning_rate` (weight decay 0, betas 0.9 / 0.999), grad norm clipped at 1.0. Trains `model` in place,
    leaves it in eval mode; returns each step's loss."""
    import torch

    rows = sft_rows(tokenizer, problems)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    losses = []
    for start in range(0, len(rows), batch_size):
        loss = model(**pad(tokenizer, rows[start : start + batch_size])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def build_warm_start(base: str | Path, settings: dict | None = None, threads: int = 1) -> Path:
    """The warm start's folder (`warm_start_dir`), built first when missing: load the model at `base` (or, when
    `settings` has `after`, that warm start of it, built first when missing), `sft_epoch` on `warmup_problems`, save
    it with its tokenizer, then the marker. Safe to call from several processes at once (a file lock: one builds,
    the others wait and read it)."""
    settings = WARMUP if settings is None else settings
    out = warm_start_dir(base, settings)
    if (out / MARKER).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / MARKER).is_file():
            _build(Path(base), settings, out, threads)
    return out


def _build(base: Path, settings: dict, out: Path, threads: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = build_warm_start(base, settings["after"], threads) if "after" in settings else base
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(start)
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    problems = warmup_problems(settings)
    print(f"warm start: one SFT epoch on {len(problems)} problems from {start} -> {out}", flush=True)
    watch, began = MachineWatch(), time.perf_counter()
    losses = sft_epoch(model, tokenizer, problems, batch_size=settings["batch_size"],
                       learning_rate=settings["learning_rate"])  # fmt: skip
    seconds = time.perf_counter() - began
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    marker = {"settings": settings, "hash": settings_hash(settings, base), "base": str(base), "start": str(start),
              "sft_seconds": seconds, "steps": len(losses), "losses": losses, "threads": threads,
              "machine": watch.stop()}  # fmt: skip
    (partial / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    print(f"warm start built in {seconds:.0f} s (loss {losses[0]:.3f} -> {losses[-1]:.3f})", flush=True)


def format_warm_start(model_dir: str | Path) -> Path:
    """`WARMUP`'s warm start of the model at `model_dir`, built beside it when missing: a recipe's
    `warm_start_function` (recipes/cpu/smollm2-*.yaml), so that a recipe trains from the answer format every arm of
    the real-model comparison starts from."""
    return build_warm_start(model_dir, WARMUP)


def warm_start_record(folder: str | Path) -> dict:
    """The warm start's marker: settings, losses, SFT seconds, the machine's load."""
    return json.loads((Path(folder) / MARKER).read_text())


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the prepared SmolLM2 folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--family", choices=list(WARMUPS), default="mixed",
                        help="whose warm-up: the mixed problems' (`WARMUP`), the chain family's (`WARMUP_CHAIN`) "
                        "or its second epoch on longer chains (`WARMUP_CHAIN_LONG`)")  # fmt: skip
    parser.add_argument("--decisive_share", type=float, default=None,
                        help="the chain warm-up with the decisive step in this share of its chains instead")  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    settings = WARMUPS[args.family]
    if args.decisive_share is not None:
        if "decisive_share" not in settings:
            parser.error(f"--decisive_share: the {args.family} warm-up has no decisive step; use --family chain-easy")
        settings = {**settings, "decisive_share": args.decisive_share}
    from trl_mintrl.smollm2 import prepare_smollm2

    print(build_warm_start(prepare_smollm2(args.model), settings, threads=args.threads))


if __name__ == "__main__":
    main()
