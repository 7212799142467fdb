"""code_reward: code extraction, every test format, passing/failing/crashing/hostile programs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest

from trl_mintrl.rewards import RunResult, Sandbox, extract_code, make_code_reward, parse_tests
from trl_mintrl.rewards import sandbox as sandbox_module
from trl_mintrl.rewards.code import stdout_matches, values_equal
from trl_mintrl.rewards.sandbox import ISOLATION_ENV, Limits, _namespace_prefix

NAMESPACES = _namespace_prefix() is not None


@pytest.fixture(scope="module")
def reward():
    return make_code_reward(timeout=2.0, max_output_mb=1)


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n"


def test_extract_code_takes_the_last_complete_python_block():
    text = "```python\nfirst()\n```\n```cpp\nint main() {}\n```\n```py\nsecond()\n```\n```python\ntruncated("
    assert extract_code(text) == "second()"
    assert extract_code("```\nunmarked()\n```") == "unmarked()"
    assert extract_code("no code at all") is None


def test_parse_tests_reads_every_format():
    taco_stdin = parse_tests({"inputs": ["1 2\n", ["3", "4"]], "outputs": ["3\n", "7"]})
    assert [(c.kind, c.input, c.expected) for c in taco_stdin] == [("stdin", "1 2\n", "3\n"), ("stdin", "3\n4", "7")]
    taco_call = parse_tests(json.dumps({"fn_name": "f", "inputs": [[1, 2], 5], "outputs": [[3], 6]}))
    assert [(c.kind, c.fn_name, c.input, c.expected) for c in taco_call] == [
        ("call", "f", [1, 2], [3]),
        ("call", "f", [5], 6),
    ]
    lcb = parse_tests(
        [{"input": "[1, 2]\n3", "output": "true", "testtype": "functional", "metadata": {"func_name": "g"}}]
    )
    assert (lcb[0].fn_name, lcb[0].input, lcb[0].expected) == ("g", [[1, 2], 3], True)
    prime = parse_tests([{"input": "x\n", "output": "y\n", "type": "stdin_stdout"}])
    assert (prime[0].kind, prime[0].input) == ("stdin", "x\n")
    assert parse_tests({"script": "assert f() == 1"})[0].kind == "script"


@pytest.mark.parametrize(
    "tests, message",
    [
        ("{not json", "not valid JSON"),
        ([{"input": "1", "output": "1", "testtype": "functional"}], "fn_name"),
        ({"inputs": [1, 2], "outputs": [1]}, "2 inputs but 1 outputs"),
        (42, "`tests` must be"),
        ([{"input": "1", "output": "1", "type": "interactive"}], "unknown test type"),
    ],
)
def test_malformed_tests_fail_clearly(tests, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(tests)


def test_output_and_value_comparisons():
    assert stdout_matches("3  \n\n", "3\n") and stdout_matches("0.3333333", "0.33333333")
    assert not stdout_matches("3 4", "3") and not stdout_matches("abc", "abd")
    assert values_equal(5, [5]) and values_equal([1, 2.0000001], (1, 2)) and values_equal({"a": [1]}, {"a": [1]})
    assert not values_equal(True, 1) and not values_equal([1, 2], [2, 1])


KILL_PARENT_THEN_ADD = """import os, signal
a, b = map(int, input().split())
try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError:
    pass
print(a + b)"""
STDIN_TESTS = json.dumps({"inputs": ["1 2\n", "10 5\n"], "outputs": ["3\n", "15\n"]})


def test_stdin_programs_passing_failing_crashing_and_hostile(reward):
    completions = [
        fenced("a, b = map(int, input().split())\nprint(a + b)"),  # passes both
        fenced("a, b = map(int, input().split())\nprint(3)"),  # passes one
        fenced("raise RuntimeError('crash')"),
        "I cannot write code.",  # no code block
        fenced("while True:\n    pass"),  # infinite loop
        fenced("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),  # fork bomb
        fenced("import sys\nwhile True:\n    sys.stdout.write('3\\n' * 10000)"),  # huge output
        fenced(KILL_PARENT_THEN_ADD),  # tries to kill its parent, then answers: graded like any program
    ]
    metrics = defaultdict(list)
    scores = reward(completions, tests=[STDIN_TESTS] * len(completions), log_metric=lambda k, v: metrics[k].append(v))
    assert scores == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    runs = 2 * 7  # two stdin cases for each completion with code
    assert metrics["code_reward/limit_file_size"] == [2 / runs]  # the huge output, cut at the cap
    assert metrics["code_reward/limit_wall_time"][0] + metrics["code_reward/limit_cpu_time"][0] >= 4 / runs  # loops
    assert metrics["code_reward/executor_errors"] == [0.0]
    assert metrics["code_reward/no_network_isolation"] == [0.0 if NAMESPACES else 1.0]
    binary = make_code_reward(binary=True, timeout=2.0)
    assert binary(completions[:2], tests=[STDIN_TESTS] * 2) == [1.0, 0.0]
    assert binary.__name__ == "code_reward"


def test_function_call_formats(reward):
    taco = json.dumps({"fn_name": "add", "inputs": [[1, 2], [2, 2]], "outputs": [[3], [4]]})
    lcb = [
        {"input": "[3, 1, 2]", "output": "3", "testtype": "functional", "metadata": {"func_name": "maxValue"}},
        {"input": "[-1]", "output": "-1", "testtype": "functional", "metadata": {"func_name": "maxValue"}},
    ]
    completions = [
        fenced("def add(a, b):\n    return a + b"),
        fenced("def add(a, b):\n    return a * b"),  # 2*2 == 2+2: one of two
        fenced("class Solution:\n    def maxValue(self, nums):\n        return max(nums)"),
        fenced("class Solution:\n    def maxValue(self, nums):\n        return nums[10]"),  # raises on every call
    ]
    assert reward(completions, tests=[taco, taco, lcb, lcb]) == [1.0, 0.5, 1.0, 0.0]


def test_script_tests_and_rows_without_tests(reward):
    script = json.dumps({"script": "assert double(2) == 4\nassert double(-1) == -2"})
    completions = [fenced("def double(x):\n    return 2 * x"), fenced("def double(x):\n    return x + 2"), "x"]
    assert reward(completions, tests=[script, script, None]) == [1.0, 0.0, None]


def test_conversational_completions(reward):
    chat = [[{"role": "assistant", "content": fenced("print(int(input()) * 2)")}]]
    assert reward(chat, tests=[{"inputs": ["21\n"], "outputs": ["42\n"]}]) == [1.0]


def test_length_mismatch_is_an_error(reward):
    with pytest.raises(ValueError, match="2 completions but 1 `tests` rows"):
        reward(["a", "b"], tests=[STDIN_TESTS])


def test_a_remote_executor_runs_every_program(monkeypatch):
    """A user's sandbox service plugs in as `executor`: it gets every job with the configured limits, nothing runs
    locally, and rows whose runs the service lost get None (no signal) and count in a metric."""
    monkeypatch.setattr(Sandbox, "_run_locally", lambda self, job: pytest.fail("ran locally"))
    seen = []

    def service(job, limits):  # stands in for an HTTP call to a sandbox service
        seen.append(limits)
        if "service cannot run this" in job.code:
            raise ConnectionError("503 from the sandbox service")
        done = subprocess.run([sys.executable, "-c", job.code], input=job.stdin, capture_output=True, text=True)
        return RunResult("ok" if done.returncode == 0 else "error", done.returncode, None, done.stdout, "", None, 0.1)

    remote_reward = make_code_reward(executor=service, timeout=3.0, memory_mb=256)
    completions = [
        fenced("a, b = map(int, input().split())\nprint(a + b)"),
        fenced("a, b = map(int, input().split())\nprint(3)"),
        fenced("# service cannot run this\nprint(0)"),
    ]
    metrics = {}
    scores = remote_reward(completions, tests=[STDIN_TESTS] * 3, log_metric=metrics.__setitem__)
    assert scores == [1.0, 0.5, None]
    assert metrics["code_reward/executor_errors"] == 2 / 6
    assert set(seen) == {Limits(3.0, None, 256, 32, 64, 16)}


def test_falling_back_without_network_isolation_is_a_metric(monkeypatch):
    monkeypatch.setattr(sandbox_module, "_namespace_prefix", lambda: None)
    monkeypatch.setattr(sandbox_module, "interpreter_hidden_paths", lambda: [])  # as root, nobody must read Python
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    metrics = {}
    scores = make_code_reward(timeout=2.0)(
        [fenced("print(int(input()) * 2)")],
        tests=[{"inputs": ["21\n"], "outputs": ["42\n"]}],
        log_metric=metrics.__setitem__,
    )
    assert scores == [1.0] and metrics["code_reward/no_network_isolation"] == 1.0
