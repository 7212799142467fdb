"""SORT's references as its repair scores them.

`ReferenceRenderer` is the one rendering of the repair's token ids (the reference, the base, teacher and plan
prompts): `ReferenceRepair` scores what it renders, and the length checks measure exactly that, so a row they let
through fits. A reference is a string or, with tools, a conversation (assistant turns with `tool_calls`, `tool`
results, a final answer): it is laid out as TRL's tool loop lays out a rollout, and only its assistant tokens are
learnt. The base and teacher prompts carry the row's tool schemas, as the policy's prompt
did. Whether each repair pass fits the context is checked on this rendering (length_checks.py).
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass

from transformers.utils import get_json_schema
from trl.data_utils import is_conversational

from ..chat_templating import TrlTemplating
from ..input_checks import (
    InputError,
    is_reference_conversation,
    named_rows,
    reference_conversation_problem,
)
from ..losses import REPAIR_WEIGHTINGS
from ..text import fill_template, question_text

logger = logging.getLogger(__name__)

ITERABLE_ROWS_CHECKED = 256  # rows of an iterable dataset the repair's length check reads before training


@dataclass
class Reference:
    """A reference as it is scored: its token ids (EOS appended unless truncated) and the text the planner reads."""

    ids: list[int]
    text: str
    truncated: bool
    tokens: int  # of the whole reference, before any cut (named when a cut one warns)
    # per token of `ids`, 1 where the repair learns it (a conversation's assistant turns), 0 on tool results and the
    # chat template's tokens between turns, which the policy never writes; None: every token (a string reference)
    learned: list[int] | None = None

    @property
    def learned_tokens(self) -> int:
        """How many tokens the repair learns: the loss is their mean."""
        return len(self.ids) if self.learned is None else sum(self.learned)


def reference_key(reference: str | list[dict]) -> str:
    """A string reference itself, or a conversation as canonical JSON: the key a reference is cached under."""
    return reference if isinstance(reference, str) else json.dumps(reference, sort_keys=True, ensure_ascii=False)


class ReferenceRenderer:
    """The token ids of SORT's repair passes, rendered the same way for the repair and for its length checks.

    Dataset prompts and one-message templates go through TRL's own `_tokenize_prompts`, with the tools of the row's
    environment (`tools_by_environment`), so the repair's base and teacher prompts are templated as the rollouts'
    are; the plan prompt is one user message rendered without tools (the policy summarises a solution there, and a
    tool call it wrote would run nowhere) and with `plan_chat_template_kwargs` over the trainer's chat template
    settings.
    """

    def __init__(
        self,
        args,
        templating: TrlTemplating,
        *,
        tools_by_environment: dict[str | None, list] | None = None,
        routes_environments: bool = False,
        policy_writes_plans: bool,
    ):
        """`args`: a config with `SORTConfig`'s repair fields; `templating`: how TRL applies the chat template;
        `tools_by_environment`: the tools a row's prompt shows, by its environment (None for the single environment
        or for `tools=` alone; None: no tools); `routes_environments`: a row names its environment in its
        `environment` column (a dict `environment_factory`); `policy_writes_plans`: no `Planner` writes the plans, so
        the plan prompt is a pass that must fit too."""
        self.args = args
        self.templating = templating
        self.tokenizer = templating.tokenizer
        self.tools_by_environment = tools_by_environment or {None: []}
        self.routes_environments = routes_environments
        self.policy_writes_plans = policy_writes_plans

    @classmethod
    def of_trainer(cls, trainer, policy_writes_plans: bool) -> ReferenceRenderer:
        """The rendering of `trainer` (a `GRPOTrainerBase` with `SORTConfig`'s repair fields), with its tools: TRL's
        per-environment tools (`_env_tools`) with `environment_factory`, else its `tools`."""
        tools = trainer._env_tools if trainer.environment_factories is not None else {None: list(trainer.tools)}
        templating = TrlTemplating(
            trainer.processing_class,
            trainer.tokenizer,
            trainer.chat_template,
            trainer.chat_template_kwargs,
            is_vlm=trainer._is_vlm,
        )
        return cls(
            trainer.args,
            templating,
            tools_by_environment=tools,
            routes_environments=trainer._multi_environment,
            policy_writes_plans=policy_writes_plans,
        )

    @classmethod
    def before_loading(cls, tokenizer, args) -> ReferenceRenderer:
        """The rendering of a trainer with this tokenizer and config, without tools, environments or images, for a
        check that runs before the model loads (the CLI, which takes no tools, where the policy writes the plans)."""
        chat_template = None  # TRL replaces the template only for tool calling
        templating = TrlTemplating(tokenizer, tokenizer, chat_template, args.chat_template_kwargs or {})
        return cls(args, templating, policy_writes_plans=True)

    def environment_of(self, row: dict) -> str | None:
        """The environment whose tools the row's prompt shows (its `environment` column with several)."""
        return row.get("environment") if self.routes_environments else None

    def tools_of(self, environment: str | None) -> list:
        if environment not in self.tools_by_environment:
            raise InputError(
                f"A row's `environment` column names {environment!r}, which is not among the environments passed to "
                f"environment_factory ({sorted(map(str, self.tools_by_environment))}): fix the column or the dict."
            )
        return self.tools_by_environment[environment]

    def reference(self, value: str | list[dict] | None) -> Reference | None:
        """`value` (a string or a conversation) as it is scored, cut to `max_reference_tokens`; None when it is
        missing or has no tokens. A function of the value, so it may be cached (`reference_key`)."""
        if is_reference_conversation(value):
            return self._conversation_reference(value)
        ids = [] if value is None else self.tokenizer(value, add_special_tokens=False)["input_ids"]
        if not ids:
            return None
        limit = self.args.max_reference_tokens
        if len(ids) > limit:
            return Reference(ids[:limit], self.tokenizer.decode(ids[:limit]), truncated=True, tokens=len(ids))
        return Reference([*ids, self.tokenizer.eos_token_id], value, truncated=False, tokens=len(ids))

    def _conversation_reference(self, messages: list[dict]) -> Reference | None:
        """A conversation reference laid out as TRL's tool loop lays out a rollout: each assistant turn as the policy
        writes it after the generation prompt (through its end-of-turn EOS), learnt; each run of tool results as the
        tokens TRL appends for them (`_get_tool_suffix_ids`: the results in the template's format, then the next
        generation prompt), not learnt. The planner reads the decoded tokens, without special tokens."""
        messages = [as_written(message) for message in messages]
        ids, learned, start = [], [], 0
        while start < len(messages):
            if messages[start]["role"] == "assistant":
                turn, start, learnt = self.templating.assistant_turn_ids(messages[start]), start + 1, 1
            else:
                end = next((i for i in range(start, len(messages)) if messages[i]["role"] != "tool"), len(messages))
                turn, start, learnt = self.templating.tool_suffix_ids(messages[start:end]), end, 0
            ids += turn
            learned += [learnt] * len(turn)
        if not ids:
            return None
        limit, tokens = self.args.max_reference_tokens, len(ids)
        ids, learned = ids[:limit], learned[:limit]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Reference(ids, text, truncated=tokens > limit, tokens=tokens, learned=learned)

    def base_prompt_ids(self, prompts: list, environments: list[str | None] | None = None) -> list[list[int]]:
        """The prompts the references are learnt after: the prompts as the policy saw them, or `base_template` with
        the question, each with the tools of its environment (`environments`, None: no environment)."""
        if self.args.base_template is None:
            return self.prompt_ids(prompts, environments)
        texts = [fill_template(self.args.base_template, {"question": question_text(p)}) for p in prompts]
        return self.templated_prompt_ids(texts, prompts, environments)

    def teacher_prompt_ids(
        self, prompts: list, plans: list[str], environments: list[str | None] | None = None
    ) -> list[list[int]]:
        """`teacher_template` with each prompt's question and its plan, with the tools its base prompt has: the
        teacher pass differs from the base pass by the plan alone."""
        texts = [
            fill_template(self.args.teacher_template, {"question": question_text(prompt), "plan": plan})
            for prompt, plan in zip(prompts, plans, strict=True)
        ]
        return self.templated_prompt_ids(texts, prompts, environments)

    def prompt_ids(self, prompts: list, environments: list[str | None] | None = None) -> list[list[int]]:
        """Token ids of dataset-style prompts exactly as TRL templates the rollouts' (`_tokenize_prompts`), each with
        the tools of its environment; one templating call per environment."""
        environments = environments or [None] * len(prompts)
        ids: list[list[int] | None] = [None] * len(prompts)
        for environment in dict.fromkeys(environments):
            rows = [i for i, e in enumerate(environments) if e == environment]
            tokenized = self.templating.prompt_ids([prompts[i] for i in rows], self.tools_of(environment))
            for row, row_ids in zip(rows, tokenized, strict=True):
                ids[row] = row_ids
        return ids

    def plan_prompt_ids(self, prompts: list, references: list[Reference]) -> list[list[int]]:
        """The plan-extraction prompts the policy generates from: `plan_template` with the question and the
        (possibly cut) reference, rendered with `plan_chat_template_kwargs` for conversational data."""
        texts = [
            fill_template(self.args.plan_template, {"question": question_text(prompt), "reference": reference.text})
            for prompt, reference in zip(prompts, references, strict=True)
        ]
        if not is_conversational({"prompt": prompts[0]}):
            return self.templated_prompt_ids(texts, prompts)
        rendered = self.templating.processing_class.apply_chat_template(
            conversation=[[{"role": "user", "content": text}] for text in texts],
            chat_template=self.templating.chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **{**self.templating.chat_template_kwargs, **self.args.plan_chat_template_kwargs},
        )
        return [list(ids) for ids in rendered["input_ids"]]

    def templated_prompt_ids(
        self, texts: list[str], like: list, environments: list[str | None] | None = None
    ) -> list[list[int]]:
        """Token ids of rendered templates, tokenised like the dataset prompts `like`: one user message through the
        chat template (with the trainer's chat template settings and the environment's tools) for conversational
        data, plain text otherwise."""
        if is_conversational({"prompt": like[0]}):
            texts = [[{"role": "user", "content": text}] for text in texts]
        return self.prompt_ids(texts, environments)

    def repair_lengths(
        self, prompts: list, references: list[Reference], environments: list[str | None] | None = None
    ) -> list[dict[str, int]]:
        """Per item, the most tokens each repair pass takes: `"plan"` (the plan prompt and `max_plan_tokens`
        generated; only when the policy writes the plans), `"teacher"` (the teacher prompt with a plan of
        `max_plan_tokens`, then the reference) and `"base"` (the base prompt, then the reference). A
        `repair_weighting` without plans has the base pass only."""
        base = self.base_prompt_ids(prompts, environments)
        lengths = [{"base": len(ids) + len(r.ids)} for ids, r in zip(base, references, strict=True)]
        if not REPAIR_WEIGHTINGS[self.args.repair_weighting].uses_plan:
            return lengths
        plan_tokens = self.args.max_plan_tokens
        teacher = self.teacher_prompt_ids(prompts, [""] * len(prompts), environments)
        for length, ids, reference in zip(lengths, teacher, references, strict=True):
            length["teacher"] = len(ids) + plan_tokens + len(reference.ids)
        if self.policy_writes_plans:
            for length, ids in zip(lengths, self.plan_prompt_ids(prompts, references), strict=True):
                length["plan"] = len(ids) + plan_tokens
        return lengths


def as_written(message: dict) -> dict:
    """A reference message as TRL's tool loop holds the policy's: tool-call arguments parsed from JSON strings (the
    way to store them in a `datasets` column), keys that hold None (filled in by such a column) left out. Public: the
    combined trainer's judge reads reference conversations in this form too."""
    message = {key: value for key, value in message.items() if value is not None}
    if message.get("tool_calls"):
        message["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _arguments(call["function"]["arguments"])}}
            for call in message["tool_calls"]
        ]
    return message


def _arguments(arguments: dict | str) -> dict:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def reference_conversation_refusal(
    renderer: ReferenceRenderer, prompt, messages: list[dict], environment: str | None
) -> str | None:
    """Why the repair cannot learn the reference conversation `messages` after `prompt`, in a sentence, or None: its
    shape (`reference_conversation_problem`), a prompt that is not a conversation, or a tool call of a tool the
    prompt does not show (the tools of `environment`), or with an argument that tool does not take."""
    problem = reference_conversation_problem(messages)
    if problem:
        return problem
    if not is_conversational({"prompt": prompt}):
        return (
            "its prompt is plain text, and a conversation continues a chat-templated prompt: make the prompts "
            "conversations ([{'role': 'user', 'content': ...}]) or the references strings"
        )
    tools = {tool.__name__: tool for tool in renderer.tools_of(environment)}
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            name, arguments = call["function"]["name"], _arguments(call["function"]["arguments"])
            if name not in tools:
                return (
                    f"message {index} calls {name!r}, which is not among the tools its prompt shows "
                    f"({sorted(tools)}): the policy could not have written it. Pass that tool in tools= (or as a "
                    "method of the environment), or fix the reference"
                )
            unknown = sorted(
                set(arguments) - set(get_json_schema(tools[name])["function"]["parameters"]["properties"])
            )
            if unknown:
                return (
                    f"message {index} calls {name!r} with argument(s) {unknown}, which it does not take. In a "
                    "datasets column, the arguments of different tools are merged into one struct whose missing keys "
                    "hold None: store each call's arguments as a JSON string (json.dumps) instead"
                )
    return None


def check_reference_conversations(renderer: ReferenceRenderer, dataset) -> None:
    """Raise `InputError` naming the column, the rows and the first problem when a reference conversation of
    `dataset` cannot be learnt (`reference_conversation_refusal`), before training. A `Dataset` is scanned whole, an
    iterable one in its first `ITERABLE_ROWS_CHECKED` rows (later rows are checked when deferred)."""
    column = renderer.args.reference_column
    columns = getattr(dataset, "column_names", None)
    if dataset is None or isinstance(columns, dict) or (columns is not None and column not in columns):
        return  # no train split, or no reference column: refused by the reference checks
    refused = []
    for start, batch in row_batches(dataset):
        for offset, row in enumerate(batch):
            if is_reference_conversation(row.get(column)):
                refusal = reference_conversation_refusal(
                    renderer, row["prompt"], row[column], renderer.environment_of(row)
                )
                if refusal:
                    refused.append((start + offset, refusal))
    if refused:
        raise InputError(
            f"Column {column!r} (reference_column) has {len(refused)} reference conversation(s) SORT cannot learn "
            f"({named_rows([row for row, _ in refused])}); in row {refused[0][0]}, {refused[0][1]}."
        )


def row_batches(dataset):
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
