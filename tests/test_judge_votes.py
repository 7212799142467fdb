"""Judges that vote (`judge_votes`, `judge_min_agree`): the tally, the rollout asking k reviews in one judge call for
every backend, the default being today's single review, and the trainer's metrics and validation."""

from __future__ import annotations

import pytest
from mintrl_helpers import CORRECTION, mintrl_args, role_reward
from test_judges import ScriptedEngine
from test_mintrl_rollout import ids, make_trajectory, run

from trl_mintrl import MInTRLTrainer
from trl_mintrl.judges import Correction, FunctionJudge, GeneratingJudge, Judge, Verdict
from trl_mintrl.judges.base import VoteTally, tally_votes


@pytest.mark.parametrize(
    "verdict, expected",
    [
        (Verdict(None), VoteTally(None, usable=1, agreeing=1, failures=0, vetoed=False)),
        (Verdict(1), VoteTally(1, usable=1, agreeing=1, failures=0, vetoed=False)),
        (Verdict(failed=True), VoteTally(None, usable=0, agreeing=0, failures=1, vetoed=False)),
        (Verdict(3), VoteTally(None, usable=0, agreeing=0, failures=1, vetoed=False)),  # out of range: fails
    ],
)
def test_one_vote_is_the_single_verdict(verdict, expected):
    assert tally_votes([verdict], num_steps=3, min_agree=1) == expected


def test_cut_at_the_smallest_step_that_min_agree_votes_reach():
    votes = [Verdict(2), Verdict(0), Verdict(None), Verdict(1)]
    assert tally_votes(votes, 3, min_agree=1) == VoteTally(0, 4, 1, 0, False)
    assert tally_votes(votes, 3, min_agree=2) == VoteTally(1, 4, 2, 0, False)  # votes 0 and 1 back a cut at 1
    assert tally_votes(votes, 3, min_agree=3) == VoteTally(2, 4, 3, 0, False)
    assert tally_votes(votes, 3, min_agree=4) == VoteTally(None, 4, 1, 0, True)  # 3 flags < 4: vetoed, kept
    abstaining = [Verdict(failed=True), Verdict(1), Verdict(9), Verdict(1)]
    assert tally_votes(abstaining, 3, min_agree=2) == VoteTally(1, 2, 2, 2, False)  # failures abstain
    assert tally_votes(abstaining[:3], 3, min_agree=2) == VoteTally(None, 1, 0, 2, True)


class RecordingJudge(Judge):
    """Answers review i of each call from `script` (by position in the call); records each call's requests."""

    def __init__(self, script):
        self.script, self.review_calls = script, []

    def review(self, requests):
        self.review_calls.append(requests)
        return [self.script(len(self.review_calls) - 1, i, r) for i, r in enumerate(requests)]

    def correct(self, requests):
        return [Correction("1+1=2\n\n") for _ in requests]


CHUNKS = ["1+1=3\n\n3+1=4\n\n", "x\n\ny"]


def test_k_copies_in_one_review_call_and_the_majority_cut(tiny_tokenizer):
    tok = tiny_tokenizer
    # first round: trajectory 7 gets votes [0, None, 0] (2 agree: cut at 0), trajectory 8 [1, None, None] (vetoed)
    first = {7: [Verdict(0), Verdict(None), Verdict(0)], 8: [Verdict(1), Verdict(None), Verdict(None)]}
    judge = RecordingJudge(lambda call, i, r: first[int(r.question[1:])][i % 3] if call == 0 else Verdict(None))
    t7, t8 = make_trajectory(7, True, budget=1), make_trajectory(8, True, budget=1)
    run(
        tok,
        {7: [CHUNKS[0], f"2+1=3{tok.eos_token}"], 8: [CHUNKS[0], f"z{tok.eos_token}"]},
        [t7, t8],
        judge,
        judge_votes=3,
        judge_min_agree=2,
    )
    assert len(judge.review_calls) == 1  # one call for both trajectories' 3 votes each
    assert [r.question for r in judge.review_calls[0]] == ["q7"] * 3 + ["q8"] * 3
    assert t7.completion_ids[: len(ids(tok, "1+1=2\n\n"))] == ids(tok, "1+1=2\n\n") and t7.revisions == 1
    assert (t7.votes_usable, t7.votes_agreeing, t7.vetoed) == (3, 2, 0)
    assert t8.revisions == 0 and (t8.votes_usable, t8.votes_agreeing, t8.vetoed) == (3, 2, 1)
    assert t8.env_mask == [1] * len(t8.completion_ids)


@pytest.mark.parametrize("votes", [1, 3])
def test_unanimous_votes_and_the_default_match_a_single_review(tiny_tokenizer, votes):
    """Defaults (one vote, min_agree 1) send one request per chunk; k identical votes decide exactly the same."""
    tok = tiny_tokenizer
    script = {7: Verdict(0), 8: Verdict(failed=True), 9: Verdict(5), 10: Verdict(None)}
    judge = RecordingJudge(lambda call, i, r: script[int(r.question[1:])] if call == 0 else Verdict(None))
    trajectories = [make_trajectory(k, True, budget=1) for k in script]
    scripts = {k: [CHUNKS[0], f"2+1=3{tok.eos_token}"] for k in script}
    settings = {} if votes == 1 else dict(judge_votes=votes, judge_min_agree=1)
    run(tok, scripts, trajectories, judge, **settings)
    assert len(judge.review_calls[0]) == 4 * votes
    chunk, tail = ids(tok, CHUNKS[0]), ids(tok, "2+1=3") + [tok.eos_token_id]
    correction = ids(tok, "1+1=2\n\n")
    assert trajectories[0].completion_ids == correction + tail  # cut at step 0, corrected
    for t in trajectories[1:]:
        assert t.completion_ids == chunk + tail and t.revisions == 0
    assert [t.judge_failures for t in trajectories] == [0, votes, votes, 0]  # failed and out-of-range votes count


def test_function_judge_is_called_k_times_and_generating_judge_once_with_k_copies(tiny_tokenizer):
    tok = tiny_tokenizer
    calls = []
    function_judge = FunctionJudge(lambda q, p, steps, ref: calls.append(q) or None, lambda q, p, r: "")
    run(tok, {7: [f"a\n\nb{tok.eos_token}"]}, [make_trajectory(7, True)], function_judge, judge_votes=4)
    assert calls == ["q7"] * 4

    engine = ScriptedEngine(tok, lambda prompt: "VERDICT: KEEP")
    judge = GeneratingJudge(engine, tok, max_review_tokens=16, temperature=0.8)
    trajectories = [make_trajectory(k, True) for k in (7, 8)]
    run(tok, {k: [f"a\n\nb{tok.eos_token}"] for k in (7, 8)}, trajectories, judge, judge_votes=3, judge_min_agree=2)
    assert len(engine.calls) == 1  # one engine call: 2 chunks x 3 votes, sampled at the judge temperature
    prompt_ids, _, temperature = engine.calls[0]
    assert len(prompt_ids) == 6 and prompt_ids[0] == prompt_ids[2] != prompt_ids[3] and temperature == 0.8


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(judge_votes=0), "judge_votes must be >= 1"),
        (dict(judge_votes=2, judge_min_agree=3), "judge_min_agree=3 must be between 1 and judge_votes=2"),
        (dict(judge_votes=2, judge_min_agree=0), "judge_min_agree=0 must be between 1"),
    ],
)
def test_vote_settings_are_validated(cpu_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        mintrl_args(cpu_args, **overrides)


def test_votes_of_a_greedy_model_judge_are_refused_before_loading(cpu_args, toy_dataset):
    args = mintrl_args(cpu_args, judge_votes=3, judge_min_agree=2)  # judge="self", judge_temperature=0.0
    with pytest.raises(ValueError, match="judge_votes=3 with judge_temperature = 0"):
        MInTRLTrainer(model="not/loaded", reward_funcs=role_reward, args=args, train_dataset=toy_dataset)


def test_trainer_logs_agreement_and_vetoed_revisions(tiny_model_path, cpu_args, toy_dataset):
    first_chunk_votes, corrections = [], []

    def review(question, prefix, steps, reference):  # one vote in three flags the first chunk: always vetoed
        if prefix:
            return None
        first_chunk_votes.append(question)
        return 0 if len(first_chunk_votes) % 3 == 1 else None

    judge = FunctionJudge(review, lambda q, p, r: corrections.append(q) or CORRECTION)
    args = mintrl_args(cpu_args, judge_votes=3, judge_min_agree=2)
    trainer = MInTRLTrainer(
        model=tiny_model_path, reward_funcs=role_reward, args=args, train_dataset=toy_dataset, judge=judge
    )
    trainer.train()
    assert corrections == [] and len(first_chunk_votes) % 3 == 0 and first_chunk_votes
    logs = [e for e in trainer.state.log_history if "mintrl/vetoed_revisions" in e]
    assert len(logs) == 2
    assert sum(e["mintrl/vetoed_revisions"] for e in logs) == len(first_chunk_votes) // 3
    assert all(2 / 3 <= e["mintrl/vote_agreement"] < 1 for e in logs)  # 2 of 3 agree on first chunks, 3 of 3 later
    assert all(e["mintrl/judge_token_frac"] == 0.0 for e in logs)


def test_endpoint_judge_sends_k_requests_and_the_votes_decide(tiny_tokenizer, monkeypatch):
    """Three review requests per chunk reach a real local server, at the judge temperature; two say REVISE 1."""
    from openai_server import ScriptedServer

    from trl_mintrl.judges import EndpointJudge

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    def respond(question, attempt, body):
        if "VERDICT" not in body["messages"][0]["content"]:
            return 200, "1+1=2\n\n", 0.0  # the correction
        return 200, "VERDICT: KEEP" if attempt == 3 else "Step 1 is wrong.\nVERDICT: REVISE 1", 0.0

    server = ScriptedServer(respond)
    try:
        judge = EndpointJudge(server.url, "judge", api_key_env=None, temperature=0.7, max_retries=0)
        t = make_trajectory(7, True, budget=1)
        run(
            tiny_tokenizer,
            {7: [CHUNKS[0], f"2+1=3{tiny_tokenizer.eos_token}"]},
            [t],
            judge,
            judge_votes=3,
            judge_min_agree=2,
        )
    finally:
        server.close()
    reviews = [body for _, body in server.requests if "VERDICT" in body["messages"][0]["content"]]
    assert len(reviews) == 3 and all(body["temperature"] == 0.7 for body in reviews)
    assert len(server.requests) == 4  # and one correction
    assert (t.revisions, t.votes_usable, t.votes_agreeing, t.vetoed) == (1, 3, 2, 0)
    assert t.completion_ids[: len(ids(tiny_tokenizer, "1+1=2\n\n"))] == ids(tiny_tokenizer, "1+1=2\n\n")
