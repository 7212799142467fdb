"""The tool task as tokens: the chat template and response template of the tool tokenizer (`[get name=a]` calls,
tool results as `tool` turns), TRL's result tokens, the tool loop's environment for one rollout outside a trainer
(calibration, evaluation) and a warm-start transcript for SFT (`sft_example`)."""

from __future__ import annotations

import random

from .task import STEP_SEPARATOR
from .tool_task import TOOL_NAME, RegisterEnv, ToolProblem

TOOL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{{- '[' + call['function']['name'] -}}"
    "{%- for key, value in call['function']['arguments'].items() -%}{{- ' ' + key + '=' + value|string -}}"
    "{%- endfor -%}"
    "{{- ']' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# transformers' response parser (new-style `response_template`): `[name key=value ...]` tool calls, the rest content
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\[(?P<name>\w+)",
            "close_pattern": r"\]\s*",
            "repeats": True,
            "content": "xml-inline",
            "content_args": {"tag_pattern": r"(?P<key>\w+)=(?P<value>[^\s\]]*)", "value_parser": {"name": "text"}},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def tool_tokenizer(tokenizer=None):
    """`tokenizer` (default: a fresh char tokenizer) with the tool chat template and response template."""
    if tokenizer is None:
        from .model import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    return tokenizer


def tool_suffix_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The tokens TRL appends after a turn's tool calls (the results and the next assistant header): TRL's own
    `GRPOTrainer._get_tool_suffix_ids`, run on this tokenizer."""
    from types import SimpleNamespace

    from trl import GRPOTrainer

    shim = SimpleNamespace(
        processing_class=tokenizer, _tokenizer=tokenizer, _is_vlm=False, chat_template=None, chat_template_kwargs={}
    )
    return list(GRPOTrainer._get_tool_suffix_ids(shim, tool_messages))


class LocalToolEnvironment:
    """MInTRL's `ToolEnvironment` for one rollout outside a trainer (calibration, evaluation): a `RegisterEnv`,
    turns parsed by TRL's `parse_response`, calls run with TRL's semantics (`run_tool_calls`), TRL's result tokens."""

    def __init__(self, tokenizer, row: dict, max_model_len: int = 2048):
        self.tokenizer = tokenizer
        self.env = RegisterEnv()
        self.env.reset(**row)
        self.max_model_len = max_model_len

    def parse_turn(self, turn_ids, context_ids):
        from trl.chat_template_utils import parse_response

        return parse_response(self.tokenizer, list(turn_ids), prefix=list(context_ids), tools=[self.env.get])

    def run(self, tool_calls):
        from trl_mintrl.mintrl.tools import run_tool_calls

        return run_tool_calls(tool_calls, {TOOL_NAME: self.env.get}, {}, None)

    def result_ids(self, tool_messages):
        return tool_suffix_ids(self.tokenizer, tool_messages)


def sft_example(tokenizer, problem: ToolProblem, read: bool, rng: random.Random) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one warm-start transcript: with `read`, the calls, TRL's result tokens (no loss) and
    the computation; without, a guess: the computation with a random value for each register (no loss on the
    prompt)."""
    from trl_mintrl.text import prompt_token_ids

    eos = tokenizer.eos_token_id

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = prompt_token_ids(tokenizer, problem.row()["prompt"])
    if read:
        values = dict(problem.values)
        tools = [{"role": "tool", "name": TOOL_NAME, "content": f"{r}={values[r]}"} for r in problem.registers]
        first, results, last = (
            encode(problem.calls) + [eos],
            tool_suffix_ids(tokenizer, tools),
            encode(problem.solution) + [eos],
        )
        ids = prompt + first + results + last
        labels = [-100] * len(prompt) + first + [-100] * len(results) + last
        return ids, labels
    for _ in range(20):  # a guess that keeps the running values in the familiar range
        guess = problem.numeric({r: rng.randint(0, 9) for r in problem.registers})
        value, ok = guess.first, True
        for op, b in guess.ops:
            value = value + b if op == "+" else value - b
            ok = ok and 0 <= value <= 19
        if ok:
            break
    else:
        guess = problem.numeric()
    turn = encode(STEP_SEPARATOR.join(guess.steps)) + [eos]
    return prompt + turn, [-100] * len(prompt) + turn
