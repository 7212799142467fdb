"""The real-model task (benchmarks/tasks/real/task.py) and its rule judge (benchmarks/tasks/real/judge.py): generation, splits,
datasets, and the judge's rules on handwritten chunks. No model needed."""

import hashlib
import random
import re
from fractions import Fraction

import pytest

from benchmarks.tasks.real.judge import RuleJudge, correct_step, review_chunk, rule_judge
from benchmarks.tasks.real.task import (
    CHAIN_LOW,
    CHAT,
    DECISIVE_OP,
    EASY_OPS,
    INSTRUCTION,
    MAX_VALUE,
    Problem,
    apply,
    calibration_problems,
    make_datasets,
    make_problem,
    make_problems,
    make_splits,
)
from benchmarks.tasks.real.themes import THEMES
from benchmarks.tasks.real.warm_start import warmup_problems
from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest
from trl_mintrl.judges.function import FunctionJudge
from trl_mintrl.mintrl.steps import split_steps

# Jack: 28 - 12 = 16, then 16 + 5 = 21
JACK = Problem(
    "people",
    "Jack has 28 stickers. He gives 12 stickers to his sister. He finds 5 more stickers. "
    "How many stickers does Jack have now?",
    ("Jack has 28 - 12 = 16 stickers left.", "Jack has 16 + 5 = 21 stickers."),
    ((28, "-", 12, 16), (16, "+", 5, 21)),
)
# a baker: 6 * 8 = 48, then 48 - 15 = 33
BAKER = Problem(
    "shop",
    "The bakery gets 6 boxes of cookies with 8 cookies in each box. The bakery sells 15 cookies. "
    "How many cookies does the bakery have now?",
    ("The bakery has 6 * 8 = 48 cookies.", "The bakery has 48 - 15 = 33 cookies left."),
    ((6, "*", 8, 48), (48, "-", 15, 33)),
)


def question(problem: Problem) -> str:
    return problem.prompt[0]["content"]


def review(problem: Problem, chunk: str, prefix: str = "", complete: bool = True, steps=None) -> int | None:
    steps = steps if steps is not None else chunk.splitlines(keepends=True)
    return review_chunk(question(problem), prefix, steps, problem.solution, last_step_complete=complete)


# ---------------------------------------------------------------------------------------------------------------
# the task


def test_reference_solution_is_written_the_models_way():
    assert JACK.solution == "Jack has 28 - 12 = 16 stickers left.\nJack has 16 + 5 = 21 stickers.\n#### 21"
    assert JACK.answer == 21 and JACK.num_steps == 2
    for num_steps in (1, 2, 3, 4, 6):
        for problem in make_problems(60, num_steps, seed=3):
            lines = problem.solution.split("\n")
            assert len(lines) == num_steps + 1 and lines[-1] == f"#### {problem.answer}"
            value = None
            for line, (a, op, b, c) in zip(lines[:-1], problem.computations, strict=True):
                assert f"{a} {op} {b} = {c}" in line and apply(a, op, b) == c
                assert value is None or a == value  # a chain on one running quantity
                assert 2 <= c <= 200 and (op != "/" or a == b * c)
                assert len(line) <= 64  # a correction is one such sentence: far under 64 tokens
                value = c
            # every operand the question gives is written in it as digits; one computation per sentence
            numbers = set(re.findall(r"\d+", problem.question))
            first = problem.computations[0]
            assert {str(first[0]), str(first[2])} <= numbers
            assert all(str(b) in numbers for _, _, b, _ in problem.computations)
            assert problem.question.endswith("?") and "?" not in problem.question[:-1]


def test_generation_is_deterministic_and_the_difficulty_is_the_number_of_steps():
    assert make_problems(40, (1, 2, 3), seed=1) == make_problems(40, (1, 2, 3), seed=1)
    assert make_problems(40, (1, 2, 3), seed=1) != make_problems(40, (1, 2, 3), seed=2)
    assert [p.num_steps for p in make_problems(6, (1, 2, 3), seed=1)] == [1, 2, 3, 1, 2, 3]
    assert calibration_problems(3, 10) == calibration_problems(3, 10)
    drawn = make_problems(400, (1, 2, 3, 4), seed=0)
    assert {p.theme for p in drawn} == {t.name for t in THEMES}
    assert {op for p in drawn for _, op, _, _ in p.computations} == {"+", "-", "*", "/"}
    assert len({p.key for p in drawn}) == len(drawn)  # make_problems never repeats a problem
    with pytest.raises(ValueError):
        make_problem(random.Random(0), 0)


def test_a_division_that_changes_what_is_counted_is_only_the_last_step():
    for problem in make_problems(300, (2, 3, 4), seed=5):
        if problem.theme != "people":
            assert all(op != "/" for _, op, _, _ in problem.computations[:-1])
        if problem.computations[-1][1] == "/" and problem.theme != "people":
            assert "each" in problem.question.rsplit(".", 1)[-1]


def test_a_chain_is_easy_steps_and_one_decisive_step_the_judge_reads():
    chains = make_problems(200, (7, 8, 9), seed=4, family="chain")
    for problem in chains:
        decisive = [i for i, (_, op, _, _) in enumerate(problem.computations) if op == DECISIVE_OP]
        assert len(decisive) == 1 and decisive[0] >= 1  # one, never the first step
        for i, (a, op, b, c) in enumerate(problem.computations):
            assert c == apply(a, op, b) and CHAIN_LOW <= c <= MAX_VALUE
            assert (2 <= b <= 4) if i in decisive else (op in EASY_OPS and 2 <= b <= 9)
        assert problem.num_steps in (7, 8, 9) and problem.answer == problem.computations[-1][3]
        # before it the value stays small enough to double, so the decisive step always fits
        assert all(c <= MAX_VALUE // 2 for _, _, _, c in problem.computations[: decisive[0]])
        q = question(problem)  # the rule judge reads its reference and corrects its decisive step
        prefix = "".join(step + "\n" for step in problem.steps[: decisive[0]])
        assert correct_step(q, prefix, problem.solution) == problem.steps[decisive[0]] + "\n"
        wrong = "".join(step + "\n" for step in problem.steps[: decisive[0]]) + "Jack has 1 * 2 = 3 cards.\n"
        assert review(problem, wrong) == decisive[0]
    # a draw whose chain once climbed past 100 before its decisive step, which then never came
    assert all([op for _, op, _, _ in p.computations].count(DECISIVE_OP) == 1
               for p in make_problems(300, (7, 8, 9), seed=14, family="chain"))  # fmt: skip
    easy = make_problems(50, 8, seed=4, family="chain-easy")
    assert all(op in EASY_OPS for p in easy for _, op, _, _ in p.computations)
    assert {p.key for p in chains}.isdisjoint(p.key for p in easy)
    # the mixed family's problems are drawn as before families existed
    assert make_problems(20, (1, 2), seed=3) == make_problems(20, (1, 2), seed=3, family="mixed")
    with pytest.raises(ValueError, match="family"):
        make_problems(1, 8, seed=0, family="chains")


def test_a_chain_warm_up_can_start_high_and_hold_a_share_of_decisive_steps():
    """The chain warm-up's options: easy chains starting up to `start_high` (the values the decisive step leads to),
    and the decisive step in about `decisive_share` of them; the defaults draw the chains as before the options."""
    mixed = make_problems(400, (7, 8, 9), seed=5, family="chain-easy", start_high=180, decisive_share=0.25)
    decisive = [p for p in mixed if any(op == DECISIVE_OP for _, op, _, _ in p.computations)]
    assert 60 <= len(decisive) <= 140  # about a quarter
    easy = [p for p in mixed if p not in decisive]
    assert max(p.computations[0][0] for p in easy) > 100  # easy chains start past where the defaults stop
    assert all(p.computations[0][0] <= MAX_VALUE // 2 for p in decisive)  # room for the decisive step to double
    for problem in mixed:
        assert all(c == apply(a, op, b) and CHAIN_LOW <= c <= MAX_VALUE for a, op, b, c in problem.computations)
    assert max(p.computations[0][0] for p in make_problems(400, 8, seed=5, family="chain-easy")) <= 60
    # without the options, the second calibration's warm-up (real_calibration_chain2.md) draws the same chains
    second = dict(problems=1024, num_steps=[7, 8, 9], seed="warmup-chain/0", family="chain-easy")
    keys = str([p.key for p in warmup_problems(second)])
    assert hashlib.sha256(keys.encode()).hexdigest()[:12] == "4a953aab42a7"


def test_splits_share_no_problem_and_are_deterministic():
    splits = make_splits(train_steps=(1, 2), longer_steps=(3, 4), n_train=600, n_heldout=150, n_longer=100, seed=0)
    assert {k: len(v) for k, v in splits.items()} == {"heldout": 150, "heldout_longer": 100, "train": 600}
    keys = {name: {p.key for p in problems} for name, problems in splits.items()}
    questions = {name: {p.question for p in problems} for name, problems in splits.items()}
    names = list(splits)
    for i, a in enumerate(names):
        assert len(keys[a]) == len(splits[a])
        for b in names[i + 1 :]:
            assert not keys[a] & keys[b], (a, b)
            assert not questions[a] & questions[b], (a, b)
    assert {p.num_steps for p in splits["train"]} == {1, 2} == {p.num_steps for p in splits["heldout"]}
    assert {p.num_steps for p in splits["heldout_longer"]} == {3, 4}
    again = make_splits(train_steps=(1, 2), longer_steps=(3, 4), n_train=600, n_heldout=150, n_longer=100, seed=0)
    assert again == splits
    # the held-out sets do not depend on the training set's size
    small = make_splits(train_steps=(1, 2), longer_steps=(3, 4), n_train=10, n_heldout=150, n_longer=100, seed=0)
    assert small["heldout"] == splits["heldout"] and small["heldout_longer"] == splits["heldout_longer"]
    assert make_splits(seed=1)["heldout"] != make_splits(seed=0)["heldout"]
    with pytest.raises(ValueError, match="longer_steps"):
        make_splits(train_steps=(1, 3), longer_steps=(3,))


def test_datasets_have_the_columns_the_trainers_use():
    data = make_datasets(n_train=8, n_heldout=4, n_longer=4)
    assert set(data) == {"train", "heldout", "heldout_longer", "chat"}
    for name in ("train", "heldout", "heldout_longer"):
        assert set(data[name].column_names) == {"prompt", "solution", "answer", "num_steps", "theme"}
    row = data["train"][0]
    assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
    assert row["prompt"][0]["content"].endswith(INSTRUCTION)
    assert row["solution"].endswith(f"\n#### {row['answer']}")
    assert "one step per line" in INSTRUCTION and "####" in INSTRUCTION
    assert not re.search(r"\d", INSTRUCTION)  # the judge reads the question's numbers from the whole prompt
    chat = data["chat"]
    assert set(chat.column_names) == {"prompt", "completion"} and len(chat) == len(CHAT) >= 20
    assert len({q for q, _ in CHAT}) == len(CHAT)
    assert chat[0]["prompt"][0]["role"] == "user" and chat[0]["completion"][0]["role"] == "assistant"
    assert not any("=" in q + a or "####" in a for q, a in CHAT)  # not maths


# ---------------------------------------------------------------------------------------------------------------
# the rule judge: review


def test_the_reference_itself_is_kept_wherever_it_is_cut():
    """Every prefix/chunk cut of the reference, the chunk's end unfinished unless it is the end: KEEP. Covers cuts in
    the middle of a number (`= 1` of 16), of `####` and at the prefix/chunk boundary."""
    problems = [JACK, BAKER, *make_problems(12, (1, 2, 3), seed=11)]
    for problem in problems:
        text = problem.solution
        for i in range(0, len(text), 3):
            for j in range(i + 1, len(text) + 1, 4):
                assert review(problem, text[i:j], prefix=text[:i], complete=j == len(text)) is None, (text, i, j)


def test_correct_steps_are_kept_in_the_models_own_phrasings():
    chunks = [
        "Jack has 28 stickers.\nHe gives away 12, so 28 - 12 = 16.\n16 + 5 = 21\n#### 21",
        "28-12=16\n5 + 16 = 21 stickers\nThe answer is: 21",
        "Jack has 28 - 12 = 16 stickers left.\nJack has 16 + 5 = 21 stickers.\n\\boxed{21}",
        "Jack has x stickers now.\n28 stickers - 12 stickers = 16 stickers\n",  # unit words between numbers
        "28 - 12 + 5 = 21\n#### 21",  # two reference steps in one computation
    ]
    for chunk in chunks:
        assert review(JACK, chunk) is None, chunk
    for chunk in (
        "6 x 8 = 48\n",
        "6*8 = 48 cookies\n",
        "There are 6 boxes x 8 cookies = 48 cookies.\n",
        "8 × 6 = 48\n",
    ):
        assert review(BAKER, chunk) is None, chunk
    # a computation never spans a line break: "x" on its own line is a variable here, not a product
    assert review(JACK, "Jack has 28 - 12 = 16 stickers left.\nx + 5 = 21\n") is None


def test_computations_are_read_as_written():
    from benchmarks.tasks.real.judge import COMPUTATION, evaluate, parse_expr

    def read(text):
        return [(parse_expr(m.group("expr")), evaluate(m.group("expr"))) for m in COMPUTATION.finditer(text)]

    assert read("28 stickers x 12 = 308 stickers") == [((["28", "12"], ["x"]), 336)]
    assert read("$9 * 9 = $84") == [((["$9", "9"], ["*"]), 81)]
    assert read("So 28 - 12 + 5 = 21 and 2x3=6") == [((["28", "12", "5"], ["-", "+"]), 21), ((["2", "3"], ["x"]), 6)]
    assert read("6 + 4 * 2 = 14, 48 / 5 = 9.6") == [
        ((["6", "4", "2"], ["+", "*"]), 14),
        ((["48", "5"], ["/"]), Fraction(48, 5)),
    ]
    assert read("9\nx + 1 = 9") == [] and read("x = 16") == [] and read("a 35-dollar deck = 5") == []


def test_wrong_arithmetic_is_flagged_at_its_step():
    assert review(JACK, "Jack has 28 - 12 = 15 stickers left.\n") == 0
    assert review(JACK, "Jack has 28 - 12 = 16 stickers left.\nJack has 16 + 5 = 20 stickers.\n#### 20") == 1
    # the model's own sample: a false product (28 x 12 is 336)
    assert review(JACK, "Jack has x stickers now.\nThere are 28 stickers x 12 = 308 stickers\n#### 308") == 1
    assert review(BAKER, "The bakery has 48 / 5 = 9 cookies.\n") == 0  # not exact
    # a true computation that is not the problem's (the question subtracts)
    assert review(JACK, "Jack has 28 stickers.\nSo 28 + 12 = 40\n") == 1
    # a wrong final answer, with no computation wrong before it
    assert review(JACK, "28 - 12 = 16\n16 + 5 = 21\nThe answer is: 20") == 2
    assert review(JACK, "28 - 12 = 16\n#### 16") == 1


def test_a_step_copying_a_wrong_number_is_flagged():
    # the wrong number was accepted earlier (reviews ran out): the step that uses it is wrong though true
    prefix = "Jack has 28 - 12 = 15 stickers left.\n"
    assert review(JACK, "Jack has 15 + 5 = 20 stickers.\n", prefix=prefix) == 0
    # a wrong number written in prose is not flagged there, but the computation that uses it is
    assert review(JACK, "So Jack has 15 stickers left.\n15 + 5 = 20\n") == 1
    # a number the question does not give (its digits misread)
    assert review(JACK, "Jack has 29 - 13 = 16 stickers left.\n") == 0


def test_an_unfinished_step_is_not_flagged_for_being_incomplete():
    for chunk in ("Jack has 28 - 12 = 1", "Jack has 28 - 12 = ", "Jack has 28 - 1", "Jack has 28 - 12 = 16\n#### 2"):
        assert review(JACK, chunk, complete=False) is None, chunk
    # the same text complete (the chunk ended with EOS) is judged as written
    assert review(JACK, "Jack has 28 - 12 = 1", complete=True) == 0
    assert review(JACK, "Jack has 28 - 12 = 16\n#### 2", complete=True) == 1
    # what is already wrong in an unfinished step is flagged: 15 cannot become 16, 2 of `#### 2` not 21
    assert review(JACK, "Jack has 28 - 12 = 15", complete=False) == 0
    assert review(JACK, "Jack has 28 - 12 = 16\n#### 3", complete=False) == 1
    assert review(JACK, "Jack has 28 - 12 = 15 sti", complete=False) == 0
    # an unfinished number completed wrongly in the next chunk: the straddling line is the chunk's first step
    assert review(JACK, "5 stickers left.\nJack has 15 + 5 = 20 stickers.\n", prefix="Jack has 28 - 12 = 1") == 0
    assert review(JACK, "6 stickers left.\nJack has 16 + 5 = 20 stickers.\n", prefix="Jack has 28 - 12 = 1") == 1


def test_the_flagged_index_is_the_step_holding_the_wrong_line_whatever_the_split():
    chunk = "Jack has 28 - 12 = 16 stickers left.\nSo far so good.\n\nJack has 16 + 5 = 22 stickers.\n#### 22"
    by_line = chunk.splitlines(keepends=True)
    assert review(JACK, chunk, steps=by_line) == 3  # the blank line is a step of its own here
    by_block = ["Jack has 28 - 12 = 16 stickers left.\nSo far so good.\n\n", "Jack has 16 + 5 = 22 stickers.\n#### 22"]
    assert review(JACK, chunk, steps=by_block) == 1
    steps = split_steps(chunk)  # the package's splitter, whichever boundaries it uses
    index = review(JACK, chunk, steps=steps)
    assert "16 + 5 = 22" in steps[index] and "16 + 5 = 22" not in "".join(steps[:index])
    assert review(JACK, chunk, steps=[chunk]) == 0


# ---------------------------------------------------------------------------------------------------------------
# the rule judge: correction


def test_the_correction_is_the_next_missing_reference_step():
    q = question(JACK)
    assert correct_step(q, "", JACK.solution) == "Jack has 28 - 12 = 16 stickers left.\n"
    assert correct_step(q, "Jack has 28 stickers.\n", JACK.solution) == "Jack has 28 - 12 = 16 stickers left.\n"
    # the first step done in the model's own words: the next one
    assert correct_step(q, "He has 28 - 12 = 16 now.\n", JACK.solution) == "Jack has 16 + 5 = 21 stickers.\n"
    # a wrong step in the prefix does not count as done
    assert correct_step(q, "28 - 12 = 15\n", JACK.solution) == "Jack has 28 - 12 = 16 stickers left.\n"
    # every step there: the answer line
    assert correct_step(q, "28 - 12 = 16\n16 + 5 = 21\n", JACK.solution) == "#### 21\n"
    # a prefix cut inside the line that the step starts with is completed; another partial line gets a new line
    assert correct_step(q, "Jack has 28 - 12 = ", JACK.solution) == "16 stickers left.\n"
    assert correct_step(q, "So, Jack", JACK.solution) == "\nJack has 28 - 12 = 16 stickers left.\n"


def test_a_judge_that_never_writes_the_answer_line_leaves_it_to_the_policy():
    q, ref = question(JACK), JACK.solution
    # steps missing: the same correction as the judge that writes the answer
    assert correct_step(q, "28 - 12 = 16\n", ref, writes_answer=False) == "Jack has 16 + 5 = 21 stickers.\n"
    # every step there: nothing, where the other writes "#### 21"
    assert correct_step(q, "28 - 12 = 16\n16 + 5 = 21\n", ref, writes_answer=False) == ""
    judge = rule_judge(writes_answer=False)
    wrong_answer = ReviewRequest(q, "28 - 12 = 16\n16 + 5 = 21\n", ["#### 20\n"], ref)
    assert [v.wrong_step for v in judge.review([wrong_answer])] == [0]  # it still flags a wrong answer line
    prefixes = ["28 - 12 = 16\n16 + 5 = 21\n", "28 - 12 = 16\n"]
    corrections = judge.correct([CorrectionRequest(q, prefix, ref) for prefix in prefixes])
    assert [(c.text, c.failed) for c in corrections] == [("", False), ("Jack has 16 + 5 = 21 stickers.\n", False)]
    assert [c.text for c in rule_judge().correct([CorrectionRequest(q, prefixes[0], ref)])] == ["#### 21\n"]


def test_an_answer_only_judge_replaces_the_wrong_line_with_the_answer_and_adds_no_step():
    q, ref = question(JACK), JACK.solution
    judge = rule_judge(answer_only=True)
    prefixes = ["28 - 12 = 16\n", "", "Jack has 28 - 12 = 16 stickers left.\n#### ", "So, Jack"]
    corrections = judge.correct([CorrectionRequest(q, prefix, ref) for prefix in prefixes])
    # a step missing (the second, or both): the answer line all the same; a started answer line is completed
    assert [c.text for c in corrections] == ["#### 21\n", "#### 21\n", "21\n", "\n#### 21\n"]
    # it reviews as the other rule judges do: a wrong answer line after one step is flagged
    one_step = ReviewRequest(q, "Jack has 28 - 12 = 16 stickers left.\n", ["#### 16\n"], ref)
    assert [v.wrong_step for v in judge.review([one_step])] == [0]
    with pytest.raises(ValueError, match="needs writes_answer=True"):
        rule_judge(writes_answer=False, answer_only=True)


def test_a_result_the_reference_computes_twice_is_done_only_when_computed_twice():
    twice = Problem(
        "people",
        "Mia has 10 beads. She buys 5 more beads. She trades each of her beads for 2 new ones. She gives away 15 "
        "beads. How many beads does Mia have now?",
        ("Mia has 10 + 5 = 15 beads.", "Mia has 15 * 2 = 30 beads.", "Mia has 30 - 15 = 15 beads left."),
        ((10, "+", 5, 15), (15, "*", 2, 30), (30, "-", 15, 15)),
    )
    q = question(twice)
    assert correct_step(q, "10 + 5 = 15\n15 * 2 = 30\n", twice.solution) == "Mia has 30 - 15 = 15 beads left.\n"
    assert correct_step(q, "10 + 5 = 15\n15 * 2 = 30\n30 - 15 = 15\n", twice.solution) == "#### 15\n"


# ---------------------------------------------------------------------------------------------------------------
# the rule judge through the package's judge interface


def test_rule_judge_is_a_function_judge_that_reads_last_step_complete():
    judge = rule_judge()
    assert isinstance(judge, RuleJudge) and isinstance(judge, FunctionJudge)
    q, ref = question(JACK), JACK.solution
    verdicts = judge.review(
        [
            ReviewRequest(q, "", ["Jack has 28 - 12 = 1"], ref, last_step_complete=False),
            ReviewRequest(q, "", ["Jack has 28 - 12 = 1"], ref, last_step_complete=True),
            ReviewRequest(q, "", ["Jack has 28 - 12 = 16 stickers left.\n", "16 + 5 = 20\n"], ref),
            ReviewRequest(q, "", ["28 - 12 = 16\n"], ref, last_step_complete=False),
            ReviewRequest(q, "", ["28 - 12 = 16\n"], None),  # no reference: the judge cannot answer (KEEP)
        ]
    )
    assert [(v.wrong_step, v.failed) for v in verdicts] == [
        (None, False),
        (0, False),
        (1, False),
        (None, False),
        (None, True),
    ]
    corrections = judge.correct([CorrectionRequest(q, "28 - 12 = 16\n", ref), CorrectionRequest(q, "", None)])
    assert corrections[0].text == "Jack has 16 + 5 = 21 stickers.\n" and not corrections[0].failed
    assert corrections[1].failed
    assert judge.review([]) == []


def test_a_judge_of_more_lines_writes_the_next_lines_or_the_rest_of_the_solution():
    """`rule_judge(lines=k)` writes the next k lines the prefix lacks, `lines=None` the rest with the answer line:
    the intensity ablation's higher shares."""
    [chain] = make_problems(1, 12, seed=4, family="chain")
    q, ref, steps = question(chain), chain.solution, list(chain.steps)
    prefix = "".join(step + "\n" for step in steps[:3])
    answer = f"#### {chain.answer}"

    def corrections(judge, *prefixes):
        return [c.text for c in judge.correct([CorrectionRequest(q, p, ref) for p in prefixes])]

    assert corrections(rule_judge(lines=4), prefix) == ["\n".join(steps[3:7]) + "\n"]
    assert corrections(rule_judge(lines=None), prefix) == ["\n".join([*steps[3:], answer]) + "\n"]
    # near the end the lines run into the answer line (or stop before it without writes_answer); one line as before
    near_end = "".join(step + "\n" for step in steps[:10])
    assert corrections(rule_judge(lines=4), near_end) == ["\n".join([*steps[10:], answer]) + "\n"]
    assert corrections(rule_judge(lines=4, writes_answer=False), near_end) == ["\n".join(steps[10:]) + "\n"]
    assert corrections(rule_judge(), prefix, prefix + steps[3][:8]) == [steps[3] + "\n", steps[3][8:] + "\n"]
    # a started line is completed and the lines after it follow
    assert corrections(rule_judge(lines=2), prefix + steps[3][:8]) == ["\n".join([steps[3][8:], steps[4]]) + "\n"]
    everything = "".join(step + "\n" for step in steps) + answer + "\n"
    assert corrections(rule_judge(lines=None, writes_answer=False), everything) == [""]
    with pytest.raises(ValueError, match="lines must be >= 1"):
        rule_judge(lines=0)


def test_the_calibration_says_where_the_judges_first_flag_falls_on_a_chain():
    """benchmarks/tasks/real/calibration.py's `text_stats` on hand-made samples of one chain problem: the reference itself
    (no flag), the decisive line wrong (flagged at it), the first line wrong (flagged before it)."""
    from benchmarks.tasks.real.calibration import text_stats

    [problem] = make_problems(1, 7, seed=6, family="chain")
    decisive = next(i for i, (_, op, _, _) in enumerate(problem.computations) if op == DECISIVE_OP)
    lines = [step + "\n" for step in problem.steps] + [f"#### {problem.answer}"]
    wrong_decisive = lines[:decisive] + ["Jack has 1 * 2 = 3 cards.\n"] + lines[decisive + 1 :]
    wrong_first = ["Jack has 1 + 2 = 3 cards.\n"] + lines[1:]
    texts = ["".join(lines), "".join(wrong_decisive), "".join(wrong_first)]
    stats = text_stats([problem], texts, [False] * 3, samples=3, family="chain")
    assert stats["first_flagged"] == pytest.approx({"before": 1 / 3, "at": 1 / 3, "after": 0.0, "none": 1 / 3})
    assert stats["pass"]["math_reward"]["samples_right"] == pytest.approx(1.0)  # the answer line is right in all 3
    assert text_stats([problem], texts, [False] * 3, samples=3)["first_flagged"] is None  # the mixed family: none
