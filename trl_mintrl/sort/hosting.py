"""How a trainer hosts SORT's repair: `WithReferenceRepair`, first in the bases of a `GRPOTrainerBase` subclass
(`SORTTrainer`, `MInTRLSORTTrainer`), checks the repair's inputs before the model loads (`check_repair_inputs`),
builds the `ReferenceRepair` component (`sort/repair.py`) once TRL has built the trainer, and wires it into the
trainer's scoring, loss, callbacks and checkpoints.
"""

from __future__ import annotations

from accelerate.utils import is_peft_model
from torch import nn
from trl.trainer.utils import get_callable_name, get_config_model_id

from ..input_checks import check_reference_column
from .buffer import resolve_reward_funcs
from .length_checks import RepairLengthCheck
from .planner import check_planner
from .references import check_reference_conversations
from .repair import ReferenceRepair
from .scoring import add_unit_temperature_head


def check_repair_inputs(args, reward_funcs, train_dataset) -> list[int]:
    """Checks that need no model, run before the host's `super().__init__()`: the reference column and the
    correctness functions' names. Returns the indices of the correctness functions."""
    check_reference_column(train_dataset, args.reference_column, "SORT's repair")  # iterable: checked per row
    return resolve_reward_funcs(args.correctness_reward_funcs, reward_func_names(reward_funcs))


class WithReferenceRepair:
    """Mixin, first in a `GRPOTrainerBase` subclass's bases, that hosts a `ReferenceRepair` as `self.repair`: inputs
    checked before the model loads, reference conversations once the trainer's tools are known and the repair's
    lengths at the start of training, each batch's prompts as the policy sees them recorded (`_generate`), each
    scored batch deferred after the trainer's own `_score_batch`, the repair added to the trainer's own
    `_compute_loss` (`repair_update="joint"`)."""

    repair: ReferenceRepair

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, *rest, planner=None, **kwargs):
        correctness_funcs = check_repair_inputs(args, reward_funcs, train_dataset)
        planner = check_planner(planner)
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)
        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model  # where TRL adds its head
        add_unit_temperature_head(policy, self.args.cast_lm_head_to_fp32)
        self.repair = ReferenceRepair(self, correctness_funcs, planner)
        check_reference_conversations(self.repair.renderer, self.train_dataset)  # their tools are the trainer's
        self.add_callback(RepairLengthCheck(self.repair.renderer, self))  # at train(): the repair's passes fit

    def _generate(self, prompts: list):
        """TRL's generation; the repair learns a deferred reference after the prompt the policy saw, which holds an
        environment's `reset` observation (TRL adds it to the last message before this call)."""
        self.repair.policy_prompts = prompts
        return super()._generate(prompts)

    def _score_batch(self, output: dict, batch) -> None:
        super()._score_batch(output, batch)
        self.repair.defer_all_wrong_groups(batch)

    def _compute_loss(self, model, inputs):
        """The trainer's own loss; with `repair_update="joint"`, the repair's gradients are accumulated first and its
        loss (detached) is added to the value (`ReferenceRepair.joint_repair`)."""
        repair = self.repair.joint_repair(model)
        return super()._compute_loss(model, inputs) + repair

    def _save_checkpoint(self, model, trial):
        # before the host's files, so a checkpoint with TRL's trainer_state.json (written last) holds it complete
        self.repair.optimizer.save_state(self._checkpoint_folder(trial))
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.repair.optimizer.load_state(checkpoint, self.repair.buffer.counters["repairs"])


def reward_func_names(reward_funcs) -> list[str]:
    """The names TRL gives the reward functions (and logs them under), known before the trainer is built."""
    if reward_funcs is None:
        return []
    names = []
    for func in reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]:
        if isinstance(func, str):
            names.append(func.rstrip("/").split("/")[-1])
        elif isinstance(func, nn.Module):
            names.append(get_config_model_id(func.config).split("/")[-1])
        else:
            names.append(get_callable_name(func))
    return names
