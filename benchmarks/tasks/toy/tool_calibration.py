"""The tool task's calibration measurements: MInTRL's two preconditions on a warm start (pass@k with the tool loop on,
and the NLL of the rule judge's corrections), shared by the calibration study (`benchmarks.studies.tool_calibration`)
and the tool task's runs (`tool_run`)."""

from __future__ import annotations

import statistics
import time

from .tool_task import TOOL_FIELDS

HELDOUT_SEED = 999
ROLLOUT = dict(chunk_size=16, max_reviews=6, max_correction_tokens=16, **TOOL_FIELDS)


def tool_rollouts(model, tokenizer, problems, n_samples: int, *, judge=None, seed: int = 0, group: int = 256,
                  temperature: float = 1.0, settings: dict | None = None):  # fmt: skip
    """`n_samples` rollouts per problem with the tool loop on (reviewed by `judge` when given): a list of
    `(problem index, Trajectory, RegisterEnv)`, reproducible for a seed."""
    import torch
    from transformers import GenerationConfig

    from trl_mintrl.engines import TransformersEngine
    from trl_mintrl.mintrl import InterventionRollout, RolloutSettings, Trajectory
    from trl_mintrl.text import prompt_token_ids

    from .tool_chat import LocalToolEnvironment

    settings = RolloutSettings(**{**ROLLOUT, **(settings or {})})
    config = GenerationConfig(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
    engine = TransformersEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], generation_config=config
    )
    rollout = InterventionRollout(engine, judge, tokenizer, settings)
    jobs = [(i, p) for i, p in enumerate(problems) for _ in range(n_samples)]
    out = []
    was_training = model.training
    model.eval()
    rng_state = torch.random.get_rng_state()
    try:
        for start in range(0, len(jobs), group):
            torch.manual_seed(seed + start)
            batch = []
            for i, problem in jobs[start : start + group]:
                row = problem.row()
                env = LocalToolEnvironment(tokenizer, row)
                t = Trajectory(
                    prompt_ids=prompt_token_ids(tokenizer, row["prompt"]),
                    question=problem.question,
                    review_budget=settings.max_reviews if judge is not None else 0,
                    environment=env,
                )
                batch.append((i, t, env.env))
            with torch.no_grad():
                rollout.run([t for _, t, _ in batch])
            out += batch
    finally:
        torch.random.set_rng_state(rng_state)
        model.train(was_training)
    return out


def pass_scores(problems, rollouts, n_samples: int) -> dict:
    from trl_mintrl.eval import pass_at_k

    from .tool_task import solved

    correct = [0] * len(problems)
    read_all, solved_read = 0, 0
    for i, t, env in rollouts:
        p = problems[i]
        ok = solved(p.answer, "".join(p.registers), t.messages, env.reads)
        correct[i] += ok
        if set(p.registers) <= set(env.reads):
            read_all += 1
            solved_read += ok
    scores = {
        f"pass@{k}": sum(pass_at_k(n_samples, c, k) for c in correct) / len(problems)
        for k in (1, 8, 64)
        if k <= n_samples
    }
    scores["read_all"] = read_all / len(rollouts)
    scores["solved_given_read"] = solved_read / read_all if read_all else float("nan")
    scores["mean_completion_tokens"] = statistics.fmean(len(t.completion_ids) for _, t, _ in rollouts)
    return scores


def correction_scores(model, tokenizer, problems, rollouts) -> dict:
    """Each correction's NLL under `model` (contiguous judge-token runs of a trajectory), and the intervened pass."""
    from benchmarks.lib.logprobs import sequence_nll

    from .tool_task import solved

    pairs, corrected, passed, judge_tokens, tokens = [], 0, 0, 0, 0
    for i, t, env in rollouts:
        p = problems[i]
        passed += solved(p.answer, "".join(p.registers), t.messages, env.reads)
        corrected += t.revisions > 0
        judge_tokens += sum(t.judge_mask)
        tokens += sum(m or j for m, j in zip(t.env_mask, t.judge_mask, strict=True))
        pos = 0
        while pos < len(t.judge_mask):
            if t.judge_mask[pos]:
                end = pos
                while end < len(t.judge_mask) and t.judge_mask[end]:
                    end += 1
                pairs.append((t.prompt_ids + t.completion_ids[:pos], t.completion_ids[pos:end]))
                pos = end
            else:
                pos += 1
    nats = sequence_nll(model, pairs)
    first = sequence_nll(model, [(context, target[:1]) for context, target in pairs])  # the decision to call: `[`
    return {
        "first_token_nats": statistics.fmean(first) if first else float("nan"),
        "correction_nats": statistics.fmean(nats) if nats else float("nan"),
        "correction_nats_std": statistics.stdev(nats) if len(nats) > 1 else 0.0,
        "corrections": len(nats),
        "corrected_share": corrected / len(rollouts),
        "intervened_pass@1": passed / len(rollouts),
        "judge_token_share": judge_tokens / max(tokens, 1),
    }


def calibrate_tools(model, tokenizer, regime: str, n_problems: int = 96, n_samples: int = 64,
                    n_intervened: int = 8, design: str | None = None) -> dict:  # fmt: skip
    from .tool_judge import tool_judge
    from .tool_task import DESIGN, make_tool_problems

    problems = make_tool_problems(n_problems, HELDOUT_SEED, regime, design or DESIGN)
    started = time.time()
    result = pass_scores(problems, tool_rollouts(model, tokenizer, problems, n_samples, seed=1), n_samples)
    intervened = tool_rollouts(model, tokenizer, problems, n_intervened, judge=tool_judge(), seed=2)
    result.update(correction_scores(model, tokenizer, problems, intervened))
    result["seconds"] = round(time.time() - started, 1)
    return result
