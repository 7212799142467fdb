"""The continuous rollout (mintrl/continuous.py) against the lock-step reference, with a deterministic fake language
model that batches continuously (one token per running request per step) and deterministic judges."""

from __future__ import annotations

import threading
import time
import zlib
from array import array

import pytest

from trl_mintrl.engines.base import Generation, GenerationEngine, GenerationStream
from trl_mintrl.judges import Correction, FunctionJudge, Judge, Verdict
from trl_mintrl.mintrl.continuous import ContinuousRollout, rollout_for
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory

STATS = ("completion_ids", "env_mask", "logprobs", "reviews", "revisions", "judge_failures", "votes_usable",
         "votes_agreeing", "vetoed", "finished")  # fmt: skip


def _hash(ids) -> int:
    return zlib.crc32(array("H", ids).tobytes())


class FakeLM(GenerationEngine):
    """Greedy and deterministic: the next token is a hash of the whole context, so a trajectory's tokens do not
    depend on which schedule or batch produced them. Tokens are letters, newlines (steps at blank lines) and EOS
    (about one in 40: long-tailed lengths). `streaming=False` makes it an engine without continuous batching;
    `capacity` caps the requests its stream runs at once (vLLM's `max_num_seqs`); `step_seconds` makes each stream
    step take that long, as a real engine's does (the judge's threads answer while the engine works)."""

    def __init__(self, tokenizer, streaming: bool = True, capacity: int | None = None, step_seconds: float = 0.0):
        super().__init__([tokenizer.eos_token_id])
        letters = [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in "abcdefghijklmnop"]
        newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
        self.table = letters * 2 + [newline] * 6 + [tokenizer.eos_token_id]
        self.streaming = streaming
        self.capacity = capacity
        self.step_seconds = step_seconds
        self.sessions = 0
        self.blocking_calls = 0  # `_generate` calls: the lock-step path, never the stream's
        self.requests = 0  # prompts asked for: in `_generate` calls and stream submissions
        self.submitted: list[list[int]] = []  # the stream's request prompts, in submission order
        self.admitted: list[list[int]] = []  # the same, in the order the backend got them
        self.priorities: list[int] = []  # each submission's priority
        self.promotions = 0  # waiting requests given a new priority
        self.most_running = 0
        self.cancels = 0  # stream requests cancelled
        self.steps = 0
        self.running: dict[str, list] = {}  # the stream's requests: id -> [context, generated, cap]

    @property
    def supports_streaming(self) -> bool:
        return self.streaming

    def next_token(self, context: list[int]) -> int:
        return self.table[_hash(context) % len(self.table)]

    def complete(self, prompt: list[int], cap: int) -> Generation:
        out: list[int] = []
        while len(out) < cap and not (out and out[-1] in self.eos_token_ids):
            out.append(self.next_token(prompt + out))
        return Generation(out, [-(tok % 7) / 10 for tok in out])

    def _open_session(self):
        self.sessions += 1
        return super()._open_session()

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        self.blocking_calls += 1
        self.requests += len(prompt_ids)
        return [self.complete(p, m) for p, m in zip(prompt_ids, max_new_tokens, strict=True)]

    def _open_stream(self, wake):
        return FakeStream(self, wake, capacity=self.capacity)


class FakeStream(GenerationStream):
    """One token for every running request per step, like a continuously batched decode iteration."""

    def submit(self, prompt_ids, max_new_tokens, temperature=None, priority=0):
        self.engine.requests += 1
        self.engine.submitted.append(list(prompt_ids))
        self.engine.priorities.append(priority)
        return super().submit(prompt_ids, max_new_tokens, temperature, priority)

    def promote(self, future, priority):
        self.engine.promotions += any(entry[2] is future for entry in self._waiting)
        super().promote(future, priority)

    def _add(self, request_id, prompt_ids, max_new_tokens, temperature):
        self.engine.running[request_id] = [prompt_ids, [], max_new_tokens]
        self.engine.admitted.append(prompt_ids)
        self.engine.most_running = max(self.engine.most_running, len(self.engine.running))

    def _step(self):
        lm, finished = self.engine, []
        lm.steps += 1
        time.sleep(lm.step_seconds)
        for request_id, (prompt, out, cap) in list(lm.running.items()):
            out.append(lm.next_token(prompt + out))
            if len(out) >= cap or out[-1] in lm.eos_token_ids:
                finished.append((request_id, Generation(out, [-(tok % 7) / 10 for tok in out])))
                del lm.running[request_id]
        return finished

    def _abort(self, request_ids):
        for request_id in request_ids:
            del self.engine.running[request_id]

    def cancel(self, future):
        self.engine.cancels += 1
        super().cancel(future)


def hashed_judge(delay: float = 0.0, fail_every: int = 0, **kwargs) -> FunctionJudge:
    """Deterministic in its request alone: flags the step a hash picks (or keeps); `fail_every` makes some reviews
    and corrections fail (an out-of-range index, a non-string)."""

    def review(question, prefix, steps, reference):
        time.sleep(delay)
        h = _hash([ord(c) for c in prefix + "".join(steps)])
        if fail_every and h % fail_every == 0:
            return len(steps)  # out of range: a failed vote
        pick = h % (len(steps) + 2)
        return pick if pick < len(steps) else None

    def correct(question, prefix, reference):
        time.sleep(delay)
        h = _hash([ord(c) for c in prefix])
        if fail_every and h % fail_every == 1:
            return None  # a failed correction: the chunk is kept whole
        return f"fix{h % 97}\n\n"

    return FunctionJudge(review, correct, **kwargs)


def trajectories(n: int = 24, budget: int = 4) -> list[Trajectory]:
    """Half controls, half intervened, in one batch; prompts of different lengths."""
    return [
        Trajectory(prompt_ids=[3 + i] * (1 + i % 5), question=f"q{i}", review_budget=budget if i % 2 else 0)
        for i in range(n)
    ]


SETTINGS = dict(chunk_size=12, max_reviews=4, max_correction_tokens=6, max_completion_length=120)


def run_both(tok, judge, n=24, speculate=True, capacity=None, **settings):
    """Both schedules on the same trajectories; the continuous one asks for the lock-step one's chunks (same
    prompts, same caps: the same number of requests), plus the speculative chunks it dropped, each cancelled.
    `capacity`: the continuous engine runs at most that many requests at once."""
    settings = RolloutSettings(**{**SETTINGS, **settings})
    barrier, continuous = trajectories(n), trajectories(n)
    barrier_lm, lm = FakeLM(tok), FakeLM(tok, capacity=capacity)
    InterventionRollout(barrier_lm, judge, tok, settings).run(barrier)
    counts = ContinuousRollout(lm, judge, tok, settings, speculate=speculate).run(continuous)
    dropped = counts.speculative_calls - counts.speculative_kept
    assert lm.requests == counts.policy_calls == barrier_lm.requests + dropped and lm.cancels == dropped
    return barrier, continuous, lm, counts


def assert_same(barrier, continuous):
    for b, c in zip(barrier, continuous, strict=True):
        assert {k: getattr(c, k) for k in STATS} == {k: getattr(b, k) for k in STATS}


@pytest.mark.parametrize(
    "judge, settings",
    [
        (hashed_judge(), {}),
        (hashed_judge(fail_every=5), {}),  # failed votes and failed corrections
        (hashed_judge(), {"judge_votes": 3, "judge_min_agree": 2}),
        (hashed_judge(delay=0.002, concurrent_batches=3), {}),  # batches in flight together, finishing out of order
        (hashed_judge(), {"max_reviews": 1, "chunk_size": 5, "max_completion_length": 40}),
    ],
)
@pytest.mark.parametrize("speculate", [True, False])
@pytest.mark.parametrize("capacity", [None, 5])  # 5: a full engine, requests admitted by priority
def test_continuous_gives_the_lock_step_trajectories(tiny_tokenizer, judge, settings, speculate, capacity):
    barrier, continuous, lm, counts = run_both(
        tiny_tokenizer, judge, speculate=speculate, capacity=capacity, **settings
    )
    assert_same(barrier, continuous)
    assert lm.most_running == (capacity or len(continuous))
    assert sum(t.revisions for t in barrier) >= 3 and sum(t.reviews for t in barrier) >= 20  # the judge mattered
    assert len({len(t.completion_ids) for t in barrier}) > 5  # lengths spread
    assert lm.blocking_calls == 0 and lm.sessions == 1 and not lm.running  # all through one stream, nothing left
    assert counts.rounds == 0 and counts.review_calls < sum(t.reviews for t in continuous)  # reviews were batched
    if speculate:  # kept where the judge kept the chunk, dropped (and aborted: nothing left running) where it revised
        assert 0 < counts.speculative_kept < counts.speculative_calls
    else:
        assert counts.speculative_calls == 0


@pytest.mark.parametrize("verdict", ["keep", "revise"])
def test_speculative_chunks_are_used_when_the_judge_keeps_and_dropped_when_it_revises(tiny_tokenizer, verdict):
    """A slow judge: every chunk under review already has its successor asked for. A judge that keeps every chunk
    gets every speculative chunk used (the policy never waited for a verdict); one that revises every chunk gets
    none used, and the same trajectories as the lock-step schedule either way."""
    keep = verdict == "keep"

    def review(question, prefix, steps, reference):
        time.sleep(0.005)
        return None if keep else 0

    judge = FunctionJudge(review, lambda question, prefix, reference: "fix\n\n", concurrent_batches=2)
    barrier, continuous, lm, counts = run_both(tiny_tokenizer, judge, n=12)
    assert_same(barrier, continuous)
    reviews = sum(t.reviews for t in continuous)
    assert reviews >= 12 and not lm.running
    # a review is speculated on unless keeping its chunk ends the trajectory (EOS, budget), at most once per rollout
    intervened = sum(1 for t in continuous if t.review_budget)
    assert reviews - intervened <= counts.speculative_calls <= reviews
    assert counts.speculative_kept == (counts.speculative_calls if keep else 0)
    # per trajectory (what the trainer logs): the same totals, and none on a control
    assert sum(t.speculative_chunks for t in continuous) == counts.speculative_calls
    assert sum(t.speculative_kept for t in continuous) == counts.speculative_kept
    assert not any(t.speculative_chunks for t in continuous if not t.review_budget)


def test_cancelling_a_stream_request_drops_it_waiting_or_running(tiny_tokenizer):
    lm = FakeLM(tiny_tokenizer)
    with lm.stream() as stream:
        running, waiting = stream.submit([1, 2, 3], 50), stream.submit([4, 5], 50)
        stream.cancel(waiting)  # never admitted
        stream.step()
        assert list(lm.running.values()) == [[[1, 2, 3], [lm.next_token([1, 2, 3])], 50]]
        stream.cancel(running)
        assert not lm.running and not stream.has_work() and running.cancelled() and waiting.cancelled()


def test_a_chunk_is_reviewed_while_the_policy_generates_for_others(tiny_tokenizer):
    """The first review happens while a control's long completion is still running, and the policy takes steps
    while the judge works; the lock-step schedule would have waited for the control before any review."""
    tok = tiny_tokenizer
    seen = []

    class WatchingJudge(Judge):
        def __init__(self):
            self.inner = hashed_judge()

        def review(self, requests):
            running_at_start, steps_at_start = len(lm.running), lm.steps
            deadline = time.monotonic() + 5
            while lm.steps < steps_at_start + 3 and lm.running and time.monotonic() < deadline:
                time.sleep(0.001)  # the policy must keep stepping while this call is in progress
            seen.append((running_at_start, lm.steps - steps_at_start))
            return self.inner.review(requests)

        def correct(self, requests):
            return self.inner.correct(requests)

    lm = FakeLM(tok)
    ts = trajectories(8)
    ContinuousRollout(lm, WatchingJudge(), tok, RolloutSettings(**SETTINGS)).run(ts)
    assert seen[0][0] >= 1 and seen[0][1] >= 3  # a control still ran at the first review, and advanced meanwhile
    controls = [t for t in ts if not t.review_budget]
    assert max(len(t.completion_ids) for t in controls) > SETTINGS["chunk_size"]  # longer than a chunk


def test_a_full_stream_admits_by_priority_then_arrival(tiny_tokenizer):
    """Beyond `capacity` the stream keeps requests waiting and admits the lowest priority first, ties in arrival
    order; a promoted request moves up, a cancelled one is never admitted."""
    lm = FakeLM(tiny_tokenizer, capacity=2)
    with lm.stream() as stream:
        futures = {name: stream.submit([n], 1, priority=p) for n, (name, p) in
                   enumerate([("a", 2), ("b", 1), ("c", 3), ("d", 1), ("e", 0), ("f", 3), ("g", 2)])}  # fmt: skip
        stream.promote(futures["f"], 1)
        stream.cancel(futures["g"])
        while stream.has_work():
            stream.step()
            assert len(lm.running) <= 2
    order = "abcdefg"
    assert ["".join(order[p[0]] for p in lm.admitted)] == ["ebdfac"]
    assert futures["g"].cancelled() and all(futures[k].done() for k in "abcdef")


def test_a_full_engine_runs_reviewed_chunks_first_and_speculative_chunks_last(tiny_tokenizer):
    """With more trajectories than the engine runs at once, the chunks the judge will review (the intervened
    trajectories' first chunks) are admitted before the controls, and the controls before any speculative chunk;
    with `prioritize=False` the engine admits in arrival order. The trajectories keep their order either way."""
    tok, settings = tiny_tokenizer, RolloutSettings(**SETTINGS)
    for prioritize in (True, False):
        lm, ts = FakeLM(tok, capacity=3), trajectories(8)
        ContinuousRollout(lm, hashed_judge(), tok, settings, prioritize=prioritize).run(ts)
        intervened = [t.prompt_ids for t in ts if t.review_budget]
        controls = [t.prompt_ids for t in ts if not t.review_budget]
        first = [t.prompt_ids for t in ts]
        if prioritize:  # the intervened trajectories' next chunks may come before a control, too
            assert lm.admitted[:4] == intervened
            assert [p for p in lm.admitted if p in controls] == controls
        else:
            assert lm.admitted[:8] == first
        assert [t.question for t in ts] == [f"q{i}" for i in range(8)]
    # speculative chunks wait behind everything else, and one the judge keeps while it waits moves up
    lm, ts = FakeLM(tok, capacity=2, step_seconds=0.001), trajectories(24)
    counts = ContinuousRollout(lm, hashed_judge(), tok, settings).run(ts)
    assert lm.priorities.count(3) == counts.speculative_calls > 0 and set(lm.priorities) == {1, 2, 3}
    assert 0 < lm.promotions <= counts.speculative_kept


class EngineJudge(Judge):
    """Like `GeneratingJudge`: generates with `engine` (from the judge's worker thread in the continuous rollout)
    and derives its answers from the tokens, so routing through a stream must give the same tokens."""

    def __init__(self, engine: FakeLM):
        self.engine = engine

    def review(self, requests):
        outs = self.engine.generate([[5 + len(r.prefix) % 50, *range(6, 6 + len(r.steps))] for r in requests], 4, 0)
        picks = [(_hash(o.token_ids) % (len(r.steps) + 2), len(r.steps)) for r, o in zip(requests, outs, strict=True)]
        return [Verdict(pick if pick < steps else None) for pick, steps in picks]

    def correct(self, requests):
        outs = self.engine.generate([[7 + len(r.prefix) % 50] for r in requests], 3, 0)
        return [Correction(f"c{o.token_ids[0]}\n\n") for o in outs]


@pytest.mark.parametrize("own_engine", [False, True])
def test_judge_engine_requests_go_through_a_stream(tiny_tokenizer, own_engine):
    """The self-judge's requests join the policy's stream; a judge with its own streaming engine (a second
    in-process vLLM) gets its own stream, stepped by the rollout's thread."""
    tok = tiny_tokenizer
    settings = RolloutSettings(**SETTINGS)
    barrier_lm, lm = FakeLM(tok), FakeLM(tok)
    barrier_judge_lm, judge_lm = (FakeLM(tok), FakeLM(tok)) if own_engine else (barrier_lm, lm)
    barrier, continuous = trajectories(12), trajectories(12)
    InterventionRollout(barrier_lm, EngineJudge(barrier_judge_lm), tok, settings).run(barrier)
    ContinuousRollout(lm, EngineJudge(judge_lm), tok, settings).run(continuous)
    assert_same(barrier, continuous)
    assert sum(t.revisions for t in barrier) >= 2
    assert judge_lm.num_calls > 0 and judge_lm.blocking_calls == 0 and judge_lm.sessions == 1
    assert lm.blocking_calls == 0


def test_a_judge_that_raises_stops_the_rollout_and_leaves_no_thread(tiny_tokenizer):
    tok = tiny_tokenizer

    class Broken(Judge):
        def review(self, requests):
            raise ZeroDivisionError("bug in the judge")

        correct = review

    lm = FakeLM(tok)
    with pytest.raises(ZeroDivisionError):
        ContinuousRollout(lm, Broken(), tok, RolloutSettings(**SETTINGS)).run(trajectories(6))
    assert not lm.running  # the stream aborted what was still running
    assert not [t for t in threading.enumerate() if t.name.startswith("mintrl-judge")]


def test_closing_the_stream_fails_a_waiting_self_judge_request(tiny_tokenizer):
    """A judge thread blocked on a policy request must not wait forever when the rollout stops."""
    lm = FakeLM(tiny_tokenizer)
    with lm.stream() as stream:
        future = stream.submit([1, 2, 3], 50)
        stream.step()
        assert not future.done() and len(lm.running) == 1
    assert not lm.running
    with pytest.raises(RuntimeError, match="closed"):
        future.result(timeout=1)


def test_schedule_selection(tiny_tokenizer):
    tok, settings = tiny_tokenizer, RolloutSettings(**SETTINGS)
    streaming, plain = FakeLM(tok), FakeLM(tok, streaming=False)
    assert type(rollout_for(streaming, None, tok, settings)) is ContinuousRollout
    assert type(rollout_for(streaming, None, tok, settings, "barrier")) is InterventionRollout
    assert type(rollout_for(plain, None, tok, settings)) is InterventionRollout
    with pytest.raises(ValueError, match="no continuous batching"):
        rollout_for(plain, None, tok, settings, "continuous")
    with pytest.raises(NotImplementedError):
        plain.stream().__enter__()
