"""Judge prompts of multi-turn tool conversations in real chat formats: TRL's own Qwen3 and Llama 3.1 chat templates
(trl/chat_templates), turns parsed by TRL's `parse_response` with the response template `add_response_schema` sets
(as `GRPOTrainer` does with tools), tool-result tokens from `GRPOTrainer._get_tool_suffix_ids`, and the path of a
model judge (`judge="self"`, `"base"`, `"model"`): render the review or correction template, then the judge's chat
template with the default `judge_chat_template_kwargs`. The tokenizer is the offline tiny one, carrying the real
template (and, for Llama, its special tokens)."""

from __future__ import annotations

import copy
import json
import re
from types import SimpleNamespace

import pytest
from test_mintrl_rollout import ScriptedPolicy
from trl import GRPOTrainer
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    llama3_1_chat_template,
    parse_response,
    qwen3_chat_template,
)

from trl_mintrl.engines.base import Generation, GenerationEngine
from trl_mintrl.judges import GeneratingJudge
from trl_mintrl.judges.base import conversation_text
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory
from trl_mintrl.mintrl.tools import run_tool_calls, tool_message

REGISTERS = {"a": "7", "b": "5"}


def get(name: str) -> str:
    """Read a register.

    Args:
        name: the register's name.
    """
    return REGISTERS[name]


def add(x: int, y: int) -> int:
    """Add two numbers.

    Args:
        x: the first number.
        y: the second number.
    """
    return x + y


TOOLS = [get, add]
QUESTION = "Add registers a and b."


@pytest.fixture
def qwen3(tiny_tokenizer):
    """The tiny tokenizer with TRL's copy of Qwen3's chat template; `<think>`, `<tool_call>` and their closing tags
    are added tokens that decoding keeps, as in Qwen3's tokenizer; the response template as `GRPOTrainer` sets it."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = qwen3_chat_template
    tok.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    return add_response_schema(tok)


@pytest.fixture
def llama(tiny_tokenizer):
    """The tiny tokenizer with TRL's copy of Llama 3.1's chat template and Llama's special tokens (decoding drops
    them, as Llama's tokenizer does)."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"],
        }
    )
    tok.chat_template = llama3_1_chat_template
    return add_response_schema(tok)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


class TRLTools:
    """A `ToolEnvironment` that does what `TRLToolEnvironment` does in `MInTRLTrainer`: TRL's `parse_response` with
    the turn's context and the tools, `run_tool_calls`, and the tool-result tokens of `GRPOTrainer`."""

    max_model_len = 100_000

    def __init__(self, tok):
        self.tok = tok
        # GRPOTrainer renders prompts and tool results with a prefix-preserving training template when it must
        chat_template = None if is_chat_template_prefix_preserving(tok) else get_training_chat_template(tok)
        self.trainer = SimpleNamespace(
            processing_class=tok, _tokenizer=tok, chat_template=chat_template, chat_template_kwargs={}, _is_vlm=False
        )

    def prompt_ids(self) -> list[int]:
        return list(
            self.tok.apply_chat_template(
                [{"role": "user", "content": QUESTION}],
                tools=TOOLS,
                chat_template=self.trainer.chat_template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )

    def parse_turn(self, turn_ids, context_ids):
        return parse_response(self.tok, turn_ids, prefix=context_ids, tools=TOOLS)

    def run(self, tool_calls):
        return run_tool_calls(tool_calls, {f.__name__: f for f in TOOLS}, {}, None)

    def result_ids(self, tool_messages):
        return list(GRPOTrainer._get_tool_suffix_ids(self.trainer, tool_messages))


class RecordingJudgeEngine(GenerationEngine):
    """A judge model: answers each prompt with `answer(prompt)` then EOS, and records the prompts as decoded text
    (special tokens included)."""

    def __init__(self, tok, answer):
        super().__init__([tok.eos_token_id])
        self.tok = tok
        self.answer = answer
        self.prompts: list[str] = []

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        outputs = []
        for prompt in prompt_ids:
            self.prompts.append(self.tok.decode(prompt))
            outputs.append(Generation(ids(self.tok, self.answer(self.prompts[-1])) + [self.tok.eos_token_id]))
        return outputs


# the judge's user message inside its chat template with `judge_chat_template_kwargs` left at its default: Qwen3's
# generation prompt closes the think block, Llama 3.1 renders its system header, then the user message
JUDGE_CHAT = {
    "qwen3": re.compile(
        r"<\|im_start\|>user\n(?P<message>.*)<\|im_end\|>\n<\|im_start\|>assistant\n<think>\n\n</think>\n\n", re.S
    ),
    "llama": re.compile(
        r"<\|begin_of_text\|><\|start_header_id\|>system<\|end_header_id\|>\n\nCutting Knowledge Date: December 2023\n"
        r"Today Date: 26 Jul 2024\n\n<\|eot_id\|><\|start_header_id\|>user<\|end_header_id\|>\n\n(?P<message>.*)"
        r"<\|eot_id\|><\|start_header_id\|>assistant<\|end_header_id\|>\n\n",
        re.S,
    ),
}


def judge_message(chat: str, prompt: str) -> str:
    """The user message of a judge prompt; fails unless the prompt is exactly that message in the chat format."""
    match = JUDGE_CHAT[chat].fullmatch(prompt)
    assert match, prompt
    return match["message"]


def transcript(message: str) -> str:
    """The `{prefix}` section of a rendered math review or correction template."""
    return re.search(r"## (?:Solution so far[^\n]*|Partial solution)\n(.*?)\n\n(?:## |Write only)", message, re.S)[1]


def rollout(tok, chat, script, answer, **settings):
    tools = TRLTools(tok)
    prompt = tools.prompt_ids()
    policy = ScriptedPolicy(tok, {prompt[0]: script})
    engine = RecordingJudgeEngine(copy.deepcopy(tok), answer)  # a model judge of the policy's family
    judge = GeneratingJudge(engine, engine.tok, max_correction_tokens=128)  # default judge_chat_template_kwargs
    t = Trajectory(prompt_ids=prompt, question=QUESTION, review_budget=8, environment=tools)
    base = dict(chunk_size=256, max_reviews=8, max_correction_tokens=128, max_completion_length=2048)
    InterventionRollout(policy, judge, tok, RolloutSettings(**{**base, **settings})).run([t])
    return t, [judge_message(chat, p) for p in engine.prompts]


def qwen3_call(name, arguments):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_qwen3_thinking_tool_conversation_in_judge_prompts(qwen3):
    """A Qwen3 policy with thinking on: turn 1 thinks and calls two tools; turn 2 thinks, then writes a wrong sum;
    the judge cuts it after the think block and writes a tool call in Qwen3's format, which TRL parses and runs;
    turn 3 answers. Each judge prompt is one user message in Qwen3's chat format with the think block closed, and
    shows the earlier turns' reasoning once (labelled, not as raw tags), each call with its arguments once, and each
    tool result under its name."""
    tok, eos = qwen3, qwen3.eos_token
    turn_one = (
        "<think>\nI need a and b.\n</think>\n\nLet me read them.\n"
        + qwen3_call("get", {"name": "a"})
        + "\n"
        + qwen3_call("get", {"name": "b"})
    )
    thought = "<think>\na is 7 and b is 5.\n</think>\n\n"
    correction = qwen3_call("add", {"x": 7, "y": 5})

    def answer(prompt):
        if "## New steps to review" not in prompt:
            return correction
        return "The sum is wrong.\nVERDICT: REVISE 2" if "The sum is 13." in prompt else "VERDICT: KEEP"

    script = [
        turn_one + eos,
        thought + "The sum is 13." + eos,
        eos,
        "<think>\nSo 12.\n</think>\n\nThe sum is 12." + eos,
    ]
    # the scripted judge counts paragraph steps (thinking block, then the sum), as Qwen3 writes them
    t, messages = rollout(tok, "qwen3", script, answer, step_split="blank_line")

    # TRL's parse of each turn: reasoning apart, arguments as dicts, the judge's call parsed into a tool call and run
    get_a, get_b = ({"type": "function", "function": {"name": "get", "arguments": {"name": n}}} for n in "ab")
    add_call = {"type": "function", "function": {"name": "add", "arguments": {"x": 7, "y": 5}}}
    assert t.messages == [
        {"role": "assistant", "reasoning_content": "I need a and b.", "content": "Let me read them.",
         "tool_calls": [get_a, get_b]},
        {"role": "tool", "name": "get", "content": "7"},
        {"role": "tool", "name": "get", "content": "5"},
        {"role": "assistant", "reasoning_content": "a is 7 and b is 5.", "content": "", "tool_calls": [add_call]},
        {"role": "tool", "name": "add", "content": "12"},
        {"role": "assistant", "reasoning_content": "So 12.", "content": "The sum is 12."},
    ]  # fmt: skip
    assert (t.tool_calls, t.tool_failures, t.revisions) == (3, 0, 1)
    judge_ids = [i for i, m in zip(t.completion_ids, t.judge_mask, strict=True) if m]
    assert tok.decode(judge_ids) == correction

    turn_one_text = (
        '[assistant reasoning]\nI need a and b.\n\n[assistant]\nLet me read them.\n[tool call] get({"name": "a"})\n'
        '[tool call] get({"name": "b"})\n\n[tool result: get]\n7\n\n[tool result: get]\n5'
    )
    review_one, review_two, correction_prompt, review_three = messages
    assert "[assistant" not in review_one  # the first turn has no conversation before it
    assert transcript(review_two) == turn_one_text + "\n\n[assistant, current turn]"
    assert "### Step 1\n" + thought.strip() + "\n\n### Step 2\nThe sum is 13." in review_two
    # the correction continues the current turn verbatim: its own think block, raw
    assert transcript(correction_prompt) == turn_one_text + "\n\n[assistant, current turn]\n" + thought.strip()
    assert transcript(review_three) == (
        turn_one_text
        + '\n\n[assistant reasoning]\na is 7 and b is 5.\n\n[assistant]\n[tool call] add({"x": 7, "y": 5})'
        "\n\n[tool result: add]\n12\n\n[assistant, current turn]"
    )
    for message in messages[1:]:
        part = transcript(message)
        assert "<think>" not in part.split("[assistant, current turn]")[0]  # earlier turns: no raw tags
        assert part.count("I need a and b.") == 1 and part.count('get({"name": "a"})') == 1
        assert '"arguments"' not in part and "<tool_call>" not in part  # calls shown once, as [tool call] lines


def test_llama_tool_conversation_in_judge_prompts(llama):
    """A Llama 3.1 policy: turn 1 is a bare JSON tool call; turn 2 guesses, the judge replaces the whole turn with a
    tool call in Llama's `{"name", "parameters"}` format, which TRL parses and runs; turn 3 answers. Each judge
    prompt is a user message in Llama 3.1's format."""
    tok, eos = llama, llama.eos_token
    correction = '{"name": "get", "parameters": {"name": "b"}}'

    def answer(prompt):
        if "## New steps to review" not in prompt:
            return correction
        return "A guess.\nVERDICT: REVISE 1" if "b is 3" in prompt else "VERDICT: KEEP"

    script = ['{"name": "get", "parameters": {"name": "a"}}' + eos, "So b is 3." + eos, eos, "The sum is 12." + eos]
    t, messages = rollout(tok, "llama", script, answer)

    get_a, get_b = ({"type": "function", "function": {"name": "get", "arguments": {"name": n}}} for n in "ab")
    assert t.messages == [
        {"role": "assistant", "content": "", "tool_calls": [get_a]},
        {"role": "tool", "name": "get", "content": "7"},
        {"role": "assistant", "content": "", "tool_calls": [get_b]},
        {"role": "tool", "name": "get", "content": "5"},
        {"role": "assistant", "content": "The sum is 12."},
    ]
    assert (t.tool_calls, t.tool_failures, t.revisions) == (2, 0, 1)

    turn_one_text = '[assistant]\n[tool call] get({"name": "a"})\n\n[tool result: get]\n7'
    review_one, review_two, correction_prompt, review_three = messages
    assert "[assistant" not in review_one
    assert transcript(review_two) == turn_one_text + "\n\n[assistant, current turn]"
    assert transcript(correction_prompt) == turn_one_text + "\n\n[assistant, current turn]"
    assert transcript(review_three) == (
        turn_one_text + '\n\n[assistant]\n[tool call] get({"name": "b"})\n\n[tool result: get]\n5'
        "\n\n[assistant, current turn]"
    )
    assert '"parameters"' not in transcript(review_three)


def test_arguments_as_a_json_string_are_not_encoded_twice(qwen3):
    """Qwen3's parser gives the arguments as a JSON string when the model wrote them as one: the transcript shows
    the same call as for a dict."""
    tools = TRLTools(qwen3)
    turn = '<tool_call>\n{"name": "get", "arguments": "{\\"name\\": \\"a\\"}"}\n</tool_call>' + qwen3.eos_token
    message = tools.parse_turn(ids(qwen3, turn), tools.prompt_ids())
    assert message["tool_calls"][0]["function"]["arguments"] == '{"name": "a"}'
    as_dict = {
        **message,
        "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"name": "a"}}}],
    }
    expected = '[assistant]\n[tool call] get({"name": "a"})\n\n[assistant, current turn]\nSo'
    assert conversation_text([message], "So") == conversation_text([as_dict], "So") == expected
    garbled = {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": "a"}}],
    }
    assert conversation_text([garbled], "") == "[assistant]\n[tool call] get(a)\n\n[assistant, current turn]\n"


def test_a_malformed_call_keeps_its_text_with_the_think_block_split_off(qwen3):
    """A malformed tool call: TRL's parse falls back to the raw text, think block included; the transcript splits
    the reasoning off as Qwen3's template does and shows the broken call as the turn's text."""
    tools = TRLTools(qwen3)
    broken = '<tool_call>\n{"name": "get", "arguments": {"name": "a"}</tool_call>'
    message = tools.parse_turn(
        ids(qwen3, "<think>\nRead a.\n</think>\n\n" + broken + qwen3.eos_token), tools.prompt_ids()
    )
    assert "tool_calls" not in message and message["content"].startswith("<think>")
    text = f"[assistant reasoning]\nRead a.\n\n[assistant]\n{broken}\n\n[assistant, current turn]\n"
    assert conversation_text([message], "") == text
    assert conversation_text([message], "", reasoning=False) == text.split("\n\n", 1)[1]


def test_tool_results_as_text_parts_and_reasoning_left_out_on_request():
    """A tool that returns a list of text parts (TRL keeps the list as the message's content) shows its texts; a
    result without a name shows no name; `reasoning=False` drops the earlier turns' reasoning, not the current
    turn's text."""
    parts = tool_message("lines", [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}])
    turn = {"role": "assistant", "reasoning_content": "Read it.", "content": None, "tool_calls": []}
    conversation = [turn, parts, {"role": "tool", "content": "ok"}]
    current = "<think>\nIt has two lines"
    assert conversation_text(conversation, current) == (
        "[assistant reasoning]\nRead it.\n\n[assistant]\n\n[tool result: lines]\nline 1\nline 2\n\n[tool result]\nok"
        "\n\n[assistant, current turn]\n<think>\nIt has two lines"
    )
    assert conversation_text(conversation, current, reasoning=False).startswith("[assistant]\n\n[tool result: lines]")


def test_a_tool_call_inside_an_open_think_block_is_not_a_call(qwen3):
    """Qwen3's format: a `<tool_call>` written before the think block is closed (a judge correcting mid-thought)
    is parsed as reasoning and not run; a judge that ends the thinking to call a tool writes `</think>` first."""
    tools = TRLTools(qwen3)
    call = qwen3_call("get", {"name": "b"})
    inside = tools.parse_turn(ids(qwen3, "<think>\nI need b.\n" + call + qwen3.eos_token), tools.prompt_ids())
    closed = tools.parse_turn(
        ids(qwen3, "<think>\nI need b.\n</think>\n\n" + call + qwen3.eos_token), tools.prompt_ids()
    )
    assert "tool_calls" not in inside and call in inside["reasoning_content"]
    assert closed["tool_calls"] == [{"type": "function", "function": {"name": "get", "arguments": {"name": "b"}}}]
