"""Prompt helpers shared by judges, SORT and evaluation: plain-text and conversational prompts alike."""

from __future__ import annotations

from trl.data_utils import is_conversational

NO_THINKING = {"enable_thinking": False}
"""Default chat-template arguments of prompts the package writes for a model (judge, planner): a thinking template
(Qwen3) would otherwise spend the answer's token budget inside `<think>`."""


def question_text(prompt: str | list[dict]) -> str:
    """The question a judge or planner sees: the prompt string, or the content of the last user message."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt):
        if message.get("role") == "user":
            content = message["content"]
            if isinstance(content, list):  # typed content blocks
                return "".join(block.get("text", "") for block in content if block.get("type") == "text")
            return content
    raise ValueError("conversational prompt has no user message")


def prompt_token_ids(tokenizer, prompt: str | list[dict], **chat_template_kwargs) -> list[int]:
    """Token ids of a prompt ready for generation: chat template with generation prompt for conversations, plain
    tokenisation for strings (as TRL does)."""
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
