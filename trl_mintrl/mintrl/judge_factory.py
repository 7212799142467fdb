"""Build the judge named by `MInTRLConfig.judge` for a trainer (SPEC 2.2)."""

from __future__ import annotations

from ..judges import EndpointJudge, GeneratingJudge, Judge
from .config import MInTRLConfig


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
    if args.judge == "self":
        return GeneratingJudge(trainer.policy_engine, trainer.processing_class, **common)
    if args.judge == "model" and args.use_vllm and args.judge_vllm_gpu_memory_utilization is not None:
        from transformers import AutoTokenizer

        from ..engines.vllm import VLLMEngine

        engine = VLLMEngine.from_model_path(
            args.judge_model_name_or_path, gpu_memory_utilization=args.judge_vllm_gpu_memory_utilization
        )
        return GeneratingJudge(engine, AutoTokenizer.from_pretrained(args.judge_model_name_or_path), **common)
    if args.judge == "model":
        return GeneratingJudge.from_pretrained(
            args.judge_model_name_or_path, device=str(trainer.accelerator.device), **common
        )
    return EndpointJudge(
        args.judge_base_url,
        args.judge_model,
        api_key_env=args.judge_api_key_env,
        timeout_s=args.judge_timeout_s,
        max_retries=args.judge_max_retries,
        max_concurrency=args.judge_max_concurrency,
        **common,
    )
