"""MInTRL on CPU in a few minutes: a ~1M-parameter model learns longer arithmetic chains with a rule judge.

    python examples/mintrl_toy.py [--steps 48] [--no-grpo]

The warm start (committed in benchmarks/toy/) solves short problems but fails most 8-11 step ones. MInTRL samples 4
on-policy control rollouts and 4 intervened rollouts per prompt; on the intervened ones a rule judge reviews each
16-token chunk, cuts at the first wrong step and writes the correct step, and the policy continues. Training is
MInTRL's advantage regression (baseline: mean reward of the controls). Held-out accuracy is measured before and
after; the same demo then runs with plain GRPO (same prompts, steps and optimiser) for comparison.

The defaults are one seed of the learning benchmark's "reachable" arm (benchmarks/learning.py: 48 steps x 8 prompts,
96 held-out problems). One seed cannot resolve a difference between the two methods, so the demo ends with what the
committed benchmark (benchmarks/results/learning.json, several seeds) found for this arm, read from the JSON. On this
arm MInTRL is not shown to beat GRPO; `examples/sort_toy.py` shows SORT on the regime where its gain is resolved.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.toy
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.toy.demo import parse_args, run_demo  # noqa: E402

REGIME = "reachable"  # long chains of familiar operations (benchmarks.toy.training.REGIMES)


def main(argv: list[str] | None = None) -> None:
    run_demo("mintrl-const", REGIME, parse_args(__doc__, "outputs/mintrl-toy", argv))


if __name__ == "__main__":
    main()
