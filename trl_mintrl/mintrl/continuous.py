"""MInTRL's rollout without round barriers: every trajectory goes generate -> review -> correct at its
own pace.

The lock-step schedule (`InterventionRollout.run`) makes every trajectory wait, each round, for the longest
generation of the batch and then for the slowest judge answer, and leaves the policy engine idle while the judge
works. Here a trajectory's chunk is a request of the policy engine's running batch (continuous batching,
`GenerationEngine.stream`); the moment it finishes the chunk goes to the judge, and the policy keeps generating for
the others meanwhile. Judge calls run on worker threads (`JudgeQueue`), batched: every request that arrives while
the judge is busy goes into its next call.

While a chunk is under review the policy already writes the next one from the chunk's end (`speculate`): when
the judge keeps the chunk, which is most reviews, the next chunk is done or under way and the review's latency is
hidden; when it revises, the speculative chunk is aborted and its tokens are thrown away.

When the engine is full (more requests than its `max_num_seqs`), the stream admits waiting requests by priority
(`Admission`): the judge's own requests, then chunks the judge will review, then chunks no wait follows
(controls, and the rest of a trajectory after its last review), then speculative chunks. A trajectory that will
wait for the judge gets its chunk first, so its waits overlap work that never waits; a speculative chunk, which
may be thrown away, only takes a slot nothing else needs until the verdict keeps its prefix.

The per-trajectory steps (accept, cut, correct, append, votes, failures) are `InterventionRollout`'s own, so with a
greedy policy and a deterministic judge both schedules give the same trajectories (a speculative chunk continues
the same prefix with the same budget as the chunk asked for after the verdict); only the order in which
trajectories advance differs. All trajectory state is changed on the calling thread: the engine's and the judge's
answers come back as events on one queue.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from enum import IntEnum

from ..engines.base import Generation
from ..judges.base import Judge
from .rollout import InterventionRollout, PendingCorrection, PendingReview, RoundCounts, Trajectory


class JudgeQueue:
    """Batches the judge's work across trajectories: at most `judge.concurrent_batches` calls in flight on worker
    threads, each taking every waiting request of one kind (review or correct), oldest first.

    An endpoint judge keeps several batches in flight (each sends its requests concurrently); an in-process judge
    model and a function judge take one batch at a time, which grows while the previous one runs, so the backend
    still sees large batches. The self-judge's batches go through the policy engine's stream like any other request
    (`GenerationEngine.stream`). Only the owner thread calls `submit` and `finish`, so no state here is shared.
    """

    def __init__(self, judge: Judge, pool: ThreadPoolExecutor, post: Callable[[Callable[[], None]], None]):
        self.judge = judge
        self.pool = pool
        self.post = post  # hands a completion to the owner thread
        self.waiting: deque[tuple[str, list, Callable[[list], None]]] = deque()
        self.in_flight = 0
        self.calls = {"review": 0, "correct": 0}

    def submit(self, kind: str, requests: list, on_answers: Callable[[list], None]) -> None:
        """Queue `requests` (`kind` is "review" or "correct"); `on_answers` gets their answers on the owner thread."""
        self.waiting.append((kind, requests, on_answers))
        self._dispatch()

    def _dispatch(self) -> None:
        while self.waiting and self.in_flight < max(1, self.judge.concurrent_batches):
            kind = self.waiting[0][0]
            batch = [item for item in self.waiting if item[0] == kind]
            self.waiting = deque(item for item in self.waiting if item[0] != kind)
            requests = [r for _, item_requests, _ in batch for r in item_requests]
            self.in_flight += 1
            self.calls[kind] += 1
            future = self.pool.submit(getattr(self.judge, kind), requests)
            future.add_done_callback(lambda f, kind=kind, batch=batch: self.post(lambda: self._finish(kind, batch, f)))

    def _finish(self, kind: str, batch: list, future: Future) -> None:
        self.in_flight -= 1
        answers = future.result()  # a judge that raises (a bug, not a failed item) stops the rollout, as lock-step
        expected = sum(len(requests) for _, requests, _ in batch)
        if len(answers) != expected:
            raise RuntimeError(f"{self.judge!r} returned {len(answers)} answers for {expected} {kind} requests")
        start = 0
        for _, requests, on_answers in batch:
            on_answers(answers[start : start + len(requests)])
            start += len(requests)
        self._dispatch()


class Admission(IntEnum):
    """Stream priorities of the rollout's requests, admitted lowest first when the engine is full. A judge's
    requests through the policy engine (the self-judge) are submitted by `generate` at priority 0."""

    REVIEWED = 1  # a chunk the judge will review: the trajectory waits for the judge after it
    UNREVIEWED = 2  # a control's completion, or a trajectory's rest after its last review: nothing waits on it
    SPECULATIVE = 3  # a next chunk asked for during a review: thrown away if the judge revises


@dataclass
class Speculation:
    """A next chunk asked for while its prefix is under review. Whichever comes second, the chunk or the verdict
    that keeps the prefix, takes the chunk (both run on the owner thread, so exactly one of them sees the other)."""

    future: Future
    chunk: Generation | None = None  # set when it arrives
    kept: bool = False  # set when the verdict keeps the prefix


class ContinuousRollout(InterventionRollout):
    """`InterventionRollout` on an engine with continuous batching (`policy.supports_streaming`): same arguments
    (and `speculate`: ask for the next chunk while a chunk is under review; `prioritize`: admit by `Admission`
    when the engine is full, else in arrival order), same trajectories for a greedy policy and a deterministic
    judge, no round barriers.

    `run` returns `RoundCounts` with `rounds` 0, `policy_calls` the chunk requests (speculative ones included),
    `speculative_calls` / `speculative_kept` and `review_calls` / `correction_calls` the batched judge calls;
    `policy_busy_seconds` is the time the engine spent stepping.
    """

    def __init__(self, *args, speculate: bool = True, prioritize: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.policy.supports_streaming:
            raise ValueError(f"{type(self.policy).__name__} has no continuous batching: use InterventionRollout.")
        self.speculate = speculate
        self.prioritize = prioritize  # False: a full engine admits in arrival order (the benchmark's reference)
        self.policy_busy_seconds = 0.0

    def run(self, trajectories: Sequence[Trajectory]) -> RoundCounts:
        if self.judge is None and any(t.review_budget > 0 for t in trajectories):
            raise ValueError("trajectories with a review budget need a judge")
        self.counts = RoundCounts()
        self.speculations: dict[int, Speculation] = {}  # id(trajectory) -> its next chunk, asked for ahead
        self.events: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.unfinished = len(trajectories)
        workers = 1 if self.judge is None else max(1, self.judge.concurrent_batches)
        wake = lambda: self.events.put(lambda: None)  # noqa: E731 (a request from a judge thread: go step it)
        # Exit order matters: the streams close first (failing any judge request still waiting on an engine), then
        # the pool joins its threads; nothing started here outlives `run`.
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mintrl-judge") as pool, ExitStack() as open_:
            streams = [open_.enter_context(engine.stream(wake)) for engine in self._streaming_engines()]
            self.stream = streams[0]
            self.judges = None if self.judge is None else JudgeQueue(self.judge, pool, self.events.put)
            for t in trajectories:
                self._next_chunk(t)
            while self.unfinished:
                busy = [stream for stream in streams if stream.has_work()]
                for stream in busy:
                    stream.step()
                if not busy:  # only the judge is working: wait for its answer (or a request it sends an engine)
                    self.events.get()()
                self._drain()
            self.policy_busy_seconds = self.stream.busy_seconds
        if self.judges is not None:
            self.counts.review_calls = self.judges.calls["review"]
            self.counts.correction_calls = self.judges.calls["correct"]
        return self.counts

    def _streaming_engines(self) -> list:
        """The policy engine, and a judge's own engine (`GeneratingJudge.engine`, e.g. a second in-process vLLM)
        when it batches continuously: its requests, sent from the judge's thread, are stepped on this thread too,
        because in-process vLLM engines must not run forward passes from two threads at once (one global forward
        context). A judge engine without streaming (`transformers`) generates on the judge's thread."""
        judge_engine = getattr(self.judge, "engine", None)
        if judge_engine is not None and judge_engine is not self.policy and judge_engine.supports_streaming:
            return [self.policy, judge_engine]
        return [self.policy]

    def _drain(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            event()

    def _next_chunk(self, t: Trajectory) -> None:
        """Ask the policy for the trajectory's next chunk, or count it finished."""
        if t.finished or self._remaining(t) <= 0:
            t.finished = True
            self.unfinished -= 1
            return
        self.counts.policy_calls += 1
        future = self.stream.submit(self.next_prompt(t), self.chunk_cap(t), priority=self._chunk_priority(t))
        future.add_done_callback(lambda f: self.events.put(lambda: self._on_chunk(t, f.result())))

    def _priority(self, admission: Admission) -> int:
        return int(admission) if self.prioritize else 0

    def _chunk_priority(self, t: Trajectory) -> int:
        """The priority of `t`'s next chunk: reviewed while reviews remain, else nothing waits on it."""
        return self._priority(Admission.REVIEWED if self._reviewable(t) else Admission.UNREVIEWED)

    def _on_chunk(self, t: Trajectory, chunk: Generation) -> None:
        pending = self.take_chunk(t, chunk)
        if pending is None:
            self._next_chunk(t)
            return
        self.judges.submit("review", self.review_requests(pending), lambda v: self._on_verdicts(pending, v))
        if self.speculate:
            self._speculate(pending)

    def _speculate(self, pending: PendingReview) -> None:
        """Ask for the chunk that follows `pending`'s if the judge keeps it (none when keeping it ends the
        trajectory: EOS, or no budget left)."""
        t, chunk = pending.trajectory, pending.chunk
        cap = self.chunk_cap(t, ahead=chunk)
        if not chunk.token_ids or self._ends_with_eos(chunk.token_ids) or cap <= 0:
            return
        self.counts.policy_calls += 1
        self.counts.speculative_calls += 1
        t.speculative_chunks += 1
        prompt = self.next_prompt(t) + chunk.token_ids
        speculation = Speculation(self.stream.submit(prompt, cap, priority=self._priority(Admission.SPECULATIVE)))
        self.speculations[id(t)] = speculation
        speculation.future.add_done_callback(
            lambda f: self.events.put(lambda: self._on_speculative_chunk(t, speculation))
        )

    def _on_speculative_chunk(self, t: Trajectory, speculation: Speculation) -> None:
        if speculation.future.cancelled():
            return
        speculation.chunk = speculation.future.result()
        if speculation.kept:
            self._on_chunk(t, speculation.chunk)

    def _on_verdicts(self, pending: PendingReview, verdicts: list) -> None:
        t = pending.trajectory
        cut = self.take_verdicts(pending, verdicts)
        speculation = self.speculations.pop(id(t), None)
        if speculation is not None and cut is None and not t.finished:
            self.counts.speculative_kept += 1
            t.speculative_kept += 1
            speculation.kept = True
            if speculation.chunk is not None:
                self._on_chunk(t, speculation.chunk)
            else:  # now the trajectory's next chunk: if it is still waiting, it waits as one
                self.stream.promote(speculation.future, self._chunk_priority(t))
            return
        if speculation is not None:  # the judge revised the prefix (or keeping it ended the trajectory)
            self.stream.cancel(speculation.future)
        if cut is None:
            self._next_chunk(t)
        else:
            self.judges.submit("correct", [self.correction_request(cut)], lambda c: self._on_correction(cut, c[0]))

    def _on_correction(self, cut: PendingCorrection, correction) -> None:
        self.take_correction(cut, correction)
        self._next_chunk(cut.trajectory)


def rollout_for(
    policy, judge: Judge | None, tokenizer, settings, schedule: str = "auto", speculate: bool = True
) -> InterventionRollout:
    """The rollout of `schedule`: "continuous" (refused on an engine without continuous batching; `speculate`: next
    chunks asked for during reviews), "barrier" (the lock-step reference), or "auto" (continuous where the engine
    supports it)."""
    if schedule == "barrier" or (schedule == "auto" and not policy.supports_streaming):
        return InterventionRollout(policy, judge, tokenizer, settings)
    return ContinuousRollout(policy, judge, tokenizer, settings, speculate=speculate)


def check_rollout_schedule(args) -> None:
    """Refuse, at trainer construction, `rollout_schedule="continuous"` where the policy engine cannot batch
    continuously: `transformers` generate, vLLM server mode, a vLLM tensor-parallel group."""
    if args.rollout_schedule != "continuous":
        return
    if not args.use_vllm or args.vllm_mode != "colocate" or args.vllm_tensor_parallel_size > 1:
        raise ValueError(
            "rollout_schedule='continuous' needs a policy engine with continuous batching: use_vllm=True, "
            "vllm_mode='colocate', vllm_tensor_parallel_size=1. transformers generate, vLLM server mode and "
            "tensor-parallel groups run lock-step rounds: use rollout_schedule='barrier' (or 'auto')."
        )
