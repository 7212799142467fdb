"""The toy arithmetic task: generation, reward, rule judge, warm-start checkpoint."""

import random

import pytest

from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest
from trl_mintrl.mintrl.steps import split_steps
from trl_mintrl.toy.task import (
    Problem,
    final_answer,
    make_dataset,
    make_problem,
    make_problems,
    parse_question,
    review_steps,
    rule_judge,
    toy_reward,
)

EXAMPLE = Problem(7, (("-", 7), ("+", 9), ("-", 8)))


def test_problem_solution_format():
    assert EXAMPLE.question == "Compute 7-7+9-8 ="
    assert EXAMPLE.solution == "7-7=0\n\n0+9=9\n\n9-8=1\n\nAnswer: 1"
    assert EXAMPLE.answer == 1
    assert parse_question("Please solve. " + EXAMPLE.question) == EXAMPLE


def test_generation_is_deterministic_and_respects_difficulty():
    a = make_problems(50, 3, 7, seed=5)
    assert a == make_problems(50, 3, 7, seed=5)
    assert a != make_problems(50, 3, 7, seed=6)
    assert {p.num_ops for p in a} == set(range(3, 8))
    for p in make_problems(200, 10, 10, seed=1, max_value=15):
        assert p.num_ops == 10
        values = [int(step.split("=")[1]) for step in p.steps[:-1]]
        assert all(0 <= v <= 15 for v in values)
        assert values[-1] == p.answer
        assert eval(p.question.removeprefix("Compute ").removesuffix(" =")) == p.answer


def test_dataset_columns():
    ds = make_dataset(4, 2, 2, seed=0)
    assert set(ds.column_names) == {"prompt", "solution", "answer", "num_ops"}
    row = ds[0]
    problem = parse_question(row["prompt"][0]["content"])
    assert row["solution"] == problem.solution and row["answer"] == problem.answer and row["num_ops"] == 2


def test_reward_checks_first_answer_only():
    completions = [
        EXAMPLE.solution,
        [{"role": "assistant", "content": EXAMPLE.solution}],
        "7-7=0\n\nAnswer: 2",
        "Answer: 11",  # 1 is a prefix of 11 but not the answer
        "Answer: 2\n\nAnswer: 1",
        "no answer",
    ]
    assert toy_reward(completions, [1] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert final_answer("x\n\nAnswer: -3") == -3


@pytest.mark.parametrize(
    ("prefix", "chunk", "expected"),
    [
        ("", EXAMPLE.solution, None),
        ("", "7-7=0\n\n0+9=8\n\n8-8=0\n\n", 1),  # earliest wrong step, later ones ignored
        ("", "7-7=1\n\n1+9=10\n\n", 0),
        ("7-7=0\n\n", "0+9=9\n\n9-8", None),  # unfinished last step that is still right
        ("7-7=0\n\n", "0+9=9\n\n9-9", 1),  # unfinished but already wrong
        ("7-7=0\n\n0+", "9=9\n\n9-8=1\n\n", None),  # a step straddling the prefix and the chunk
        ("7-7=0\n\n0+", "9=8\n\n9-8=1\n\n", 0),
        ("7-7=0\n\n0+9=9\n\n", "9-8=1\n\nAnswer: 2", 1),
        ("", "7-7=0\n0+9=9\n\n", 0),  # steps must be separated by a blank line
        (EXAMPLE.solution[:-9], "Answer: 1\n\n1+1=2", 1),  # anything after the answer is wrong
    ],
)
def test_rule_review_finds_earliest_wrong_step(prefix, chunk, expected):
    assert review_steps(EXAMPLE.question, prefix, split_steps(chunk), None) == expected


def test_rule_judge_corrections_repair_random_trajectories():
    """Simulate the rollout loop with a policy that slips at random: judge cuts and corrections always converge on
    the reference solution, and the judge never flags a right step."""
    judge = rule_judge()
    rng = random.Random(0)
    for _ in range(100):
        problem = make_problem(rng, rng.randint(1, 8))
        prefix = ""
        for _round in range(4 * len(problem.steps)):
            target = problem.solution[len(prefix) :] if problem.solution.startswith(prefix) else None
            assert target is not None, (problem.solution, prefix)
            if not target:
                break
            chunk = target[: rng.randint(1, 12)]
            slipped = rng.random() < 0.5 and any(ch.isdigit() for ch in chunk)
            if slipped:
                pos = max(i for i, ch in enumerate(chunk) if ch.isdigit())
                chunk = chunk[:pos] + str((int(chunk[pos]) + 1) % 10) + chunk[pos + 1 :]
            steps = split_steps(chunk)
            verdict = judge.review([ReviewRequest(problem.question, prefix, steps)])[0]
            assert not verdict.failed
            if verdict.wrong_step is None:
                assert not slipped
                prefix += chunk
                continue
            assert slipped
            prefix += "".join(steps[: verdict.wrong_step])
            correction = judge.correct([CorrectionRequest(problem.question, prefix)])[0]
            assert correction.text
            prefix += correction.text
        assert prefix == problem.solution
        assert toy_reward([prefix], [problem.answer]) == [1.0]
