"""`MInTRLSORTTrainer`: MInTRL's rollout and advantage regression, plus SORT's repair of groups that failed entirely.

Interventions help the prompts the policy almost solves: a judge correction turns a near miss into a correct
rollout. A prompt whose controls and intervened rollouts all fail gets nothing from the regression (every advantage
is `r - V(x) = 0`); SORT's repair trains on its reference instead. The trainer is `MInTRLTrainer` with SORT's
`ReferenceRepair` component hosted through `WithReferenceRepair`, exactly as `SORTTrainer` hosts it:
- `_score_batch`: MInTRL's advantages, then SORT's deferral of all-wrong groups (a group is every
  rollout of a prompt, controls and intervened ones, so a prompt an intervention rescued is not deferred);
- `_compute_loss`: MInTRL's regression, plus the repair with `repair_update="joint"` (`"separate"`: the repair is
  its own optimizer step after the regression step);
- `_extra_state`: MInTRL's state and SORT's buffer, in one checkpoint file (`STATE_FILE`).

With `tools=` / `environment_factory=` each part keeps its own tool wiring: MInTRL runs the tools inside its
intervention rollout (`mintrl/tools.py`), the repair learns reference conversations after the prompt the policy saw,
with the row's tools (`sort/references.py`). The one column both read is the reference: the judge reads a reference
conversation as a transcript (`judge_reference`), the repair learns its assistant turns.
"""

from __future__ import annotations

from ..input_checks import is_reference_conversation
from ..judges.base import conversation_text
from ..mintrl.trainer import MInTRLTrainer
from ..sort.hosting import WithReferenceRepair
from ..sort.references import as_written
from ..sort.trainer import SORTTrainer
from ..trainer_base import default_output_dir
from .config import MInTRLSORTConfig

STATE_FILE = "mintrl_sort_state.json"


class MInTRLSORTTrainer(WithReferenceRepair, MInTRLTrainer):
    """MInTRL + SORT. Used exactly like [`MInTRLTrainer`] (same arguments, optional `judge` object, `tools=` /
    `environment_factory=`) with a [`MInTRLSORTConfig`]; the train dataset must have the `reference_column`, which both
    the judge and the repair read: strings, or with tools tool-calling conversations, as in `SORTTrainer`. `planner`
    (a `trl_mintrl.sort.Planner`) writes the repair plans instead of the policy, as in `SORTTrainer`."""

    extra_state_file = STATE_FILE
    learns_reference_conversations = True  # a reference may be a tool-calling conversation, as in SORTTrainer
    _tag_names = ["trl", "mintrl", "sort"]
    _name = "MInTRL + SORT"
    _paper = {
        "title": f"{MInTRLTrainer._paper['title']}; {SORTTrainer._paper['title']}",
        "id": None,  # two papers: both are cited
        "citation": f"{MInTRLTrainer._paper['citation']}\n\n{SORTTrainer._paper['citation']}",
    }

    def __init__(self, model, reward_funcs, args: MInTRLSORTConfig | None = None, train_dataset=None, *rest, **kwargs):
        if args is None:
            args = MInTRLSORTConfig(default_output_dir(model, "MInTRL-SORT"))
        if not isinstance(args, MInTRLSORTConfig):
            raise TypeError(f"MInTRLSORTTrainer needs args=MInTRLSORTConfig(...), got {type(args).__name__}.")
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)

    def judge_reference(self, row: dict) -> str | None:
        """The judge's privileged context: a string reference as it is; a reference conversation as a transcript
        (`reference_transcript`), in the layout the judge's prompts give the rollout's own conversation."""
        reference = super().judge_reference(row)
        return reference_transcript(reference) if is_reference_conversation(reference) else reference

    def _extra_state(self) -> dict:
        return {"mintrl": super()._extra_state(), "sort_buffer": self.repair.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        super()._load_extra_state(state["mintrl"])
        self.repair.load_state_dict(state["sort_buffer"])


def reference_transcript(messages: list[dict]) -> str:
    """A reference conversation as plain text for a judge prompt: the transcript the judges' prompts give a rollout's
    earlier turns (`trl_mintrl.judges.base.conversation_text`: `[assistant]` blocks with their `[tool call]` lines,
    `[tool result: name]` blocks), without the current-turn block that follows them there. The messages are taken as
    the repair takes them (`as_written`: arguments stored as JSON strings parsed, keys holding None left out)."""
    transcript = conversation_text([as_written(message) for message in messages], "")
    head, _, _current_turn = transcript.rpartition("\n\n")  # the (empty) current turn's block is the last one
    return head
