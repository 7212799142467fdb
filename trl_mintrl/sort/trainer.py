"""`SORTTrainer`: GRPO plus the plan-salience-weighted repair of all-wrong prompts (SPEC section 3).

The repair is `ReferenceRepair`, a mixin shared with `MInTRLSORTTrainer` (`trl_mintrl.combined`). It adds no TRL
hook of its own: a trainer calls `_check_repair_inputs` before `super().__init__()` (fail before the model loads),
`_init_repair` after it, `_defer_all_wrong_groups` after its `_generate_and_score_completions` and
`_with_joint_repair` on its `_compute_loss`, and saves `sort_buffer` with its checkpoints. So the main update stays
the trainer's own (GRPO here, MInTRL's regression in the combined trainer) and the repair is the same code.

- deferring: after TRL has scored the batch, prompts none of whose rollouts is correct (by
  `correctness_reward_funcs` and `correct_threshold`) go to the buffer with their reference. Rewards are already
  gathered; the deferred (prompt, reference) pairs are gathered too, so every process appends the same items in the
  same order and holds the same buffer.
- the repair: when the buffer holds `repair_batch_size` items, they are popped, the policy writes a plan for each
  (with `plan_chat_template_kwargs`), the reference is scored under the base and the teacher prompt, and
  `repair_loss_weight * repair_loss` is either its own optimizer step right after the main step
  (`repair_update="separate"`, run by a callback at `on_optimizer_step`) or added to the first micro-batch's loss
  (`"joint"`).
- `SORTTrainer._extra_state` / `_load_extra_state`: the buffer is the extra state `GRPOTrainerBase` writes
  atomically to `sort_buffer.json` in every checkpoint and requires on resume.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import torch
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object
from torch import nn
from transformers import TrainerCallback
from trl.data_utils import is_conversational
from trl.trainer.utils import get_callable_name, get_config_model_id, selective_log_softmax

from ..engines.vllm import check_vllm_mode_supported
from ..losses import reference_nll_loss, sort_repair_terms
from ..model_card import ModelCardMixin
from ..text import fill_template, opens_thinking, outside_thinking, question_text
from ..trainer_base import GRPOTrainerBase, check_reference_column
from .buffer import BUFFER_FILE, RepairBuffer, RepairItem, classify_groups, correctness_scores, resolve_reward_funcs
from .config import SORTConfig
from .planner import Planner, PlanRequest, check_planner

logger = get_logger(__name__)


@dataclass
class _Reference:
    """A reference as it is scored: its token ids (EOS appended unless truncated) and the text the planner reads."""

    ids: list[int]
    text: str
    truncated: bool


class ReferenceRepair:
    """SORT's repair machinery for a `GRPOTrainerBase` subclass whose config has `SORTConfig`'s repair fields (see the
    module docstring for how a trainer wires it).

    The repair items of a step are dealt round-robin across processes; each process scores its share and the loss is
    normalised by the global token count, so the gradient averaged over processes is that of the repair over all
    items, as in a single process.
    """

    sort_buffer: RepairBuffer
    sort_planner: Planner | None  # None: the policy writes the plans (set by the trainer's constructor)

    def _check_repair_inputs(self, args, reward_funcs, train_dataset) -> None:
        """Checks that need no model, run before `super().__init__()`: the reference column and the correctness
        functions' names."""
        check_reference_column(train_dataset, args.reference_column, "SORT's repair")  # iterable: checked per row
        self._correctness_funcs = resolve_reward_funcs(args.correctness_reward_funcs, reward_func_names(reward_funcs))

    def _init_repair(self) -> None:
        """The empty buffer, and with `repair_update="separate"` the callback that runs the repair step."""
        self.sort_buffer = RepairBuffer()
        self._batches_failing_unseen = 0  # see `_warn_if_failures_slip_through`
        self._warned_failures_slip_through = False
        if self.args.repair_update == "separate":
            self.add_callback(_SeparateRepairStep(self))

    # ---- deferring all-wrong prompts -------------------------------------------------------------------------------

    def _defer_all_wrong_groups(self, inputs: list[dict]) -> None:
        """Push every all-wrong prompt of the gathered batch into the buffer (same items, same order, every rank).
        Evaluation batches are not deferred."""
        if not self.model.training:
            return
        scores = correctness_scores(self._batch_rewards_per_func, self.reward_weights, self._correctness_funcs)
        all_wrong, all_right = classify_groups(scores, self._group_size(), self.args.correct_threshold)
        rows = self._process_slice(len(inputs))
        first_rows = [g * self._group_size() for g in all_wrong.nonzero().flatten().tolist()]
        mine = [
            (row, inputs[row - rows.start]["prompt"], self._reference_of(inputs[row - rows.start]))
            for row in first_rows
            if rows.start <= row < rows.stop
        ]
        for _, prompt, reference in sorted(gather_object(mine), key=lambda t: t[0]):
            if reference is None or not self._reference_token_ids(reference):
                self.sort_buffer.counters["empty_references"] += 1
            else:
                self.sort_buffer.add(prompt, reference)
        self._metrics["train"]["sort/all_wrong_frac"].append(all_wrong.float().mean().item())
        self._metrics["train"]["sort/all_right_frac"].append(all_right.float().mean().item())
        self._warn_if_failures_slip_through(all_wrong)

    # Generation batches in a row after which `_warn_if_failures_slip_through` warns.
    failures_slip_through_batches = 10

    def _warn_if_failures_slip_through(self, all_wrong: torch.Tensor) -> None:
        """Warn once when, batch after batch, nothing is deferred although a correctness function earns nothing (<= 0)
        on every rollout of some groups: a shaping term (format bonus) or a threshold below a wrong rollout's score
        lets failures through, and only `sort/all_wrong_frac = 0` would show it."""
        if self._warned_failures_slip_through:
            return
        rewards = self._batch_rewards_per_func[:, self._correctness_funcs]
        earned_nothing = (rewards.view(-1, self._group_size(), rewards.shape[1]) <= 0).all(dim=1).any(dim=0)
        if all_wrong.any() or not earned_nothing.any():
            self._batches_failing_unseen = 0
            return
        self._batches_failing_unseen += 1
        if self._batches_failing_unseen < self.failures_slip_through_batches:
            return
        self._warned_failures_slip_through = True
        names = [self.reward_func_names[self._correctness_funcs[i]] for i in earned_nothing.nonzero().flatten()]
        logger.warning(
            f"SORT deferred no prompt for {self._batches_failing_unseen} generation batches, yet {names} scored <= 0 "
            "on every rollout of some prompts: those failures never reach the repair buffer. If these functions "
            "decide correctness, set `correctness_reward_funcs` to them alone (a format bonus makes a wrong rollout "
            f"look correct), or raise `correct_threshold` (now {self.args.correct_threshold}) to at least the score "
            "of a wrong rollout."
        )

    def _reference_of(self, row: dict) -> str | None:
        column = self.args.reference_column
        if column not in row:
            raise ValueError(
                f"A training row has no {column!r} column for its reference solution (keys: {sorted(row)}). Add it, "
                "or set `reference_column` to the column that holds them."
            )
        reference = row[column]
        if reference is not None and not isinstance(reference, str):
            raise ValueError(f"`{column}` (the `reference_column`) must hold strings, got {type(reference).__name__}.")
        return reference

    def _reference_token_ids(self, reference: str) -> list[int]:
        return self._tokenizer(reference, add_special_tokens=False)["input_ids"]

    # ---- the repair ------------------------------------------------------------------------------------------------

    def _with_joint_repair(self, model, loss: torch.Tensor) -> torch.Tensor:
        """`loss` (the trainer's main loss of a micro-batch); with `repair_update="joint"`, plus the repair loss on the
        first micro-batch of an optimizer step when the buffer is full.

        The repair loss enters each repairing optimizer step exactly once, so it is not divided by the number of
        accumulation steps: its weight relative to the (already GA-scaled) main loss does not depend on how the
        step's batch is split into micro-batches.
        """
        first_micro_batch = self._step % self.current_gradient_accumulation_steps == 0
        if self.args.repair_update == "joint" and self.model.training and first_micro_batch:
            repair = self._repair_from_buffer(model)
            if repair is not None:
                loss = loss + self.args.repair_loss_weight * repair
        return loss

    def _repair_from_buffer(self, model) -> torch.Tensor | None:
        """This process's repair loss on the `repair_batch_size` oldest buffered prompts, None when fewer are held;
        logs the buffer metrics either way. The buffer is the same on every process, so is the decision."""
        repair = None
        if len(self.sort_buffer) >= self.args.repair_batch_size:
            repair = self._repair_loss(model, self.sort_buffer.pop(self.args.repair_batch_size))
        metrics = self._metrics["train"]
        metrics["sort/buffer_size"].append(len(self.sort_buffer))
        for name, value in self.sort_buffer.counters.items():
            metrics[f"sort/{name}"].append(value)
        return repair

    def _separate_repair_step(self) -> None:
        """The repair as an optimizer step of its own, right after the main (GRPO or MInTRL) step
        (`repair_update="separate"`).

        Runs at `on_optimizer_step`: after `optimizer.step()`, before the scheduler step and `global_step += 1`, so it
        uses the main step's learning rate and is not a step of the schedule. It shares the optimizer (and its state,
        e.g. Adam's moments) with the main update. Gradients are clipped on their own to `max_grad_norm`. Under
        DeepSpeed the engine steps and clips (its `gradient_clipping`) inside `accelerator.backward`, and
        `optimizer.step()` is a no-op, exactly as in the trainer's own step.
        """
        model = self.model_wrapped
        with self.compute_loss_context_manager():
            repair = self._repair_from_buffer(model)
        if repair is None:
            return
        model.zero_grad()  # the main step's gradients, already used by the step just taken
        deepspeed = self.accelerator.distributed_type == DistributedType.DEEPSPEED
        self.accelerator.backward(
            self.args.repair_loss_weight * repair, **({"scale_wrt_gas": False} if deepspeed else {})
        )
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else math.inf
        grad_norm = self.accelerator.clip_grad_norm_(model.parameters(), max_norm)
        self.optimizer.step()
        model.zero_grad()
        if grad_norm is not None:
            self._metrics["train"]["sort/repair_grad_norm"].append(float(grad_norm))

    def _repair_loss(self, model, items: list[RepairItem]) -> torch.Tensor:
        """This process's part of the SORT loss on `items`; summed over processes it is the loss over all items."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        references = [self._prepare_reference(item.reference) for item in items]
        self.sort_buffer.counters["repairs"] += 1
        self.sort_buffer.counters["truncated_references"] += sum(r.truncated for r in references)

        # Round-robin share; a process with one item fewer scores a copy of item 0 at zero weight, so that every
        # process runs the same generate call and forward passes (ZeRO-3 gathers parameters collectively).
        share = list(range(rank, len(items), world))
        real = [1.0] * len(share) + [0.0] * (math.ceil(len(items) / world) - len(share))
        share += [0] * (len(real) - len(share))
        items, references = [items[i] for i in share], [references[i] for i in share]

        reference_ids = [r.ids for r in references]
        base_logps, mask = self._reference_logps(
            model, self._base_prompt_ids([i.prompt for i in items]), reference_ids
        )
        mask = mask * torch.tensor(real, device=mask.device).unsqueeze(1)
        if self.args.repair_weighting == "uniform":  # plain SFT on the references: no plan, no teacher pass
            loss, weights, salience = reference_nll_loss(base_logps.float(), mask), torch.ones_like(mask), None
            failed_plans = torch.zeros((), device=mask.device)
        else:
            plans, failed = self._write_plans(items, references)
            teacher_prompts = self._templated_prompt_ids(
                [
                    fill_template(self.args.teacher_template, {"question": question_text(item.prompt), "plan": plan})
                    for item, plan in zip(items, plans, strict=True)
                ],
                [item.prompt for item in items],
            )
            with torch.no_grad():
                plan_logps, _ = self._reference_logps(model, teacher_prompts, reference_ids)
            loss, weights, salience = sort_repair_terms(
                base_logps.float(), plan_logps.float(), mask, self.args.repair_beta
            )
            failed_plans = torch.tensor(
                float(sum(f for f, r in zip(failed, real, strict=True) if r)), device=mask.device
            )

        sums = [mask.sum(), loss.detach() * mask.sum(), (weights * mask).sum(), failed_plans]  # loss: mean over tokens
        if salience is not None:
            sums.append((salience * mask).sum())
        totals = self.accelerator.reduce(torch.stack(sums), reduction="sum").tolist()
        tokens, loss_sum, weight_sum, failed_total = totals[:4]
        self.sort_buffer.counters["failed_plans"] += int(failed_total)
        metrics = self._metrics["train"]
        metrics["sort/repair_loss"].append(loss_sum / tokens)
        metrics["sort/mean_weight"].append(weight_sum / tokens)
        if salience is not None:
            local_max = salience.masked_fill(mask == 0, -math.inf).max().reshape(1)
            metrics["sort/salience_mean"].append(totals[4] / tokens)
            metrics["sort/salience_max"].append(self.accelerator.gather(local_max).max().item())

        # Gradients are averaged over processes (DDP, DeepSpeed): scale so that the average is the global loss.
        scale = mask.sum() * world / tokens
        return loss * scale

    def _prepare_reference(self, reference: str) -> _Reference:
        ids = self._reference_token_ids(reference)
        limit = self.args.max_reference_tokens
        if len(ids) > limit:
            return _Reference(ids[:limit], self._tokenizer.decode(ids[:limit]), truncated=True)
        return _Reference([*ids, self._tokenizer.eos_token_id], reference, truncated=False)

    def _write_plans(self, items: list[RepairItem], references: list[_Reference]) -> tuple[list[str], list[bool]]:
        """The plan per item and whether each failed: from the trainer's `planner` when it has one (a failed plan is
        empty), else the policy's, from one batched call of the trainer's generation engine (transformers or vLLM).

        A plan fails when it hits `max_plan_tokens` without ending or leaves a thinking block open. A failed item is
        still repaired, with what the plan has outside thinking (an empty plan when it only thought): the item was
        popped from the buffer, its reference is still worth learning, and an empty plan only takes the plan's
        salience out of its weights.
        """
        if self.sort_planner is not None:
            requests = [PlanRequest(question_text(i.prompt), r.text) for i, r in zip(items, references, strict=True)]
            written = self.sort_planner.plan(requests)
            if len(written) != len(requests):
                raise ValueError(f"{self.sort_planner!r} returned {len(written)} plans for {len(requests)} requests")
            return [p.text.strip() for p in written], [p.failed for p in written]
        texts = [
            fill_template(self.args.plan_template, {"question": question_text(item.prompt), "reference": ref.text})
            for item, ref in zip(items, references, strict=True)
        ]
        if is_conversational({"prompt": items[0].prompt}):
            rendered = self.processing_class.apply_chat_template(
                conversation=[[{"role": "user", "content": text}] for text in texts],
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                **{**self.chat_template_kwargs, **self.args.plan_chat_template_kwargs},
            )
            prompts = [list(ids) for ids in rendered["input_ids"]]
        else:
            prompts = self._templated_prompt_ids(texts, [item.prompt for item in items])
        generations = self.policy_engine.generate(
            prompts, self.args.max_plan_tokens, temperature=self.args.plan_temperature
        )
        plans, failed = [], []
        for prompt, generation in zip(prompts, generations, strict=True):
            ended = bool(generation.token_ids) and generation.token_ids[-1] in self.eos_token_ids
            plan, thinking_open = outside_thinking(
                self._tokenizer.decode(generation.token_ids, skip_special_tokens=True),
                opened=opens_thinking(self._tokenizer.decode(prompt)),
            )
            plans.append(plan.strip())
            failed.append(thinking_open or not ended)
        return plans, failed

    def _base_prompt_ids(self, prompts: list) -> list[list[int]]:
        if self.args.base_template is None:
            return list(self._tokenize_prompts(prompts)[0])
        texts = [fill_template(self.args.base_template, {"question": question_text(p)}) for p in prompts]
        return self._templated_prompt_ids(texts, prompts)

    def _templated_prompt_ids(self, texts: list[str], like: list) -> list[list[int]]:
        """Token ids of rendered templates, tokenised like the dataset prompts: one user message through the chat
        template (with the trainer's chat template settings) for conversational data, plain text otherwise."""
        if is_conversational({"prompt": like[0]}):
            texts = [[{"role": "user", "content": text}] for text in texts]
        return list(self._tokenize_prompts(texts)[0])

    def _reference_logps(
        self, model, prompt_ids: list[list[int]], reference_ids: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) log-probs at temperature 1.0 of each reference token after its prompt, and the (B, R) token mask.

        Prompts are left-padded and references right-padded, as TRL lays out prompts and completions. At sampling
        temperature 1.0 this is TRL's fused scoring; otherwise TRL's fused head would divide by the sampling
        temperature, so the reference positions' logits are taken from the model and normalised here.
        """
        width, length = max(map(len, prompt_ids)), max(map(len, reference_ids))
        input_ids = torch.full((len(prompt_ids), width + length), self._tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, (prompt, reference) in enumerate(zip(prompt_ids, reference_ids, strict=True)):
            input_ids[row, width - len(prompt) : width + len(reference)] = torch.tensor([*prompt, *reference])
            attention_mask[row, width - len(prompt) : width + len(reference)] = 1
        input_ids, attention_mask = input_ids.to(self.accelerator.device), attention_mask.to(self.accelerator.device)
        mask = attention_mask[:, width:].float()
        if self.temperature == 1.0:
            logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, length)
        else:
            with self.accelerator.autocast():
                logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length + 1).logits
            logps = selective_log_softmax(logits[:, :-1].float(), input_ids[:, width:])
        return logps * mask, mask


class SORTTrainer(ReferenceRepair, ModelCardMixin, GRPOTrainerBase):
    """Selective Off-policy Reference Tuning: GRPO whose all-wrong prompts are repaired later from their references.

    Used exactly like [`~trl.GRPOTrainer`] (same arguments, plus an optional `planner`: a `trl_mintrl.sort.Planner`
    that writes the repair plans instead of the policy) with a [`SORTConfig`]. The train dataset must have the
    `reference_column` (default `"solution"`). The repair items of a step are dealt round-robin across processes;
    each process scores its share and the loss is normalised by the global token count, so the gradient averaged over
    processes is that of the repair over all items, as in a single process.
    """

    extra_state_file = BUFFER_FILE
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

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: SORTConfig | None = None,
        train_dataset=None,
        *rest,
        planner=None,
        **kwargs,
    ):
        if args is None:
            model_id = model if isinstance(model, str) else get_config_model_id(model.config)
            args = SORTConfig(f"{model_id.split('/')[-1]}-SORT")
        if not isinstance(args, SORTConfig):
            raise TypeError(f"SORTTrainer needs `args` to be a SORTConfig, got {type(args).__name__}.")
        self._check_repair_inputs(args, reward_funcs, train_dataset)
        self.sort_planner = check_planner(planner)
        check_vllm_mode_supported(args)
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)
        self._init_repair()

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._defer_all_wrong_groups(inputs)
        return output

    def _compute_loss(self, model, inputs):
        """GRPO loss; with `repair_update="joint"`, plus the repair loss (`ReferenceRepair._with_joint_repair`)."""
        return self._with_joint_repair(model, super()._compute_loss(model, inputs))

    def _extra_state(self) -> dict:
        return self.sort_buffer.state_dict()

    def _load_extra_state(self, state: dict) -> None:
        self.sort_buffer.load_state_dict(state)


class _SeparateRepairStep(TrainerCallback):
    """Runs the trainer's repair step right after each main optimizer step (`repair_update="separate"`)."""

    def __init__(self, trainer: ReferenceRepair):
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._separate_repair_step()


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
