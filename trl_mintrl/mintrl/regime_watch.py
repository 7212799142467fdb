"""Early warnings that a MInTRL run has left the regime its paper describes, each naming the settings that bring it
back. Fed once per training batch with measures over all processes, so every process takes the same decision.

- The judge's share of the completion tokens. The paper's corrections are at most 64 tokens in rollouts of thousands,
  2-4% of the tokens, and its intensity ablation found the gain largest there and negative (below no intervention)
  near 40%. On SmolLM2-135M with 22-token answers one reference sentence is half a rollout: the judge wrote 34-38% of
  the tokens, and the completions of every such run grew to the cap.
- The controls' length. Controls are plain policy samples, so a control length climbing toward
  `max_completion_length` while the judge intervenes is the policy learning to run on from what the intervened
  rollouts reward. In those runs the controls went from 22 tokens to 47-52 of the 64 by the fourth or fifth
  intervention step and to the cap after it.
- Controls cut at the cap from the start. A reward that reads the final answer never finds it in a cut completion,
  so the controls score about 0, the baseline is 0, and every gradient comes from the rollouts the judge completed:
  supervised training on the judge's text rather than RL. SmolLM2-135M-Instruct, without a format warm-up, had half
  to all of its 96-token completions cut from the first step.

- Corrections that lengthen the rollouts. When the policy stops early (one line where two are needed), the judge's
  correction adds the missing step instead of replacing a wrong one, and a revised rollout is about twice a control's
  length; with the controls scoring less, every positive advantage sits on such a rollout. In every SmolLM2 in-band run
  the intervened rollouts (revised or not) were about 1.5-2.2 times the controls' length at the first two intervention
  steps and the controls then grew toward and past that length (22 tokens to 25-52 at the fourth intervention step,
  50-63 at the eighth), whatever the judge-token share (a run held at 2-8% a step grew too); where a correction replaced
  a step and the rollouts stayed as long as the controls (the reachable regime, 0.96-1.06 times), nothing grew at a
  13-39% share.

All four look at the last `WINDOW` intervention steps, so they can speak from the second one, and each warns once per
run. The controls' length is also watched after the interventions end (the window then holds the last steps of the
run): on the chain family, at an 8-18% share, the controls stayed near 209 tokens over the 8 intervention steps, then
grew to 309 with 75% of them cut at the 320-token cap in the 5 steps after. With `judge_token_target` the
controller's first step runs with every slot reviewed; the share warning needs every step of its window above the
threshold, so that first step alone never triggers it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

WINDOW = 2  # intervention steps a warning looks at
CLIPPED_CONTROLS = 0.25  # share of the controls cut at the cap that, with the length, makes the climb a warning
CLIPPED_FROM_START = 0.5  # share of the controls cut at the cap over the first intervention steps that warns


@dataclass
class RegimeWatch:
    """The four warnings of the module's docstring. `max_judge_share`: warn when the judge's share of the completion
    tokens is above it on each of the last `WINDOW` intervention steps (None: never). `control_length_climb`: warn
    when the controls' mean length over the last `WINDOW` intervention steps has covered this share of the way from
    their length at the first intervention step to `max_completion_length`, with at least `CLIPPED_CONTROLS` of them
    cut at the cap, or when at least `CLIPPED_FROM_START` of them were cut over the first `WINDOW` intervention steps
    (None: neither). `revised_length_ratio`: warn when, over the last `WINDOW` intervention steps that revised any
    rollout, the revised rollouts' mean length is at least this multiple of the controls' and their mean reward above
    the controls' (None: never)."""

    max_judge_share: float | None
    control_length_climb: float | None
    max_completion_length: int
    revised_length_ratio: float | None = None
    enabled: bool = True  # False on every process but the main one: they decide alike, one of them logs
    shares: list[float] = field(default_factory=list)
    control_lengths: list[float] = field(default_factory=list)
    control_clipped: list[float] = field(default_factory=list)
    revised: list[tuple[float, float, float]] = field(default_factory=list)  # (controls', revised length, reward gap)
    start_length: float | None = None
    intervention_steps: int = 0  # seen so far
    steps_after_interventions: int = 0  # steps seen since the last intervention step
    warned: set[str] = field(default_factory=set)  # "share", "length", "clipped", "lengthening"

    def update(
        self,
        judge_share: float,
        control_length: float,
        control_clipped: float,
        revised_length: float | None = None,
        revised_reward_gap: float | None = None,
    ) -> list[str]:
        """One intervention step's judge-token share, controls' mean length (every token) and share cut at the cap;
        the revised rollouts' mean length and mean reward minus the controls' (None: the judge revised none, or no
        reward). Returns the warnings it logged (each once per run)."""
        if revised_length is not None and revised_reward_gap is not None and math.isfinite(revised_reward_gap):
            self.revised = [*self.revised, (control_length, revised_length, revised_reward_gap)][-WINDOW:]
        self.shares = [*self.shares, judge_share][-WINDOW:]
        self._add_controls(control_length, control_clipped)
        if self.start_length is None:
            self.start_length = control_length
        self.intervention_steps += 1
        self.steps_after_interventions = 0
        checks = (("share", self._share), ("length", self._length), ("clipped", self._clipped),
                  ("lengthening", self._lengthening))  # fmt: skip
        return self._say([name for name, check in checks if check()])

    def update_after_interventions(self, control_length: float, control_clipped: float) -> list[str]:
        """A step without interventions, once the run has had some: the length warning alone, on the controls' mean
        length and share cut at the cap. Returns the warning if it logged it."""
        if not self.intervention_steps:
            return []
        self._add_controls(control_length, control_clipped)
        self.steps_after_interventions += 1
        return self._say(["length"] if self._length() else [])

    def _add_controls(self, control_length: float, control_clipped: float) -> None:
        self.control_lengths = [*self.control_lengths, control_length][-WINDOW:]
        self.control_clipped = [*self.control_clipped, control_clipped][-WINDOW:]

    def _say(self, said: list[str]) -> list[str]:
        if self.enabled:
            for name in said:
                logger.warning(self.message(name))
        self.warned.update(said)
        return said

    def _share(self) -> bool:
        limit = self.max_judge_share
        full = len(self.shares) == WINDOW
        return limit is not None and "share" not in self.warned and full and min(self.shares) > limit

    def _length(self) -> bool:
        climb, start = self.control_length_climb, self.start_length
        if climb is None or "length" in self.warned or len(self.control_lengths) < WINDOW:
            return False
        length = sum(self.control_lengths) / WINDOW
        clipped = sum(self.control_clipped) / WINDOW
        climbed = length > start and length >= start + climb * (self.max_completion_length - start)
        return climbed and clipped >= CLIPPED_CONTROLS

    def _clipped(self) -> bool:
        first_window = self.intervention_steps == WINDOW
        clipped = sum(self.control_clipped) / WINDOW
        return self.control_length_climb is not None and first_window and clipped >= CLIPPED_FROM_START

    def _lengthening(self) -> bool:
        ratio = self.revised_length_ratio
        if ratio is None or "lengthening" in self.warned or len(self.revised) < WINDOW:
            return False
        controls, revised, gap = self._revised_means()
        return revised >= ratio * controls and gap > 0

    def _revised_means(self) -> tuple[float, ...]:
        """(controls' length, revised length, reward gap), each a mean over the window of steps that revised any."""
        return tuple(sum(column) / WINDOW for column in zip(*self.revised, strict=True))

    def message(self, name: str) -> str:
        if name == "share":
            return (
                f"MInTRL judge: the judge wrote {100 * min(self.shares):.0f}-{100 * max(self.shares):.0f}% of the "
                f"completion tokens over the last {WINDOW} intervention steps, above judge_share_warning="
                f"{self.max_judge_share} and far from the paper's 2-4% (its ablation found ~40% worse than no "
                "intervention at all): each correction is a large part of its rollout, not a local fix. Fixes: "
                "judge_token_target=0.03 (review only a share of the intervened slots), or corrections that are "
                "short against the rollout (max_correction_tokens, max_reviews; longer problems or "
                "max_completion_length). Shown once per run; mintrl/judge_token_frac is logged every step."
            )
        if name == "lengthening":
            controls, revised, gap = self._revised_means()
            return (
                f"MInTRL: the rollouts the judge revised are {revised / controls:.1f} times as long as the controls "
                f"({revised:.0f} tokens against {controls:.0f}, every token counted) and score {gap:+.2f} above them, "
                f"over the last {WINDOW} intervention steps that revised any: the corrections add the steps the policy "
                "left out rather than replace a wrong one. Every positive advantage then sits on a rollout longer than "
                "the policy writes, and on SmolLM2-135M the controls then grew to that length and past it (half way "
                "to the cap within 3-6 more steps), whatever the judge-token share. Fixes: make the policy write whole "
                "solutions before MInTRL (an SFT or format warm-up on complete answers), so that a correction replaces "
                "a step inside a rollout of the usual length; mask_truncated_completions=True keeps rollouts cut at "
                "the cap out of the regression if they grow anyway. Shown once per run; mintrl/length_control and "
                "mintrl/length_intervened are logged every step."
            )
        length = sum(self.control_lengths) / WINDOW
        clipped = sum(self.control_clipped) / WINDOW
        if name == "clipped":
            return (
                f"MInTRL: {100 * clipped:.0f}% of the control rollouts (plain policy samples) were cut at "
                f"max_completion_length={self.max_completion_length} over the first {WINDOW} intervention steps. A "
                "reward that reads the final answer finds none in a cut completion, so the controls score about 0 and "
                "every gradient comes from the rollouts the judge completed: supervised training on the judge's text, "
                "not RL. Fixes: a larger max_completion_length, a prompt or format warm-up that makes answers end, "
                "mask_truncated_completions=True (cut rollouts leave the regression). Shown once per run; "
                "mintrl/clipped_ratio_control is logged every step."
            )
        when = (
            "while the judge intervenes"
            if not self.steps_after_interventions
            else f"by {self.steps_after_interventions} steps after the judge's {self.intervention_steps} intervention "
            "steps (the growth they started outlives them)"
        )
        return (
            f"MInTRL: the control rollouts (plain policy samples) grew from {self.start_length:.0f} to {length:.0f} "
            f"tokens of max_completion_length={self.max_completion_length} {when}, "
            f"{100 * clipped:.0f}% of them cut at the cap: the policy is learning to run on. Everything the policy "
            "writes after the judge's last correction shares the rollout's advantage, and a cut rollout stays in the "
            "regression. Fixes: a warm-up on whole solutions, so that a correction replaces a step instead of adding "
            "the ones the policy left out (the lengthening warning); mask_truncated_completions=True (cut rollouts "
            "leave the regression) and judge_token_target=0.03 each lowered the share at the cap by about 30 points "
            "on SmolLM2-135M without stopping the growth. Shown once per run; mintrl/length_control and "
            "mintrl/clipped_ratio_control are logged every step."
        )

    def state_dict(self) -> dict:
        return {"shares": self.shares, "control_lengths": self.control_lengths,
                "control_clipped": self.control_clipped, "revised": [list(step) for step in self.revised],
                "start_length": self.start_length, "intervention_steps": self.intervention_steps,
                "steps_after_interventions": self.steps_after_interventions,
                "warned": sorted(self.warned)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.shares = [float(v) for v in state["shares"]]
        self.control_lengths = [float(v) for v in state["control_lengths"]]
        self.control_clipped = [float(v) for v in state["control_clipped"]]
        self.revised = [tuple(float(v) for v in step) for step in state.get("revised", [])]  # added later
        self.start_length = None if state["start_length"] is None else float(state["start_length"])
        self.intervention_steps = int(state["intervention_steps"])
        self.steps_after_interventions = int(state.get("steps_after_interventions", 0))  # added later
        self.warned = set(state["warned"])
