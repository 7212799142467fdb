"""The intervention rollout state machine with a scripted policy engine and scripted judges (exact ids and masks)."""

from __future__ import annotations

import pytest

from trl_mintrl.engines.base import Generation, GenerationEngine
from trl_mintrl.judges import Correction, FunctionJudge, Judge, Verdict
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory
from trl_mintrl.mintrl.steps import cut_point, split_steps


class ScriptedPolicy(GenerationEngine):
    """Returns, for each trajectory (keyed by its first prompt token), the next scripted output; records calls."""

    def __init__(self, tokenizer, scripts: dict[int, list[str]]):
        super().__init__([tokenizer.eos_token_id])
        self.tok = tokenizer
        self.scripts = {key: [self._ids(text) for text in outputs] for key, outputs in scripts.items()}
        self.calls: list[list[tuple[list[int], int]]] = []  # per call: (prompt ids, cap) per row
        self.sessions = 0

    def _ids(self, text: str) -> list[int]:
        eos = self.tok.eos_token
        pieces = text.split(eos)
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            ids += self.tok(piece, add_special_tokens=False)["input_ids"]
            if i < len(pieces) - 1:
                ids.append(self.tok.eos_token_id)
        return ids

    def _open_session(self):
        self.sessions += 1
        return super()._open_session()

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        self.calls.append(list(zip(prompt_ids, max_new_tokens, strict=True)))
        return [Generation(self.scripts[p[0]].pop(0)) for p in prompt_ids]


def make_trajectory(key: int, intervened: bool, budget: int = 4, reference: str | None = "ref") -> Trajectory:
    return Trajectory(
        prompt_ids=[key], question=f"q{key}", reference=reference, review_budget=budget if intervened else 0
    )


def run(tok, scripts, trajectories, judge, **settings):
    base = dict(chunk_size=64, max_reviews=4, max_correction_tokens=64, max_completion_length=256)
    policy = ScriptedPolicy(tok, scripts)
    counts = InterventionRollout(policy, judge, tok, RolloutSettings(**{**base, **settings})).run(trajectories)
    return policy, counts


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


KEEP_ALL = FunctionJudge(lambda q, prefix, steps, ref: None, lambda q, prefix, ref: "")


def test_split_steps_blank_lines_fences_and_partial_tail():
    assert split_steps("7-7=0\n\n0+9=9\n\n9-8=1\n\nAnswer: 1") == ["7-7=0\n\n", "0+9=9\n\n", "9-8=1\n\n", "Answer: 1"]
    assert split_steps("a\n\n\n\nb") == ["a\n\n\n\n", "b"]
    fenced = "Code:\n```python\nx = 1\n\ny = 2\n```\n\nDone"
    assert split_steps(fenced) == ["Code:\n", "```python\nx = 1\n\n", "y = 2\n```\n\n", "Done"]  # tests/test_steps.py
    assert split_steps("no boundary at all") == ["no boundary at all"]
    assert split_steps("first\n\nunfinished ste") == ["first\n\n", "unfinished ste"]
    assert split_steps("```\nopen fence\n\nstill code") == ["```\nopen fence\n\n", "still code"]
    for text in ["a\n\nb", "\n\nx\n\n", fenced, ""]:
        assert "".join(split_steps(text)) == text


def test_cut_point_drops_a_token_that_straddles_the_step_boundary():
    tokens = ["ab", "c\n", "\nd", "e"]  # text "abc\n\nde": step 1 starts inside token 2

    def decode(token_ids):
        return "".join(tokens[i] for i in token_ids)

    assert cut_point([0, 1, 2, 3], 5, decode) == 2  # keep "abc\n"; the straddling "\nd" goes with the wrong step
    assert cut_point([0, 1, 2, 3], 4, decode) == 2
    assert cut_point([0, 1, 2, 3], 0, decode) == 0
    assert cut_point([0, 1, 2, 3], 7, decode) == 4


def test_keep_accepts_chunk_exactly(tiny_tokenizer):
    tok = tiny_tokenizer
    text = f"1+1=2\n\n2+1=3\n\nAnswer: 3{tok.eos_token}"
    t = make_trajectory(5, intervened=True)
    policy, counts = run(tok, {5: [text]}, [t], KEEP_ALL)
    assert t.completion_ids == ids(tok, "1+1=2\n\n2+1=3\n\nAnswer: 3") + [tok.eos_token_id]
    assert t.env_mask == [1] * len(t.completion_ids)
    assert (t.reviews, t.revisions, t.finished) == (1, 0, True)
    assert counts.review_calls == 1 and counts.correction_calls == 0


def test_revise_first_step_replaces_whole_chunk_with_correction(tiny_tokenizer):
    tok = tiny_tokenizer
    seen = []

    def review(question, prefix, steps, reference):
        seen.append((question, prefix, steps, reference))
        return 0 if steps[0].startswith("1+1=3") else None

    judge = FunctionJudge(review, lambda q, prefix, ref: "1+1=2\n\n")
    t = make_trajectory(7, intervened=True)
    policy, counts = run(tok, {7: ["1+1=3\n\n3+1=4\n\n", f"2+1=3{tok.eos_token}"]}, [t], judge)
    correction = ids(tok, "1+1=2\n\n")
    tail = ids(tok, "2+1=3") + [tok.eos_token_id]
    assert t.completion_ids == correction + tail
    assert t.env_mask == [0] * len(correction) + [1] * len(tail)
    assert (t.reviews, t.revisions, t.judge_tokens) == (2, 1, len(correction))
    assert seen[0] == ("q7", "", ["1+1=3\n\n", "3+1=4\n\n"], "ref")
    assert seen[1][1] == "1+1=2\n\n"  # the second review sees the correction as accepted prefix
    # token-in/token-out: the continuation prompt is prompt + correction ids, never re-tokenised text
    assert policy.calls[1][0][0] == [7] + correction


def test_revise_last_step_keeps_earlier_steps_on_token_boundary(tiny_tokenizer):
    tok = tiny_tokenizer
    judge = FunctionJudge(lambda q, p, steps, r: 2 if len(steps) == 3 else None, lambda q, p, r: "c=3\n\n")
    t = make_trajectory(9, intervened=True)
    run(
        tok,
        {9: ["a=1\n\nb=2\n\nc=4", f"Answer{tok.eos_token}"]},
        [t],
        judge,
        chunk_size=len(ids(tok, "a=1\n\nb=2\n\nc=4")),
    )
    kept, corr, tail = ids(tok, "a=1\n\nb=2\n\n"), ids(tok, "c=3\n\n"), ids(tok, "Answer") + [tok.eos_token_id]
    assert t.completion_ids == kept + corr + tail
    assert t.env_mask == [1] * len(kept) + [0] * len(corr) + [1] * len(tail)


def test_eos_inside_chunk_ends_the_rollout_and_revise_cuts_the_eos(tiny_tokenizer):
    tok = tiny_tokenizer
    t_keep = make_trajectory(3, intervened=True)
    run(tok, {3: [f"x=1{tok.eos_token}junk after eos"]}, [t_keep], KEEP_ALL)
    assert t_keep.completion_ids == ids(tok, "x=1") + [tok.eos_token_id] and t_keep.finished

    judge = FunctionJudge(lambda q, p, steps, r: 1 if "wrong" in "".join(steps) else None, lambda q, p, r: "fix\n\n")
    t_cut = make_trajectory(4, intervened=True)
    run(tok, {4: [f"ok\n\nwrong{tok.eos_token}", f"end{tok.eos_token}"]}, [t_cut], judge)
    expected = ids(tok, "ok\n\n") + ids(tok, "fix\n\n") + ids(tok, "end") + [tok.eos_token_id]
    assert t_cut.completion_ids == expected
    assert t_cut.completion_ids.count(tok.eos_token_id) == 1  # the cut EOS is gone; the policy stopped again


def test_length_cap_is_exact_and_bounds_corrections(tiny_tokenizer):
    tok = tiny_tokenizer
    judge = FunctionJudge(lambda q, p, steps, r: 0, lambda q, p, r: "9 " * 50)  # always revise step 0
    t = make_trajectory(1, intervened=True, budget=1)
    policy, _ = run(
        tok,
        {1: ["1 1 1 1", "2 2 2 2 2 2 2 2 2 2 2 2"]},
        [t],
        judge,
        chunk_size=4,
        max_completion_length=10,
        max_correction_tokens=6,
    )
    assert len(t.completion_ids) == 10
    assert t.env_mask[:6] == [0] * 6 and t.env_mask[6:] == [1] * 4  # correction capped at 6, rest is policy
    assert policy.calls[1][0][1] == 4  # review budget spent: the rest (10 - 6 tokens) in one call


def test_review_cap_then_rest_in_one_call(tiny_tokenizer):
    tok = tiny_tokenizer
    reviews = []
    judge = FunctionJudge(lambda q, p, steps, r: reviews.append(steps) or None, lambda q, p, r: "")
    t = make_trajectory(2, intervened=True, budget=2)
    policy, counts = run(
        tok, {2: ["a a", "b b", f"c c c c c{tok.eos_token}"]}, [t], judge, chunk_size=2, max_completion_length=40
    )
    assert len(reviews) == 2 and t.reviews == 2
    assert [call[0][1] for call in policy.calls] == [2, 2, 36]  # two reviewed chunks, then the remaining budget
    assert counts.rounds == 3 and t.finished


class FailingJudge(Judge):
    def __init__(self, verdict: Verdict, correction: Correction | None = None):
        self.verdict, self.correction = verdict, correction or Correction("never used")

    def review(self, requests):
        return [self.verdict for _ in requests]

    def correct(self, requests):
        return [self.correction for _ in requests]


@pytest.mark.parametrize(
    "judge",
    [
        FailingJudge(Verdict(failed=True)),  # unparseable / timeout
        FailingJudge(Verdict(wrong_step=7)),  # out of range
        FailingJudge(Verdict(wrong_step=0), Correction(failed=True)),  # correction failed
    ],
)
def test_judge_failures_count_as_keep(tiny_tokenizer, judge):
    tok = tiny_tokenizer
    t = make_trajectory(6, intervened=True)
    run(tok, {6: [f"a\n\nb{tok.eos_token}"]}, [t], judge)
    assert t.completion_ids == ids(tok, "a\n\nb") + [tok.eos_token_id]
    assert t.env_mask == [1] * len(t.completion_ids)
    assert (t.judge_failures, t.revisions, t.finished) == (1, 0, True)


def test_controls_never_see_the_judge(tiny_tokenizer):
    tok = tiny_tokenizer

    class ExplodingJudge(Judge):
        def review(self, requests):
            raise AssertionError("controls must not be reviewed")

        correct = review

    t = make_trajectory(8, intervened=False)
    policy, counts = run(tok, {8: [f"x{tok.eos_token}"]}, [t], ExplodingJudge(), max_completion_length=30)
    assert policy.calls[0][0][1] == 30 and counts.review_calls == 0 and t.reviews == 0


@pytest.mark.parametrize("batch", [2, 32])
def test_engine_and_judge_calls_per_round_do_not_grow_with_batch(tiny_tokenizer, batch):
    tok = tiny_tokenizer
    judge = FunctionJudge(lambda q, p, steps, r: 0 if "bad" in steps[0] else None, lambda q, p, r: "good\n\n")
    scripts, trajectories = {}, []
    for key in range(10, 10 + batch):
        intervened = key % 2 == 0
        scripts[key] = ["bad\n\n", f"fine{tok.eos_token}"] if intervened else [f"plain{tok.eos_token}"]
        trajectories.append(make_trajectory(key, intervened))
    policy, counts = run(tok, scripts, trajectories, judge)
    assert (counts.rounds, counts.policy_calls, counts.review_calls, counts.correction_calls) == (2, 2, 2, 1)
    assert policy.sessions == 1  # one engine session (vLLM wake/sleep, ZeRO-3 gather) for all rounds
    assert len(policy.calls[0]) == batch and len(policy.calls[1]) == batch // 2  # finished rows leave the batch
    assert all(t.finished for t in trajectories)


def test_policy_tokens_after_judge_count_only_the_policys_after_the_last_correction():
    # policy, policy, judge, judge, policy, judge, policy, tool result, policy
    env_mask, judge_mask = [1, 1, 0, 0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 0, 1, 0, 0, 0]
    t = Trajectory(
        prompt_ids=[1], question="q", completion_ids=list(range(9)), env_mask=env_mask, judge_mask=judge_mask
    )
    assert t.policy_tokens_after_judge == 2  # not the tool result, nor the policy token between the corrections
    unrevised = Trajectory(prompt_ids=[1], question="q", completion_ids=[5, 6], env_mask=[1, 1], judge_mask=[0, 0])
    assert unrevised.policy_tokens_after_judge == 0


def test_a_correction_writing_the_final_answer_ends_the_rollout_when_asked(tiny_tokenizer):
    """`end_at_judge_answer`: a correction that writes a final answer closes the turn with the judge's EOS. One that
    writes no answer, one inside an open `<think>` (opened by the prompt's generation prompt) and every correction
    with the setting off hand the pen back, as does one that fills the budget (no room for the EOS)."""
    tok = tiny_tokenizer
    judge = FunctionJudge(
        lambda q, p, steps, r: 1 if "wrong" in "".join(steps) else None,
        lambda q, p, r: "the answer is 5\n" if "final" in p else "step\n",
    )
    think = ids(tok, "<think>\n")
    scripts = {
        1: ["final\nwrong"],
        2: ["final\nwrong", f"more{tok.eos_token}"],
        3: ["final\nwrong", f"more{tok.eos_token}"],
        4: ["first\nwrong", f"more{tok.eos_token}"],
    }
    answered, off, thinking, no_answer = (make_trajectory(key, intervened=True) for key in (1, 2, 3, 4))
    thinking.prompt_ids += think
    correction = ids(tok, "the answer is 5\n")
    policy, _ = run(tok, {k: v for k, v in scripts.items() if k != 2}, [answered, thinking, no_answer], judge,
                    chunk_size=16, end_at_judge_answer=True)  # fmt: skip
    assert answered.completion_ids == ids(tok, "final\n") + correction + [tok.eos_token_id]
    assert answered.judge_mask == [0] * len(ids(tok, "final\n")) + [1] * (len(correction) + 1)
    assert answered.ended_by_judge and answered.finished and answered.policy_tokens_after_judge == 0
    assert len(policy.calls) == 2 and [row[0][0] for row in policy.calls[1]] == [3, 4]  # it never wrote again
    for t in (thinking, no_answer):
        assert not t.ended_by_judge and t.completion_ids[-len(ids(tok, "more")) - 1 :] == ids(tok, "more") + [
            tok.eos_token_id
        ]
    run(tok, {2: scripts[2]}, [off], judge, chunk_size=16)
    assert not off.ended_by_judge and off.completion_ids == ids(tok, "final\n") + correction + ids(tok, "more") + [
        tok.eos_token_id
    ]
    full = make_trajectory(1, intervened=True)  # the correction takes the last tokens of the budget: no EOS fits
    run(tok, {1: ["final\nwrong"]}, [full], judge, chunk_size=16, end_at_judge_answer=True,
        max_completion_length=len(ids(tok, "final\n")) + len(correction))  # fmt: skip
    assert full.completion_ids == ids(tok, "final\n") + correction and not full.ended_by_judge and full.finished


def test_ending_at_the_judge_answer_needs_an_eos_token(tiny_tokenizer):
    class NoEos:  # a tokenizer without an EOS token, for an engine that stops at none
        eos_token_id = None

    engine = ScriptedPolicy(tiny_tokenizer, {})
    engine.eos_token_ids = []
    settings = dict(chunk_size=4, max_reviews=1, max_correction_tokens=4, max_completion_length=8)
    InterventionRollout(engine, None, NoEos(), RolloutSettings(**settings))  # off: nothing needs to close a turn
    with pytest.raises(ValueError, match="end_at_judge_answer=True ends a turn with the policy's EOS token"):
        InterventionRollout(engine, None, NoEos(), RolloutSettings(**settings, end_at_judge_answer=True))
