"""Rebuild the committed warm-start checkpoint: `python -m benchmarks.tasks.toy.warm_start_build [OUT_DIR]`.

Defaults reproduce `benchmarks/tasks/toy/warm_start/` exactly (fixed seed, one CPU thread; ~4 min on a free core) and then
print held-out pass@1 / pass@8 by number of operations, the table docs/benchmarks.md records.

`--hint` rebuilds `benchmarks/tasks/toy/warm_start_hint/` (SORT's regime, `benchmarks.tasks.toy.hint`): the committed warm start
trained `HINT_BUILD["steps"]` more steps on batches 3/4 hinted examples (fixed seed, one CPU thread; ~5 min).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _hint_build() -> dict:
    from .warm_start import WARM_START_DIR

    # the hint warm start: the committed one, trained further on batches 3/4 hinted
    return dict(init_dir=WARM_START_DIR, steps=600, hint_fraction=0.75, learning_rate=1e-3, warmup_steps=30)


HINT_BUILD = _hint_build()


def main(argv: list[str] | None = None) -> None:
    from .evaluate import difficulty_table
    from .warm_start import WARM_START_DIR, build_warm_start

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tasks.toy.warm_start_build", description=__doc__)
    parser.add_argument("out_dir", nargs="?", default=None, help="default: the committed checkpoint's folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="default: 500 (--hint: HINT_BUILD's)")
    parser.add_argument("--hint", action="store_true", help="build the hint warm start from the committed one")
    parser.add_argument("--eval-problems", type=int, default=200, help="held-out problems per difficulty (0: skip)")
    args = parser.parse_args(argv)
    if args.hint:
        from .hint import WARM_START_HINT_DIR

        settings = {**HINT_BUILD, **({"steps": args.steps} if args.steps else {})}
        path = build_warm_start(args.out_dir or WARM_START_HINT_DIR, seed=args.seed, **settings)
    else:
        path = build_warm_start(args.out_dir or WARM_START_DIR, seed=args.seed, steps=args.steps or 500)
    print(f"warm start written to {path}")
    if args.eval_problems:
        print(difficulty_table(path, args.eval_problems))


if __name__ == "__main__":
    main()
