"""`AsyncMInTRLTrainer`: MInTRL on TRL's `AsyncGRPOTrainer`, generation, judging and training overlapping.

TRL's trainer runs the loop: it syncs the weights to the vLLM server, starts the rollout worker, packs the rollouts
it pushes into rows (`TreeRow`) and trains on them. This subclass only wires its seams:
- `__init__` builds MInTRL's rollout worker (`MInTRLRolloutWorker` on a `VLLMHTTPEngine`, with the judge) and the
  disk weight sync unless given, and makes TRL's constructor and its tree attention run off CUDA (`cpu_shims`);
  `tools=` / `environment_factory=` go to that worker, which builds and runs them as `MInTRLTrainer`'s rollout does
  (async_/tools.py), as TRL's asynchronous trainer hands them to its own worker;
- `get_train_dataloader` swaps in `MInTRLRolloutCollator`, which lays the judge-token mask out per loss term;
- `compute_loss` is MInTRL's sequence-level regression on the packed loss terms: policy tokens anchored at the
  log-probs they were sampled with (by whatever weights wrote the rollout), judge tokens at `kappa`, no ratio;
- checkpoints carry the trainer's and the worker's state (`TrainerExtras`), the judge's included;
- `judge_outage_policy="stop"` stops after the optimizer step that trains the batch whose judge calls decided it
  (`JudgeOutageStop`), with a checkpoint and `JudgeOutageError`, as `MInTRLTrainer` does.
"""

from __future__ import annotations

import os
import time
from unittest import mock

import torch
from accelerate.utils import broadcast_object_list
from datasets import Dataset
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOTrainer, async_grpo_trainer
from trl.import_utils import is_requests_available

from ...input_checks import check_reference_column, context_length
from ...judges import Judge
from ...losses import mintrl_anchors, packed_advantage_regression_loss
from ...trainer_base import TrainerExtras, default_output_dir
from ..absorption import AbsorptionTracker
from ..judge_factory import build_judge, check_judge_backend, check_judge_votes
from ..judge_watch import raise_if_judge_stopped
from ..loss_metrics import log_loss_totals
from ..paper import PAPER
from .collator import MInTRLRolloutCollator
from .config import AsyncMInTRLConfig
from .cpu_shims import install_cpu_shims, peak_flops_unknown_off_cuda
from .transfer import DiskReloadTransfer

STATE_FILE = "mintrl_async_state.json"


class JudgeOutageStop(TrainerCallback):
    """`judge_outage_policy="stop"` for the asynchronous trainer. The rollout worker decides when it scores a batch,
    up to `max_staleness` steps before that batch trains (`MInTRLRolloutWorker.judge_outage_stop`); the run saves a
    checkpoint and stops after the optimizer step that trains the deciding batch, as `MInTRLTrainer` stops after the
    step whose batch decided. Rank 0 holds the worker: its decision is broadcast, so every rank stops together."""

    def __init__(self, trainer: AsyncMInTRLTrainer):
        self.trainer = trainer
        self.reason: str | None = None  # set when it stopped the run

    def on_train_begin(self, args, state, control, **kwargs):
        self.reason = None

    def on_step_end(self, args, state, control, **kwargs):
        worker = self.trainer.rollout_worker
        decision = getattr(worker, "judge_outage_stop", None)  # a given worker may not watch the judge
        if self.trainer.accelerator.num_processes > 1:
            decision = broadcast_object_list([decision], from_process=0)[0]
        if decision is not None and state.global_step >= decision[0] + 1:  # batch s trains at optimizer step s + 1
            self.reason = decision[1]
            control.should_save = True
            control.should_training_stop = True
        return control


class AsyncMInTRLTrainer(TrainerExtras, AsyncGRPOTrainer):
    """Asynchronous Minimal-Intervention RL. Used like TRL's `AsyncGRPOTrainer` (the model as a path or Hub id that
    the vLLM server at `args.vllm_server_base_url` serves), plus an optional `judge` object (e.g. a `FunctionJudge`)
    that overrides `args.judge`, and TRL's `tools` and `environment_factory`, which the rollout worker runs.

    `rollout_worker` and `weight_transfer` replace the defaults (TRL's protocols): a worker must push `RolloutSample`s
    whose `metrics` is a `SampleMetrics` with the judge-token mask, and have `state_dict(step)` /
    `load_state_dict(state)` for checkpoints; a `weight_transfer` replaces the sync that `args.weight_sync` names.
    """

    extra_state_file = STATE_FILE
    _tag_names = ["trl", "mintrl", "async"]
    _name = "AsyncMInTRL"
    _paper = PAPER

    def __init__(
        self,
        model: str,
        reward_funcs=None,
        args: AsyncMInTRLConfig | None = None,
        train_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        judge: Judge | None = None,
        rollout_worker=None,
        weight_transfer=None,
        tools=None,
        environment_factory=None,
        **kwargs,
    ):
        if args is None:
            args = AsyncMInTRLConfig(default_output_dir(model, "AsyncMInTRL"))
        if not isinstance(args, AsyncMInTRLConfig):
            raise TypeError(f"AsyncMInTRLTrainer needs args=AsyncMInTRLConfig(...), got {type(args).__name__}.")
        require_requests()
        check_async_inputs(args, model, train_dataset, peft_config, judge, rollout_worker, weight_transfer, kwargs)
        train_dataset = check_async_tools(args, train_dataset, rollout_worker, tools, environment_factory)
        # the judge `args.judge` names needs the trainer (its model, device, engine): set once TRL has made it
        judge_from_args = rollout_worker is None and judge is None
        if rollout_worker is None:
            processing_class, rollout_worker = self._build_rollout_worker(
                model, args, processing_class, train_dataset, reward_funcs, judge, tools, environment_factory
            )
        if weight_transfer is None and args.weight_sync == "disk":
            weight_transfer = disk_weight_transfer(args)
        with peak_flops_unknown_off_cuda():
            super().__init__(
                model,
                reward_funcs,
                args=args,
                train_dataset=train_dataset,
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
                rollout_worker=rollout_worker,
                weight_transfer=weight_transfer,
            )
        check_no_vlm_with_tools(self._is_vlm, rollout_worker)
        install_cpu_shims()  # after TRL's constructor, which registers its own tree attention
        unwrapped = self.accelerator.unwrap_model(self.model)
        if isinstance(self.weight_transfer, DiskReloadTransfer):  # the stream names the base model's weights
            self.weight_transfer.bind(unwrapped.get_base_model() if peft_config is not None else unwrapped)
        if judge_from_args:
            rollout_worker.judge = build_judge(args, self)
        self.absorption = AbsorptionTracker(args.absorption_window, args.absorption_max_nll, args.absorption_min_fall)
        self.judge_outage_stop = JudgeOutageStop(self)
        self.add_callback(self.judge_outage_stop)

    def train(self, *args, **kwargs):
        """`AsyncGRPOTrainer.train`; raises `JudgeOutageError` when `judge_outage_policy="stop"` ended it, after the
        checkpoint of the step it stopped at was written."""
        output = super().train(*args, **kwargs)
        raise_if_judge_stopped(self.judge_outage_stop.reason, self._checkpoint_folder(None))
        return output

    def _build_rollout_worker(
        self, model: str, args, tokenizer, train_dataset, reward_funcs, judge, tools=None, environment_factory=None
    ):
        """(tokenizer, worker): MInTRL's rollout worker on the vLLM server, built before TRL's constructor (which reads
        its queue), with the tokenizer and end-of-completion ids that constructor would set up. The judge is `judge`;
        when None, the caller sets the one `args.judge` names, whose "self" judge is `self.policy_engine`. The worker
        builds the tools and environments from `tools` and `environment_factory`, as TRL's asynchronous trainer has
        its own worker build them; a tool-calling rollout may reach the model's positions (TRL's rule)."""
        from ...engines.vllm_http import VLLMHTTPEngine
        from .worker import MInTRLRolloutWorker

        hub_kwargs = dict(
            revision=(args.model_init_kwargs or {}).get("revision"), trust_remote_code=args.trust_remote_code
        )
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(model, **hub_kwargs)
        if tokenizer.pad_token is None:  # as TRL's constructor sets it
            tokenizer.pad_token = tokenizer.eos_token
        self.policy_engine = VLLMHTTPEngine(
            args.vllm_server_base_url,
            model=model,  # the name `vllm serve <model>` serves it under, as TRL's own worker requests it
            eos_token_ids=end_of_completion_ids(model, tokenizer, **hub_kwargs),
            # the filters sent at their "off" values (AsyncMInTRLConfig refuses others): without them `vllm serve`
            # applies the model's generation_config.json (Qwen3: top_p 0.95, top_k 20), which the anchors cannot follow
            sampling_defaults=dict(
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                min_p=args.min_p or 0.0,
                repetition_penalty=args.repetition_penalty,
            ),  # fmt: skip
            request_timeout=args.request_timeout,
            seed=args.seed,
        )
        max_model_len = None
        if tools or environment_factory is not None:
            max_model_len = context_length(AutoConfig.from_pretrained(model, **hub_kwargs), args)
        worker = MInTRLRolloutWorker(
            args, tokenizer, train_dataset, reward_funcs, judge, self.policy_engine,
            tools=tools, environment_factory=environment_factory, max_model_len=max_model_len,
        )  # fmt: skip
        return tokenizer, worker

    def get_train_dataloader(self):
        """TRL's dataloader with `MInTRLRolloutCollator`, which adds the judge-token mask per loss term. TRL builds
        its collator inline by its module-global name, so the name is swapped for this call only."""
        with mock.patch.object(async_grpo_trainer, "DataCollatorForRollout", MInTRLRolloutCollator):
            return super().get_train_dataloader()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's unpacking and forward of a packed row (the lines up to `_last_forward_time_s`, pinned in
        tests/test_trl_guard.py), then MInTRL's regression instead of TRL's clipped ratio, then TRL's per-step
        accounting. Padding terms (`token_index < 0`, `segment_id` 0) are left out before anything is summed."""
        mask_bool = inputs["attention_mask"].bool()
        selected = inputs["token_index"] >= 0
        input_ids = inputs["input_ids"][mask_bool].unsqueeze(0)
        position_ids = inputs["position_ids"][mask_bool].unsqueeze(0)
        shift_labels = inputs["shift_labels"][mask_bool].unsqueeze(0)
        token_index = inputs["token_index"][selected]
        old_log_probs = inputs["old_log_probs"][selected]
        advantages = inputs["advantages"][selected]
        segment_id = inputs["segment_id"][selected]
        judge_tokens = inputs["judge_mask"][selected].bool()
        tree_kwargs = {
            key: inputs[key][inputs[key] >= 0] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")
        }
        tree_kwargs["tree_max_seqlen_q"], tree_kwargs["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()

        forward_start = time.time()
        outputs = model(
            input_ids=input_ids,
            position_ids=position_ids,
            shift_labels=shift_labels,
            fused_lm_head=True,
            **tree_kwargs,
        )
        log_probs = outputs.log_probs.flatten()[token_index]
        entropy = outputs.entropy.flatten()[token_index]
        self._last_forward_time_s = time.time() - forward_start

        # the behaviour policy's sampled log-probs on policy tokens, kappa on judge tokens; no ratio, no clipping
        anchors = mintrl_anchors(old_log_probs, judge_tokens, "const", self.args.kappa)
        # The mean over the optimizer step's rollouts in the regression, as MInTRLTrainer's: each rank divides by
        # its share of the step's count (DDP averages the ranks' gradients); the count covers every micro-batch of
        # the step (the Trainer's own accumulation scaling is off), so a micro-batch with fewer rows in the
        # regression (mask_truncated_completions) gives each of them the same weight as the others'.
        step_rows = inputs["step_regression_rows"][0].clamp(min=1.0) / self.accelerator.num_processes
        loss, residuals = packed_advantage_regression_loss(
            log_probs, anchors, segment_id, advantages, self.args.regression_beta, step_rows
        )
        self._log_packed_loss_totals(log_probs, entropy, judge_tokens, residuals)

        # TRL's per-step accounting (flushed by `_log_step_metrics`)
        n_forward_tokens = float(inputs["global_n_forward_tokens"][0])
        mean_seq_len = float(inputs["mean_seq_len"][0])
        self._step_forward_tokens += n_forward_tokens
        self._step_trained_tokens += float(inputs["global_n_tokens"][0])
        self._step_seq_len_weighted += mean_seq_len * n_forward_tokens
        self._step_samples += n_forward_tokens / mean_seq_len
        self._step_forward_s += self._last_forward_time_s
        return loss

    @torch.no_grad()
    def _log_packed_loss_totals(self, log_probs, entropy, judge_tokens, residuals) -> None:
        """Log the sums `log_loss_totals` takes, over this micro-batch's packed loss terms (padding left out) and
        every rank: the same metrics as `MInTRLTrainer`'s padded rows give."""
        local = torch.stack(
            [
                -(log_probs * judge_tokens).sum(),
                judge_tokens.sum().float(),
                entropy.sum(),
                torch.tensor(float(log_probs.numel()), device=log_probs.device),
                residuals.pow(2).sum(),
                torch.tensor(float(residuals.numel()), device=log_probs.device),
            ]
        )
        log_loss_totals(self, "train", self.accelerator.reduce(local, reduction="sum"))

    # ----- checkpoint state (written to and read from STATE_FILE by TrainerExtras) -----
    def _extra_state(self) -> dict:
        """The worker's state as of the checkpoint's step (it has written rollouts for later steps already); only
        the main process has a worker."""
        worker = self.rollout_worker
        worker_state = worker.state_dict(self.state.global_step) if worker is not None else None
        return {**self._loop_state(), "rollout_worker": worker_state}

    def _extra_state_keys(self) -> set[str]:
        """Without asking the worker: on resume it has no state for the checkpoint's step before it is loaded."""
        return {*self._loop_state(), "rollout_worker"}

    def _loop_state(self) -> dict:
        return {
            "model_version": self.model_version,
            # TRL's epoch count: the groups its collator has seen, one micro-batch ahead of training
            "groups_trained": self._groups_before_resume + len(self._trained_groups),
            "judge_absorption": self.absorption.state_dict(),
        }

    def _load_extra_state(self, state: dict) -> None:
        self.model_version = int(state["model_version"])
        self._groups_before_resume = int(state["groups_trained"])
        self.absorption.load_state_dict(state["judge_absorption"])
        if self.rollout_worker is not None:
            self.rollout_worker.load_state_dict(state["rollout_worker"])


def disk_weight_transfer(args) -> DiskReloadTransfer:
    """`weight_sync="disk"`: the trainer's own folder (`weight_sync_dir`, or `.vllm_weights` in `output_dir`)."""
    folder = args.weight_sync_dir or os.path.join(args.output_dir, ".vllm_weights")
    return DiskReloadTransfer(
        args.vllm_server_base_url,
        folder,
        reload_timeout=args.weight_sync_timeout,
        server_timeout=args.vllm_server_timeout,
    )


def require_requests() -> None:
    """An ImportError naming the extra, before any model loads: TRL's `AsyncGRPOTrainer` builds its `VLLMClient`,
    which talks to the vLLM server with `requests`, a dependency of neither TRL nor trl-mintrl's base install."""
    if not is_requests_available():
        raise ImportError(
            "AsyncMInTRLTrainer needs `requests`: TRL's AsyncGRPOTrainer talks to the vLLM server with it. Install "
            'the extra: pip install "trl-mintrl[async]" (from a checkout: pip install -e ".[async]").'
        )


def check_async_inputs(
    args, model, train_dataset, peft_config, judge, rollout_worker, weight_transfer, trainer_kwargs
) -> None:
    """What `AsyncMInTRLTrainer` refuses before the model loads: TRL arguments its rollout replaces, a weight sync
    that cannot serve the policy, and for the worker it builds, a judge object of the wrong type or a judge backend
    or vote setting that cannot work (a given worker brings its own judge)."""
    for name in trainer_kwargs:
        raise TypeError(f"AsyncMInTRLTrainer got an unexpected keyword argument {name!r}.")
    if not isinstance(model, str):
        raise TypeError(
            f"AsyncMInTRLTrainer needs the model as a path or Hub id (the name the vLLM server serves), got "
            f"{type(model).__name__}."
        )
    if args.weight_sync == "nccl" and weight_transfer is None and peft_config is not None:
        raise ValueError(
            "weight_sync='nccl' with peft_config: TRL then syncs LoRA adapters under versioned names when the server "
            "has --enable-lora, which MInTRL's rollout worker does not request. Use weight_sync='disk' (the merged "
            "weights are written and reloaded)."
        )
    if rollout_worker is not None:
        if judge is not None:
            raise ValueError(
                "judge= is for the rollout worker the trainer builds; a given rollout_worker has its own."
            )
        return
    if judge is not None and not isinstance(judge, Judge):
        raise TypeError(f"judge must be a trl_mintrl.judges.Judge (e.g. FunctionJudge), got {type(judge)}.")
    if judge is None:
        if args.judge in ("self", "base") and args.intervention_steps > 0:
            check_reference_column(train_dataset, args.reference_column, f"judge={args.judge!r}")
        if args.judge == "base" and peft_config is not None:
            raise ValueError(
                "judge='base' with peft_config is not supported by AsyncMInTRLTrainer: the policy's adapter cannot "
                "be disabled for the judge while the trainer trains it. Use judge='model' with "
                "judge_model_name_or_path=<the base model>, or judge='endpoint' on a server that serves it."
            )
        check_judge_backend(args, model, peft_config)
    check_judge_votes(args, judge)


def check_async_tools(args, train_dataset, rollout_worker, tools, environment_factory):
    """The train dataset, after what `AsyncMInTRLTrainer` refuses of `tools=` / `environment_factory=` before the
    model loads: what TRL's `AsyncGRPOTrainer` refuses (a run without a dataset needs one environment that owns the
    data and `max_steps`), and tools beside a given `rollout_worker`, which would silently not run (TRL's trainer
    passes them to its own worker only). Without a dataset, TRL's placeholder rows of empty prompts: the
    environment's `reset` writes each rollout's prompt."""
    if (tools or environment_factory is not None) and rollout_worker is not None:
        field = "tools" if tools else "environment_factory"
        raise ValueError(
            f"{field}= is for the rollout worker the trainer builds; a given rollout_worker runs its own tools (pass "
            "them to MInTRLRolloutWorker(tools=..., environment_factory=...))."
        )
    if train_dataset is not None:
        return train_dataset
    if environment_factory is None:  # TRL's AsyncGRPOTrainer's refusals, with its messages
        raise ValueError("`train_dataset` is required unless an `environment_factory` is provided.")
    if isinstance(environment_factory, dict):
        raise ValueError(
            "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an `environment` "
            "column to route each example to its environment. Provide a dataset, or pass a single environment "
            "factory."
        )
    if args.max_steps <= 0:
        raise ValueError(
            "When training without a `train_dataset` (the environment owns the data and returns the prompt from "
            "`reset()`), `max_steps` must be set to a positive value to define the training length. Set it via "
            "`AsyncMInTRLConfig(max_steps=...)`."
        )
    rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows})


def check_no_vlm_with_tools(is_vlm: bool, rollout_worker) -> None:
    """After TRL has loaded the processing class, as `MInTRLTrainer` refuses it: tool results with images have no
    place in MInTRL's rollout."""
    if is_vlm and getattr(rollout_worker, "tools", None) is not None:
        raise ValueError(
            "processing_class is a vision-language processor and tools= / environment_factory= are set: "
            "AsyncMInTRLTrainer does not take images in tool results or prompts with tools yet. Use a text model."
        )


def end_of_completion_ids(model: str, tokenizer, **hub_kwargs) -> list[int]:
    """The ids that end a completion, as `AsyncGRPOTrainer.__init__` derives them (the tokenizer's EOS and every EOS
    of the model's generation config), needed before it runs: the rollout worker's engine is built first."""
    try:
        generation_config = GenerationConfig.from_pretrained(model, **hub_kwargs)
    except OSError:  # none saved: transformers derives it from the model's config, as for TRL's model
        generation_config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model, **hub_kwargs))
    declared = generation_config.eos_token_id
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]
