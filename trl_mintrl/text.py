"""Text helpers shared by the data loaders, rewards, judges, SORT and evaluation: prompt templates, prompt rendering,
`\\boxed{}` answers and thinking blocks.

Templates (loader prompts, judge and SORT templates) follow one convention: a placeholder is `{name}` with `name` one
of the template's fields, and only those are substituted, in one pass. Every other brace is text, so math prompts
write `\\boxed{}` (or `\\boxed{answer}`) as they are, with no doubling, and braces inside the substituted values
(questions, solutions, code) are never read as placeholders.

Thinking blocks: `<think> ... </think>` is reasoning. A thinking chat template may open the block in the prompt, so
a text can start inside one; a `</think>` with no `<think>` before it closes such a block.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping

NO_THINKING = {"enable_thinking": False}
"""Default chat-template arguments of prompts the package writes for a model (judge, planner): a thinking template
(Qwen3) would otherwise spend the answer's token budget inside `<think>`."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")
_LATEX_COMMAND_BEFORE = re.compile(r"\\[A-Za-z]{2,}\*?\Z")  # `\boxed` right before `{answer}`: a LaTeX argument
_CLOSED_THINK_BLOCK = re.compile(re.escape(THINK_OPEN) + ".*?" + re.escape(THINK_CLOSE), re.DOTALL)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


# ---------------------------------------------------------------------------------------------------------------
# Templates


def _placeholders(template: str, fields: Iterable[str] | None = None):
    """The `{name}` matches of a template (only those of `fields` when given), skipping LaTeX arguments."""
    for match in _PLACEHOLDER.finditer(template):
        if fields is not None and match.group(1) not in fields:
            continue
        if _LATEX_COMMAND_BEFORE.search(template, max(0, match.start() - 40), match.start()):
            continue
        yield match


def template_fields(template: str) -> set[str]:
    """The placeholder names a template uses: `{name}` with `name` an identifier, not right after a LaTeX command."""
    return {match.group(1) for match in _placeholders(template)}


def check_template(name: str, template, fields: Iterable[str], required: Iterable[str] | None = None) -> None:
    """Raise a `ValueError` naming the config field `name` when `template` is not a non-empty string, lacks a
    `required` placeholder (default: all of `fields`) or uses one that is not in `fields`."""
    fields = set(fields)
    required = fields if required is None else set(required)
    shown = ", ".join("{" + f + "}" for f in sorted(fields))
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"`{name}` must be a template string with the placeholder(s) {shown}, got {template!r}.")
    used = template_fields(template)
    unknown = sorted(used - fields)
    if unknown:
        hints = []
        for field in unknown:
            match = difflib.get_close_matches(field, fields, n=1)
            hints.append("{" + field + "}" + (f" (did you mean {{{match[0]}}}?)" if match else ""))
        raise ValueError(
            f"`{name}` uses unknown field(s) {', '.join(hints)}; it may use {shown}. Other braces are text: "
            "`\\boxed{}` needs no escaping."
        )
    missing = sorted(required - used)
    if missing:
        raise ValueError(
            f"`{name}` must contain the placeholder(s) {', '.join('{' + f + '}' for f in missing)} (it may use "
            f"{shown}); got {template!r}."
        )


def fill_template(template: str, values: Mapping[str, object]) -> str:
    """`template` with each `{field}` of `values` replaced by `str(value)`, in one pass: other braces stay as written
    and placeholders inside the values are not substituted again."""
    pieces, end = [], 0
    for match in _placeholders(template, values):
        pieces += [template[end : match.start()], str(values[match.group(1)])]
        end = match.end()
    return "".join(pieces) + template[end:]


# ---------------------------------------------------------------------------------------------------------------
# Prompts


def content_text(content: str | list[dict] | None) -> str:
    """A message's text: the string itself, or the text blocks of typed content joined."""
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if block.get("type") == "text")
    return content or ""


def question_text(prompt: str | list[dict]) -> str:
    """The question a judge or planner sees: the prompt string, or the content of the last user message."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt):
        if message.get("role") == "user":
            return content_text(message["content"])
    raise ValueError("conversational prompt has no user message")


def prompt_token_ids(tokenizer, prompt: str | list[dict], **chat_template_kwargs) -> list[int]:
    """Token ids of a prompt ready for generation: chat template with generation prompt for conversations, plain
    tokenisation for strings (as TRL does)."""
    from trl.data_utils import is_conversational

    if is_conversational({"prompt": prompt}):
        return list(
            tokenizer.apply_chat_template(
                prompt, tokenize=True, add_generation_prompt=True, return_dict=False, **chat_template_kwargs
            )
        )
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def chat_token_ids(tokenizer, user_message: str, **chat_template_kwargs) -> list[int]:
    """Token ids of a one-message conversation (judge, planner and teacher prompts).

    `chat_template_kwargs` go to the chat template (e.g. `enable_thinking=False` for Qwen3); templates that do not use
    a variable ignore it.
    """
    return prompt_token_ids(tokenizer, [{"role": "user", "content": user_message}], **chat_template_kwargs)


def chat_template_kwargs_field(name: str, value) -> dict:
    """A config field of chat-template arguments as a dict: a mapping, None (empty) or, from the command line, a JSON
    object string. Raises a `ValueError` naming the field `name`."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"`{name}` must be a JSON object, e.g. '{{\"enable_thinking\": false}}'; got {value!r} ({err})."
            ) from None
    if not isinstance(value, Mapping):
        raise ValueError(
            f"`{name}` must be a dict of chat-template arguments, e.g. {{'enable_thinking': False}}, got {value!r}."
        )
    return dict(value)


# ---------------------------------------------------------------------------------------------------------------
# Answers and thinking blocks


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


def opens_thinking(prompt_text: str) -> bool:
    """Whether a rendered prompt leaves a thinking block open (templates that start the assistant turn with it)."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def outside_thinking(text: str, opened: bool = False) -> tuple[str, bool]:
    """(the text outside thinking blocks, whether a block was left open).

    `opened`: the text starts inside a block (see `opens_thinking`); a `</think>` before any `<think>` means the
    same. Closed blocks are removed; an unclosed one is cut with everything after its opening tag, since that text
    is reasoning. The result is not stripped.
    """
    close, start = text.find(THINK_CLOSE), text.find(THINK_OPEN)
    if opened or (close >= 0 and (start < 0 or close < start)):
        text = THINK_OPEN + text
    text = _CLOSED_THINK_BLOCK.sub("", text)
    start = text.find(THINK_OPEN)
    return (text[:start], True) if start >= 0 else (text, False)
