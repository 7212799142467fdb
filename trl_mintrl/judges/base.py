"""The batched judge interface that MInTRL's rollout loop calls.

One `review` call and one `correct` call per rollout round serve the whole batch of trajectories. A judge never
raises for a single bad item: a failed item (timeout, HTTP error, unparseable or out-of-range verdict, exception in
user code) comes back marked `failed`, and the rollout loop treats it as KEEP and counts it. A judge behind a server
also reports how many of its requests got no answer at all (`transport_status`), so that the trainer can tell an
unreachable judge from one whose answers are unusable.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class ReviewRequest:
    """Review the new steps of one trajectory.

    Attributes:
        question: the prompt text (for conversational prompts, the content of the last user message).
        prefix: the completion text accepted so far (judge corrections included); with tools, that of the current
            assistant turn.
        steps: the new chunk split into steps; `"".join(steps)` is the chunk's text.
        reference: the reference solution, when the dataset has one (privileged context for the judge).
        last_step_complete: False when the chunk was cut by the chunk size, so its last step may be unfinished and
            must not be flagged merely for being incomplete.
        conversation: with tools, the rollout's earlier assistant turns (TRL's parsed messages, with their
            `tool_calls`) and tool results (`{"role": "tool", "name", "content"}`), oldest first; empty otherwise.
    """

    question: str
    prefix: str
    steps: list[str]
    reference: str | None = None
    last_step_complete: bool = True
    conversation: list[dict] = field(default_factory=list)


@dataclass
class CorrectionRequest:
    """Write the next short piece of a trajectory, continuing `prefix` (already cut before the wrong step; with
    tools, the current assistant turn, after the `conversation` as in `ReviewRequest`). The piece may be a tool
    call in the policy's format: it runs when its turn ends."""

    question: str
    prefix: str
    reference: str | None = None
    conversation: list[dict] = field(default_factory=list)


# the parsed message's reasoning field: `reasoning_content` (Qwen3, GLM-4, DeepSeek-R1, Nemotron 3, Gemma 4), `thinking`
# (gpt-oss, LFM2.5); TRL's response templates name one or the other
_REASONING_KEYS = ("reasoning_content", "thinking")


def conversation_text(conversation: list[dict], prefix: str, reasoning: bool = True) -> str:
    """A rollout's earlier turns and tool results, then the current turn's `prefix`, as a plain transcript for a
    judge prompt; `prefix` alone without a conversation (single-turn rollouts).

    The messages are TRL's parsed turns (`parse_response`: `content`, the reasoning under `reasoning_content` or
    `thinking`, `tool_calls`) and tool results (`{"role": "tool", "name", "content"}`). Each earlier turn is an
    `[assistant]` block (its content, then one `[tool call] name(arguments)` line per call, the arguments as JSON
    whether the parser gave a dict or a JSON string), after an `[assistant reasoning]` block when the turn has
    reasoning; each result is a `[tool result: name]` block; content given as a list of parts shows its text parts.
    A turn whose parse failed (a malformed tool call: TRL keeps the raw text as `content`) has its `<think>` block
    split off as Qwen3's template splits it.

    Earlier turns' reasoning is shown by default (`reasoning=False` leaves it out): the policy wrote the current turn
    with it in its context (the rollout appends tokens, nothing is re-rendered), and Qwen3's template keeps the
    reasoning of every assistant turn after the last user message, which is all of a tool-calling rollout (it drops
    only the reasoning of turns before a user message). A step of the current turn may build on it, and the judge
    sees the current turn's own reasoning anyway.

    The current turn's `prefix` is shown verbatim, as the policy wrote it after the generation prompt: the review's
    steps are cut from the same text and a correction is appended to it as is. For a thinking policy it starts with
    the policy's `<think>` (Qwen3 with thinking on), or inside the block without the tag when the chat template
    opens it in the generation prompt (Qwen3-Thinking-2507, DeepSeek-R1), and has no block when thinking is off (the
    template's empty block is in the prompt). A judge that ends the thinking to call a tool writes `</think>` first:
    a `<tool_call>` inside an open block is parsed as reasoning and not run.
    """
    if not conversation:
        return prefix
    blocks = []
    for message in conversation:
        role = message.get("role") or "assistant"
        content = _content_text(message.get("content"))
        if role == "tool":
            name = message.get("name")
            blocks.append(f"[tool result{f': {name}' if name else ''}]\n{content}")
            continue
        thought = next((message[k] for k in _REASONING_KEYS if isinstance(message.get(k), str)), None)
        if thought is None and "</think>" in content:  # raw text: split as Qwen3's template does
            thought = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        thought = (thought or "").strip("\n")
        if reasoning and thought.strip():
            blocks.append(f"[{role} reasoning]\n{thought}")
        calls = [
            f"[tool call] {call['function']['name']}({_arguments_text(call['function'].get('arguments'))})"
            for call in message.get("tool_calls") or []
            if call.get("type", "function") == "function" and call.get("function")
        ]
        blocks.append("\n".join([f"[{role}]", *([content] if content else []), *calls]))
    blocks.append(f"[assistant, current turn]\n{prefix}")
    return "\n\n".join(blocks)


def _content_text(content) -> str:
    """A message's content as text: a string as is, a list of parts as its text parts (other parts as `[type]`)."""
    if content is None:
        return ""
    if isinstance(content, list):
        parts = [part if isinstance(part, dict) else {"type": "text", "text": part} for part in content]
        return "\n".join(
            str(part.get("text", "")) if part.get("type", "text") == "text" else f"[{part['type']}]" for part in parts
        )
    return str(content)


def _arguments_text(arguments) -> str:
    """Tool-call arguments as JSON: a dict encoded, a JSON string (what some parsers return) decoded first so that
    it is not encoded twice, and a string that is not JSON (a malformed call) as it is."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False)


@dataclass
class Verdict:
    """`wrong_step`: 0-based index of the earliest wrong step, or None (KEEP). `failed`: the judge could not
    answer (counted as KEEP by the caller)."""

    wrong_step: int | None = None
    failed: bool = False


@dataclass
class Correction:
    """`text`: the correction (may be empty). `failed`: the judge could not answer; the caller keeps the chunk."""

    text: str = ""
    failed: bool = False


@dataclass
class VoteTally:
    """The decision of several reviews of one chunk. `wrong_step`: the step to cut at, or None (KEEP). `usable`:
    reviews that answered; `agreeing`: those that support the decision (KEEP votes for a KEEP, REVISE votes at or
    before the cut for a REVISE); `failures`: failed or out-of-range reviews (abstentions); `vetoed`: some review
    said REVISE but fewer than `min_agree` agreed, so the chunk is kept."""

    wrong_step: int | None
    usable: int
    agreeing: int
    failures: int
    vetoed: bool


def tally_votes(verdicts: Sequence[Verdict], num_steps: int, min_agree: int) -> VoteTally:
    """REVISE when at least `min_agree` reviews flag a step at or before some step i, cutting at the smallest such i
    (the `min_agree`-th smallest flagged index): a review that flags step j says the chunk is wrong by step j, so
    it backs every cut at or after j. Failed reviews, and indices outside the chunk's steps, abstain. With one
    review and `min_agree=1` this is the single verdict: its step, or KEEP."""
    flagged, failures = [], 0
    for verdict in verdicts:
        step = verdict.wrong_step
        if verdict.failed or step is not None and not 0 <= step < num_steps:
            failures += 1
        elif step is not None:
            flagged.append(step)
    usable = len(verdicts) - failures
    flagged.sort()
    if len(flagged) >= min_agree:
        cut = flagged[min_agree - 1]
        return VoteTally(cut, usable, sum(step <= cut for step in flagged), failures, vetoed=False)
    return VoteTally(None, usable, usable - len(flagged), failures, vetoed=bool(flagged))


@dataclass(frozen=True)
class TransportStatus:
    """What reaching a judge's server has cost since the judge was built: `sent` requests, `unanswered` of them that
    got no answer (connection refused, timeout, HTTP error: the judge could not be reached, as opposed to an answer
    that came back unusable), and the reason of the latest unanswered one."""

    sent: int = 0
    unanswered: int = 0
    last_error: str | None = None


class Judge(ABC):
    """Reviews and corrects batches of trajectories. Implementations batch internally (one model call, or bounded
    concurrent HTTP requests) and return one result per request, in order.

    `concurrent_batches`: how many `review`/`correct` calls the continuous rollout (mintrl/continuous.py) may have
    in flight at once, each from its own worker thread. 1 (the default) suits a judge whose backend batches: the
    requests that arrive during a call all go into the next one. A judge whose calls do not share state may allow
    more.
    """

    concurrent_batches = 1

    @abstractmethod
    def review(self, requests: list[ReviewRequest]) -> list[Verdict]: ...

    @abstractmethod
    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]: ...

    def transport_status(self) -> TransportStatus:
        """Requests sent to the judge's server and those that got no answer, since construction. A judge that runs
        in-process (a model, a function) has no server to lose: nothing sent, nothing unanswered."""
        return TransportStatus()

    def state_dict(self) -> dict:
        """Judge state to save with checkpoints (e.g. counters); stateless judges return {}."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (stateless judges restore nothing)
        """Restore what `state_dict` returned."""
