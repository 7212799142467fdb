"""`AsyncMInTRLConfig`: TRL's `AsyncGRPOConfig` plus MInTRL's fields and checks (`MInTRLFields`, shared with
`MInTRLConfig`), the settings of the asynchronous pipeline, and refusals of what MInTRL cannot honour there."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl.experimental.async_grpo import AsyncGRPOConfig

from ..config import MInTRLFields, refusal_entries

WEIGHT_SYNCS = ("disk", "nccl")

# AsyncGRPOConfig (and MInTRL) fields the asynchronous trainer cannot honour: a value other than this config's default
# is refused when the config is built. field -> (why, what to do instead)
REFUSED_ASYNC_FIELDS: dict[str, tuple[str, str]] = {
    **refusal_entries(
        "epsilon epsilon_high",
        "MInTRL replaces GRPO's clipped policy-gradient loss by a sequence-level advantage regression, with no "
        "probability ratio and no clipping: a rollout written by older weights is regressed as it is",
        "shape the update with `regression_beta` and `kappa`, and bound how old a rollout may be with `max_staleness`",
    ),
    **refusal_entries(
        "token_budget",
        "an optimizer step trains exactly per_device_train_batch_size x gradient_accumulation_steps x num_processes "
        "rollouts, whole groups, like MInTRLTrainer's batch: the rollout worker admits rollouts and schedules "
        "interventions per optimizer step, and the regression is a mean over the step's rollouts, while a token "
        "budget makes the number of rollouts per micro-batch vary",
        "leave it at 0 (a fixed number of rollouts per micro-batch) and bound memory with per_device_train_batch_size",
    ),
    **refusal_entries(
        "router_aux_loss_coef",
        "MInTRL's loss does not add a Mixture-of-Experts router load-balancing loss",
        "leave it at 0.0 (no auxiliary loss is added)",
    ),
    **refusal_entries(
        "fork_threshold_tokens",
        "it tunes how TRL's rollout worker splits re-tokenized multi-turn conversations into training rows; a MInTRL "
        "rollout is one token sequence (policy, judge and tool-result tokens) that is never re-tokenized",
        "nothing to set",
    ),
    **refusal_entries(
        "queue_maxsize",
        "it sizes TRL's own rollout worker's queue; MInTRL's worker writes one optimizer step's rollouts at a time, "
        "only as far ahead as max_staleness allows, which bounds the rollouts queued",
        "bound how far generation runs ahead with max_staleness",
    ),
    **refusal_entries(
        "log_completions num_completions_to_print",
        "TRL's rollout worker prints sample completions; MInTRL's worker logs its rollouts' rewards and lengths "
        "(reward, rewards/<function>, completions/*) but no texts",
        "read the rewards and lengths in the logs",
    ),
    **refusal_entries(
        "top_p top_k min_p repetition_penalty",
        "the regression anchors each policy token at the log-prob the vLLM server sampled it with, and the trainer "
        "scores the same token under the full softmax at `temperature`; a truncated (top_p, top_k, min_p) or "
        "penalised (repetition_penalty) sampling distribution gives the server a different log-prob even at "
        "staleness 0 (measured: -0.10 nats per token at temperature 0.7, top_p 0.9), a bias in every residual that "
        "grows with the completion's length and so favours long rollouts",
        "sample from the full distribution and shape it with `temperature` only (MInTRLTrainer, which scores its "
        "own samples, takes these fields)",
    ),
    **refusal_entries(
        "judge_vllm_gpu_memory_utilization",
        "the asynchronous trainer has no colocated vLLM engine to share GPU memory with: the policy generates on a "
        "vLLM server, and a judge='model' or 'base' judge generates with transformers in the trainer's process",
        "serve the judge model with `vllm serve` and use judge='endpoint', or leave it None",
    ),
}


@dataclass
class AsyncMInTRLConfig(MInTRLFields, AsyncGRPOConfig):
    r"""
    Configuration class for the [`AsyncMInTRLTrainer`]: MInTRL on TRL's asynchronous GRPO trainer
    (`trl.experimental.async_grpo`), where a `vllm serve` server writes the rollouts (policy chunks, judge reviews
    and corrections) while the trainer trains on earlier ones.

    [`~trl.experimental.async_grpo.AsyncGRPOConfig`] parameters apply, except those MInTRL cannot honour
    (`REFUSED_ASYNC_FIELDS`: `epsilon`, `epsilon_high`, `token_budget`, `router_aux_loss_coef`,
    `fork_threshold_tokens`, `queue_maxsize`, `log_completions`,
    `num_completions_to_print`, the sampling filters `top_p`, `top_k`, `min_p` and `repetition_penalty`,
    `judge_vllm_gpu_memory_utilization`): a non-default value is refused when the config is built, with the reason
    and what to use instead. The server must report the log-probs it samples with (`vllm serve --logprobs-mode
    processed_logprobs`, checked when training starts): its default, the raw model's, ignores `temperature`. `max_inflight_tasks` is not read (TRL sets it for its own
    worker): `max_staleness` bounds how far MInTRL's worker runs ahead. MInTRL's own parameters are those
    of [`MInTRLConfig`], with the same names, defaults, meaning and checks, except `anchor` (below). On CPU set
    `use_cpu=True` and `bf16=False` (`AsyncGRPOConfig` defaults to bf16).

    Parameters:
        > Parameters that control the asynchronous pipeline

        max_staleness (`int`, *optional*, defaults to `2`):
            How many weight syncs a rollout may lag behind the weights that train on it; the worker starts a step's
            rollouts only once they will be this fresh, so none is dropped. At least `1`: TRL's dataloader
            (accelerate's dispatcher) fetches the next micro-batch before the current one trains, so the rollouts of
            optimizer step s+1 exist before step s updates the weights. `1` is the least staleness possible, but then
            generation and training take turns (the next batch may start only after the sync that ends the step
            before); `2` is the least at which they overlap. The default `2` measured 1.95x the steps per second of
            `MInTRLTrainer` with no resolved learning cost (`benchmarks/studies/cost_async.py`, `learning_async.py`). The
            regression needs no correction for staleness (its target holds for any behaviour policy), but older
            rollouts say less about the current policy.
        weight_sync (`str`, *optional*, defaults to `"disk"`):
            How the trained weights reach the vLLM server after each optimizer step (every `weight_sync_steps`):
            `"disk"` writes them as safetensors into `weight_sync_dir` and has the server reload them (vLLM's
            dev-mode `reload_weights` RPC: start the server with `VLLM_SERVER_DEV_MODE=1`, on a filesystem it shares
            with the trainer; the full model per sync, so for small models and CPU runs); `"nccl"` is TRL's NCCL
            broadcast (CUDA on both sides, a server started with `--weight-transfer-config '{"backend": "nccl"}'`).
        weight_sync_dir (`str` or `None`, *optional*, defaults to `None`):
            `weight_sync="disk"`: the folder the weights are written to, the trainer's own (it is deleted when
            training ends). `None`: `.vllm_weights` in `output_dir`.
        token_budget (`int` or `None`, *optional*, defaults to `0`):
            `AsyncGRPOConfig`'s token-budgeted batching is refused: a fixed `per_device_train_batch_size` rollouts
            per micro-batch and rank.
        router_aux_loss_coef (`float` or `None`, *optional*, defaults to `0.0`):
            MInTRL adds no Mixture-of-Experts load-balancing loss: any other value is refused.

        > Parameters that control the rewards and the loss

        reward_weights (`list[float]` or `None`, *optional*, defaults to `None`):
            Weights of the reward functions, one per function. `None`: weight `1.0` each.
        mask_truncated_completions (`bool`, *optional*, defaults to `False`):
            Leave rollouts cut at `max_completion_length` out of the regression; they still count in their group's
            baseline, as in [`MInTRLConfig`].
        anchor (`str`, *optional*, defaults to `"const"`):
            Only `"const"` (judge tokens anchored at `kappa`). `"proxy"` is refused: it anchors judge tokens at the
            behaviour policy's log-probability of them, and here the behaviour policy is a past weight version the
            trainer no longer holds, whose probability of those tokens the vLLM server never computed (it did not
            sample them).
    """

    _VALID_DICT_FIELDS = AsyncGRPOConfig._VALID_DICT_FIELDS + ["judge_chat_template_kwargs"]

    refused_fields = REFUSED_ASYNC_FIELDS

    # AsyncGRPOConfig fields with MInTRL's defaults
    max_staleness: int = field(
        default=2,
        metadata={
            "help": "How many weight syncs a rollout may lag behind the weights that train on it. At least 1: TRL's "
            "dataloader fetches the next micro-batch before the current one trains; 1 makes generation and training "
            "take turns, 2 (default) is the least at which they overlap."
        },
    )
    token_budget: int | None = field(
        default=0,
        metadata={"help": "Refused at any other value: a fixed per_device_train_batch_size rollouts per micro-batch."},
    )
    router_aux_loss_coef: float | None = field(
        default=0.0, metadata={"help": "MInTRL adds no Mixture-of-Experts load-balancing loss: keep 0.0."}
    )
    # asynchronous pipeline
    weight_sync: str = field(
        default="disk",
        metadata={
            "help": "How trained weights reach the vLLM server: 'disk' (safetensors in weight_sync_dir, reloaded by "
            "the server's dev-mode reload_weights RPC; VLLM_SERVER_DEV_MODE=1, shared filesystem) or 'nccl' (TRL's "
            "NCCL broadcast; CUDA on both sides).",
            "choices": list(WEIGHT_SYNCS),
        },
    )
    weight_sync_dir: str | None = field(
        default=None,
        metadata={
            "help": "weight_sync='disk': the trainer's own folder for the weights (deleted when training ends). None: "
            ".vllm_weights in output_dir."
        },
    )
    # rewards and loss (GRPOConfig fields that AsyncGRPOConfig lacks)
    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "Weights of the reward functions, one per function. None: weight 1.0 each."},
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={
            "help": "Leave rollouts cut at max_completion_length out of the regression (they still count in their "
            "group's baseline)."
        },
    )

    def __post_init__(self):
        if self.anchor == "proxy":
            raise ValueError(
                "anchor='proxy' is refused by AsyncMInTRLConfig: proxy anchors judge tokens at the behaviour policy's "
                "log-probability of them, and in asynchronous training the behaviour policy is a past weight version "
                "the trainer no longer holds, whose probability of those tokens the vLLM server never computed (it "
                "did not sample them). Use anchor='const' (judge tokens anchored at kappa), or MInTRLTrainer for proxy "
                "anchors."
            )
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync={self.weight_sync!r} is not one of {WEIGHT_SYNCS}.")
        if self.max_staleness < 1:
            raise ValueError(
                f"max_staleness={self.max_staleness}: TRL's dataloader (accelerate's dispatcher, dispatch_batches=True) "
                "fetches the next micro-batch before the current one trains, so the rollouts of optimizer step s+1 are "
                "written before step s updates the weights and are at least one weight sync old when they train; a "
                "rollout worker that waits for fresher weights would wait forever. Use max_staleness >= 1 (1: the "
                "least staleness possible)."
            )
        super().__post_init__()
        # after MInTRL's checks, which resolve num_generations from the group split
        samples_per_step = self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size
        if samples_per_step % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size x gradient_accumulation_steps x processes = {samples_per_step} rollouts "
                f"per optimizer step is not a multiple of num_generations={self.num_generations}: a step trains "
                "whole groups (a group's controls are its baseline). Change per_device_train_batch_size or "
                "num_generations."
            )
