"""MInTRL's semi-on-policy rollout as an engine-agnostic, batched state machine.

Each round advances every unfinished trajectory together: one policy `generate` call for the batch, one judge
`review` call for the trajectories that still have reviews left, one judge `correct` call for those the judge
revised. Finished trajectories leave the batch. Completions are kept as token ids (token-in/token-out): policy
tokens exactly as sampled, the cut on a token boundary at or before the first wrong step, corrections tokenised
with the policy's tokenizer. Control trajectories are the same state machine with no reviews, so they never see
the judge and share the policy call of the first round.

Tool calling (TRL's `tools=` / `environment_factory=`, tools.py): a trajectory with an `environment` is a multi-turn
conversation. A turn ends where the policy stops (EOS) or the budget does, so a chunk never spans two turns. Only an
accepted turn reaches the environment: once its last chunk is kept (or reviews are spent), its tool calls run, as in
TRL's `_tool_call_loop` (at most `max_tool_calling_iterations` times; a result that would pass
`max_completion_length` or the model's length ends the rollout), their results are appended as environment tokens,
and the next turn starts. Nothing the environment saw is ever cut, so no environment is rolled back. A correction
may write a tool call: the turn it ends in runs it.

This lock-step schedule is the reference. The steps of one trajectory (`take_chunk`, `take_verdicts`,
`take_correction` and the requests they lead to) are separate methods, so the continuous schedule
(`continuous.ContinuousRollout`), where each trajectory advances on its own, runs exactly the same logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..engines.base import Generation, GenerationEngine
from ..judges.base import Correction, CorrectionRequest, Judge, ReviewRequest, Verdict, tally_votes
from ..rewards.math import writes_final_answer
from .steps import STEP_SPLITS, cut_point, split_steps
from .tools import ToolEnvironment


class Role(Enum):
    """Who wrote a completion token: the policy (regressed, anchored at its behaviour log-prob), the judge
    (regressed, anchored at kappa or the proxy) or the environment (tool results: no gradient, no anchor)."""

    POLICY = "policy"
    JUDGE = "judge"
    ENVIRONMENT = "environment"


@dataclass
class RolloutSettings:
    """Chunking and budgets: `chunk_size` policy tokens per reviewed chunk, `max_reviews` reviews per trajectory,
    corrections capped at `max_correction_tokens` policy tokens, completions at `max_completion_length` tokens.
    Each chunk gets `judge_votes` reviews (in the same judge call) and is cut only where `judge_min_agree` agree.
    A trajectory with tools runs them after at most `max_tool_calling_iterations` turns (None: no limit).
    `step_split` says where a chunk splits into steps (`split_steps`'s mode; `MInTRLConfig.step_split`).
    `end_at_judge_answer`: a correction that writes a final answer ends the turn (the config field of that name)."""

    chunk_size: int
    max_reviews: int
    max_correction_tokens: int
    max_completion_length: int
    judge_votes: int = 1
    judge_min_agree: int = 1
    max_tool_calling_iterations: int | None = None
    step_split: str = "line"
    end_at_judge_answer: bool = False

    def __post_init__(self):
        if self.step_split not in STEP_SPLITS:
            raise ValueError(f"step_split={self.step_split!r} is not one of {STEP_SPLITS}.")


@dataclass
class Trajectory:
    """One rollout in progress. `review_budget` is 0 for control rollouts. `env_mask` is 1 on policy tokens and 0
    on the others (TRL's `env_mask`: judge and environment tokens); `judge_mask` is 1 on judge tokens; `logprobs`
    holds the engine's sampling log-probs (None on judge and environment tokens, or no list at all when the engine
    does not report them). With an `environment` (tools), `turn_start` is where the current assistant turn starts
    in `completion_ids`, `messages` the conversation's parsed turns and tool results (TRL's completion messages),
    `tool_calls` / `tool_failures` the calls made and those that failed (TRL's `tools/*` metrics). `judge_failures` counts unusable answers (each failed review vote, each failed
    correction); `votes_usable` / `votes_agreeing` / `vetoed` count the review votes and the revisions voted down;
    `speculative_chunks` / `speculative_kept` count the next chunks the continuous schedule asked for while this
    trajectory's chunk was under review, and those it used (the judge kept the chunk). `ended_by_judge`: a correction
    that wrote the final answer ended it (`RolloutSettings.end_at_judge_answer`)."""

    prompt_ids: list[int]
    question: str
    reference: str | None = None
    review_budget: int = 0
    environment: ToolEnvironment | None = None
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    judge_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] | None = field(default_factory=list)
    reviews: int = 0
    revisions: int = 0
    judge_failures: int = 0
    votes_usable: int = 0
    votes_agreeing: int = 0
    vetoed: int = 0
    speculative_chunks: int = 0
    speculative_kept: int = 0
    turn_start: int = 0
    messages: list[dict] = field(default_factory=list)
    tool_iterations: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    ended_by_judge: bool = False
    finished: bool = False

    @property
    def judge_tokens(self) -> int:
        return sum(self.judge_mask)

    @property
    def written_tokens(self) -> int:
        """Policy and judge tokens: the completion without the environment's."""
        return sum(self.env_mask) + self.judge_tokens

    @property
    def policy_tokens_after_judge(self) -> int:
        """Policy tokens written after the judge's last token (0 when the judge wrote none): the part of a revised
        rollout that no review saw after the last correction, yet shares the rollout's reward."""
        last = max((i for i, judge in enumerate(self.judge_mask) if judge), default=len(self.judge_mask))
        return sum(self.env_mask[last + 1 :])


@dataclass
class PendingReview:
    """A trajectory waiting for the judge's verdicts on its new chunk, split into `steps`."""

    trajectory: Trajectory
    chunk: Generation
    steps: list[str]


@dataclass
class PendingCorrection:
    """A trajectory waiting for a correction after the first `keep` tokens of its revised chunk."""

    trajectory: Trajectory
    chunk: Generation
    keep: int


@dataclass
class RoundCounts:
    """Engine and judge calls made by a `run`, for tests and cost metrics."""

    rounds: int = 0
    policy_calls: int = 0
    review_calls: int = 0
    correction_calls: int = 0
    speculative_calls: int = 0  # continuous schedule: next chunks asked for while their prefix was under review
    speculative_kept: int = 0  # ... of which the judge kept the prefix, so the chunk was used


class InterventionRollout:
    """Runs intervention (and control) trajectories to completion.

    Args:
        policy: the policy's generation engine (sampling settings of the trainer).
        judge: reviews and corrects; may be None when every trajectory is a control.
        tokenizer: the policy's tokenizer (decodes chunks for the judge, tokenises corrections).
        settings: chunk size and budgets.
    """

    def __init__(self, policy: GenerationEngine, judge: Judge | None, tokenizer, settings: RolloutSettings):
        self.policy = policy
        self.judge = judge
        self.tokenizer = tokenizer
        self.settings = settings
        self.eos_token_ids = set(policy.eos_token_ids)
        # the token a turn the judge ends closes with: the tokenizer's own EOS when the engine stops at it
        eos = getattr(tokenizer, "eos_token_id", None)
        self.end_token_id = eos if eos in self.eos_token_ids else min(self.eos_token_ids, default=eos)
        if settings.end_at_judge_answer and self.end_token_id is None:
            raise ValueError(
                "end_at_judge_answer=True ends a turn with the policy's EOS token, and neither the engine nor the "
                "tokenizer names one: set the tokenizer's eos_token, or end_at_judge_answer=False"
            )

    def run(self, trajectories: Sequence[Trajectory]) -> RoundCounts:
        if self.judge is None and any(t.review_budget > 0 for t in trajectories):
            raise ValueError("trajectories with a review budget need a judge")
        counts = RoundCounts()
        with self.policy.session():  # e.g. one vLLM wake/sleep or one ZeRO-3 gather for all rounds
            for t in trajectories:
                t.finished = t.finished or self._remaining(t) <= 0
            # A synchronized engine (vLLM tensor-parallel group, vLLM server) is called by all ranks of its group
            # together: a rank whose trajectories are done keeps joining each round and call while others work.
            while self.policy.any_rank(bool(active := [t for t in trajectories if not t.finished])):
                self._round(active, counts)
        return counts

    def _remaining(self, t: Trajectory) -> int:
        """Tokens the trajectory may still take: the completion budget, and with tools the model's length too. A
        tool-calling prompt (tool schemas, an environment's first observation) is not bounded by the prompt-length
        check, and an engine cannot continue a sequence that fills its context (vLLM refuses the request)."""
        remaining = self.settings.max_completion_length - len(t.completion_ids)
        if t.environment is not None:
            remaining = min(remaining, t.environment.max_model_len - len(t.prompt_ids) - len(t.completion_ids))
        return remaining

    def _reviewable(self, t: Trajectory) -> bool:
        return t.reviews < t.review_budget

    def _round(self, active: list[Trajectory], counts: RoundCounts) -> None:
        """One lock-step round: one policy call for every active trajectory, one review call for the chunks with
        steps to review, one correction call for the revised ones (each joined by every rank of a synchronized
        engine, or skipped by all of them)."""
        counts.rounds += 1
        chunks = self.policy.generate([self.next_prompt(t) for t in active], [self.chunk_cap(t) for t in active])
        counts.policy_calls += 1
        to_review = [pending for t, c in zip(active, chunks, strict=True) if (pending := self.take_chunk(t, c))]
        if not self.policy.any_rank(bool(to_review)):
            return
        votes = self.settings.judge_votes  # k copies of each request in the one call: sampled independently
        verdicts = self.judge.review([r for pending in to_review for r in self.review_requests(pending)])
        counts.review_calls += 1
        if len(verdicts) != len(to_review) * votes:
            raise RuntimeError(
                f"{self.judge!r} returned {len(verdicts)} verdicts for {len(to_review) * votes} reviews"
            )
        revise = [
            cut
            for i, pending in enumerate(to_review)
            if (cut := self.take_verdicts(pending, verdicts[i * votes : (i + 1) * votes]))
        ]
        if not self.policy.any_rank(bool(revise)):
            return
        corrections = self.judge.correct([self.correction_request(cut) for cut in revise])
        counts.correction_calls += 1
        for cut, correction in zip(revise, corrections, strict=True):
            self.take_correction(cut, correction)

    # ----------------------------------------------------------------------------------------------------------------
    # One trajectory's steps, shared by this lock-step schedule and the continuous one (continuous.py): each takes
    # one answer (a chunk, a chunk's verdicts, a correction) and says what the trajectory waits for next.

    def next_prompt(self, t: Trajectory) -> list[int]:
        return t.prompt_ids + t.completion_ids

    def chunk_cap(self, t: Trajectory, ahead: Generation | None = None) -> int:
        """A reviewed chunk while reviews remain; after them, the whole remaining budget in one piece. `ahead`: a
        chunk under review that the request continues (a speculative next chunk), counted as kept and reviewed."""
        remaining = self._remaining(t) - (0 if ahead is None else ahead.num_tokens)
        reviewable = t.reviews + (ahead is not None) < t.review_budget
        return min(self.settings.chunk_size, remaining) if reviewable else remaining

    def take_chunk(self, t: Trajectory, chunk: Generation) -> PendingReview | None:
        """A chunk to review, or None when it was accepted at once (no reviews left, or no text: only EOS)."""
        # the accepted prefix says whether the chunk starts inside a code block
        if not self._reviewable(t):
            steps = []
        else:
            steps = split_steps(self._decode(chunk.token_ids), self._turn_text(t), self.settings.step_split)
        if steps:
            return PendingReview(t, chunk, steps)
        self._accept(t, chunk)
        return None

    def review_requests(self, pending: PendingReview) -> list[ReviewRequest]:
        """`judge_votes` copies of the chunk's review request, sampled independently in the same judge call."""
        t, chunk = pending.trajectory, pending.chunk
        request = ReviewRequest(
            question=t.question,
            prefix=self._turn_text(t),
            steps=pending.steps,
            reference=t.reference,
            last_step_complete=self._ends_with_eos(chunk.token_ids),
            conversation=list(t.messages),
        )
        return [request] * self.settings.judge_votes

    def take_verdicts(self, pending: PendingReview, verdicts: Sequence[Verdict]) -> PendingCorrection | None:
        """Counts the chunk's votes; a kept chunk is accepted (None), a revised one waits for its correction."""
        t, chunk, steps = pending.trajectory, pending.chunk, pending.steps
        tally = tally_votes(verdicts, len(steps), self.settings.judge_min_agree)
        t.reviews += 1
        t.judge_failures += tally.failures
        t.votes_usable += tally.usable
        t.votes_agreeing += tally.agreeing
        t.vetoed += tally.vetoed
        if tally.wrong_step is None:
            self._accept(t, chunk)
            return None
        kept_chars = sum(len(s) for s in steps[: tally.wrong_step])
        return PendingCorrection(t, chunk, cut_point(chunk.token_ids, kept_chars, self._decode))

    def correction_request(self, cut: PendingCorrection) -> CorrectionRequest:
        t = cut.trajectory
        return CorrectionRequest(
            question=t.question,
            prefix=self._turn_text(t, cut.chunk.token_ids[: cut.keep]),
            reference=t.reference,
            conversation=list(t.messages),
        )

    def take_correction(self, cut: PendingCorrection, correction: Correction) -> None:
        """The kept part of the chunk, then the correction."""
        t, chunk, keep = cut.trajectory, cut.chunk, cut.keep
        # A failed correction (error, cut off by its cap, unclosed <think>) is never inserted. Keep the whole chunk
        # as if the judge had said KEEP: a cut with nothing after it would hand the policy the same prefix it wrote
        # the wrong step from, and it would likely write it again.
        if correction.failed:
            t.judge_failures += 1
            self._accept(t, chunk)
            return
        t.revisions += 1
        kept = Generation(chunk.token_ids[:keep], None if chunk.logprobs is None else chunk.logprobs[:keep])
        self._append(t, kept, Role.POLICY)
        correction_ids = self._correction_ids(correction.text, self._remaining(t))
        ends = self._ends_answer(t, correction_ids)
        self._append(t, Generation(correction_ids + ends), Role.JUDGE)
        t.ended_by_judge = t.ended_by_judge or bool(ends)
        self._settle(t, turn_over=bool(ends))

    def _ends_answer(self, t: Trajectory, correction_ids: list[int]) -> list[int]:
        """[EOS] when the correction, as inserted, writes a final answer outside an open `<think>` and
        `end_at_judge_answer` is on (and the budget holds one more token), else []: the reward reads the judge's
        answer, so anything the policy wrote after it would be rewarded unread."""
        if not self.settings.end_at_judge_answer or self._remaining(t) <= len(correction_ids):
            return []
        if not writes_final_answer(self._decode(correction_ids)):
            return []
        context = self._decode(t.prompt_ids + t.completion_ids + correction_ids)
        if context.rfind("<think>") > context.rfind("</think>"):
            return []  # an answer in the reasoning is not the final one
        return [self.end_token_id]

    def _accept(self, t: Trajectory, chunk: Generation) -> None:
        self._append(t, chunk, Role.POLICY)
        # an engine that returns nothing would otherwise loop forever on this trajectory
        self._settle(t, turn_over=not chunk.token_ids or self._ends_with_eos(chunk.token_ids))

    def _settle(self, t: Trajectory, turn_over: bool) -> None:
        """After an accepted piece: the turn is over when the policy stopped or the budget is spent; without an
        environment that ends the trajectory, with one its tool calls run first (`_end_turn`)."""
        turn_over = turn_over or self._remaining(t) <= 0
        if turn_over and t.environment is not None:
            self._end_turn(t)
        else:
            t.finished = turn_over

    def _end_turn(self, t: Trajectory) -> None:
        """An accepted assistant turn, as TRL's `_tool_call_loop` treats it: parsed; its tool calls run while
        iterations remain; their results appended as environment tokens unless they would pass the completion
        budget or the model's length (then, as in TRL, the results are dropped and the rollout ends)."""
        env = t.environment
        turn_ids = t.completion_ids[t.turn_start :]
        message = env.parse_turn(turn_ids, t.prompt_ids + t.completion_ids[: t.turn_start]) if turn_ids else {}
        if message or t.turn_start == 0:  # TRL keeps the first turn's message even when empty
            t.messages.append(message or {"role": "assistant", "content": ""})
        tool_calls = message.get("tool_calls")
        limit = self.settings.max_tool_calling_iterations
        t.finished = True
        if not tool_calls or (limit is not None and t.tool_iterations >= limit):
            return
        t.tool_iterations += 1
        results, failures = env.run(tool_calls)
        t.tool_calls += len(tool_calls)
        t.tool_failures += failures
        result_ids = env.result_ids(results)
        length = len(t.completion_ids) + len(result_ids)
        if length > self.settings.max_completion_length or len(t.prompt_ids) + length >= env.max_model_len:
            return
        t.messages.extend(results)
        self._append(t, Generation(result_ids), Role.ENVIRONMENT)
        t.turn_start = len(t.completion_ids)
        t.finished = self._remaining(t) <= 0

    def _append(self, t: Trajectory, piece: Generation, role: Role) -> None:
        policy = role is Role.POLICY
        t.completion_ids.extend(piece.token_ids)
        t.env_mask.extend([int(policy)] * piece.num_tokens)
        t.judge_mask.extend([int(role is Role.JUDGE)] * piece.num_tokens)
        if t.logprobs is not None:
            if policy and piece.logprobs is None:
                t.logprobs = None  # the engine does not report sampling log-probs
            else:
                t.logprobs.extend(piece.logprobs if policy else [None] * piece.num_tokens)

    def _turn_text(self, t: Trajectory, more: Sequence[int] = ()) -> str:
        """The current assistant turn's accepted text (the whole completion without tools), then `more`."""
        return self._decode(t.completion_ids[t.turn_start :] + list(more))

    def _correction_ids(self, text: str, remaining: int) -> list[int]:
        """Policy-tokenizer ids of a correction, without special tokens, capped by the budgets."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = [i for i in ids if i not in self.eos_token_ids]  # the policy decides when to stop
        return ids[: min(self.settings.max_correction_tokens, remaining)]

    def _ends_with_eos(self, ids: Sequence[int]) -> bool:
        return bool(ids) and ids[-1] in self.eos_token_ids

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
