"""Code reward: the last fenced Python block of a completion, run against the row's tests in the sandbox.

Test formats (the `tests` column: a dict or list, or a string holding one as JSON):
- APPS/TACO (DeepCoder's taco subset): `{"inputs": [...], "outputs": [...]}` are stdin/stdout cases; with
  `"fn_name"` they are function calls (`inputs[i]` the argument list, `outputs[i]` the value, possibly wrapped
  in a one-element list as APPS does).
- LiveCodeBench / DeepCoder lists: `[{"input", "output", "testtype": "stdin" | "functional"}, ...]` (functional
  inputs are one JSON value per line, the name comes from `fn_name` or `metadata.func_name`) and
  `[{"input", "output", "type": "stdin_stdout" | "function_call", "fn_name"}, ...]` (primeintellect).
- `{"script": CODE}`: test code appended to the program that must exit cleanly (HumanEval+, MBPP+ checkers).

Function calls go to `Solution().name` when the program defines LeetCode-style `class Solution`, else `name`.

Under a trainer the reward logs `code_reward/...` metrics: runs without network isolation, runs ended or cut by a
limit, and runs an executor failed (their rows get None: nothing is known about the program).
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .math import completion_text
from .sandbox import Executor, Job, RunResult, Sandbox

_PYTHON_FENCES = ("", "python", "py", "python3")


@dataclass
class TestCase:
    """One test: `kind` "stdin" (input text -> expected stdout), "call" (argument list -> expected value) or
    "script" (test code; passes when the program plus it exits with status 0)."""

    kind: str
    input: object
    expected: object = None
    fn_name: str | None = None


def extract_code(text: str) -> str | None:
    """The last complete fenced code block marked python/py/python3 (or unmarked); None if there is none (an
    unclosed block, e.g. a truncated completion, does not count)."""
    blocks, current, language = [], None, ""
    for line in text.splitlines():
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            current, language = [], stripped[3:].strip().lower()
        elif current is not None and stripped == "```":
            if language in _PYTHON_FENCES:
                blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks[-1] if blocks else None


def parse_tests(tests) -> list[TestCase]:
    """Normalise one row's `tests` (any supported format, see the module docstring) to test cases."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as err:
            raise ValueError(f"`tests` is a string but not valid JSON ({err}): {tests[:80]!r}") from None
    if isinstance(tests, dict) and "script" in tests:
        return [TestCase("script", tests["script"])]
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        return _apps_cases(tests)
    if isinstance(tests, list) and all(isinstance(case, dict) for case in tests):
        return [_list_case(case) for case in tests]
    raise ValueError(
        "`tests` must be {'inputs': [...], 'outputs': [...], 'fn_name'?: ...}, {'script': CODE} or a list of "
        f"{{'input', 'output', 'testtype'|'type'}} dicts; got {type(tests).__name__}: {str(tests)[:80]!r}"
    )


def _apps_cases(tests: dict) -> list[TestCase]:
    inputs, outputs, fn_name = tests["inputs"], tests["outputs"], tests.get("fn_name")
    if len(inputs) != len(outputs):
        raise ValueError(f"`tests` has {len(inputs)} inputs but {len(outputs)} outputs")
    if fn_name:
        return [
            TestCase("call", list(args) if isinstance(args, list) else [args], out, fn_name)
            for args, out in zip(inputs, outputs)
        ]
    return [TestCase("stdin", _text(inp), _text(out)) for inp, out in zip(inputs, outputs)]


def _list_case(case: dict) -> TestCase:
    kind = case.get("testtype") or case.get("type") or "stdin"
    if kind in ("stdin", "stdin_stdout"):
        return TestCase("stdin", _text(case["input"]), _text(case["output"]))
    if kind not in ("functional", "function_call"):
        raise ValueError(f"`tests`: unknown test type {kind!r} (expected stdin/stdin_stdout/functional/function_call)")
    fn_name = case.get("fn_name") or (case.get("metadata") or {}).get("func_name")
    if not fn_name:
        raise ValueError("`tests`: a function-call case needs `fn_name` (or `metadata.func_name`)")
    args, expected = case["input"], case["output"]
    if isinstance(args, str):  # LiveCodeBench: one JSON value per line
        args = [json.loads(line) for line in args.split("\n") if line.strip()]
        expected = json.loads(expected) if isinstance(expected, str) else expected
    return TestCase("call", list(args), expected, fn_name)


def _text(value) -> str:
    """Stdin/stdout may be stored as a list of lines."""
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def stdout_matches(got: str, expected: str) -> bool:
    """Output equality as judges use it: trailing whitespace ignored per line and at the end; failing that, the
    same whitespace-separated tokens with numbers equal to 1e-6 (relative or absolute)."""
    if _lines(got) == _lines(expected):
        return True
    got_tokens, expected_tokens = got.split(), expected.split()
    return len(got_tokens) == len(expected_tokens) and all(map(_token_equal, got_tokens, expected_tokens))


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def _token_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)
    except ValueError:
        return False


def values_equal(got, expected) -> bool:
    """A returned value against the expected one: tuples as lists (JSON), floats to 1e-6, and APPS's habit of
    wrapping the expected value in a one-element list accepted."""
    if _same(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _same(got, expected[0])


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def score_programs(
    programs: list[str | None], suites: list[list[TestCase]], sandbox: Sandbox, log_metric: Callable | None = None
) -> list[float | None]:
    """Fraction of each program's tests passed; None when the executor failed on one of its runs. All runs of all
    programs go to the sandbox at once (in parallel): one run per stdin or script case, one run per program for all
    its function calls. `log_metric(name, value)` (TRL's reward kwarg) gets the run statistics."""
    jobs, plan = [], []  # plan: (row, cases, job index) per job
    for row, (program, cases) in enumerate(zip(programs, suites, strict=True)):
        if program is None:
            continue
        calls = [case for case in cases if case.kind == "call"]
        if calls:
            plan.append((row, calls, len(jobs)))
            jobs.append(Job(program, calls=[(case.fn_name, case.input) for case in calls]))
        for case in cases:
            if case.kind == "stdin":
                plan.append((row, [case], len(jobs)))
                jobs.append(Job(program, stdin=case.input))
            elif case.kind == "script":
                plan.append((row, [case], len(jobs)))
                jobs.append(Job(f"{program}\n\n{case.input}"))
    results = sandbox.run_many(jobs)
    if log_metric is not None and results:
        _log_run_metrics(results, log_metric)
    passed, unknown = [0] * len(programs), set()
    for row, cases, index in plan:
        if results[index].status == "executor_error":
            unknown.add(row)
        passed[row] += _passed(cases, results[index])
    return [None if row in unknown else passed[row] / len(cases) if cases else 0.0 for row, cases in enumerate(suites)]


def _log_run_metrics(results: list[RunResult], log_metric: Callable) -> None:
    """Fractions of this batch's runs: without network isolation, stopped by each limit, lost to the executor."""
    log_metric("code_reward/no_network_isolation", sum(r.isolation == "process" for r in results) / len(results))
    log_metric("code_reward/executor_errors", sum(r.status == "executor_error" for r in results) / len(results))
    limits = Counter(r.limit for r in results)
    for limit in ("wall_time", "cpu_time", "file_size"):
        log_metric(f"code_reward/limit_{limit}", limits[limit] / len(results))


def _passed(cases: list[TestCase], result: RunResult) -> int:
    kind = cases[0].kind
    if kind == "script":
        return int(result.status == "ok")
    if kind == "stdin":
        return int(result.status == "ok" and stdout_matches(result.stdout, cases[0].expected))
    values = result.values or []
    return sum(
        "value" in value and values_equal(value["value"], case.expected)
        for case, value in zip(cases, values)  # calls after a crash or timeout have no value: failed
    )


_default_sandbox: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The sandbox of `code_reward`, built at the first call (settings from the environment, e.g.
    `TRL_MINTRL_SANDBOX_ISOLATION`); `trl-mintrl train` builds it before loading the model to fail early."""
    global _default_sandbox
    with _default_lock:
        if _default_sandbox is None:
            _default_sandbox = Sandbox()
        return _default_sandbox


def _reward(
    completions: list, tests: list, binary: bool, sandbox: Sandbox, log_metric: Callable | None
) -> list[float | None]:
    suites = [None if row is None or row == "" else parse_tests(row) for row in tests]
    programs = [extract_code(completion_text(c)) for c in completions]
    if len(suites) != len(programs):
        raise ValueError(f"got {len(programs)} completions but {len(suites)} `tests` rows")
    scored = [i for i, cases in enumerate(suites) if cases]
    scores = score_programs([programs[i] for i in scored], [suites[i] for i in scored], sandbox, log_metric)
    rewards: list[float | None] = [None] * len(programs)  # rows without tests carry no signal
    for i, score in zip(scored, scores):
        rewards[i] = score if score is None or not binary else float(score == 1.0)
    return rewards


def code_reward(completions: list, tests: list, binary: bool = False, **kwargs) -> list[float | None]:
    """Fraction of the row's tests that the completion's last fenced Python block passes (1/0 with
    `binary=True`); 0 without a code block, None for a row without tests. TRL reward-function convention."""
    return _reward(completions, tests, binary, default_sandbox(), kwargs.get("log_metric"))


def make_code_reward(binary: bool = False, executor: Executor | None = None, **sandbox_kwargs):
    """`code_reward` with its own `Sandbox(executor=executor, **sandbox_kwargs)` (timeout, cpu_seconds, memory_mb,
    num_workers, isolation, ...), as a named function for TRL. `executor(job, limits) -> RunResult` runs the
    programs elsewhere, e.g. on a remote sandbox service; the default is the local sandbox."""
    sandbox = Sandbox(executor=executor, **sandbox_kwargs)

    def code_reward(completions: list, tests: list, **kwargs) -> list[float | None]:
        return _reward(completions, tests, binary, sandbox, kwargs.get("log_metric"))

    code_reward.sandbox = sandbox
    return code_reward
