"""A toy task for CPU demos and benchmarks: multi-step arithmetic, a rule judge, a ~1M-parameter warm start.

    from benchmarks.tasks.toy import WARM_START_DIR, make_dataset, make_problems, toy_reward, rule_judge, evaluate

`WARM_START_DIR` holds the committed warm-start checkpoint (rebuild: `python -m benchmarks.tasks.toy.warm_start_build`).
"""

from .evaluate import evaluate, sample_completions
from .model import build_char_tokenizer, build_toy_model
from .task import (
    Problem,
    correct_step,
    make_dataset,
    make_problem,
    make_problems,
    parse_question,
    review_steps,
    rule_judge,
    step_reward,
    toy_reward,
)
from .warm_start import WARM_START_DIR, build_warm_start

__all__ = [
    "WARM_START_DIR",
    "Problem",
    "build_char_tokenizer",
    "build_toy_model",
    "build_warm_start",
    "correct_step",
    "evaluate",
    "make_dataset",
    "make_problem",
    "make_problems",
    "parse_question",
    "review_steps",
    "rule_judge",
    "sample_completions",
    "step_reward",
    "toy_reward",
]
