"""math_reward: answer extraction, equivalence via math-verify, None for unparseable gold, hard time bounds."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from trl_mintrl.rewards import MathVerifier, completion_text, last_boxed, make_math_reward

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
