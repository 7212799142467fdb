"""`SORTTrainer`: GRPO plus the plan-salience-weighted repair of all-wrong prompts.

The repair is the `ReferenceRepair` component (`sort/repair.py`), hosted through `WithReferenceRepair`
(`sort/hosting.py`) exactly as `MInTRLSORTTrainer` (`trl_mintrl.combined`) hosts it; the main update is TRL's GRPO
unchanged. The component's state (the buffer and its counters) is the extra state `GRPOTrainerBase` writes
atomically to `sort_buffer.json` in every checkpoint and requires on resume.
"""

from __future__ import annotations

import textwrap

from ..engines.vllm import check_vllm_mode_supported
from ..trainer_base import GRPOTrainerBase, default_output_dir
from .buffer import BUFFER_FILE
from .config import SORTConfig
from .hosting import WithReferenceRepair


class SORTTrainer(WithReferenceRepair, GRPOTrainerBase):
    """Selective Off-policy Reference Tuning: GRPO whose all-wrong prompts are repaired later from their references.

    Used exactly like [`~trl.GRPOTrainer`] (same arguments, plus an optional `planner`: a `trl_mintrl.sort.Planner`
    that writes the repair plans instead of the policy) with a [`SORTConfig`]. The train dataset must have the
    `reference_column` (default `"solution"`): strings, or with `tools=` / `environment_factory=` (TRL's tool loop, as
    in `GRPOTrainer`) tool-calling conversations whose assistant turns are learnt (docs/sort.md). The repair items of a
    step are dealt round-robin across processes; each process scores its share and the loss is normalised by the
    global token count, so the gradient averaged over processes is that of the repair over all items, as in a single
    process.
    """

    extra_state_file = BUFFER_FILE
    learns_reference_conversations = True  # a reference may be a tool-calling conversation (`check_trainer_inputs`)
    _tag_names = ["trl", "sort"]
    _name = "SORT"
    _paper = {
        "title": "Selective Off-Policy Reference Tuning with Plan Guidance",
        "id": "2605.11505",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @inproceedings{sort2026,
                title        = {{Selective Off-Policy Reference Tuning with Plan Guidance}},
                booktitle    = {Advances in Neural Information Processing Systems},
                year         = 2026,
                eprint       = {arXiv:2605.11505},
            }"""),
    }

    def __init__(self, model, reward_funcs=None, args: SORTConfig | None = None, train_dataset=None, *rest, **kwargs):
        if args is None:
            args = SORTConfig(default_output_dir(model, "SORT"))
        if not isinstance(args, SORTConfig):
            raise TypeError(f"SORTTrainer needs `args` to be a SORTConfig, got {type(args).__name__}.")
        check_vllm_mode_supported(args)
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)

    def _extra_state(self) -> dict:
        return self.repair.state_dict()

    def _load_extra_state(self, state: dict) -> None:
        self.repair.load_state_dict(state)
