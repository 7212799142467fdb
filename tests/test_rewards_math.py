"""math_reward: answer extraction, equivalence via math-verify, None for unparseable gold, hard time bounds."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from trl_mintrl.rewards import MathVerifier, completion_text, last_boxed, make_math_reward, math_reward
from trl_mintrl.rewards.math import writes_final_answer

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def reward():
    function = make_math_reward(timeout=TIMEOUT, num_workers=2)
    yield function
    function.verifier.close()


def test_last_boxed_balances_braces():
    assert last_boxed(r"\boxed{1} and then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\fbox{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{12") is None and last_boxed("no box") is None


@pytest.mark.parametrize(
    ("text", "writes"),
    [
        ("#### 21\n", True),
        ("So the total is \\boxed{21}.", True),
        ("The answer is 21.", True),
        ("Answer: 21", True),
        ("Jack has 16 + 5 = 21 stickers.\n", False),  # a step whose result is the answer: not an answer line
        ("To find the answer we add 16 and 5.\n", False),
        ("#### Step 2\n", False),  # a Markdown heading
    ],
)
def test_a_final_answer_is_told_in_every_form_the_reward_reads(text, writes):
    assert writes_final_answer(text) is writes


def test_completion_text_reads_every_completion_shape():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "chat"}]) == "chat"
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(blocks) == "ab"


EQUIVALENT = [
    (r"\frac{1}{2}", r"So the answer is \boxed{0.5}."),
    ("0.5", r"\boxed{\frac12}"),
    ("x^2+2x+1", r"\boxed{(x+1)^2}"),
    ("(1,2)", r"\boxed{(1, 2)}"),
    (r"\sqrt{2}/2", r"\boxed{\frac{\sqrt{2}}{2}}"),
    (r"The area is $6 \cdot 4 = \boxed{24}$.", r"\boxed{24}"),  # worked solution as gold
    ("3", "The final answer is 3."),  # no box: the answer line
    ("3", "Answer: $3$"),
    ("3", r"First \boxed{4}, but that was wrong: \boxed{3}"),  # the last box counts
]
WRONG = [
    ("3", r"\boxed{4}"),
    ("3", r"\boxed{3} and also \boxed{4}"),
    ("3", "I think 3 is nice"),  # a number without an answer anchor is not an answer
    ("12", r"\boxed{12"),
    ("3", ""),
]


def test_equivalent_forms_score_one_and_wrong_answers_zero(reward):
    pairs = EQUIVALENT + WRONG
    scores = reward([c for _, c in pairs], solution=[g for g, _ in pairs])
    assert scores == [1.0] * len(EQUIVALENT) + [0.0] * len(WRONG)


def test_unparseable_gold_is_skipped_not_zero(reward):
    scores = reward([r"\boxed{3}"] * 4, solution=["", "See the proof above.", "hello world", "3"])
    assert scores == [None, None, None, 1.0]


def test_gold_whose_parsing_raises_is_skipped_not_zero(reward):
    """A gold that breaks the parser (here not a string: the extraction raises TypeError) must not read as a wrong
    answer, or SORT would defer the prompt as all-wrong; a malformed completion still scores 0."""
    assert reward([r"\boxed{3}", r"\boxed{3}", r"\boxed{3}"], solution=[None, ["3"], "3"]) == [None, None, 1.0]
    assert reward([None], solution=["3"]) == [0.0]


def test_conversational_and_plain_completions(reward):
    chat = [[{"role": "assistant", "content": r"Thus \boxed{42}."}], [{"role": "assistant", "content": "no"}]]
    assert reward(chat, solution=["42", "42"]) == [1.0, 0.0]
    assert reward([r"Thus \boxed{42}."], solution=["42"]) == [1.0]


def test_slow_expression_is_bounded_in_a_worker_thread(reward):
    """TRL's accuracy_reward disables math-verify's timeouts outside the main thread: this would hang."""
    out = {}
    thread = threading.Thread(
        target=lambda: out.setdefault("scores", reward([r"\boxed{9^{9^{9^{9}}}}", r"\boxed{1}"], solution=["1", "1"]))
    )
    start = time.monotonic()
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert out["scores"] == [0.0, 1.0]
    assert time.monotonic() - start < TIMEOUT + 1 + 10  # the bound, plus slack for a loaded machine


def test_stuck_worker_is_killed_and_replaced(reward):
    """A worker that stops answering (e.g. stuck in C code, where no signal reaches it) is killed after
    timeout + 1 s; the call still returns and the pool recovers."""
    verifier = reward.verifier
    stuck = verifier.worker_pids()
    for pid in stuck:
        os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    assert reward([r"\boxed{1}", r"\boxed{1}"], solution=["1", "1"]) == [0.0, 0.0]
    assert time.monotonic() - start < TIMEOUT + 1 + 30  # replacement workers start within the call
    fresh = verifier.worker_pids()
    assert not set(fresh) & set(stuck)
    for pid in stuck:  # killed and reaped: nothing leaks
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert reward([r"\boxed{1}"], solution=["1"]) == [1.0]


def test_bad_arguments_fail_clearly(reward):
    with pytest.raises(ValueError, match="timeout"):
        MathVerifier(timeout=0)
    with pytest.raises(ValueError, match="num_workers"):
        MathVerifier(num_workers=0)
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        reward(["a", "b"], solution=["1"])


# ----- GSM8K's `#### N` and the answers a real chat model writes -----

SAMPLES_FILE = Path(__file__).resolve().parent / "data" / "smollm2_samples.json"


def smollm2_samples() -> tuple[list[str], list[str]]:
    """SmolLM2-135M-Instruct's own samples (scripts/smollm2_samples.py) and each one's gold answer."""
    record = json.loads(SAMPLES_FILE.read_text())
    golds = [record["problems"][sample["problem"]]["gold"] for sample in record["samples"]]
    return [sample["text"] for sample in record["samples"]], golds


GSM8K_LINES = [
    ("16", "Jack has 28 - 12 = 16 stickers left.\n#### 16", 1.0),
    ("308", "#### 308\n#### 12 + 28 = 30 = total", 1.0),  # the first `####` line is the answer ...
    ("30", "#### 308\n#### 12 + 28 = 30 = total", 0.0),  # ... not what the model wrote after it
    ("4", "#### 4\n#### 5", 1.0),  # of two answer lines, the first
    ("5", "#### 4\n#### 5", 0.0),
    ("12", "#### 12 + 28 = 30 = total", 0.0),  # an expression after `####` is no answer line
    ("316", "The answer is: 316.", 1.0),  # MetaMathQA's answer line (SmolLM2 was tuned on it)
    ("316", "So she has 316 stamps.\n#### 316\nThe answer is: 316", 1.0),
    ("1234", "Total: 1,000 + 234.\n#### 1,234", 1.0),
    ("16", "#### $16", 1.0),
    ("16", "#### 16 apples.", 1.0),
    ("-2.5", "#### -2.5", 1.0),
    ("16", "16 - 1 = 15 so 15 is left\n#### 16", 1.0),  # `####` beats the last number
    ("16", "#### 15\nNo: \\boxed{16}", 1.0),  # a box keeps priority
    ("15", "#### 15\nNo: \\boxed{16}", 0.0),
    ("5", "#### Step 1\n2 + 3 = 5\n#### 5", 1.0),  # a Markdown heading is no answer line
    ("1", "#### 1. Add the costs\n3 + 4 = 7\n#### 7", 0.0),  # ... nor a numbered heading: the answer is 7
    ("72", "#### 72", 1.0),
]


def test_gsm8k_answer_lines_are_read_first_marker_wins():
    scores = math_reward([text for _, text, _ in GSM8K_LINES], solution=[gold for gold, _, _ in GSM8K_LINES])
    assert scores == [expected for _, _, expected in GSM8K_LINES]


def test_gsm8k_worked_solution_as_gold():
    """A GSM8K `answer` column (worked solution with calculator annotations, then `#### N`) is a gold answer."""
    gold = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips in all.\n#### 72"
    )
    assert math_reward(["#### 72", "The answer is 72.", "#### 24"], solution=[gold] * 3) == [1.0, 1.0, 0.0]


def test_smollm2_samples_are_read_as_the_model_wrote_them():
    """SmolLM2-135M-Instruct's samples at temperature 1 (24: 6 word problems, bare and with the benchmark's
    `#### <answer>` instruction): none has the gold answer (by the reward or by its last integer) and none writes
    `\\boxed{}`; two write a `####` answer line, read as their first one (not their last integer), and two an
    answer line in words. A `####` glued to other text with an expression after it is no answer."""
    texts, golds = smollm2_samples()
    assert len(texts) == 24
    assert math_reward(texts, solution=golds) == [0.0] * 24
    assert not any(re.findall(r"\d+", text.replace(",", ""))[-1:] == [gold] for text, gold in zip(texts, golds))
    assert not any(last_boxed(text) for text in texts)
    assert [i for i, text in enumerate(texts) if "####" in text] == [12, 15, 22]
    # sample 12: "Lisa reads 20 pages in 2 weeks.\n#### 2\n..." then more text ending "6 pages yesterday"
    # sample 15: "#### 9", "#### 10", ... "#### 13": the first is the answer
    # sample 22: "$12/H * 60####  4 * 1 = $24": no answer line
    # sample 2: "Tom's answer is 60 + 20 = 80"; sample 18: "Answer: Day 135"
    cases = [(12, "2", 1.0), (12, "6", 0.0), (15, "9", 1.0), (15, "13", 0.0), (22, "4", 0.0), (22, "24", 0.0)]
    cases += [(2, "80", 1.0), (18, "135", 1.0)]
    scores = math_reward([texts[i] for i, _, _ in cases], solution=[gold for _, gold, _ in cases])
    assert scores == [expected for _, _, expected in cases]
