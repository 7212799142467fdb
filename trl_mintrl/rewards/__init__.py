"""Verifiable rewards in TRL's reward-function convention, `f(completions, **columns) -> list[float | None]`.

- `math_reward(completions, solution)`: final answer checked with math-verify, time-bounded in any thread.
- `code_reward(completions, tests)`: last fenced Python block run against the row's tests in a sandbox.

`make_math_reward(...)` / `make_code_reward(...)` build configured variants (time limits, workers, binary).
"""

from ..text import last_boxed
from .code import code_reward, extract_code, make_code_reward, parse_tests
from .math import MathVerifier, completion_text, make_math_reward, math_reward
from .sandbox import Job, RunResult, Sandbox

__all__ = [
    "Job",
    "MathVerifier",
    "RunResult",
    "Sandbox",
    "code_reward",
    "completion_text",
    "extract_code",
    "last_boxed",
    "make_code_reward",
    "make_math_reward",
    "math_reward",
    "parse_tests",
]
