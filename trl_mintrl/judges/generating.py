"""A judge that generates its answers with a `GenerationEngine`: the policy itself (`self`) or a second model.

Each batch costs exactly one engine call for the reviews and one for the corrections, whatever its size. For the
`self` backend pass the policy's own engine and tokenizer: no second copy of the weights, and the reference solution
in the prompt is the privileged context that makes the policy a useful judge of itself.
"""

from __future__ import annotations

import logging

from ..engines.base import Generation, GenerationEngine
from ..text import NO_THINKING, chat_token_ids
from .base import Correction, CorrectionRequest, ReviewRequest, Verdict
from .model_judge import TemplatedJudge
from .parsing import parse_correction, parse_verdict

logger = logging.getLogger(__name__)


class GeneratingJudge(TemplatedJudge):
    """Renders judge prompts with the tokenizer's chat template and generates them in one batched engine call.

    Args:
        engine: the engine that generates the judge's answers.
        tokenizer: the tokenizer matching `engine`'s model (chat template, decoding).
        review_template: a preset name ("math", "code") or a custom review template string.
        correction_template: a preset name ("math", "code") or a custom correction template string.
        max_review_tokens: budget of a review answer; a review cut by it fails (its verdict line may be cut too).
        max_correction_tokens: budget of a correction answer (the rollout loop caps it again in policy tokens).
        temperature: sampling temperature of the judge; 0 decodes greedily, None uses the engine's settings.
        chat_template_kwargs: arguments of the chat template when rendering judge prompts; None means
            `{"enable_thinking": False}` (a thinking template would spend the review budget inside `<think>`),
            `{}` renders the template's defaults. Templates ignore variables they do not use.

    A review or correction that hits its token cap before ending, or leaves a `<think>` block open, fails.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer,
        review_template: str = "math",
        correction_template: str = "math",
        max_review_tokens: int = 1024,
        max_correction_tokens: int = 64,
        temperature: float | None = 0.0,
        chat_template_kwargs: dict | None = None,
    ):
        for name, value in (
            ("max_review_tokens", max_review_tokens),
            ("max_correction_tokens", max_correction_tokens),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GeneratingJudge `{name}` must be a positive integer, got {value!r}")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise ValueError(f"GeneratingJudge `chat_template_kwargs` must be a dict, got {chat_template_kwargs!r}")
        if temperature is not None and temperature < 0:
            raise ValueError(f"GeneratingJudge `temperature` must be >= 0 or None, got {temperature}")
        self.engine = engine
        self.tokenizer = tokenizer
        super().__init__(review_template, correction_template, max_review_tokens, max_correction_tokens, temperature)
        self.chat_template_kwargs = dict(NO_THINKING if chat_template_kwargs is None else chat_template_kwargs)

    @classmethod
    def from_pretrained(
        cls, path: str, device: str | None = None, dtype: str = "auto", **judge_kwargs
    ) -> GeneratingJudge:
        """Load a judge model and tokenizer (a local directory or a cached checkpoint) into a `TransformersEngine`
        (`TransformersEngine.from_model_path`), sampling with the checkpoint's generation config by default.

        Args:
            path: the model directory (or name, when the Hub is reachable).
            device: where the model runs; default "cuda" when available, else "cpu".
            dtype: the model's dtype ("auto" keeps the checkpoint's).
            judge_kwargs: the other `GeneratingJudge` arguments (templates, budgets, temperature).
        """
        from transformers import AutoTokenizer

        from ..engines.transformers import TransformersEngine

        tokenizer = AutoTokenizer.from_pretrained(path)
        engine = TransformersEngine.from_model_path(path, tokenizer=tokenizer, device=device, dtype=dtype)
        return cls(engine, tokenizer, **judge_kwargs)

    def __repr__(self) -> str:
        return (
            f"GeneratingJudge(engine={type(self.engine).__name__}, max_review_tokens={self.max_review_tokens}, "
            f"max_correction_tokens={self.max_correction_tokens}, temperature={self.temperature}, "
            f"chat_template_kwargs={self.chat_template_kwargs})"
        )

    def _generate(self, texts: list[str], max_new_tokens: int) -> list[Generation]:
        prompts = [chat_token_ids(self.tokenizer, text, **self.chat_template_kwargs) for text in texts]
        return self.engine.generate(prompts, max_new_tokens, self.temperature)

    def _decode(self, generation: Generation) -> str:
        return self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)

    def _truncated(self, generation: Generation, cap: int) -> bool:
        ended = bool(generation.token_ids) and generation.token_ids[-1] in self.engine.eos_token_ids
        return not ended and generation.num_tokens >= cap

    def review(self, requests: list[ReviewRequest]) -> list[Verdict]:
        if not requests and not self.engine.synchronized:  # a synchronized engine's call is collective: join it
            return []
        outputs = self._generate([self.templates.render_review(r) for r in requests], self.max_review_tokens)
        verdicts = []
        for req, out in zip(requests, outputs, strict=True):
            text = self._decode(out)
            if self._truncated(out, self.max_review_tokens):
                verdicts.append(Verdict(failed=True))
            else:
                verdicts.append(parse_verdict(text, len(req.steps)))
            if verdicts[-1].failed:
                logger.debug("unusable judge review (%d tokens): %r", out.num_tokens, text[-200:])
        return verdicts

    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]:
        if not requests and not self.engine.synchronized:  # a synchronized engine's call is collective: join it
            return []
        outputs = self._generate([self.templates.render_correction(r) for r in requests], self.max_correction_tokens)
        corrections = [
            parse_correction(self._decode(out), self._truncated(out, self.max_correction_tokens)) for out in outputs
        ]
        for out, correction in zip(outputs, corrections, strict=True):
            if correction.failed:
                logger.debug("unusable judge correction (%d tokens): %r", out.num_tokens, self._decode(out)[-200:])
        return corrections
