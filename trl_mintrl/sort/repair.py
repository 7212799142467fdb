"""SORT's repair of all-wrong prompts (SPEC section 3) as a component, `ReferenceRepair`, that any trainer built on
`GRPOTrainerBase` can host: `SORTTrainer` (GRPO's update) and `MInTRLSORTTrainer` (MInTRL's regression) both do,
through `WithReferenceRepair`, so the main update stays the trainer's own and the repair is the same code.

The host interface is small: `check_repair_inputs` before the model loads, then the component is built after
`super().__init__()`; the host passes each scored generation batch to `defer_all_wrong_groups`, each micro-batch loss
through `with_joint_repair`, and saves `state_dict()` with its checkpoints. The component reads the host's
tokenizer, generation engine, scoring forward pass and metrics, and owns its buffer, counters and warnings.

- deferring: after TRL has scored the batch, prompts none of whose rollouts is correct (by
  `correctness_reward_funcs` and `correct_threshold`) go to the buffer with their reference. Rewards are already
  gathered; the deferred (prompt, reference) pairs are gathered too, so every process appends the same items in the
  same order and holds the same buffer.
- the repair: when the buffer holds `repair_batch_size` items, they are popped, the policy writes a plan for each
  (with `plan_chat_template_kwargs`), the reference is scored under the base and the teacher prompt, and
  `repair_loss_weight * repair_loss` is either its own optimizer step right after the main step
  (`repair_update="separate"`, run by a callback at `on_optimizer_step`) or added to the first micro-batch's loss
  (`"joint"`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object
from torch import nn
from transformers import TrainerCallback
from trl.data_utils import is_conversational
from trl.trainer.utils import get_callable_name, get_config_model_id, selective_log_softmax

from ..losses import REPAIR_WEIGHTINGS
from ..text import fill_template, opens_thinking, outside_thinking, question_text
from ..trainer_base import check_reference_column
from .buffer import RepairBuffer, RepairItem, classify_groups, correctness_scores, resolve_reward_funcs
from .planner import Planner, PlanRequest, check_planner

logger = get_logger(__name__)


def check_repair_inputs(args, reward_funcs, train_dataset) -> list[int]:
    """Checks that need no model, run before the host's `super().__init__()`: the reference column and the
    correctness functions' names. Returns the indices of the correctness functions."""
    check_reference_column(train_dataset, args.reference_column, "SORT's repair")  # iterable: checked per row
    return resolve_reward_funcs(args.correctness_reward_funcs, reward_func_names(reward_funcs))


class WithReferenceRepair:
    """Mixin, first in a `GRPOTrainerBase` subclass's bases, that hosts a `ReferenceRepair` as `self.repair`: inputs
    checked before the model loads, each scored batch deferred after the trainer's own `_score_batch`, the repair
    added to the trainer's own `_compute_loss` (`repair_update="joint"`)."""

    repair: ReferenceRepair

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, *rest, planner=None, **kwargs):
        correctness_funcs = check_repair_inputs(args, reward_funcs, train_dataset)
        planner = check_planner(planner)
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)
        self.repair = ReferenceRepair(self, correctness_funcs, planner)

    def _score_batch(self, output: dict, batch) -> None:
        super()._score_batch(output, batch)
        self.repair.defer_all_wrong_groups(batch)

    def _compute_loss(self, model, inputs):
        """The trainer's own loss; with `repair_update="joint"`, plus the repair loss (`with_joint_repair`)."""
        return self.repair.with_joint_repair(model, super()._compute_loss(model, inputs))


@dataclass
class _Reference:
    """A reference as it is scored: its token ids (EOS appended unless truncated) and the text the planner reads."""

    ids: list[int]
    text: str
    truncated: bool


class ReferenceRepair:
    """SORT's repair as a component of its host trainer: it owns the buffer, its counters and its warnings; the host
    hands it each scored batch (`defer_all_wrong_groups`) and its micro-batch loss (`with_joint_repair`), and saves
    `state_dict()` with its checkpoints. `WithReferenceRepair` does that wiring.

    The repair items of a step are dealt round-robin across processes; each process scores its share and the loss is
    normalised by the global token count, so the gradient averaged over processes is that of the repair over all
    items, as in a single process.
    """

    # Generation batches in a row after which `_warn_if_failures_slip_through` warns.
    failures_slip_through_batches = 10

    def __init__(self, host, correctness_funcs: list[int], planner: Planner | None = None):
        """`host`: the trainer that repairs (a `GRPOTrainerBase` whose config has `SORTConfig`'s repair fields);
        `correctness_funcs`: the indices `check_repair_inputs` resolved; `planner`: writes the plans (None: the
        policy writes them through the host's generation engine). With `repair_update="separate"` the
        component adds the callback that runs the repair step to the host."""
        self.host = host
        self.args = host.args
        self.correctness_funcs = correctness_funcs
        self.planner = planner
        self.buffer = RepairBuffer()
        self._prepared: dict[str, _Reference] = {}  # buffered references, tokenised once when deferred
        self._batches_failing_unseen = 0  # see `_warn_if_failures_slip_through`
        self._warned_failures_slip_through = False
        if self.args.repair_update == "separate":
            host.add_callback(_SeparateRepairStep(self))

    def state_dict(self) -> dict:
        """The repair's training state (the buffer and its counters), saved with the host's checkpoints."""
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)

    # ---- deferring all-wrong prompts -------------------------------------------------------------------------------

    def defer_all_wrong_groups(self, batch) -> None:
        """Push every all-wrong prompt of the gathered batch into the buffer (same items, same order, every rank).
        Evaluation batches are not deferred."""
        if not self.host.model.training:
            return
        inputs = batch.inputs
        scores = correctness_scores(batch.rewards_per_func, self.host.reward_weights, self.correctness_funcs)
        all_wrong, all_right = classify_groups(scores, self.host._group_size(), self.args.correct_threshold)
        rows = self.host._process_slice(len(inputs))
        first_rows = [g * self.host._group_size() for g in all_wrong.nonzero().flatten().tolist()]
        mine = [
            (row, inputs[row - rows.start]["prompt"], self._reference_of(inputs[row - rows.start]))
            for row in first_rows
            if rows.start <= row < rows.stop
        ]
        for _, prompt, reference in sorted(gather_object(mine), key=lambda t: t[0]):
            prepared = self._prepare_reference(reference)
            if prepared is None:
                self.buffer.counters["empty_references"] += 1
            elif self.buffer.add(prompt, reference):
                self._prepared[reference] = prepared
        self.host._metrics["train"]["sort/all_wrong_frac"].append(all_wrong.float().mean().item())
        self.host._metrics["train"]["sort/all_right_frac"].append(all_right.float().mean().item())
        self._warn_if_failures_slip_through(all_wrong, batch.rewards_per_func)

    def _warn_if_failures_slip_through(self, all_wrong: torch.Tensor, rewards_per_func: torch.Tensor) -> None:
        """Warn once when, batch after batch, nothing is deferred although a correctness function earns nothing (<= 0)
        on every rollout of some groups: a shaping term (format bonus) or a threshold below a wrong rollout's score
        lets failures through, and only `sort/all_wrong_frac = 0` would show it."""
        if self._warned_failures_slip_through:
            return
        rewards = rewards_per_func[:, self.correctness_funcs]
        earned_nothing = (rewards.view(-1, self.host._group_size(), rewards.shape[1]) <= 0).all(dim=1).any(dim=0)
        if all_wrong.any() or not earned_nothing.any():
            self._batches_failing_unseen = 0
            return
        self._batches_failing_unseen += 1
        if self._batches_failing_unseen < self.failures_slip_through_batches:
            return
        self._warned_failures_slip_through = True
        names = [self.host.reward_func_names[self.correctness_funcs[i]] for i in earned_nothing.nonzero().flatten()]
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

    # ---- the repair ------------------------------------------------------------------------------------------------

    def with_joint_repair(self, model, loss: torch.Tensor) -> torch.Tensor:
        """`loss` (the trainer's main loss of a micro-batch); with `repair_update="joint"`, plus the repair loss on the
        first micro-batch of an optimizer step when the buffer is full.

        The repair loss enters each repairing optimizer step exactly once, so it is not divided by the number of
        accumulation steps: its weight relative to the (already GA-scaled) main loss does not depend on how the
        step's batch is split into micro-batches.
        """
        first_micro_batch = self.host._step % self.host.current_gradient_accumulation_steps == 0
        if self.args.repair_update == "joint" and self.host.model.training and first_micro_batch:
            repair = self._repair_from_buffer(model)
            if repair is not None:
                loss = loss + self.args.repair_loss_weight * repair
        return loss

    def _repair_from_buffer(self, model) -> torch.Tensor | None:
        """This process's repair loss on the `repair_batch_size` oldest buffered prompts, None when fewer are held;
        logs the buffer metrics either way. The buffer is the same on every process, so is the decision."""
        repair = None
        if len(self.buffer) >= self.args.repair_batch_size:
            repair = self._repair_loss(model, self.buffer.pop(self.args.repair_batch_size))
        metrics = self.host._metrics["train"]
        metrics["sort/buffer_size"].append(len(self.buffer))
        for name, value in self.buffer.counters.items():
            metrics[f"sort/{name}"].append(value)
        return repair

    def separate_repair_step(self) -> None:
        """The repair as an optimizer step of its own, right after the main (GRPO or MInTRL) step
        (`repair_update="separate"`).

        Runs at `on_optimizer_step`: after `optimizer.step()`, before the scheduler step and `global_step += 1`, so it
        uses the main step's learning rate and is not a step of the schedule. It shares the optimizer (and its state,
        e.g. Adam's moments) with the main update. Gradients are clipped on their own to `max_grad_norm`. Under
        DeepSpeed the engine steps and clips (its `gradient_clipping`) inside `accelerator.backward`, and
        `optimizer.step()` is a no-op, exactly as in the trainer's own step.
        """
        model = self.host.model_wrapped
        with self.host.compute_loss_context_manager():
            repair = self._repair_from_buffer(model)
        if repair is None:
            return
        model.zero_grad()  # the main step's gradients, already used by the step just taken
        deepspeed = self.host.accelerator.distributed_type == DistributedType.DEEPSPEED
        self.host.accelerator.backward(
            self.args.repair_loss_weight * repair, **({"scale_wrt_gas": False} if deepspeed else {})
        )
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else math.inf
        grad_norm = self.host.accelerator.clip_grad_norm_(model.parameters(), max_norm)
        self.host.optimizer.step()
        model.zero_grad()
        if grad_norm is not None:
            self.host._metrics["train"]["sort/repair_grad_norm"].append(float(grad_norm))

    def _repair_loss(self, model, items: list[RepairItem]) -> torch.Tensor:
        """This process's part of the SORT loss on `items`; summed over processes it is the loss over all items."""
        world = self.host.accelerator.num_processes
        references = [
            self._prepared.pop(item.reference, None) or self._prepare_reference(item.reference) for item in items
        ]
        self.buffer.counters["repairs"] += 1
        self.buffer.counters["truncated_references"] += sum(r.truncated for r in references)
        items, references, real = self._process_share(items, references)

        reference_ids = [r.ids for r in references]
        base_logps, mask = self._reference_logps(
            model, self._base_prompt_ids([i.prompt for i in items]), reference_ids
        )
        mask = mask * torch.tensor(real, device=mask.device).unsqueeze(1)
        weighting = REPAIR_WEIGHTINGS[self.args.repair_weighting]
        plan_logps, failed_plans = None, torch.zeros((), device=mask.device)
        if weighting.uses_plan:  # "uniform" is plain SFT on the references: no plan, no teacher pass
            plan_logps, failed_plans = self._plan_logps(model, items, references, real)
        loss, weights, salience = weighting.terms(
            base_logps.float(), None if plan_logps is None else plan_logps.float(), mask, self.args.repair_beta
        )
        tokens = self._log_repair(loss, weights, salience, mask, failed_plans)

        # Gradients are averaged over processes (DDP, DeepSpeed): scale so that the average is the global loss.
        scale = mask.sum() * world / tokens
        return loss * scale

    def _process_share(self, items: list[RepairItem], references: list[_Reference]):
        """This process's round-robin share of the items and references, and 1.0 / 0.0 per row: real or a pad.

        A process with one item fewer scores a copy of item 0 at zero weight, so that every process runs the same
        generate call and forward passes (ZeRO-3 gathers parameters collectively)."""
        world, rank = self.host.accelerator.num_processes, self.host.accelerator.process_index
        share = list(range(rank, len(items), world))
        real = [1.0] * len(share) + [0.0] * (math.ceil(len(items) / world) - len(share))
        share += [0] * (len(real) - len(share))
        return [items[i] for i in share], [references[i] for i in share], real

    def _plan_logps(self, model, items: list[RepairItem], references: list[_Reference], real: list[float]):
        """(B, R) log-probs of the references under the teacher prompt with the policy's plans (no gradient), and
        the number of failed plans among the real rows (a 0-d tensor, summed over processes by the caller)."""
        plans, failed = self._write_plans(items, references)
        teacher_prompts = self._templated_prompt_ids(
            [
                fill_template(self.args.teacher_template, {"question": question_text(item.prompt), "plan": plan})
                for item, plan in zip(items, plans, strict=True)
            ],
            [item.prompt for item in items],
        )
        with torch.no_grad():
            plan_logps, mask = self._reference_logps(model, teacher_prompts, [r.ids for r in references])
        failed_plans = torch.tensor(float(sum(f for f, r in zip(failed, real, strict=True) if r)), device=mask.device)
        return plan_logps, failed_plans

    def _log_repair(self, loss, weights, salience, mask, failed_plans) -> float:
        """Log the repair's metrics over all processes (a collective); returns the global reference token count."""
        sums = [mask.sum(), loss.detach() * mask.sum(), (weights * mask).sum(), failed_plans]  # loss: mean over tokens
        if salience is not None:
            sums.append((salience * mask).sum())
        totals = self.host.accelerator.reduce(torch.stack(sums), reduction="sum").tolist()
        tokens, loss_sum, weight_sum, failed_total = totals[:4]
        self.buffer.counters["failed_plans"] += int(failed_total)
        metrics = self.host._metrics["train"]
        metrics["sort/repair_loss"].append(loss_sum / tokens)
        metrics["sort/mean_weight"].append(weight_sum / tokens)
        if salience is not None:
            local_max = salience.masked_fill(mask == 0, -math.inf).max().reshape(1)
            metrics["sort/salience_mean"].append(totals[4] / tokens)
            metrics["sort/salience_max"].append(self.host.accelerator.gather(local_max).max().item())
        return tokens

    def _prepare_reference(self, reference: str | None) -> _Reference | None:
        """The reference as it is scored, cut to `max_reference_tokens`; None when it is missing or has no tokens
        (counted as an empty reference, never deferred). A pure function of the text, so it may be cached."""
        ids = [] if reference is None else self.host._tokenizer(reference, add_special_tokens=False)["input_ids"]
        if not ids:
            return None
        limit = self.args.max_reference_tokens
        if len(ids) > limit:
            return _Reference(ids[:limit], self.host._tokenizer.decode(ids[:limit]), truncated=True)
        return _Reference([*ids, self.host._tokenizer.eos_token_id], reference, truncated=False)

    def _write_plans(self, items: list[RepairItem], references: list[_Reference]) -> tuple[list[str], list[bool]]:
        """The plan per item and whether each failed: from the `planner` when there is one (a failed plan is
        empty), else the policy's, from one batched call of the trainer's generation engine (transformers or vLLM).

        A plan fails when it hits `max_plan_tokens` without ending or leaves a thinking block open. A failed item is
        still repaired, with what the plan has outside thinking (an empty plan when it only thought): the item was
        popped from the buffer, its reference is still worth learning, and an empty plan only takes the plan's
        salience out of its weights.
        """
        if self.planner is not None:
            requests = [PlanRequest(question_text(i.prompt), r.text) for i, r in zip(items, references, strict=True)]
            written = self.planner.plan(requests)
            if len(written) != len(requests):
                raise ValueError(f"{self.planner!r} returned {len(written)} plans for {len(requests)} requests")
            return [p.text.strip() for p in written], [p.failed for p in written]
        texts = [
            fill_template(self.args.plan_template, {"question": question_text(item.prompt), "reference": ref.text})
            for item, ref in zip(items, references, strict=True)
        ]
        if is_conversational({"prompt": items[0].prompt}):
            rendered = self.host.processing_class.apply_chat_template(
                conversation=[[{"role": "user", "content": text}] for text in texts],
                chat_template=self.host.chat_template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                **{**self.host.chat_template_kwargs, **self.args.plan_chat_template_kwargs},
            )
            prompts = [list(ids) for ids in rendered["input_ids"]]
        else:
            prompts = self._templated_prompt_ids(texts, [item.prompt for item in items])
        generations = self.host.policy_engine.generate(
            prompts, self.args.max_plan_tokens, temperature=self.args.plan_temperature
        )
        plans, failed = [], []
        for prompt, generation in zip(prompts, generations, strict=True):
            ended = bool(generation.token_ids) and generation.token_ids[-1] in self.host.eos_token_ids
            plan, thinking_open = outside_thinking(
                self.host._tokenizer.decode(generation.token_ids, skip_special_tokens=True),
                opened=opens_thinking(self.host._tokenizer.decode(prompt)),
            )
            plans.append(plan.strip())
            failed.append(thinking_open or not ended)
        return plans, failed

    def _base_prompt_ids(self, prompts: list) -> list[list[int]]:
        if self.args.base_template is None:
            return list(self.host._tokenize_prompts(prompts)[0])
        texts = [fill_template(self.args.base_template, {"question": question_text(p)}) for p in prompts]
        return self._templated_prompt_ids(texts, prompts)

    def _templated_prompt_ids(self, texts: list[str], like: list) -> list[list[int]]:
        """Token ids of rendered templates, tokenised like the dataset prompts: one user message through the chat
        template (with the trainer's chat template settings) for conversational data, plain text otherwise."""
        if is_conversational({"prompt": like[0]}):
            texts = [[{"role": "user", "content": text}] for text in texts]
        return list(self.host._tokenize_prompts(texts)[0])

    def _reference_logps(
        self, model, prompt_ids: list[list[int]], reference_ids: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) log-probs at temperature 1.0 of each reference token after its prompt, and the (B, R) token mask.

        Prompts are left-padded and references right-padded, as TRL lays out prompts and completions. At sampling
        temperature 1.0 this is TRL's fused scoring; otherwise TRL's fused head would divide by the sampling
        temperature, so the reference positions' logits are taken from the model and normalised here.
        """
        width, length = max(map(len, prompt_ids)), max(map(len, reference_ids))
        input_ids = torch.full((len(prompt_ids), width + length), self.host._tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, (prompt, reference) in enumerate(zip(prompt_ids, reference_ids, strict=True)):
            input_ids[row, width - len(prompt) : width + len(reference)] = torch.tensor([*prompt, *reference])
            attention_mask[row, width - len(prompt) : width + len(reference)] = 1
        input_ids, attention_mask = (
            input_ids.to(self.host.accelerator.device),
            attention_mask.to(self.host.accelerator.device),
        )
        mask = attention_mask[:, width:].float()
        if self.host.temperature == 1.0:
            logps, _, _ = self.host._get_per_token_logps_and_entropies(model, input_ids, attention_mask, length)
        else:
            with self.host.accelerator.autocast():
                logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length + 1).logits
            logps = selective_log_softmax(logits[:, :-1].float(), input_ids[:, width:])
        return logps * mask, mask


class _SeparateRepairStep(TrainerCallback):
    """Runs the repair step right after each main optimizer step (`repair_update="separate"`)."""

    def __init__(self, repair: ReferenceRepair):
        self.repair = repair

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.repair.separate_repair_step()


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
