"""Verifiable rewards in TRL's reward-function convention, `f(completions, **columns) -> list[float | None]`.

- `math_reward(completions, solution)`: final answer checked with math-verify, time-bounded in any thread.
- `code_reward(completions, tests)`: last fenced Python block run against the row's tests in a sandbox.

`make_math_reward(...)` / `make_code_reward(...)` build configured variants (time limits, workers, binary).

`REWARDS` is the one table of these built-in rewards by task: the short names recipes use in `reward_funcs`, the
dataset column each reads, the variant evaluation scores with, and what must be built before training starts.
"""

from collections.abc import Callable
from dataclasses import dataclass

from ..text import last_boxed
from .code import code_reward, default_sandbox, extract_code, make_code_reward, parse_tests
from .math import MathVerifier, completion_text, make_math_reward, math_reward
from .sandbox import Job, RunResult, Sandbox


@dataclass(frozen=True)
class TaskReward:
    """A task's built-in reward (a row of `REWARDS`)."""

    reward: Callable  # what `reward_funcs: [<task>]` trains with
    column: str  # the dataset column it checks against
    scorer: Callable[[float], Callable]  # timeout -> the reward `trl-mintrl eval` scores with (1.0 = correct)
    prepare: Callable[[], object] | None = None  # builds what the reward needs up front, so a machine lacking it
    # fails before the model loads (code: its sandbox)


REWARDS: dict[str, TaskReward] = {
    "math": TaskReward(math_reward, "solution", lambda timeout: make_math_reward(timeout=timeout)),
    "code": TaskReward(
        code_reward, "tests", lambda timeout: make_code_reward(binary=False, timeout=timeout), default_sandbox
    ),
}

__all__ = [
    "REWARDS",
    "Job",
    "MathVerifier",
    "RunResult",
    "Sandbox",
    "TaskReward",
    "code_reward",
    "completion_text",
    "extract_code",
    "last_boxed",
    "make_code_reward",
    "make_math_reward",
    "math_reward",
    "parse_tests",
]
