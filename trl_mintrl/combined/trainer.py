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
"""

from __future__ import annotations

from ..mintrl.trainer import MInTRLTrainer
from ..sort.hosting import WithReferenceRepair
from ..sort.trainer import SORTTrainer
from ..trainer_base import default_output_dir
from .config import MInTRLSORTConfig

STATE_FILE = "mintrl_sort_state.json"


class MInTRLSORTTrainer(WithReferenceRepair, MInTRLTrainer):
    """MInTRL + SORT. Used exactly like [`MInTRLTrainer`] (same arguments, optional `judge` object) with a
    [`MInTRLSORTConfig`]; the train dataset must have the `reference_column`, which both the judge and the repair
    read. `planner` (a `trl_mintrl.sort.Planner`) writes the repair plans instead of the policy, as in
    `SORTTrainer`."""

    extra_state_file = STATE_FILE
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
        for name in ("tools", "environment_factory"):
            if kwargs.get(name):
                raise ValueError(
                    f"MInTRLSORTTrainer does not take {name}= yet: MInTRL's tool-calling rollout and SORT's repair of "
                    "tool-calling references are each tested alone, not together. Use MInTRLTrainer (interventions in "
                    "the tool loop) or SORTTrainer (repairs from reference conversations)."
                )
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)

    def _extra_state(self) -> dict:
        return {"mintrl": super()._extra_state(), "sort_buffer": self.repair.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        super()._load_extra_state(state["mintrl"])
        self.repair.load_state_dict(state["sort_buffer"])
