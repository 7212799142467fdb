"""SORT's repair of all-wrong prompts as a component, `ReferenceRepair`, that any trainer built on
`GRPOTrainerBase` can host: `SORTTrainer` (GRPO's update) and `MInTRLSORTTrainer` (MInTRL's regression) both do,
through `WithReferenceRepair` (`sort/hosting.py`), so the main update stays the trainer's own and the repair is the
same code.

The host interface is small: `check_repair_inputs` before the model loads, then the component is built after
`super().__init__()`; the host passes each scored generation batch to `defer_all_wrong_groups`, calls `joint_repair`
before each micro-batch's own loss, and saves `state_dict()` with its checkpoints. The component reaches the host
through `GRPOTrainerBase`'s public interface (its tokenizer and prompt templating, group size, process slice, metrics,
generation engine and scoring forward pass), and owns its buffer, counters and warnings. How the references and the
passes' prompts are rendered is `sort/references.py`, the length checks on them `sort/length_checks.py`; the separate repair step's
optimizer state is `sort/repair_optimizer.py`.

- deferring: after TRL has scored the batch, prompts none of whose rollouts is correct (by
  `correctness_reward_funcs` and `correct_threshold`) go to the buffer with their reference. Rewards are already
  gathered; the deferred (prompt, reference) pairs are gathered too, so every process appends the same items in the
  same order and holds the same buffer.
  The buffer is bounded (`repair_buffer_size`, oldest evicted) and a buffered prompt that is sampled again and solved
  leaves it.
- the repair: while the buffer holds `repair_batch_size` items (at most `max_repairs_per_step` times per optimizer
  step), that many are popped, the policy writes a plan for each (with `plan_chat_template_kwargs`, in generate calls
  of `plan_batch_size` rows, by default one), the reference is scored under the teacher and the base prompt, and the
  gradient of `repair_loss_weight * repair_loss` is accumulated micro-batch by micro-batch (at most
  `per_device_train_batch_size` rows per forward). It is either its own optimizer step right after the main step
  (`repair_update="separate"`, run by a callback at `on_optimizer_step`, with its own optimizer state under
  `repair_optimizer="own"`) or accumulated into the main step on its first micro-batch (`"joint"`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object
from transformers import TrainerCallback

from ..input_checks import is_reference_conversation
from ..losses import REPAIR_WEIGHTINGS, RepairTerms
from ..text import opens_thinking, outside_thinking, question_text
from .buffer import RepairBuffer, RepairItem, classify_groups, correctness_scores, solved_groups
from .config import repair_buffer_bounds
from .length_checks import repair_passes_over_context
from .planner import Planner, PlanRequest
from .references import (
    Reference,
    ReferenceRenderer,
    reference_conversation_refusal,
    reference_key,
)
from .repair_optimizer import RepairOptimizer
from .scoring import learned_mask

logger = get_logger(__name__)


@dataclass
class _RepairSums:
    """This process's sums over the reference tokens of one repair, accumulated micro-batch by micro-batch."""

    loss: float = 0.0  # of -w_t * log p_base
    weight: float = 0.0
    salience: float = 0.0
    salience_max: float = -math.inf

    def add(self, terms: RepairTerms, mask: torch.Tensor) -> None:
        self.loss += (terms.loss.detach() * mask.sum()).item()  # `terms.loss` is the mean over `mask`
        self.weight += (terms.weights * mask).sum().item()
        if terms.salience is not None:
            self.salience += (terms.salience * mask).sum().item()
            chunk_max = terms.salience.masked_fill(mask == 0, -math.inf).max().item()
            self.salience_max = max(self.salience_max, chunk_max)


class ReferenceRepair:
    """SORT's repair as a component of its host trainer: it owns the buffer, its counters and its warnings; the host
    hands it each scored batch (`defer_all_wrong_groups`), calls `joint_repair` before each micro-batch's loss, and
    saves `state_dict()` with its checkpoints. `WithReferenceRepair` does that wiring.

    The repair items of a step are dealt round-robin across processes; each process scores its share and the loss is
    normalised by the global token count, so the gradient averaged over processes is that of the repair over all
    items, as in a single process.
    """

    # Generation batches in a row after which `_warn_if_failures_slip_through` warns.
    failures_slip_through_batches = 10
    # Warned once per run, by `_deferrable_reference`.
    _warned_cut_reference = False
    _warned_too_long = False

    def __init__(self, host, correctness_funcs: list[int], planner: Planner | None = None):
        """`host`: the trainer that repairs (a `GRPOTrainerBase` whose config has `SORTConfig`'s repair fields);
        `correctness_funcs`: the indices `check_repair_inputs` resolved; `planner`: writes the plans (None: the
        policy writes them through the host's generation engine). With `repair_update="separate"` the
        component adds the callback that runs the repair step to the host."""
        self.host = host
        self.args = host.args
        self.correctness_funcs = correctness_funcs
        self.planner = planner
        self.renderer = ReferenceRenderer.of_trainer(host, policy_writes_plans=planner is None)
        capacity, self.max_repairs_per_step = repair_buffer_bounds(self.args)
        self.buffer = RepairBuffer(capacity)
        self._prepared: dict[str, Reference] = {}  # buffered references by `reference_key`, tokenised once
        self.policy_prompts: list | None = None  # the batch's prompts as the policy saw them (`WithReferenceRepair`)
        self._batches_failing_unseen = 0  # see `_warn_if_failures_slip_through`
        self._warned_failures_slip_through = False
        self.optimizer = RepairOptimizer(host)  # how the separate repair steps step, and their own optimizer state
        if self.args.repair_update == "separate":
            host.add_callback(_SeparateRepairStep(self))

    def state_dict(self) -> dict:
        """The repair's training state (the buffer and its counters), saved with the host's checkpoints."""
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)

    # ---- deferring all-wrong prompts -------------------------------------------------------------------------------

    def defer_all_wrong_groups(self, batch) -> None:
        """Push every all-wrong prompt of the gathered batch into the buffer, and drop every buffered prompt that a
        rollout of the batch solved (same changes, same order, every rank). Evaluation batches change nothing."""
        if not self.host.model.training:
            return
        inputs = batch.inputs
        scores = correctness_scores(batch.rewards_per_func, self.host.reward_weights, self.correctness_funcs)
        group_size, threshold = self.host.group_size(), self.args.correct_threshold
        all_wrong, all_right = classify_groups(scores, group_size, threshold)
        solved = solved_groups(scores, group_size, threshold)
        rows = self.host.process_slice(len(inputs))
        # the prompts as the policy saw them: with an environment, its `reset` observation is in the last message
        prompts, self.policy_prompts = self.policy_prompts, None
        mine = []  # (row, solved, prompt, reference, environment) of this process's groups that change the buffer
        for group in (all_wrong | solved).nonzero().flatten().tolist():
            row = group * group_size
            if not rows.start <= row < rows.stop:
                continue
            prompt, environment = prompts[row - rows.start], self.renderer.environment_of(inputs[row - rows.start])
            if all_wrong[group]:
                mine.append((row, False, prompt, self._reference_of(inputs[row - rows.start], prompt), environment))
            elif self.buffer.holds(prompt):
                mine.append((row, True, prompt, None, environment))
        step = self.host.state.global_step
        for _, solved_now, prompt, reference, environment in sorted(gather_object(mine), key=lambda t: t[0]):
            if solved_now:
                self.buffer.remove_solved(prompt)
                continue
            # None: empty or too long, counted there
            prepared = self._deferrable_reference(reference, prompt, environment)
            if prepared is not None and self.buffer.add(prompt, reference, deferred_at=step, environment=environment):
                self._prepared[reference_key(reference)] = prepared
        held = {reference_key(item.reference) for item in self.buffer.items}  # evicted and solved ones' are not
        self._prepared = {key: ref for key, ref in self._prepared.items() if key in held}
        self.host.log_train_metric("sort/all_wrong_frac", all_wrong.float().mean().item())
        self.host.log_train_metric("sort/all_right_frac", all_right.float().mean().item())
        self._warn_if_failures_slip_through(all_wrong, batch.rewards_per_func)

    def _warn_if_failures_slip_through(self, all_wrong: torch.Tensor, rewards_per_func: torch.Tensor) -> None:
        """Warn once when, batch after batch, nothing is deferred although a correctness function earns nothing (<= 0)
        on every rollout of some groups: a shaping term (format bonus) or a threshold below a wrong rollout's score
        lets failures through, and only `sort/all_wrong_frac = 0` would show it."""
        if self._warned_failures_slip_through:
            return
        rewards = rewards_per_func[:, self.correctness_funcs]
        earned_nothing = (rewards.view(-1, self.host.group_size(), rewards.shape[1]) <= 0).all(dim=1).any(dim=0)
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

    def _reference_of(self, row: dict, prompt) -> str | list[dict] | None:
        """The row's reference, checked as the dataset's are before training (a row of an iterable dataset is seen
        here first): a string, None, or a conversation the repair can learn after `prompt`."""
        column = self.args.reference_column
        if column not in row:
            raise ValueError(
                f"A training row has no {column!r} column for its reference solution (keys: {sorted(row)}). Add it, "
                "or set `reference_column` to the column that holds them."
            )
        reference = row[column]
        if not (reference is None or isinstance(reference, str) or is_reference_conversation(reference)):
            raise ValueError(
                f"`{column}` (the `reference_column`) must hold strings or conversations (lists of messages), got "
                f"{type(reference).__name__}."
            )
        if is_reference_conversation(reference):
            refusal = reference_conversation_refusal(
                self.renderer, prompt, reference, self.renderer.environment_of(row)
            )
            if refusal:
                raise ValueError(
                    f"A reference conversation in `{column}` (the `reference_column`) cannot be learnt: {refusal}"
                )
        return reference

    def _deferrable_reference(
        self, reference: str | list[dict] | None, prompt, environment: str | None
    ) -> Reference | None:
        """The reference of the all-wrong `prompt` as it is scored, or None when the pair may not be deferred, which
        is counted: an empty reference (`empty_references`), a pair that a repair pass cannot fit in the context
        (`skipped_too_long`: a row the check before training did not scan, e.g. of an iterable dataset). The first
        cut reference and the first skip of a run each warn once, naming the setting."""
        prepared = self.renderer.reference(reference)
        counters = self.buffer.counters
        if prepared is None:
            counters["empty_references"] += 1
            return None
        needed = self.renderer.repair_lengths([prompt], [prepared], [environment])[0]
        over = repair_passes_over_context(needed, self.host.model.config, self.args)
        if over:
            counters["skipped_too_long"] = counters.get("skipped_too_long", 0) + 1
            if not self._warned_too_long:
                self._warned_too_long = True
                logger.warning(f"SORT skips an all-wrong prompt it cannot repair: {over[0]} Skips are counted in "
                               "sort/skipped_too_long.")  # fmt: skip
            return None
        limit = self.args.max_reference_tokens
        if prepared.truncated and not self._warned_cut_reference:
            self._warned_cut_reference = True
            logger.warning(
                f"A deferred reference has {prepared.tokens} tokens, more than max_reference_tokens={limit}: the "
                f"repair learns only its first {limit} tokens (and no EOS). {counters['truncated_references']} cut "
                "references repaired so far; all are counted in sort/truncated_references. Raise "
                "max_reference_tokens (within the context) to learn whole references."
            )
        return prepared

    # ---- the repair ------------------------------------------------------------------------------------------------

    def joint_repair(self, model) -> torch.Tensor | float:
        """With `repair_update="joint"`, on the first micro-batch of an optimizer step: runs the due repairs, their
        gradients accumulated now, and returns `repair_loss_weight` times their summed loss, detached, which the host
        adds to the loss it reports; 0.0 otherwise.

        The gradients are accumulated here (micro-batch by micro-batch, `_repair_loss`) instead of returned as a loss
        for the host's backward because a repair of long references does not fit in one graph. It runs before the
        host's own forward so that every forward is followed by its own backward (DDP would not reduce the gradients
        of a forward that waits behind another). Each repair enters its optimizer step exactly once and is not divided
        by the accumulation steps: its weight relative to the (already GA-scaled) main loss does not depend on how the
        step's batch is split into micro-batches.
        """
        first_micro_batch = self.host.is_first_micro_batch()
        if self.args.repair_update != "joint" or not self.host.model.training or not first_micro_batch:
            return 0.0
        repair = sum(self._repair_loss(model, items) for items in self._due_repairs())
        self._log_buffer()
        return self.args.repair_loss_weight * repair

    def _due_repairs(self) -> list[list[RepairItem]]:
        """The repairs to run now, popped from the buffer: `repair_batch_size` oldest items each, as many as the
        buffer holds, at most `max_repairs_per_step`. The buffer is the same on every process, so is the decision."""
        count = min(len(self.buffer) // self.args.repair_batch_size, self.max_repairs_per_step)
        return [self.buffer.pop(self.args.repair_batch_size) for _ in range(count)]

    def _log_buffer(self) -> None:
        """The buffer's size and running counters, once per optimizer step, after its repairs."""
        self.host.log_train_metric("sort/buffer_size", len(self.buffer))
        for name, value in self.buffer.counters.items():
            self.host.log_train_metric(f"sort/{name}", value)

    def separate_repair_step(self) -> None:
        """The due repairs as optimizer steps of their own, right after the main (GRPO or MInTRL) step
        (`repair_update="separate"`), one step per repair.

        Runs at `on_optimizer_step`: after `optimizer.step()`, before the scheduler step and `global_step += 1`. The
        main step's gradients are released first, before any plan is written or forward run. Each repair step uses
        the main schedule's current learning rate and is not a step of the schedule; with `repair_optimizer="own"`
        it steps with an optimizer state of its own (`repair_optimizer.OwnOptimizerState`). Gradients are clipped on
        their own to `max_grad_norm`. Under DeepSpeed the engine steps and clips (its `gradient_clipping`) inside the
        last micro-batch's `accelerator.backward`, and `optimizer.step()` is a no-op, exactly as in the trainer's own
        step.
        """
        repairs = self._due_repairs()
        if not repairs:
            self._log_buffer()
            return
        model = self.host.model_wrapped
        model.zero_grad()  # the main step's gradients, already used by the step just taken
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else math.inf
        with self.optimizer.stepping():
            for items in repairs:
                with self.host.compute_loss_context_manager():
                    self._repair_loss(model, items, steps_engine=True)
                grad_norm = self.host.accelerator.clip_grad_norm_(model.parameters(), max_norm)
                self.host.optimizer.step()
                model.zero_grad()
                if grad_norm is not None:
                    self.host.log_train_metric("sort/repair_grad_norm", float(grad_norm))
        self._log_buffer()

    def _repair_loss(self, model, items: list[RepairItem], steps_engine: bool = False) -> torch.Tensor:
        """Backpropagates `repair_loss_weight` times this process's part of the SORT loss on `items`, micro-batch by
        micro-batch, and returns the loss over all items (detached, the same on every process).

        Every forward takes at most `per_device_train_batch_size` rows: the teacher pass (no gradient) first, then
        the base pass, each of its micro-batches backpropagated before the next runs. The loss is normalised once by
        the reference tokens of all items on all processes (every process holds every item, so no collective is
        needed), so the micro-batches' gradients, averaged over processes, add up to the gradient of the unchunked
        repair over all items. `steps_engine`: under DeepSpeed the last micro-batch's backward is the engine's
        optimizer step (the separate repair step); otherwise the engine only accumulates.
        """
        world = self.host.accelerator.num_processes
        references = [
            self._prepared.pop(reference_key(item.reference), None) or self.renderer.reference(item.reference)
            for item in items
        ]
        self.buffer.counters["repairs"] += 1
        self.buffer.counters["truncated_references"] += sum(r.truncated for r in references)
        tokens = sum(r.learned_tokens for r in references)
        ages = [self.host.state.global_step - item.deferred_at for item in items]
        items, references, real = self._process_share(items, references)

        chunks = self._micro_batches(len(items))
        weighting = REPAIR_WEIGHTINGS[self.args.repair_weighting]
        plan_logps, failed_plans = [None] * len(chunks), 0.0
        if weighting.uses_plan:  # "uniform" is plain SFT on the references: no plan, no teacher pass
            plan_logps, failed_plans = self._plan_logps(model, items, references, real, chunks)
        base_prompts = self.renderer.base_prompt_ids([i.prompt for i in items], [i.environment for i in items])
        sums = _RepairSums()
        for index, (rows, plan) in enumerate(zip(chunks, plan_logps, strict=True)):
            base, mask = self._reference_logps(
                model, [base_prompts[i] for i in rows], [references[i].ids for i in rows]
            )
            mask = mask * torch.tensor([real[i] for i in rows], device=mask.device).unsqueeze(1)
            mask = mask * learned_mask([references[i] for i in rows], mask)
            terms = weighting.terms(base.float(), None if plan is None else plan.float(), mask, self.args.repair_beta)
            # Gradients are averaged over processes (DDP, DeepSpeed): scaled so that the average is the global loss.
            loss = terms.loss * mask.sum() * (world / tokens)
            last = index == len(chunks) - 1
            self._backward(model, self.args.repair_loss_weight * loss, last=last, steps_engine=steps_engine and last)
            sums.add(terms, mask)
        return self._log_repair(sums, failed_plans, tokens, ages, with_salience=weighting.uses_plan)

    def _backward(self, model, loss: torch.Tensor, last: bool, steps_engine: bool) -> None:
        """`accelerator.backward` of one repair micro-batch. Outside DeepSpeed, gradients are synchronised across
        processes on the last micro-batch only (`no_sync` before it, as the Trainer does for its own micro-batches).
        Under DeepSpeed the engine's accumulation boundary is set explicitly: the engine steps only when
        `steps_engine`, and the loss is not divided by the accumulation steps (as the Trainer's `scale_wrt_gas`)."""
        accelerator = self.host.accelerator
        if accelerator.distributed_type != DistributedType.DEEPSPEED:
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                accelerator.backward(loss)
            return
        # What `accelerator.backward` does under DeepSpeed, with the boundary given instead of the accumulation
        # state's (its public wrapper takes it: the engine steps on it); `scale_wrt_gas=False` reaches the engine
        accelerator.deepspeed_engine_wrapped.backward(loss, sync_gradients=steps_engine, scale_wrt_gas=False)

    def _micro_batches(self, rows: int, plans: bool = False) -> list[range]:
        """Consecutive row ranges of at most `per_device_train_batch_size` rows: every repair forward takes one, and
        every plan generate call takes at most `plan_batch_size` rows (`plans=True`; None: all rows in one call), as
        plans are generated without gradients. Every process has as many rows (`_process_share`), so as many ranges:
        the same forwards and generate calls on every process, as ZeRO-3 and a synchronized engine need."""
        size = (self.args.plan_batch_size or max(rows, 1)) if plans else self.args.per_device_train_batch_size
        return [range(start, min(start + size, rows)) for start in range(0, rows, size)]

    def _process_share(self, items: list[RepairItem], references: list[Reference]):
        """This process's round-robin share of the items and references, and 1.0 / 0.0 per row: real or a pad.

        A process with one item fewer scores a copy of item 0 at zero weight, so that every process runs the same
        generate call and forward passes (ZeRO-3 gathers parameters collectively)."""
        world, rank = self.host.accelerator.num_processes, self.host.accelerator.process_index
        share = list(range(rank, len(items), world))
        real = [1.0] * len(share) + [0.0] * (math.ceil(len(items) / world) - len(share))
        share += [0] * (len(real) - len(share))
        return [items[i] for i in share], [references[i] for i in share], real

    def _plan_logps(
        self, model, items: list[RepairItem], references: list[Reference], real: list[float], chunks: list[range]
    ) -> tuple[list[torch.Tensor], float]:
        """Per micro-batch of `chunks`, the (rows, R) log-probs of the references under the teacher prompt with the
        policy's plans (no gradient), and the number of failed plans among the real rows (summed over processes by
        the caller)."""
        plans, failed = self._write_plans(items, references)
        teacher_prompts = self.renderer.teacher_prompt_ids(
            [item.prompt for item in items], plans, [item.environment for item in items]
        )
        with torch.no_grad():
            plan_logps = [
                self._reference_logps(model, [teacher_prompts[i] for i in rows], [references[i].ids for i in rows])[0]
                for rows in chunks
            ]
        return plan_logps, float(sum(f for f, r in zip(failed, real, strict=True) if r))

    def _log_repair(
        self, sums: _RepairSums, failed_plans: float, tokens: int, ages: list[int], with_salience: bool
    ) -> torch.Tensor:
        """Log the repair's metrics over all processes (collectives); returns the loss over all items (mean over
        their `tokens` reference tokens). `ages`: optimizer steps each item waited in the buffer."""
        device = self.host.accelerator.device
        local = torch.tensor([sums.loss, sums.weight, failed_plans, sums.salience], device=device)
        loss_sum, weight_sum, failed_total, salience_sum = self.host.accelerator.reduce(local, "sum").tolist()
        self.buffer.counters["failed_plans"] += int(failed_total)
        log = self.host.log_train_metric
        log("sort/repair_loss", loss_sum / tokens)
        log("sort/mean_weight", weight_sum / tokens)
        log("sort/repair_age_mean", sum(ages) / len(ages))
        log("sort/repair_age_max", max(ages))
        if with_salience:
            salience_max = self.host.accelerator.gather(torch.tensor([sums.salience_max], device=device)).max()
            log("sort/salience_mean", salience_sum / tokens)
            log("sort/salience_max", salience_max.item())
        return torch.tensor(loss_sum / tokens, device=device)

    def _write_plans(self, items: list[RepairItem], references: list[Reference]) -> tuple[list[str], list[bool]]:
        """The plan per item and whether each failed: from the `planner` when there is one (a failed plan is
        empty), else the policy's, from the trainer's generation engine (transformers or vLLM) in calls of
        `plan_batch_size` rows (None: one call for all of this process's items).

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
        prompts = self.renderer.plan_prompt_ids([item.prompt for item in items], references)
        engine, generations = self.host.policy_engine, []
        with engine.session():  # one preparation (ZeRO-3 gather, vLLM wake) for all calls
            for rows in self._micro_batches(len(prompts), plans=True):
                generations += engine.generate(
                    [prompts[i] for i in rows], self.args.max_plan_tokens, temperature=self.args.plan_temperature
                )
        plans, failed = [], []
        for prompt, generation in zip(prompts, generations, strict=True):
            ended = bool(generation.token_ids) and generation.token_ids[-1] in self.host.eos_token_ids
            plan, thinking_open = outside_thinking(
                self.host.tokenizer.decode(generation.token_ids, skip_special_tokens=True),
                opened=opens_thinking(self.host.tokenizer.decode(prompt)),
            )
            plans.append(plan.strip())
            failed.append(thinking_open or not ended)
        return plans, failed

    def _reference_logps(
        self, model, prompt_ids: list[list[int]], reference_ids: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) log-probs at temperature 1.0 of each reference token after its prompt, and the (B, R) token mask,
        from one forward of these rows.

        Prompts are left-padded and references right-padded, as TRL lays out prompts and completions. Scored through
        TRL's fused LM head at temperature 1.0 (`add_unit_temperature_head`), whatever the sampling temperature: the
        head projects the reference positions in tiles, so no (rows, R, vocabulary) logits are ever built.
        """
        width, length = max(map(len, prompt_ids)), max(map(len, reference_ids))
        input_ids = torch.full((len(prompt_ids), width + length), self.host.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, (prompt, reference) in enumerate(zip(prompt_ids, reference_ids, strict=True)):
            input_ids[row, width - len(prompt) : width + len(reference)] = torch.tensor([*prompt, *reference])
            attention_mask[row, width - len(prompt) : width + len(reference)] = 1
        input_ids, attention_mask = (
            input_ids.to(self.host.accelerator.device),
            attention_mask.to(self.host.accelerator.device),
        )
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, :width] = -100  # only the reference tokens are scored
        with self.host.accelerator.autocast():
            outputs = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                labels=labels,
                fused_lm_head=True,
                score_at_unit_temperature=True,
            )
        mask = attention_mask[:, width:].float()
        return outputs.log_probs[:, -length:] * mask, mask


class _SeparateRepairStep(TrainerCallback):
    """Runs the repair step right after each main optimizer step (`repair_update="separate"`)."""

    def __init__(self, repair: ReferenceRepair):
        self.repair = repair

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.repair.separate_repair_step()
