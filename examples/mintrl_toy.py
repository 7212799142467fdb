"""MInTRL on CPU in a few minutes: a ~1M-parameter model learns a rule it finds unlikely from a rule judge.

    python examples/mintrl_toy.py [--steps 48] [--no-grpo]

The regime is chosen by MInTRL's two preconditions, not by its result: every problem applies an operator
no prompt explains, `a~b = a+b-1`, twice (`Compute 1+4+7~7~1 =`), and the reward checks both applications. The warm
start (committed in benchmarks/tasks/toy/) almost never samples both right (held-out pass@8 0.5%, pass@64 3%: outside what
sampling finds), yet each correct step is unlikely but not impossible for it (a correction costs ~7 nats: inside
what training can absorb). MInTRL samples 4 on-policy control rollouts and 4 intervened rollouts per prompt; on the
intervened ones a rule judge reviews every 16-token chunk, cuts at the first wrong step and writes the right one in
the policy's own notation (`5+7=11`), and the policy continues. Training is MInTRL's advantage regression (baseline:
mean reward of the controls); interventions stop after 40% of the steps. The same demo then runs plain GRPO (same
prompts, steps and optimiser).

The defaults are one seed of the learning benchmark's in-band arm (benchmarks/studies/learning.py: 48 steps x 8 prompts, 96
held-out problems). One seed cannot resolve a difference between the two methods, so the demo ends with what the
committed benchmark (benchmarks/results/learning.json, several seeds) found for this arm, read from the JSON.
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

REGIME = "in-band"  # a rule applied twice, out of sampling's reach, corrections within reach (toy.training.REGIMES)


def main(argv: list[str] | None = None) -> None:
    run_demo("mintrl-const", REGIME, parse_args(__doc__, "outputs/mintrl-toy", argv))


if __name__ == "__main__":
    main()
