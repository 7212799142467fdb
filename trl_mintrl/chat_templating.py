"""TRL's own chat templating, called outside TRL's generation step with the tools given: what renders prompts and
tool results for a rollout that TRL does not generate (SORT's repair of buffered prompts and reference
conversations, the asynchronous trainer's rollout worker) exactly as TRL renders them for its rollouts."""

from __future__ import annotations

import functools
from types import SimpleNamespace

from trl import GRPOTrainer

from .input_checks import InputError


class TrlTemplating:
    """TRL's own chat templating of prompts (`GRPOTrainer._tokenize_prompts`) and of tool results
    (`GRPOTrainer._get_tool_suffix_ids`), called with the tools given rather than those of the batch being generated
    (which `_tokenize_prompts` reads with `environment_factory`), so that the repair renders a buffered prompt, or
    one before the model loads, exactly as the trainer rendered it for the rollouts."""

    def __init__(self, processing_class, tokenizer, chat_template: str | None, chat_template_kwargs: dict,
                 is_vlm: bool = False):  # fmt: skip
        """`processing_class`, `chat_template`, `chat_template_kwargs`, `is_vlm`: as the trainer has them (TRL's
        `chat_template` is the prefix-preserving one it swaps in for tool calling); `tokenizer`: the text one."""
        self.processing_class = processing_class
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.chat_template_kwargs = chat_template_kwargs
        self.is_vlm = is_vlm

    def _trainer_view(self, tools: list) -> SimpleNamespace:
        """The attributes TRL's two methods read from the trainer, with `tools` for every prompt."""
        return SimpleNamespace(
            processing_class=self.processing_class,
            _tokenizer=self.tokenizer,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
            _is_vlm=self.is_vlm,
            environment_factories=None,  # the tools are given: TRL's per-environment branch would read the batch's
            tools=tools,
        )

    def prompt_ids(self, prompts: list, tools: list) -> list[list[int]]:
        """Token ids of dataset-style prompts, each showing `tools`, with the generation prompt."""
        return [list(ids) for ids in GRPOTrainer._tokenize_prompts(self._trainer_view(tools), prompts)[0]]

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """The tokens TRL's tool loop appends after an assistant turn for its tool results: the rest of the turn's
        end, the results, and the next generation prompt."""
        return list(GRPOTrainer._get_tool_suffix_ids(self._trainer_view([]), tool_messages))

    def assistant_turn_ids(self, message: dict) -> list[int]:
        """The tokens of an assistant turn as the policy writes them: what the template renders for `message` after
        the generation prompt, through its last EOS (the template's text after the EOS is the tool suffix's or
        never written), against the same one-message context TRL renders tool results in."""
        context = [{"role": "user", "content": "dummy"}]
        render = functools.partial(self.processing_class.apply_chat_template, tokenize=True, return_dict=False,
                                   chat_template=self.chat_template, **self.chat_template_kwargs)  # fmt: skip
        prompt, full = render(context, add_generation_prompt=True), render([*context, message])
        if full[: len(prompt)] != prompt:
            raise InputError(
                "The chat template does not render an assistant turn as a continuation of its generation prompt, so "
                "a reference conversation cannot be laid out as the policy writes it: use a prefix-preserving chat "
                "template (TRL swaps one in for tool calling: pass tools= or environment_factory=), or string "
                "references."
            )
        turn = full[len(prompt) :]
        ends = [i for i, token in enumerate(turn) if token == self.tokenizer.eos_token_id]
        return turn[: ends[-1] + 1] if ends else turn
