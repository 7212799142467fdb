"""`MInTRLSORTTrainer`: MInTRL's rollout and advantage regression, plus SORT's repair of groups that failed entirely.

Interventions help the prompts the policy almost solves: a judge correction turns a near miss into a correct
rollout. A prompt whose controls and intervened rollouts all fail gets nothing from the regression (every advantage
is `r - V(x) = 0`); SORT's repair trains on its reference instead. The trainer is `MInTRLTrainer` with SORT's
`ReferenceRepair` mixed in, wired exactly as `SORTTrainer` wires it:
- `_generate_and_score_completions`: MInTRL's advantages, then SORT's deferral of all-wrong groups (a group is every
  rollout of a prompt, controls and intervened ones, so a prompt an intervention rescued is not deferred);
- `_compute_loss`: MInTRL's regression, plus the repair with `repair_update="joint"` (`"separate"`: the repair is
  its own optimizer step after the regression step);
- `_extra_state`: MInTRL's state and SORT's buffer, in one checkpoint file (`STATE_FILE`).
"""

from __future__ import annotations

from ..mintrl.trainer import MInTRLTrainer
from ..sort.planner import check_planner
from ..sort.trainer import ReferenceRepair, SORTTrainer
from .config import MInTRLSORTConfig

STATE_FILE = "mintrl_sort_state.json"


class MInTRLSORTTrainer(ReferenceRepair, MInTRLTrainer):
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

    def __init__(
        self,
        model,
        reward_funcs,
        args: MInTRLSORTConfig | None = None,
        train_dataset=None,
        *rest,
        planner=None,
        **kwargs,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = MInTRLSORTConfig(f"{name.split('/')[-1]}-MInTRL-SORT")
        if not isinstance(args, MInTRLSORTConfig):
            raise TypeError(f"MInTRLSORTTrainer needs args=MInTRLSORTConfig(...), got {type(args).__name__}.")
        self._check_repair_inputs(args, reward_funcs, train_dataset)
        self.sort_planner = check_planner(planner)
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)
        self._init_repair()

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._defer_all_wrong_groups(inputs)
        return output

    def _compute_loss(self, model, inputs):
        """MInTRL's regression loss; with `repair_update="joint"`, plus the repair loss."""
        return self._with_joint_repair(model, super()._compute_loss(model, inputs))

    def _extra_state(self) -> dict:
        return {"mintrl": super()._extra_state(), "sort_buffer": self.sort_buffer.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        super()._load_extra_state(state["mintrl"])
        self.sort_buffer.load_state_dict(state["sort_buffer"])
