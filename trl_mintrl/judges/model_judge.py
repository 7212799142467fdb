"""`TemplatedJudge`: what the model-backed judges share: the review and correction templates they render, the token
budgets of their answers and their sampling temperature. Each subclass validates its own arguments first."""

from __future__ import annotations

from .base import Judge
from .templates import JudgeTemplates


class TemplatedJudge(Judge):
    """Base of `GeneratingJudge` and `EndpointJudge`: a judge that answers rendered templates within budgets."""

    def __init__(
        self,
        review_template: str,
        correction_template: str,
        max_review_tokens: int,
        max_correction_tokens: int,
        temperature: float | None,
    ):
        self.templates = JudgeTemplates(review_template, correction_template)
        self.max_review_tokens = max_review_tokens
        self.max_correction_tokens = max_correction_tokens
        self.temperature = temperature
