"""SORT on CPU in a few minutes: a ~1M-parameter model learns an operator no sample of it finds, from reference
solutions weighted by what a plan makes likely.

    python examples/sort_toy.py [--steps 48] [--no-grpo]

Every problem ends with `a@b`, a rule (`a+b-7`) the warm start never saw and no prompt states: sampling cannot find
it (warm-start pass@64 4.2%), so GRPO's groups are almost all wrong and it has little to learn from. SORT defers the
prompts whose whole group failed; when 8 are buffered, a rule planner writes each one's plan from the reference
solution (`Rule: a@b = a+b-7.`), and the reference tokens are trained with weights sqrt(p_base * p_plan): high where
the plan makes a token likely that the policy alone does not predict, the `@` step. The warm start
(benchmarks/tasks/toy/warm_start_hint/) has learned to apply a rule stated in its context, which is what SORT's plan
guidance assumes. Held-out accuracy (no plan in the prompt) is measured before and after, then the same with plain
GRPO (same prompts, steps and optimiser).

The defaults are one seed of the learning benchmark's "sort-hint" arm (benchmarks/studies/learning.py: 48 steps x 8 prompts,
96 held-out problems); the demo ends with what the committed benchmark found for it over 5 seeds, read from
benchmarks/results/learning.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.tasks.toy
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.tasks.toy.demo import parse_args, run_demo  # noqa: E402

REGIME = (
    "sort-hint"  # out-of-reach problems from the hint warm start, the rule planner (benchmarks.tasks.toy.training)
)


def main(argv: list[str] | None = None) -> None:
    run_demo("sort", REGIME, parse_args(__doc__, "outputs/sort-toy", argv))


if __name__ == "__main__":
    main()
