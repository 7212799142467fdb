"""Bad input refused before the expensive part, or counted and skipped during training (docs/reliability.md).

One place for what both trainers and `trl-mintrl train` check in the user's data and functions:
- `check_train_dataset`: prompts that are empty or too long for the model, reference solutions that are not strings
  or all empty. The CLI calls it before the model loads, `GRPOTrainerBase.__init__` (via `check_trainer_inputs`)
  before training starts.
- `check_reference_column`: the reference column a method reads is there, before the model loads (the trainers that
  read references call it first; `check_train_dataset` with `reference_required`).
- `reference_conversation_problem`: what is wrong with a reference that is a conversation (SORT with tools: assistant
  turns with `tool_calls`, `tool` results, a final answer), named per row by `check_train_dataset`.
- `RewardFunctionGuard`: a reward function that raises on some completions costs those completions their reward
  (None, as TRL's own "cannot score this one"), counted in `rewards/<name>/failures`; one that never scores anything,
  or returns the wrong number or kind of values, stops the run at its first batch with a message naming it.
- `check_code_sandbox`: `code_reward`'s sandbox is built up front, so isolation this machine cannot give (strict
  `TRL_MINTRL_SANDBOX_ISOLATION=namespaces` without namespaces) fails before the model loads, not at the first reward.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Sequence

import torch
from trl.trainer.utils import is_async_callable

logger = logging.getLogger(__name__)

_SHOWN = 5  # rows named in an error message


class InputError(ValueError):
    """Bad training input; the message names the column or function, the rows, and the fix."""


class RewardFunctionError(RuntimeError):
    """A reward function that breaks its contract (one float or None per completion) or never works."""


def named_rows(indices: list[int]) -> str:
    """The rows an error message names: "row 3", or "rows 0, 1, 2, 3, 4, ..." (at most five shown)."""
    shown = ", ".join(map(str, indices[:_SHOWN]))
    return f"row{'s' if len(indices) > 1 else ''} {shown}{', ...' if len(indices) > _SHOWN else ''}"


def _is_blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _prompt_is_empty(prompt) -> bool:
    """A plain-text prompt with no text, or a conversation whose messages hold no text."""
    if isinstance(prompt, str) or prompt is None:
        return _is_blank(prompt)
    if isinstance(prompt, Sequence):  # [{"role": ..., "content": str | [{"type": "text", "text": ...}, ...]}]
        for message in prompt:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str) and content.strip():
                return False
            if isinstance(content, list) and any(
                not isinstance(part, dict) or part.get("type") != "text" or str(part.get("text", "")).strip()
                for part in content
            ):
                return False
        return True
    return False


def check_train_dataset(
    dataset,
    *,
    reference_column: str | None = None,
    reference_required: bool = False,
    reference_conversations: bool = False,
    tokenize: Callable[[list], list[list[int]]] | None = None,
    max_prompt_tokens: int | None = None,
    context: str = "",
    environment_observations: bool = False,
) -> None:
    """Raise `InputError` for a missing `reference_column` when `reference_required`, and for rows a run cannot
    use: an empty prompt (allowed with `environment_observations`: TRL appends an `environment_factory`'s `reset()`
    text to the last user message, so a row may leave it empty); a prompt of more than `max_prompt_tokens`
    tokens (as `tokenize` counts them); a `reference_column` value that is not a string (or None); a reference
    column that is empty in every row. Rows with an empty reference only warn (SORT counts and skips them, MInTRL's
    judge then sees no reference). `reference_conversations`: a reference may also be a conversation (SORT), checked
    by `reference_conversation_problem`. Datasets without column names (iterable ones) are not scanned."""
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # DatasetDict: the caller passes the train split; nothing to check here
        return
    if dataset is None or columns is None:
        return
    if "prompt" not in columns:
        raise InputError(f"The train dataset has no 'prompt' column (columns: {columns}); TRL trains on it.")
    prompts = list(dataset["prompt"])
    empty = [i for i, prompt in enumerate(prompts) if _prompt_is_empty(prompt)]
    if empty and not environment_observations:
        raise InputError(
            f"The train dataset has {len(empty)} empty prompt(s) ({named_rows(empty)}): the model would be asked "
            "nothing. Remove them, e.g. dataset.filter(lambda row: <the prompt has text>)."
        )
    if reference_required:
        check_reference_column(dataset, reference_column, "this run")
    if reference_column is not None and reference_column in columns:
        _check_references(list(dataset[reference_column]), reference_column, reference_conversations)
    if tokenize is not None and max_prompt_tokens is not None:
        too_long = []
        for start in range(0, len(prompts), 256):
            lengths = [len(ids) for ids in tokenize(prompts[start : start + 256])]
            too_long += [(start + i, n) for i, n in enumerate(lengths) if n > max_prompt_tokens]
        if too_long:
            longest = max(n for _, n in too_long)
            raise InputError(
                f"{len(too_long)} prompt(s) ({named_rows([i for i, _ in too_long])}) are longer than the "
                f"{max_prompt_tokens} tokens that fit ({context}); the longest has {longest}. TRL does not truncate "
                "prompts: filter them out, e.g. dataset.filter(lambda row: len(tokenizer.apply_chat_template("
                "row['prompt'])) <= N), or lower max_completion_length."
            )


def check_reference_column(dataset, column: str, used_for: str) -> None:
    """Raise `InputError` when the train dataset lacks the reference column that `used_for` (named in the message)
    reads, before the model loads. Datasets without column names (iterable ones) are checked row by row by the
    caller."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None:
        return
    if isinstance(columns, dict):  # DatasetDict
        columns = next(iter(columns.values()))
    if column not in columns:
        raise InputError(
            f"The train dataset has no column {column!r} (columns: {columns}); {used_for} reads the reference "
            "solutions from it. Add it, or set `reference_column` to the column that holds them."
        )


def is_reference_conversation(value) -> bool:
    """A reference given as a list of messages (dicts) rather than a string."""
    return isinstance(value, list) and all(isinstance(message, dict) for message in value)


def reference_conversation_problem(messages: list) -> str | None:
    """What makes `messages` unusable as a reference conversation, in a sentence, or None.

    A reference conversation continues the prompt as a tool-calling rollout does: assistant turns (`content`, and
    `tool_calls` as `{"type": "function", "function": {"name": str, "arguments": dict or JSON string}}`), each turn
    with tool calls followed by one `tool` message per call (`name`, string `content`), ending with a final assistant
    turn without tool calls. Keys that hold None (a `datasets` column fills them in) count as absent."""
    messages = [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages]
    pending: list[str] = []  # names of the calls whose results are still due
    for index, message in enumerate(messages):
        where = f"message {index}"
        if not isinstance(message, dict) or message.get("role") not in ("assistant", "tool"):
            role = message.get("role") if isinstance(message, dict) else type(message).__name__
            return (f"{where} is {role!r}; a reference holds only what the policy writes (\"assistant\") and what "
                    "its tools return (\"tool\"): put system and user messages in the prompt")  # fmt: skip
        if message["role"] == "tool":
            if not pending:
                return f"{where} is a tool result that no tool call of the assistant turn before it asked for"
            name, content = pending.pop(0), message.get("content")
            if message.get("name") != name:
                return f"{where} is the result of the call to {name!r} but is named {message.get('name')!r}"
            if not isinstance(content, str):
                images = isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image"
                                                           for p in content)  # fmt: skip
                why = ("images in tool results cannot be learnt from: the repair scores references as text tokens"
                       if images else "TRL's tool loop gives a tool's result as str(result)")  # fmt: skip
                return f"{where} (a tool result) must have string content: {why}"
            continue
        if pending:
            return f"{where} is an assistant turn, but the tool call(s) {pending} before it have no result"
        if not isinstance(message.get("content", ""), str):
            return f"{where} (an assistant turn) must have string content, not {type(message['content']).__name__}"
        calls = message.get("tool_calls", [])
        if not isinstance(calls, list):
            return f"{where}'s tool_calls must be a list"
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = None
            if (
                not isinstance(function, dict)
                or not isinstance(function.get("name"), str)
                or not isinstance(arguments, dict)
            ):
                return (f"{where} has a tool call {call!r}; each must be {{\"type\": \"function\", \"function\": "
                        "{\"name\": str, \"arguments\": dict or a JSON object string}}")  # fmt: skip
            pending.append(function["name"])
    if pending:
        return f"the tool call(s) {pending} of its last assistant turn have no result"
    if messages and (messages[-1].get("role") != "assistant" or messages[-1].get("tool_calls")):
        return "it must end with the final assistant answer (a turn without tool calls)"
    return None


def _check_references(values: list, column: str, conversations: bool = False) -> None:
    wrong_type = [
        i for i, v in enumerate(values) if not (v is None or isinstance(v, str) or is_reference_conversation(v))
    ]
    if wrong_type:
        kind = type(values[wrong_type[0]]).__name__
        also = " or conversations (lists of messages)" if conversations else ""
        raise InputError(
            f"Column {column!r} (reference_column) must hold strings{also}, but {named_rows(wrong_type)} hold {kind}. "
            f"Convert it, e.g. dataset.map(lambda row: {{{column!r}: str(row[{column!r}])}}), or set reference_column "
            "to the column holding the reference solutions."
        )
    if not conversations and any(is_reference_conversation(value) for value in values):
        rows = [i for i, value in enumerate(values) if is_reference_conversation(value)]
        raise InputError(
            f"Column {column!r} (reference_column) holds conversations in {named_rows(rows)}; only SORTTrainer and "
            "MInTRLSORTTrainer (in Python, with tools= or environment_factory=) learn from reference conversations, "
            "this run reads references as text. Give the reference solutions as strings."
        )
    problems = [(i, reference_conversation_problem(v)) for i, v in enumerate(values) if is_reference_conversation(v)]
    problems = [(i, problem) for i, problem in problems if problem is not None]
    if problems:
        raise InputError(
            f"Column {column!r} (reference_column) has {len(problems)} reference conversation(s) SORT cannot learn "
            f"from ({named_rows([i for i, _ in problems])}); in row {problems[0][0]}, {problems[0][1]}. Fix them, or "
            "filter them out."
        )
    blank = [i for i, value in enumerate(values) if _is_blank(value) or value == []]
    if values and len(blank) == len(values):
        raise InputError(
            f"Column {column!r} (reference_column) is empty in all {len(values)} rows. Fill it with the reference "
            "solutions, or set reference_column to the column that holds them (MInTRL without references: remove "
            "the column)."
        )
    if blank:
        logger.warning(
            "Column %r (reference_column) is empty in %d of %d rows (%s): SORT skips them when they are all-wrong "
            "(sort/empty_references), MInTRL's judge sees no reference for them.",
            column,
            len(blank),
            len(values),
            named_rows(blank),
        )


class RewardFunctionGuard:
    """Calls a synchronous reward function for TRL and checks what it returns.

    An exception is retried row by row, so one completion the function cannot handle costs only that completion
    its reward (None); the rows lost are appended to `trainer._metrics[mode]["rewards/<name>/failures"]`. A function
    that fails on every row before it has ever returned a reward is broken, not unlucky: `RewardFunctionError`,
    as is a result with the wrong length or a value that is not a number or None.
    """

    def __init__(self, func: Callable, name: str, trainer):
        functools.update_wrapper(self, func)
        self.func, self.name, self.trainer = func, name, trainer
        self.ever_scored = False

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        n = len(prompts)
        try:
            rewards, failed = self._checked(self.func(prompts=prompts, completions=completions,
                                                      completion_ids=completion_ids, **kwargs), n), 0  # fmt: skip
        except RewardFunctionError:
            raise
        except Exception as err:
            rewards, failed, first_error = [], 0, err
            for row in range(n):
                one = {k: v[row : row + 1] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}
                try:
                    rewards += self._checked(
                        self.func(prompts=prompts[row : row + 1], completions=completions[row : row + 1],
                                  completion_ids=completion_ids[row : row + 1], **one), 1)  # fmt: skip
                except RewardFunctionError:
                    raise
                except Exception:
                    rewards.append(None)
                    failed += 1
            if failed == n and not self.ever_scored:
                raise RewardFunctionError(
                    f"Reward function {self.name!r} raised on every one of the {n} completions of its first batch "
                    f"({type(first_error).__name__}: {first_error}): it is broken, not unlucky. Fix it (it is called "
                    "as fn(prompts=..., completions=..., completion_ids=..., **dataset columns, trainer_state=..., "
                    "...): accept **kwargs), or return None for a completion it cannot score."
                ) from first_error
            logger.warning(
                "Reward function %r raised on %d of %d completions (%s: %s); they get no reward from it "
                "(rewards/%s/failures).",
                self.name,
                failed,
                n,
                type(first_error).__name__,
                first_error,
                self.name,
            )
        self.ever_scored = self.ever_scored or failed < n
        mode = "train" if self.trainer.model.training else "eval"
        self.trainer._metrics[mode][f"rewards/{self.name}/failures"].append(float(failed))
        return rewards

    def _checked(self, rewards, n: int) -> list:
        """`rewards` as floats (None kept): any sized sequence of numbers as TRL accepts (lists, arrays, tensors)."""
        sized = hasattr(rewards, "__len__") and not isinstance(rewards, str | bytes | dict)
        if not sized or len(rewards) != n:
            got = f"{len(rewards)} values" if sized else type(rewards).__name__
            raise RewardFunctionError(
                f"Reward function {self.name!r} returned {got} for {n} completions: return a list with one float "
                "(or None when it cannot score a completion) per completion, in order."
            )
        values = []
        for reward in rewards:
            try:
                if isinstance(reward, str | bytes):
                    raise TypeError
                values.append(None if reward is None else float(reward))
            except (TypeError, ValueError):
                raise RewardFunctionError(
                    f"Reward function {self.name!r} returned {reward!r} ({type(reward).__name__}): each reward must "
                    "be a number, or None when it cannot score the completion."
                ) from None
        return values


def check_code_sandbox(reward_funcs) -> None:
    """Build the sandbox of the default `code_reward` now when it is one of `reward_funcs` (it would be built at its
    first call; `REWARDS[...].prepare`): `InputError` naming the setting when this machine cannot provide the
    isolation asked for."""
    from .rewards import REWARDS
    from .rewards.sandbox import ISOLATION_ENV

    for task in REWARDS.values():
        if task.prepare is None or not any(func is task.reward for func in reward_funcs):
            continue
        try:
            task.prepare()
        except (RuntimeError, ValueError) as err:
            setting = f" with ${ISOLATION_ENV}={os.environ[ISOLATION_ENV]}" if os.environ.get(ISOLATION_ENV) else ""
            raise InputError(
                f"reward_funcs has {task.reward.__name__}, whose sandbox cannot start here{setting}: {err}"
            ) from None


def context_length(model_config, args) -> int | None:
    """How many tokens the policy can take: the model's positions, or vLLM's max_model_length when it is smaller."""
    limits = [getattr(model_config, "max_position_embeddings", None)]
    if getattr(args, "use_vllm", False):
        limits.append(getattr(args, "vllm_max_model_length", None))
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None


def max_prompt_tokens(model_config, args) -> tuple[int | None, str]:
    """The longest prompt that leaves room for `max_completion_length`, and how it was computed (for messages)."""
    context = context_length(model_config, args)
    if context is None:
        return None, ""
    return context - args.max_completion_length, (
        f"context of {context} tokens minus max_completion_length={args.max_completion_length}"
    )


def check_trainer_inputs(trainer) -> None:
    """What `GRPOTrainerBase.__init__` checks once TRL has loaded the model and tokenizer: the train dataset (as
    `check_train_dataset`, tokenised by the trainer itself), the code sandbox, and a guard on every plain reward
    function."""
    args = trainer.args
    limit, context = max_prompt_tokens(trainer.model.config, args)
    check_train_dataset(
        trainer.train_dataset,
        reference_column=getattr(args, "reference_column", None),
        reference_conversations=getattr(trainer, "learns_reference_conversations", False),
        # per-environment tool schemas render prompts differently: TRL tokenises them one by one, in a step
        tokenize=None if getattr(trainer, "environment_factories", None) else trainer.tokenize_prompts,
        max_prompt_tokens=limit,
        context=context,
        environment_observations=bool(getattr(trainer, "environment_factories", None)),
    )
    check_code_sandbox(trainer.reward_funcs)
    for i, func in enumerate(trainer.reward_funcs):
        if isinstance(func, torch.nn.Module | RewardFunctionGuard) or is_async_callable(func):
            continue  # reward models and async functions: TRL's own handling
        trainer.reward_funcs[i] = RewardFunctionGuard(func, trainer.reward_func_names[i], trainer)
