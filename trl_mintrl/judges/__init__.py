"""Judges for MInTRL's intervention rollouts: review a chunk's steps, write short corrections.

Backends behind one batched interface: `FunctionJudge` (Python callables), `GeneratingJudge` (the policy itself or a
second model, through a generation engine) and `EndpointJudge` (an OpenAI-compatible HTTP endpoint).
"""

from .base import Correction, CorrectionRequest, Judge, ReviewRequest, TransportStatus, Verdict, conversation_text
from .endpoint import EndpointJudge
from .function import FunctionJudge
from .generating import GeneratingJudge
from .parsing import clean_correction, parse_correction, parse_verdict
from .templates import (
    CORRECTION_FIELDS,
    CORRECTION_TEMPLATES,
    REVIEW_FIELDS,
    REVIEW_TEMPLATES,
    JudgeTemplates,
    resolve_template,
)

__all__ = [
    "CORRECTION_FIELDS",
    "CORRECTION_TEMPLATES",
    "REVIEW_FIELDS",
    "REVIEW_TEMPLATES",
    "Correction",
    "CorrectionRequest",
    "EndpointJudge",
    "FunctionJudge",
    "GeneratingJudge",
    "Judge",
    "JudgeTemplates",
    "ReviewRequest",
    "TransportStatus",
    "Verdict",
    "clean_correction",
    "conversation_text",
    "parse_correction",
    "parse_verdict",
    "resolve_template",
]
