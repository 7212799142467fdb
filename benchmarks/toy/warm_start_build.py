"""Rebuild the committed warm-start checkpoint: `python -m benchmarks.toy.warm_start_build [OUT_DIR]`.

Defaults reproduce `benchmarks/toy/warm_start/` exactly (fixed seed, one CPU thread; ~4 min on a free core) and then
print held-out pass@1 / pass@8 by number of operations, the table docs/benchmarks.md records.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> None:
    from .evaluate import difficulty_table
    from .warm_start import WARM_START_DIR, build_warm_start

    parser = argparse.ArgumentParser(prog="python -m benchmarks.toy.warm_start_build", description=__doc__)
    parser.add_argument("out_dir", nargs="?", default=str(WARM_START_DIR))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-problems", type=int, default=200, help="held-out problems per difficulty (0: skip)")
    args = parser.parse_args(argv)
    path = build_warm_start(args.out_dir, seed=args.seed, steps=args.steps)
    print(f"warm start written to {path}")
    if args.eval_problems:
        print(difficulty_table(path, args.eval_problems))


if __name__ == "__main__":
    main()
