"""Build the judge named by `MInTRLConfig.judge` for a trainer (SPEC 2.2), and watch its failure rate."""

from __future__ import annotations

import logging

from ..engines import AdapterDisabledEngine
from ..judges import EndpointJudge, GeneratingJudge, Judge
from ..judges.endpoint import require_openai
from .config import MInTRLConfig

logger = logging.getLogger(__name__)


def _is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def check_judge_backend(args: MInTRLConfig, model, peft_config) -> None:
    """Refuse judge settings that cannot work, before the model is loaded."""
    if args.judge == "endpoint" and args.intervention_steps and args.num_intervened_generations:
        require_openai()  # the endpoint judge's HTTP client is an extra
    if args.judge == "base" and args.use_vllm and (peft_config is not None or _is_peft_model(model)):
        raise ValueError(
            "judge='base' with a PEFT adapter is not supported with use_vllm=True: the colocated vLLM engine holds "
            "the adapter merged into the weights, so it cannot generate with the adapter disabled (vLLM LoRA is not "
            "wired). Use use_vllm=False (the judge is then the policy with its adapter disabled, no extra memory), "
            "or judge='model' with judge_model_name_or_path=<the base model> and judge_vllm_gpu_memory_utilization."
        )


def check_judge_votes(args: MInTRLConfig, judge: Judge | None) -> None:
    """Refuse votes that could not differ: k reviews of a greedy judge are k copies of one review."""
    if args.judge_votes == 1:
        return
    temperature = args.judge_temperature if judge is None else getattr(judge, "temperature", None)
    if temperature == 0:
        source = "judge_temperature" if judge is None else f"the judge object's temperature ({type(judge).__name__})"
        raise ValueError(
            f"judge_votes={args.judge_votes} with {source} = 0: a greedy judge gives the same review every time, so "
            "the votes could never disagree. Set a sampling temperature > 0 (e.g. judge_temperature=0.7) or "
            "judge_votes=1."
        )


def policy_model_path(trainer) -> str:
    """Where the policy's initial weights live: the path or id the model was loaded from."""
    path = getattr(trainer.model.config, "_name_or_path", None)
    if not path:
        raise ValueError(
            "judge='base' without PEFT loads a frozen copy of the initial weights from the policy's path, but the "
            "model has no config._name_or_path. Pass the model as a path or id, use a PEFT adapter, or use "
            "judge='model' with judge_model_name_or_path."
        )
    return path


def build_judge(args: MInTRLConfig, trainer) -> Judge | None:
    """The judge named by `args.judge`; None when the run never intervenes."""
    if args.intervention_steps == 0 or args.num_intervened_generations == 0:
        return None
    common = dict(
        review_template=args.judge_review_template,
        correction_template=args.judge_correction_template,
        max_review_tokens=args.judge_max_review_tokens,
        max_correction_tokens=args.max_correction_tokens,
        temperature=args.judge_temperature,
    )
    if args.judge == "endpoint":  # the server renders the chat template
        return EndpointJudge(
            args.judge_base_url,
            args.judge_model,
            api_key_env=args.judge_api_key_env,
            timeout_s=args.judge_timeout_s,
            max_retries=args.judge_max_retries,
            max_concurrency=args.judge_max_concurrency,
            **common,
        )
    common["chat_template_kwargs"] = args.judge_chat_template_kwargs
    if args.judge == "self":
        return GeneratingJudge(trainer.policy_engine, trainer.processing_class, **common)
    if args.judge == "base" and _is_peft_model(trainer.model):
        engine = AdapterDisabledEngine(trainer.policy_engine, trainer.model)
        return GeneratingJudge(engine, trainer.processing_class, **common)
    path = policy_model_path(trainer) if args.judge == "base" else args.judge_model_name_or_path
    if args.use_vllm and args.judge_vllm_gpu_memory_utilization is not None:
        from transformers import AutoTokenizer

        from ..engines.vllm import VLLMEngine

        engine = VLLMEngine.from_model_path(path, gpu_memory_utilization=args.judge_vllm_gpu_memory_utilization)
        return GeneratingJudge(engine, AutoTokenizer.from_pretrained(path), **common)
    return GeneratingJudge.from_pretrained(path, device=str(trainer.accelerator.device), **common)


class JudgeFailureWarning:
    """Warns once per run when more than half of a step's reviews come back unusable: the judge then almost never
    intervenes, and the usual causes are a thinking chat template or too small a token budget."""

    def __init__(self, args: MInTRLConfig, enabled: bool = True):
        self.args = args
        self.enabled = enabled
        self.warned = False

    def update(self, reviews: float, failures: float) -> None:
        """`reviews`: reviews made this step (all processes); `failures`: unusable reviews and corrections."""
        if self.warned or not self.enabled or reviews <= 0 or failures <= reviews / 2:
            return
        self.warned = True
        args = self.args
        if args.judge == "endpoint":
            fix = (
                "the endpoint renders its own chat template: turn thinking off on the server (vLLM/SGLang accept "
                "chat_template_kwargs per request) or raise judge_max_review_tokens / max_correction_tokens"
            )
        else:
            fix = (
                f"judge_chat_template_kwargs={args.judge_chat_template_kwargs} (use {{'enable_thinking': False}} for "
                f"Qwen3-style templates), or raise judge_max_review_tokens={args.judge_max_review_tokens} / "
                f"max_correction_tokens={args.max_correction_tokens}"
            )
        logger.warning(
            "MInTRL judge: %d unusable answers in %d reviews this step (a failed review counts as KEEP, a failed "
            "correction keeps the chunk), so the judge rarely intervenes. Likely cause: the judge's answers are cut "
            "off by their token cap, e.g. a thinking chat template spending the budget inside <think>, or a review "
            "budget too small for the judge's explanation. Fix: %s. Shown once per run; mintrl/judge_failures "
            "counts them every step.",
            int(failures),
            int(reviews),
            fix,
        )
