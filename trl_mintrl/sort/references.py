"""SORT's references as its repair scores them, and whether each repair pass fits the context.

`ReferenceRenderer` is the one rendering of the repair's token ids (the reference, the base, teacher and plan
prompts): `ReferenceRepair` scores what it renders, and the length checks measure exactly that, so a row they let
through fits. `check_repair_lengths` refuses a train dataset with rows that cannot fit, before the run spends anything
on them: `check_repair_lengths_before_loading` with the tokenizer and the model's config alone (the CLI, before the
model loads), `RepairLengthCheck` at the start of training (the trainer, once its planner is known).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from ..input_checks import InputError, context_length, named_rows
from ..losses import REPAIR_WEIGHTINGS
from ..text import fill_template, question_text

logger = logging.getLogger(__name__)

# SORT's repair passes: what each holds, and the settings that shorten it
REPAIR_PASSES = {
    "plan": (
        "the plan prompt (plan_template with the question and the reference, cut to max_reference_tokens={r}) "
        "plus max_plan_tokens={p} generated",
        "lower max_reference_tokens or max_plan_tokens",
    ),
    "teacher": (
        "the teacher pass (teacher_template with the question and a plan of up to max_plan_tokens={p}, then the "
        "reference of up to max_reference_tokens={r})",
        "lower max_reference_tokens or max_plan_tokens",
    ),
    "base": (
        "the base pass (the prompt, or base_template, then the reference of up to max_reference_tokens={r})",
        "lower max_reference_tokens",
    ),
}
ITERABLE_ROWS_CHECKED = 256  # rows of an iterable dataset the repair's length check reads before training


@dataclass
class Reference:
    """A reference as it is scored: its token ids (EOS appended unless truncated) and the text the planner reads."""

    ids: list[int]
    text: str
    truncated: bool
    tokens: int  # of the whole reference, before any cut (named when a cut one warns)


class ReferenceRenderer:
    """The token ids of SORT's repair passes, rendered the same way for the repair and for its length checks.

    Dataset prompts and one-message templates go through `tokenize_prompts` (TRL's own `_tokenize_prompts`), so the
    repair's prompts are templated as the rollouts' are; the plan prompt is one user message rendered with
    `plan_chat_template_kwargs` over the trainer's chat template settings.
    """

    def __init__(
        self,
        args,
        tokenizer,
        tokenize_prompts: Callable[[list], list[list[int]]],
        *,
        processing_class,
        chat_template: str | None,
        chat_template_kwargs: dict,
        policy_writes_plans: bool,
    ):
        """`args`: a config with `SORTConfig`'s repair fields; `tokenizer`: the text tokenizer (references, EOS);
        `tokenize_prompts`: prompts as in the dataset -> their token ids, as TRL templates them; `processing_class`,
        `chat_template`, `chat_template_kwargs`: how TRL applies the chat template; `policy_writes_plans`: no
        `Planner` writes the plans, so the plan prompt is a pass that must fit too."""
        self.args = args
        self.tokenizer = tokenizer
        self.tokenize_prompts = tokenize_prompts
        self.processing_class = processing_class
        self.chat_template = chat_template
        self.chat_template_kwargs = chat_template_kwargs
        self.policy_writes_plans = policy_writes_plans

    @classmethod
    def of_trainer(cls, trainer, policy_writes_plans: bool) -> ReferenceRenderer:
        """The rendering of `trainer` (a `GRPOTrainerBase` with `SORTConfig`'s repair fields)."""
        return cls(
            trainer.args,
            trainer.tokenizer,
            trainer.tokenize_prompts,
            processing_class=trainer.processing_class,
            chat_template=trainer.chat_template,
            chat_template_kwargs=trainer.chat_template_kwargs,
            policy_writes_plans=policy_writes_plans,
        )

    @classmethod
    def before_loading(cls, tokenizer, args) -> ReferenceRenderer:
        """The rendering of a trainer with this tokenizer and config, without tools, environments or images, for a
        check that runs before the model loads (the CLI, where the policy writes the plans)."""
        chat_template_kwargs = args.chat_template_kwargs or {}
        return cls(
            args,
            tokenizer,
            _TrlPromptTemplating(tokenizer, chat_template_kwargs),
            processing_class=tokenizer,
            chat_template=None,  # TRL replaces the template only for tool calling
            chat_template_kwargs=chat_template_kwargs,
            policy_writes_plans=True,
        )

    def reference(self, text: str | None) -> Reference | None:
        """`text` as it is scored, cut to `max_reference_tokens`; None when it is missing or has no tokens. A
        function of the text, so it may be cached."""
        ids = [] if text is None else self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            return None
        limit = self.args.max_reference_tokens
        if len(ids) > limit:
            return Reference(ids[:limit], self.tokenizer.decode(ids[:limit]), truncated=True, tokens=len(ids))
        return Reference([*ids, self.tokenizer.eos_token_id], text, truncated=False, tokens=len(ids))

    def base_prompt_ids(self, prompts: list) -> list[list[int]]:
        """The prompts the references are learnt after: the dataset's own, or `base_template` with the question."""
        if self.args.base_template is None:
            return self.tokenize_prompts(prompts)
        texts = [fill_template(self.args.base_template, {"question": question_text(p)}) for p in prompts]
        return self.templated_prompt_ids(texts, prompts)

    def teacher_prompt_ids(self, prompts: list, plans: list[str]) -> list[list[int]]:
        """`teacher_template` with each prompt's question and its plan."""
        texts = [
            fill_template(self.args.teacher_template, {"question": question_text(prompt), "plan": plan})
            for prompt, plan in zip(prompts, plans, strict=True)
        ]
        return self.templated_prompt_ids(texts, prompts)

    def plan_prompt_ids(self, prompts: list, references: list[Reference]) -> list[list[int]]:
        """The plan-extraction prompts the policy generates from: `plan_template` with the question and the
        (possibly cut) reference, rendered with `plan_chat_template_kwargs` for conversational data."""
        texts = [
            fill_template(self.args.plan_template, {"question": question_text(prompt), "reference": reference.text})
            for prompt, reference in zip(prompts, references, strict=True)
        ]
        if not is_conversational({"prompt": prompts[0]}):
            return self.templated_prompt_ids(texts, prompts)
        rendered = self.processing_class.apply_chat_template(
            conversation=[[{"role": "user", "content": text}] for text in texts],
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **{**self.chat_template_kwargs, **self.args.plan_chat_template_kwargs},
        )
        return [list(ids) for ids in rendered["input_ids"]]

    def templated_prompt_ids(self, texts: list[str], like: list) -> list[list[int]]:
        """Token ids of rendered templates, tokenised like the dataset prompts `like`: one user message through the
        chat template (with the trainer's chat template settings) for conversational data, plain text otherwise."""
        if is_conversational({"prompt": like[0]}):
            texts = [[{"role": "user", "content": text}] for text in texts]
        return self.tokenize_prompts(texts)

    def repair_lengths(self, prompts: list, references: list[Reference]) -> list[dict[str, int]]:
        """Per item, the most tokens each repair pass takes: `"plan"` (the plan prompt and `max_plan_tokens`
        generated; only when the policy writes the plans), `"teacher"` (the teacher prompt with a plan of
        `max_plan_tokens`, then the reference) and `"base"` (the base prompt, then the reference). A
        `repair_weighting` without plans has the base pass only."""
        base = self.base_prompt_ids(prompts)
        lengths = [{"base": len(ids) + len(r.ids)} for ids, r in zip(base, references, strict=True)]
        if not REPAIR_WEIGHTINGS[self.args.repair_weighting].uses_plan:
            return lengths
        plan_tokens = self.args.max_plan_tokens
        teacher = self.teacher_prompt_ids(prompts, [""] * len(prompts))
        for length, ids, reference in zip(lengths, teacher, references, strict=True):
            length["teacher"] = len(ids) + plan_tokens + len(reference.ids)
        if self.policy_writes_plans:
            for length, ids in zip(lengths, self.plan_prompt_ids(prompts, references), strict=True):
                length["plan"] = len(ids) + plan_tokens
        return lengths


class _TrlPromptTemplating:
    """TRL's `GRPOTrainer._tokenize_prompts` before there is a trainer: the attributes it reads, as a trainer without
    tools or images has them, so that prompts are tokenised before the model loads exactly as the trainer will."""

    _is_vlm = False
    environment_factories = None
    tools = None
    chat_template = None

    def __init__(self, tokenizer, chat_template_kwargs: dict):
        self.processing_class = tokenizer
        self.chat_template_kwargs = chat_template_kwargs

    def __call__(self, prompts: list) -> list[list[int]]:
        return list(GRPOTrainer._tokenize_prompts(self, prompts)[0])


def repair_passes_over_context(needed: dict[str, int], model_config, args) -> list[str]:
    """For each of SORT's repair passes that needs more tokens (`needed`, by pass) than it can take, a sentence naming
    it, its length, the limit and the fix. The plan is generated by the policy's engine (`context_length`); the base
    and teacher passes are forward passes of the training model, bounded by its positions only."""
    positions = getattr(model_config, "max_position_embeddings", None)
    engine = context_length(model_config, args)
    limits = {"plan": engine, "teacher": positions, "base": positions}
    sentences = []
    for name in REPAIR_PASSES:
        tokens, limit = needed.get(name, 0), limits[name]
        if limit is None or tokens <= limit:
            continue
        what, fix = REPAIR_PASSES[name]
        where = f"the model's {limit} positions (max_position_embeddings)"
        if name == "plan" and limit != positions:
            where = f"the {limit} tokens of the policy's vLLM engine (vllm_max_model_length)"
            fix = f"raise vllm_max_model_length, {fix}"
        what = what.format(r=args.max_reference_tokens, p=args.max_plan_tokens)
        sentences.append(f"{what} needs up to {tokens} tokens, more than {where}: {fix}.")
    return sentences


def check_repair_lengths(renderer: ReferenceRenderer, dataset, model_config) -> None:
    """Raise `InputError` when SORT's repair cannot fit a row of `dataset` in the context, before the run spends
    anything on it; warn, naming max_reference_tokens, about references it would cut.

    Lengths come from the repair's own rendering (`renderer`). A `Dataset` is scanned whole (three chat-template
    renderings and one tokenisation per row), an iterable one in its first `ITERABLE_ROWS_CHECKED` rows; a row found
    too long during training is skipped and counted instead."""
    args = renderer.args
    column = args.reference_column
    columns = getattr(dataset, "column_names", None)
    if dataset is None or isinstance(columns, dict) or (columns is not None and column not in columns):
        return  # no train split, or no reference column: refused by the reference checks
    over: dict[str, list[int]] = {}  # pass -> rows that do not fit
    most: dict[str, int] = {}  # pass -> the most tokens a row needs
    cut, scanned = [], 0
    for start, batch in _row_batches(dataset):
        scanned += len(batch)
        kept = [(start + i, row["prompt"], renderer.reference(row.get(column))) for i, row in enumerate(batch)
                if isinstance(row.get(column), str)]  # fmt: skip
        kept = [(index, prompt, reference) for index, prompt, reference in kept if reference is not None]
        if not kept:
            continue
        cut += [index for index, _, reference in kept if reference.truncated]
        lengths = renderer.repair_lengths([prompt for _, prompt, _ in kept], [reference for _, _, reference in kept])
        for (index, _, _), needed in zip(kept, lengths, strict=True):
            for name, tokens in needed.items():
                most[name] = max(most.get(name, 0), tokens)
                if repair_passes_over_context({name: tokens}, model_config, args):
                    over.setdefault(name, []).append(index)
    if over:
        rows = sorted({index for indices in over.values() for index in indices})
        longest = repair_passes_over_context({name: most[name] for name in over}, model_config, args)
        raise InputError(
            f"SORT's repair cannot fit {len(rows)} row(s) of the train dataset ({named_rows(rows)}) in the context: "
            f"at the longest, {' Also, '.join(longest)} Or filter out the rows that do not fit."
        )
    if cut:
        logger.warning(
            "%d of %d references are longer than max_reference_tokens=%d (%s): the repair learns only their first "
            "%d tokens (counted in sort/truncated_references). Raise max_reference_tokens if the context allows, or "
            "filter them out.",
            len(cut),
            scanned,
            args.max_reference_tokens,
            named_rows(cut),
            args.max_reference_tokens,
        )


def _row_batches(dataset):
    """(index of the first row, its rows) 64 rows at a time: all of a `Dataset`, the first `ITERABLE_ROWS_CHECKED`
    of an iterable one (its column names may be known or not)."""
    if not hasattr(dataset, "__len__"):  # iterable
        rows = list(itertools.islice(iter(dataset), ITERABLE_ROWS_CHECKED))
        batches = ((start, rows[start : start + 64]) for start in range(0, len(rows), 64))
    else:
        batches = ((start, dataset[start : start + 64]) for start in range(0, len(dataset), 64))
    for start, batch in batches:
        if isinstance(batch, dict):  # a Dataset slice: columns of values
            batch = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        yield start, batch


def check_repair_lengths_before_loading(tokenizer, model_config, args, dataset) -> None:
    """`check_repair_lengths` with only the tokenizer and the model's config loaded (the CLI, no planner)."""
    check_repair_lengths(ReferenceRenderer.before_loading(tokenizer, args), dataset, model_config)


class RepairLengthCheck(TrainerCallback):
    """Runs `check_repair_lengths` at the start of training: the trainer's repair (and its planner) exists only once
    its `__init__` is done, and no rollout has been generated yet."""

    def __init__(self, renderer: ReferenceRenderer, trainer):
        self.renderer, self.trainer = renderer, trainer

    def on_train_begin(self, args, state, control, **kwargs):
        check_repair_lengths(self.renderer, self.trainer.train_dataset, self.trainer.model.config)
