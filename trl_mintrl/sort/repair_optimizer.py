"""The trainer's optimizer as SORT's separate repair steps step it (`repair_update="separate"`), and the optimizer
state of their own those steps keep under `repair_optimizer="own"`: swapped in for the repair steps, saved with every
checkpoint (one file per process when there are several) and restored on resume.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict

import torch
from accelerate.logging import get_logger
from accelerate.utils import DistributedType

logger = get_logger(__name__)

# the own repair optimizer state in a checkpoint (`repair_optimizer="own"`), beside TRL's optimizer.pt
REPAIR_OPTIMIZER_FILE = "repair_optimizer"


class RepairOptimizer:
    """How the separate repair steps use the host trainer's optimizer (`stepping`), and their own optimizer state
    (`own_state`, None with `repair_optimizer="shared"`: the main optimizer's, which TRL saves)."""

    def __init__(self, host):
        """`host`: the trainer whose optimizer the repair steps (its config has `SORTConfig`'s repair fields)."""
        self.host = host
        self.own_state = OwnOptimizerState() if host.args.repair_optimizer == "own" else None

    @contextlib.contextmanager
    def stepping(self):
        """The trainer's optimizer as the separate repair steps step it: with the repair's own state under
        `repair_optimizer="own"`, and under DeepSpeed with the engine's learning-rate scheduler detached (the engine
        steps it in every engine step), so that the schedule advances with the main steps only."""
        with contextlib.ExitStack() as stack:
            if self.own_state is not None:
                stack.enter_context(self.own_state.swapped_into(self.host.optimizer))
            if self.host.accelerator.distributed_type == DistributedType.DEEPSPEED:
                stack.enter_context(scheduler_detached(self.host.accelerator.deepspeed_engine_wrapped.engine))
            yield

    def state_file(self, checkpoint: str) -> str:
        """Where this process keeps the own repair optimizer state in `checkpoint`: one file per process when there
        are several (DeepSpeed's ZeRO and FSDP shard the optimizer state), as DeepSpeed keeps its own."""
        accelerator = self.host.accelerator
        rank = f"-rank{accelerator.process_index}" if accelerator.num_processes > 1 else ""
        return os.path.join(checkpoint, f"{REPAIR_OPTIMIZER_FILE}{rank}.pt")

    def save_state(self, checkpoint: str) -> None:
        """Write the own repair optimizer state into `checkpoint`, atomically; nothing before the first repair step
        (the state is still empty) or with the shared one (TRL saves it)."""
        if self.own_state is None or not self.own_state.state:
            return
        path = self.state_file(checkpoint)
        os.makedirs(checkpoint, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            torch.save(self.own_state.state_dict(self.host.optimizer), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load_state(self, checkpoint: str, repairs: int) -> None:
        """Restore the own repair optimizer state from `checkpoint`; without its file the state starts empty (no
        repair step was taken before that checkpoint), with a warning if `repairs` (the repairs the checkpoint's
        buffer counts) says otherwise."""
        if self.own_state is None:
            return
        path = self.state_file(checkpoint)
        if not os.path.exists(path):
            self.own_state = OwnOptimizerState()
            if self.host.args.repair_update == "separate" and repairs:
                logger.warning(
                    f"{path} is missing although {repairs} repairs ran before this checkpoint was written: the "
                    'repair steps restart with an empty optimizer state (repair_optimizer="own").',
                    main_process_only=False,
                )
            return
        saved = torch.load(path, map_location="cpu", weights_only=True)
        try:
            self.own_state.load_state_dict(self.host.optimizer, saved)
        except (KeyError, IndexError) as err:
            raise ValueError(
                f"Cannot resume from {checkpoint}: {path} does not match this run's optimizer ({err}); resume with "
                "the same model, PEFT and DeepSpeed settings and number of processes it was written with."
            ) from err


class OwnOptimizerState:
    """The separate repair step's optimizer state under `repair_optimizer="own"`: swapped into the trainer's optimizer
    for the repair steps and out again, so the repair steps the same optimizer (class, hyperparameters, parameter
    groups, current learning rate; under DeepSpeed the engine's, with its master weights and partitioning) with
    moments and step counter of its own, and the main state only ever sees main steps. Created empty: the optimizer
    initialises it on the first repair step, as it did its own on the first main step."""

    def __init__(self):
        self.state: defaultdict = defaultdict(dict)  # per parameter, as `torch.optim.Optimizer.state`
        self.group_steps: dict[int, object] = {}  # step counters kept per parameter group (DeepSpeed's FusedAdam)

    def state_dict(self, optimizer) -> dict:
        """The state with each parameter named by its position in `optimizer`'s parameter groups, as
        `torch.optim.Optimizer.state_dict` names them, so that a resumed run's own parameters can take it."""
        params = _optimizer_params(optimizer)
        state = {index: self.state[p] for index, p in enumerate(params) if p in self.state}
        if len(state) != len(self.state):
            raise ValueError("the repair optimizer state holds parameters that are not in the trainer's optimizer")
        return {"state": state, "group_steps": dict(self.group_steps)}

    def load_state_dict(self, optimizer, saved: dict) -> None:
        """The inverse of `state_dict`: moment tensors move to their parameter's device; step counters stay as
        saved (torch keeps Adam's on the CPU unless it is capturable)."""
        params = _optimizer_params(optimizer)
        self.state = defaultdict(dict)
        for index, entry in saved["state"].items():
            param = params[index]
            self.state[param] = {
                key: value.to(param.device) if torch.is_tensor(value) and key != "step" else value
                for key, value in entry.items()
            }
        self.group_steps = dict(saved["group_steps"])

    @contextlib.contextmanager
    def swapped_into(self, optimizer):
        inner = _state_holder(optimizer)
        main_state, inner.state = inner.state, self.state
        main_steps = _exchange_group_steps(inner.param_groups, self.group_steps)
        try:
            yield
        finally:
            self.state, inner.state = inner.state, main_state
            self.group_steps = _exchange_group_steps(inner.param_groups, main_steps)


def _state_holder(optimizer):
    """The optimizer that holds the per-parameter state: accelerate's wrapper, and DeepSpeed's ZeRO optimizer inside
    it, each keep the optimizer they wrap as `.optimizer`."""
    while hasattr(optimizer, "optimizer"):
        if getattr(optimizer, "optimizer_swapper", None) is not None:
            raise ValueError(
                'repair_optimizer="own" cannot keep a second optimizer state while DeepSpeed swaps the optimizer '
                'state to NVMe (offload_optimizer.device: nvme); set `repair_optimizer="shared"` or offload to cpu.'
            )
        optimizer = optimizer.optimizer
    return optimizer


def _optimizer_params(optimizer) -> list:
    """The parameters the optimizer steps, in the order of its parameter groups."""
    return [param for group in _state_holder(optimizer).param_groups for param in group["params"]]


def _exchange_group_steps(groups: list[dict], steps: dict[int, object]) -> dict[int, object]:
    """Put `steps` (parameter group index -> its "step" entry) into `groups`; returns the entries they held."""
    held = {index: group.pop("step") for index, group in enumerate(groups) if "step" in group}
    for index, step in steps.items():
        groups[index]["step"] = step
    return held


@contextlib.contextmanager
def scheduler_detached(engine):
    """A DeepSpeed engine that does not step its learning-rate scheduler in `engine.step()` (it skips a None one)."""
    scheduler, engine.lr_scheduler = engine.lr_scheduler, None
    try:
        yield
    finally:
        engine.lr_scheduler = scheduler
