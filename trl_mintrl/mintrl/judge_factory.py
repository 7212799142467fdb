"""Build the judge named by `MInTRLConfig.judge` for a trainer, and check before the model loads that it can work:
the backend's inputs, an endpoint that answers, a vote setting the judge can sample. Its failures during training
are watched by `judge_watch.py`."""

from __future__ import annotations

import logging

from ..engines import AdapterDisabledEngine
from ..judges import EndpointJudge, GeneratingJudge, Judge
from ..judges.endpoint import EndpointUnreachableError, require_openai, served_models
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
    check_judge_endpoint(args)
    use_vllm = getattr(args, "use_vllm", False)  # AsyncMInTRLConfig has none: its policy is on a vLLM server
    if args.judge == "base" and use_vllm and (peft_config is not None or _is_peft_model(model)):
        raise ValueError(
            "judge='base' with a PEFT adapter is not supported with use_vllm=True: the colocated vLLM engine holds "
            "the adapter merged into the weights, so it cannot generate with the adapter disabled (vLLM LoRA is not "
            "wired). Use use_vllm=False (the judge is then the policy with its adapter disabled, no extra memory), "
            "or judge='model' with judge_model_name_or_path=<the base model> and judge_vllm_gpu_memory_utilization."
        )


def check_judge_endpoint(args: MInTRLConfig) -> None:
    """An endpoint judge's server answers, and serves `judge_model` when it lists its models (`GET /models`); else
    one error naming the field to fix. Skipped with `judge_check_endpoint=False`, and for runs that never call the
    judge."""
    if args.judge != "endpoint" or not args.judge_check_endpoint:
        return
    if not (args.intervention_steps and args.num_intervened_generations):
        return
    url, skip = args.judge_base_url, "set judge_check_endpoint=False if the server comes up after training starts"
    try:
        models = served_models(url, args.judge_api_key_env, args.judge_timeout_s)
    except EndpointUnreachableError as err:
        if err.status in (401, 403):
            raise ValueError(
                f"judge_base_url={url!r}: the judge server refused the API key ({err}). Put a valid key in the "
                f"environment variable named by judge_api_key_env={args.judge_api_key_env!r}, or point "
                "judge_api_key_env at the variable that holds it."
            ) from None
        raise ValueError(
            f"judge_base_url={url!r}: the judge server cannot be reached ({err}). Start the server, or correct "
            "judge_base_url: the API root that `/chat/completions` follows, e.g. http://127.0.0.1:8000/v1. Checked "
            f"before the model loads; {skip}."
        ) from None
    if models is None:
        logger.warning(
            "judge_base_url=%r does not list its models (GET /models), so judge_model=%r was not checked. If "
            "judge_base_url lacks its /v1, every judge request will fail: see mintrl/judge_transport_failures.",
            url,
            args.judge_model,
        )
    elif args.judge_model not in models:
        raise ValueError(
            f"judge_model={args.judge_model!r} is not served at judge_base_url={url!r}, which serves {models}. Set "
            "judge_model to the served name (`vllm serve --served-model-name`), or judge_base_url to the server "
            f"that serves it; {skip}."
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


def judge_correction_budget(args: MInTRLConfig) -> int:
    """A model or endpoint judge's budget for writing a correction, in its own tokens."""
    return args.max_correction_tokens if args.judge_max_correction_tokens is None else args.judge_max_correction_tokens


def build_judge(args: MInTRLConfig, trainer) -> Judge | None:
    """The judge named by `args.judge`; None when the run never intervenes."""
    if args.intervention_steps == 0 or args.num_intervened_generations == 0:
        return None
    common = dict(
        review_template=args.judge_review_template,
        correction_template=args.judge_correction_template,
        max_review_tokens=args.judge_max_review_tokens,
        max_correction_tokens=judge_correction_budget(args),
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
    if getattr(args, "use_vllm", False) and args.judge_vllm_gpu_memory_utilization is not None:
        from transformers import AutoTokenizer

        from ..engines.vllm import VLLMEngine

        engine = VLLMEngine.from_model_path(path, gpu_memory_utilization=args.judge_vllm_gpu_memory_utilization)
        return GeneratingJudge(engine, AutoTokenizer.from_pretrained(path), **common)
    return GeneratingJudge.from_pretrained(path, device=str(trainer.accelerator.device), **common)
