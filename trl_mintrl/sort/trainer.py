"""`SORTTrainer`: GRPO plus the plan-salience-weighted repair of all-wrong prompts (SPEC section 3).

How it plugs into `GRPOTrainer` (all by wrapping `super()`):
- `_generate_and_score_completions`: after TRL has scored the batch, prompts whose rollouts all scored 0 go to the
  buffer with their reference. Rewards are already gathered; the deferred (prompt, reference) pairs are gathered too,
  so every process appends the same items in the same order and holds the same buffer.
- `_compute_loss`: on the first micro-batch of an optimizer step, when the buffer holds `repair_batch_size` items,
  they are popped, the policy writes a plan for each, the reference is scored under the base and the teacher
  prompt, and `repair_loss_weight * repair_loss` is added to that micro-batch's GRPO loss.
- `_extra_state` / `_load_extra_state`: the buffer is the extra state `GRPOTrainerBase` writes atomically to
  `sort_buffer.json` in every checkpoint and requires on resume.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from trl.data_utils import is_conversational
from trl.trainer.utils import get_config_model_id, selective_log_softmax

from ..engines.vllm import check_vllm_mode_supported
from ..losses import sort_repair_terms
from ..model_card import ModelCardMixin
from ..prompts import question_text
from ..trainer_base import GRPOTrainerBase, check_reference_column
from .buffer import BUFFER_FILE, RepairBuffer, RepairItem, classify_groups
from .config import SORTConfig


@dataclass
class _Reference:
    """A reference as it is scored: its token ids (EOS appended unless truncated) and the text the planner reads."""

    ids: list[int]
    text: str
    truncated: bool


class SORTTrainer(ModelCardMixin, GRPOTrainerBase):
    """Selective Off-policy Reference Tuning: GRPO whose all-wrong prompts are repaired later from their references.

    Used exactly like [`~trl.GRPOTrainer`] (same arguments) with a [`SORTConfig`]. The train dataset must have the
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

    def __init__(self, model, reward_funcs=None, args: SORTConfig | None = None, train_dataset=None, *rest, **kwargs):
        if args is None:
            model_id = model if isinstance(model, str) else get_config_model_id(model.config)
            args = SORTConfig(f"{model_id.split('/')[-1]}-SORT")
        if not isinstance(args, SORTConfig):
            raise TypeError(f"SORTTrainer needs `args` to be a SORTConfig, got {type(args).__name__}.")
        check_reference_column(train_dataset, args.reference_column, "SORT's repair")  # iterable: checked per row
        check_vllm_mode_supported(args)  # plans are written by the colocated engine, never by a server
        super().__init__(model, reward_funcs, args, train_dataset, *rest, **kwargs)
        self.sort_buffer = RepairBuffer()

    # ---- deferring all-wrong prompts -------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._defer_all_wrong_groups(inputs)
        return output

    def _defer_all_wrong_groups(self, inputs: list[dict]) -> None:
        """Push every all-wrong prompt of the gathered batch into the buffer (same items, same order, every rank)."""
        all_wrong, all_right = classify_groups(self._batch_rewards(), self._group_size())
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

    def _compute_loss(self, model, inputs):
        """GRPO loss, plus the repair loss on the first micro-batch of an optimizer step when the buffer is full.

        The repair loss enters each repairing optimizer step exactly once, so it is not divided by the number of
        accumulation steps: its weight relative to the (already GA-scaled) GRPO loss does not depend on how the
        step's batch is split into micro-batches.
        """
        loss = super()._compute_loss(model, inputs)
        if not self.model.training or self._step % self.current_gradient_accumulation_steps:
            return loss
        if len(self.sort_buffer) >= self.args.repair_batch_size:
            repair = self._repair_loss(model, self.sort_buffer.pop(self.args.repair_batch_size))
            loss = loss + self.args.repair_loss_weight * repair
        metrics = self._metrics["train"]
        metrics["sort/buffer_size"].append(len(self.sort_buffer))
        for name, value in self.sort_buffer.counters.items():
            metrics[f"sort/{name}"].append(value)
        return loss

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

        plans = self._write_plans(items, references)
        base_prompts = self._base_prompt_ids([item.prompt for item in items])
        teacher_prompts = self._templated_prompt_ids(
            [
                self.args.teacher_template.format(question=question_text(item.prompt), plan=plan)
                for item, plan in zip(items, plans, strict=True)
            ],
            [item.prompt for item in items],
        )
        reference_ids = [r.ids for r in references]
        base_logps, mask = self._reference_logps(model, base_prompts, reference_ids)
        with torch.no_grad():
            plan_logps, _ = self._reference_logps(model, teacher_prompts, reference_ids)
        mask = mask * torch.tensor(real, device=mask.device).unsqueeze(1)

        repair = sort_repair_terms(base_logps.float(), plan_logps.float(), mask, self.args.repair_beta)
        local = torch.stack(
            [
                mask.sum(),
                repair.loss.detach() * mask.sum(),  # the loss is normalised by this process's token count
                (repair.weights * mask).sum(),
                (repair.salience * mask).sum(),
            ]
        )
        tokens, loss_sum, weight_sum, salience_sum = self.accelerator.reduce(local, reduction="sum").tolist()
        local_max = repair.salience.masked_fill(mask == 0, -math.inf).max().reshape(1)
        salience_max = self.accelerator.gather(local_max).max()
        metrics = self._metrics["train"]
        metrics["sort/repair_loss"].append(loss_sum / tokens)
        metrics["sort/mean_weight"].append(weight_sum / tokens)
        metrics["sort/salience_mean"].append(salience_sum / tokens)
        metrics["sort/salience_max"].append(salience_max.item())

        # Gradients are averaged over processes (DDP, DeepSpeed): scale so that the average is the global loss.
        scale = mask.sum() * world / tokens
        return repair.loss * scale

    def _prepare_reference(self, reference: str) -> _Reference:
        ids = self._reference_token_ids(reference)
        limit = self.args.max_reference_tokens
        if len(ids) > limit:
            return _Reference(ids[:limit], self._tokenizer.decode(ids[:limit]), truncated=True)
        return _Reference([*ids, self._tokenizer.eos_token_id], reference, truncated=False)

    def _write_plans(self, items: list[RepairItem], references: list[_Reference]) -> list[str]:
        """One batched call of the trainer's generation engine (transformers or vLLM): the policy's plan per item."""
        prompts = self._templated_prompt_ids(
            [
                self.args.plan_template.format(question=question_text(item.prompt), reference=ref.text)
                for item, ref in zip(items, references, strict=True)
            ],
            [item.prompt for item in items],
        )
        generations = self.policy_engine.generate(
            prompts, self.args.max_plan_tokens, temperature=self.args.plan_temperature
        )
        return [self._tokenizer.decode(g.token_ids, skip_special_tokens=True).strip() for g in generations]

    def _base_prompt_ids(self, prompts: list) -> list[list[int]]:
        if self.args.base_template is None:
            return list(self._tokenize_prompts(prompts)[0])
        texts = [self.args.base_template.format(question=question_text(p)) for p in prompts]
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

    # ---- checkpoints -----------------------------------------------------------------------------------------------

    def _extra_state(self) -> dict:
        return self.sort_buffer.state_dict()

    def _load_extra_state(self, state: dict) -> None:
        self.sort_buffer.load_state_dict(state)
