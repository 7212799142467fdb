"""Calibration: each regime is defined by a measured precondition of the warm start, reported next to its results.

    python -m benchmarks.toy.calibration [--problems 96] [--samples 64] [REGIME ...]

prints, per regime, the warm start's held-out pass@1 / pass@8 / pass@64 (from `--samples` samples at temperature 1,
unbiased estimator) and, for regimes with a new operator, pass@1 / pass@8 on the same problems written in familiar
notation (`Problem.familiar()`): the rest of each problem is within the warm start's ability, only the rule is
missing. "out-of-reach" asks for pass@64 below 1% (sampling cannot find the rule); `learning.py` computes the same
numbers on its held-out set in every run.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HELDOUT_SEED = 999  # the learning benchmark's held-out problems


def calibrate(model, tokenizer, problems, n_samples: int = 64) -> dict[str, dict[str, float]]:
    """`{"sampled": pass@1/8/64 (those <= n_samples), "familiar": pass@1/8}`; "familiar" only when the problems have
    a new operator."""
    from .evaluate import evaluate

    ks = tuple(k for k in (1, 8, 64) if k <= n_samples)
    result = {"sampled": evaluate(model, tokenizer, problems, n_samples, ks=ks)}
    familiar = [p.familiar() for p in problems]
    if familiar != list(problems):
        result["familiar"] = evaluate(model, tokenizer, familiar, 8, ks=(1, 8))
    return result


def calibration_table(rows: dict[str, dict]) -> str:
    """Markdown table of `{regime: calibrate(...)}` in %; a missing k or familiar form is `-`."""
    lines = [
        "| regime | pass@1 | pass@8 | pass@64 | familiar notation: pass@1 | pass@8 |",
        "|---|---|---|---|---|---|",
    ]
    for regime, result in rows.items():
        cells = [result["sampled"].get(f"pass@{k}") for k in (1, 8, 64)]
        cells += [result.get("familiar", {}).get(f"pass@{k}") for k in (1, 8)]
        lines.append(f"| {regime} | " + " | ".join("-" if c is None else f"{100 * c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .training import REGIMES
    from .warm_start import WARM_START_DIR

    parser = argparse.ArgumentParser(prog="python -m benchmarks.toy.calibration", description=__doc__)
    parser.add_argument("regimes", nargs="*", default=list(REGIMES))
    parser.add_argument("--problems", type=int, default=96)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--model", default=str(WARM_START_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = {
        name: calibrate(model, tokenizer, REGIMES[name].problems(args.problems, seed=HELDOUT_SEED), args.samples)
        for name in args.regimes
    }
    print(f"{args.problems} held-out problems x {args.samples} samples at temperature 1 (%), model {args.model}")
    print(calibration_table(rows))


if __name__ == "__main__":
    main()
