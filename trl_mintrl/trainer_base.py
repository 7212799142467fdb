"""`GRPOTrainerBase`: the glue MInTRL and SORT share on top of TRL's `GRPOTrainer`.

TRL computes rewards and group advantages inside `_generate_and_score_completions` (~600 lines). Rather than copy
it, the base opens one `GenerationBatch` record per generation batch before calling it: TRL's hooks fill it (the
dataset rows, the rollout function's result, the rewards gathered across processes), the subclass's `_score_batch`
reads it once TRL is done (to adjust the advantages and take the batch's decisions), and the record is then
cleared, so no stage can read another batch's state or depend on the order of TRL's hooks.

`TrainerExtras` (also the asynchronous MInTRL trainer's base, and the CLI's for TRL's own trainers) is what a
trl-mintrl trainer adds to a TRL trainer's outputs: the extra training state it saves with each checkpoint (one JSON
file, written atomically, and refused on resume when it is missing or corrupt rather than silently reset), and a
model card that names the method, its paper and the recipe, in the output folder and every checkpoint.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from .engines import GenerationEngine, engine_for_trainer
from .input_checks import check_trainer_inputs
from .model_card import CARD, add_recipe_section, copy_card, recipe_section
from .resume import TRAINER_STATE, finished_run, resolve_resume_from_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class GenerationBatch:
    """One generation batch on its way through TRL's `_generate_and_score_completions`: opened by the base with the
    batch's rows, completed by TRL's hooks, read by the subclass's `_score_batch`, then cleared."""

    inputs: list[dict]  # this process's dataset rows, one per rollout
    rollout: Any = None  # what the subclass's rollout_func hands over (MInTRL's `RolloutBatch`), if it has one
    rewards_per_func: torch.Tensor | None = None  # (global rows, reward functions), gathered by TRL; NaN: no reward

    def rewards(self, reward_weights: torch.Tensor) -> torch.Tensor:
        """(global rows,) weighted reward of each rollout, NaN where every reward function returned None."""
        per_func = self.rewards_per_func
        rewards = (per_func * reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        return rewards


class TrainerExtras:
    """What a trl-mintrl trainer adds to a TRL trainer class (mix in before it): training state beyond TRL's, in every
    checkpoint folder and back on resume, and a model card (`model_card.py`). A trainer with extra state sets
    `extra_state_file` and implements `_extra_state()` / `_load_extra_state(state)`: the state is written, atomically,
    before TRL's files, and a resume without a usable one is refused rather than silently started afresh. `recipe`
    ({"path": ..., "command": ...}) is set by `trl-mintrl train` for the card."""

    extra_state_file: str | None = None  # file name of the subclass's extra state in a checkpoint folder (None: none)
    recipe: dict | None = None

    # keys of `_extra_state()` added after checkpoints were first written: a checkpoint without one still resumes
    optional_extra_state_keys: frozenset[str] = frozenset()

    def _extra_state(self) -> dict:
        """The subclass's training state beyond TRL's (JSON-serialisable), saved with every checkpoint."""
        raise NotImplementedError

    def _load_extra_state(self, state: dict) -> None:
        """Restore what `_extra_state()` returned; raise KeyError/TypeError/ValueError on a malformed state."""
        raise NotImplementedError

    def _extra_state_keys(self) -> set[str]:
        """The keys a checkpoint's extra state must hold: those of `_extra_state()`, by default asked for now."""
        return set(self._extra_state())

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`resume_from_checkpoint=True` resumes from the last *complete* checkpoint, skipping (with a warning) a
        newer folder a crash cut short; transformers would pick that one by number alone and fail. A checkpoint at
        the end of the run resumes to nothing: transformers would train one step past `max_steps` and, with
        `save_total_limit`, delete the very checkpoint it resumed from."""
        if resume_from_checkpoint is True:
            required = [self.extra_state_file] if self.extra_state_file else []
            resume_from_checkpoint = resolve_resume_from_checkpoint(True, self.args.output_dir, required)
        if isinstance(resume_from_checkpoint, str):
            finished = finished_run(resume_from_checkpoint, self.args.max_steps, self.args.num_train_epochs)
            if finished:
                return self._restore_finished_run(resume_from_checkpoint, finished)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _restore_finished_run(self, checkpoint: str, message: str) -> TrainOutput:
        """The trainer as the finished run left it (weights, trainer state, extra state), without training a step.
        DeepSpeed and FSDP load their weight shards inside the training loop only: there the model keeps its
        current weights, and the finished ones stay in `checkpoint`."""
        if self.accelerator.is_main_process:
            logger.warning(message)
        if not (self.is_deepspeed_enabled or self.is_fsdp_enabled):
            self._load_from_checkpoint(checkpoint)
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
        if self.extra_state_file:
            self._load_extra_state_from(checkpoint)
        losses = [entry["train_loss"] for entry in self.state.log_history if "train_loss" in entry]
        return TrainOutput(self.state.global_step, losses[-1] if losses else float("nan"), {})

    def _checkpoint_folder(self, trial) -> str:
        """The folder TRL's `_save_checkpoint` writes for the current step."""
        return os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")

    def _save_checkpoint(self, model, trial):
        # Written before TRL's files, so a folder that has TRL's `trainer_state.json` (written last) has ours too.
        folder = self._checkpoint_folder(trial)
        if self.args.should_save and self.extra_state_file:
            os.makedirs(folder, exist_ok=True)
            write_json_atomically(os.path.join(folder, self.extra_state_file), self._extra_state())
        super()._save_checkpoint(model, trial)  # TRL writes the model card to output_dir first
        if self.is_world_process_zero():
            copy_card(self.args.output_dir, folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.extra_state_file:
            self._load_extra_state_from(checkpoint)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        if model_name is None:  # as TRL's `_save_checkpoint` names it
            model_name = (self.args.hub_model_id or self.args.output_dir).rstrip("/").split("/")[-1]
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            base_model = get_config_model_id(self.model.config)
            section = recipe_section(self._name, self._paper, base_model, self.recipe)
            path = os.path.join(self.args.output_dir, CARD)
            add_recipe_section(path, base_model, self.args.output_dir, self.args.hub_model_id, section)

    def _load_extra_state_from(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, self.extra_state_file)
        state = read_extra_state(path, expected_keys=self._extra_state_keys() - self.optional_extra_state_keys)
        try:
            self._load_extra_state(state)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{_refusal(path)} It holds a malformed {type(self).__name__} state ({err}).") from err


class GRPOTrainerBase(TrainerExtras, GRPOTrainer):
    """Base of `MInTRLTrainer` and `SORTTrainer`. A subclass sets `extra_state_file` and implements
    `_extra_state()` / `_load_extra_state(state)`; `TrainerExtras` writes that state into every checkpoint folder
    and restores it on resume, and writes the model card.

    A component the trainer hosts (SORT's `ReferenceRepair`) reaches the trainer's internals through the public
    methods below (`group_size`, `process_slice`, `tokenizer`, `tokenize_prompts`, `log_train_metric`,
    `is_first_micro_batch`): the TRL private members behind them (pinned by tests/test_trl_guard.py) are read here
    only."""

    _batch: GenerationBatch | None = None  # the generation batch being generated and scored, None between batches
    _policy_engine: GenerationEngine | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_trainer_inputs(self)  # bad prompts/references refused, reward functions guarded (input_checks.py)

    # ----- the batch being generated and scored -----
    def _generate_and_score_completions(self, inputs):
        self._batch = batch = GenerationBatch(inputs)
        try:
            output = super()._generate_and_score_completions(inputs)
            self._score_batch(output, batch)
        finally:
            self._batch = None
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._batch.rewards_per_func = rewards_per_func
        return rewards_per_func

    def _score_batch(self, output: dict, batch: GenerationBatch) -> None:
        """Adjust TRL's `output` for this batch (e.g. the advantages) and take the decisions it feeds, with the
        complete record in hand. The base adds nothing to TRL's GRPO."""

    def _mode(self) -> str:
        """The key of `self._metrics` the current batch logs to: "train" or "eval"."""
        return "train" if self.model.training else "eval"

    # ----- what the subclasses and a hosted component read and write -----
    def process_slice(self, local_rows: int) -> slice:
        """This process's rows within the gathered batch (TRL's own convention)."""
        start = self.accelerator.process_index * local_rows
        return slice(start, start + local_rows)

    def group_size(self) -> int:
        """Rollouts per prompt in the current batch (TRL samples a different number in evaluation)."""
        return self.num_generations if self.model.training else self.num_generations_eval

    @property
    def tokenizer(self):
        """The text tokenizer: `processing_class`, or the tokenizer of a processor (TRL's `_tokenizer`)."""
        return self._tokenizer

    def tokenize_prompts(self, prompts: list) -> list[list[int]]:
        """Token ids of dataset-style prompts exactly as TRL templates the rollouts' (its `_tokenize_prompts`)."""
        return list(self._tokenize_prompts(prompts)[0])

    def log_train_metric(self, name: str, value: float) -> None:
        """Add `value` to the training metric `name`, which TRL averages into the next logged step (`_metrics`)."""
        self._metrics["train"][name].append(value)

    def is_first_micro_batch(self) -> bool:
        """The micro-batch about to be computed is the first of its optimizer step (TRL counts them in `_step`)."""
        return self._step % self.current_gradient_accumulation_steps == 0

    @property
    def policy_engine(self) -> GenerationEngine:
        """The policy's generation engine (the colocated vLLM engine with `use_vllm`, else transformers), built
        on first use because TRL creates the vLLM engine inside `GRPOTrainer.__init__`."""
        if self._policy_engine is None:
            self._policy_engine = engine_for_trainer(self)
        return self._policy_engine

    def _issue_warnings_after_load(self, load_result) -> None:
        """transformers warns `missing keys in the checkpoint model loaded: ['lm_head.weight']` for a model whose
        output layer is tied to its embeddings: the checkpoint stores the shared tensor once, under the embedding's
        name, and loading it fills both. Only such tied keys are dropped from the warning; any other still warns."""
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        missing = [key for key in load_result.missing_keys if not self._loaded_through_tie(key, tied.get(key))]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _loaded_through_tie(self, key: str, source: str | None) -> bool:
        """`key` is the same tensor as `source`, which the checkpoint holds."""
        if source is None:
            return False
        try:
            return self.model.get_parameter(key) is self.model.get_parameter(source)
        except AttributeError:
            return False


def write_json_atomically(path: str, obj) -> None:
    """Write `obj` as JSON to `path` so that a reader sees the old file or the whole new one, never a part: a
    temporary file in the same folder, flushed and fsynced, then renamed over `path`. Temporary files left by an
    earlier writer killed mid-write (e.g. a checkpoint folder written again after a resume) are removed."""
    folder, name = os.path.split(path)
    for stale in glob.glob(os.path.join(glob.escape(folder or "."), f".{glob.escape(name)}.*.tmp")):
        os.remove(stale)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def read_extra_state(path: str, expected_keys: set[str]) -> dict:
    """The JSON object at `path`; a missing, unparseable or incomplete file is refused with an error naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{_refusal(path)} The file is missing: this folder was not saved by this trainer.")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{_refusal(path)} The file is not valid JSON ({err}).") from err
    if not isinstance(state, dict):
        raise ValueError(f"{_refusal(path)} It holds a {type(state).__name__}, not a JSON object.")
    missing = sorted(expected_keys - set(state))
    if missing:
        raise ValueError(f"{_refusal(path)} It lacks the keys {missing}.")
    return state


def _refusal(path: str) -> str:
    return (
        f"Cannot resume from {os.path.dirname(path)}: the trainer's extra state {path} is needed to continue the run "
        "exactly and is not usable, so resuming is refused rather than silently starting it afresh. Resume from an "
        "earlier complete checkpoint, or start a new run from these weights (model=<checkpoint folder>, no "
        "resume_from_checkpoint)."
    )


def default_output_dir(model, method: str) -> str:
    """`<model name>-<method>`: the output folder of a trainer built without `args`, named as TRL names GRPO's."""
    model_id = model if isinstance(model, str) else get_config_model_id(model.config)
    return f"{model_id.split('/')[-1]}-{method}"


def with_trainer_extras(trainer_cls: type) -> type:
    """`trainer_cls` itself when it already carries `TrainerExtras`, else a subclass of the same name that does (TRL's
    own trainers, as `trl-mintrl train grpo` builds them: the model card, no extra state)."""
    if issubclass(trainer_cls, TrainerExtras):
        return trainer_cls
    return type(trainer_cls.__name__, (TrainerExtras, trainer_cls), {"__module__": trainer_cls.__module__})
