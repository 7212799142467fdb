"""Calibration: each regime is defined by a measured precondition of the warm start, reported next to its results.

    python -m benchmarks.tasks.toy.calibration [--problems 96] [--samples 64] [REGIME ...]

prints, per regime, the warm start's held-out pass@1 / pass@8 / pass@64 (from `--samples` samples at temperature 1,
unbiased estimator) and, for regimes with a new operator, pass@1 / pass@8 on the same problems written in familiar
notation (`Problem.familiar()`): the rest of each problem is within the warm start's ability, only the rule is
missing. "out-of-reach" asks for pass@64 below 1% (sampling cannot find the rule); `learning.py` computes the same
numbers on its held-out set in every run.
"""

from __future__ import annotations

import argparse
import os

from benchmarks.lib.logprobs import sequence_nll, token_ids

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HELDOUT_SEED = 999  # the learning benchmark's held-out problems


def calibrate(model, tokenizer, problems, n_samples: int = 64) -> dict[str, dict[str, float]]:
    """`{"sampled": pass@1/8/64 (those <= n_samples), "familiar": pass@1/8}`; "familiar" only when the problems have
    a new operator."""
    from .evaluate import evaluate

    ks = tuple(k for k in (1, 8, 64) if k <= n_samples)
    result = {"sampled": evaluate(model, tokenizer, problems, n_samples, ks=ks)}
    familiar = [p.familiar() for p in problems]
    if familiar != list(problems):
        result["familiar"] = evaluate(model, tokenizer, familiar, 8, ks=(1, 8))
    return result


def judge_calibration(
    model,
    tokenizer,
    problems,
    *,
    notation: str,
    reviewed_tokens: int,
    n_samples: int = 8,
    max_new_tokens: int = 96,
    max_rounds: int = 8,
    seed: int = 0,
) -> dict[str, float]:
    """How far the judge's corrections are from the warm start, and whether its reviews reach the errors.

    The warm start's own rollouts (`n_samples` per problem) go through the intervention loop with the whole
    completion reviewed: the rule judge (`notation`) finds the first wrong step, the rollout is cut there, the judge
    writes the step, and the warm start continues from the correction (up to `max_rounds` corrections). Returns
    `correction_nats`: the mean (and std, n) over corrections of their NLL under the warm start, summed over a
    correction's tokens, given the prompt and everything before it; `corrected_share`: rollouts corrected at least
    once; `coverage`: the share of corrected wrong steps that start within the first `reviewed_tokens` completion
    tokens (the span `max_reviews` chunks review; corrections shift later chunks, so this is the share a review of
    the first `reviewed_tokens` tokens reaches)."""
    import statistics

    from trl_mintrl.mintrl import split_steps
    from trl_mintrl.text import prompt_token_ids

    from .evaluate import sample_texts
    from .task import correct_step, review_steps

    rows = [(p, prompt_token_ids(tokenizer, p.row()["prompt"])) for p in problems for _ in range(n_samples)]
    accepted = [""] * len(rows)  # the completion so far: policy text up to a cut, and corrections
    active = list(range(len(rows)))
    nats, starts, corrected = [], [], set()
    for round_ in range(max_rounds + 1):
        prompts = [rows[i][1] + token_ids(tokenizer, accepted[i]) for i in active]
        budgets = [max_new_tokens - len(token_ids(tokenizer, accepted[i])) for i in active]
        texts = sample_texts(model, tokenizer, prompts, max(budgets), seed=seed + round_)
        scored, still = [], []
        for i, text, budget in zip(active, texts, budgets, strict=True):
            text = tokenizer.decode(token_ids(tokenizer, text)[:budget])
            problem, prefix = rows[i][0], accepted[i]
            steps = split_steps(text)
            index = review_steps(problem.question, prefix, steps, notation=notation) if round_ < max_rounds else None
            if index is None:
                continue
            prefix += "".join(steps[:index])
            correction = correct_step(problem.question, prefix, notation=notation)
            if not correction:
                continue
            starts.append(len(token_ids(tokenizer, prefix)))
            scored.append((rows[i][1] + token_ids(tokenizer, prefix), token_ids(tokenizer, correction)))
            accepted[i] = prefix + correction
            corrected.add(i)
            if len(token_ids(tokenizer, accepted[i])) < max_new_tokens:
                still.append(i)
        nats += sequence_nll(model, scored)
        active = still
        if not active:
            break
    return {
        "correction_nats": statistics.fmean(nats) if nats else float("nan"),
        "correction_nats_std": statistics.stdev(nats) if len(nats) > 1 else 0.0,
        "corrections": len(nats),
        "corrected_share": len(corrected) / len(rows),
        "coverage": sum(s < reviewed_tokens for s in starts) / len(starts) if starts else float("nan"),
    }


def reference_logprobs(model, tokenizer, problems, prompt_fn=None, notation: str = "near") -> dict[str, float]:
    """Mean per-token log-prob of each problem's reference (`notation`, EOS appended, as SORT scores it) after its
    prompt (`prompt_fn(problem)`, default the problem's own), averaged over problems (`mean_token_logprob`), and the
    mean log-prob of the new operator's step result (`decisive_logprob`: the digits after `=` of the last step; the
    token SORT's salience has to find), in nats."""
    import torch

    from trl_mintrl.text import prompt_token_ids

    from .task import STEP_SEPARATOR

    means, decisive = [], []
    for problem in problems:
        steps = problem.written_steps(notation)
        reference = STEP_SEPARATOR.join(steps)
        prompt = prompt_token_ids(tokenizer, prompt_fn(problem) if prompt_fn else problem.row()["prompt"])
        ref_ids = tokenizer(reference, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ref_ids])).logits[0, len(prompt) - 1 : -1]
        token_lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ref_ids)[:, None])[:, 0]
        means.append(token_lp.mean().item())
        last = steps[-2]  # the new operator's step (the last computation step)
        start = len(STEP_SEPARATOR.join(steps[:-2]) + (STEP_SEPARATOR if len(steps) > 2 else "")) + last.index("=") + 1
        decisive.append(token_lp[start : start + len(last) - last.index("=") - 1].mean().item())
    return {
        "mean_token_logprob": sum(means) / len(means),
        "decisive_logprob": sum(decisive) / len(decisive),
    }


def hint_calibration(model, tokenizer, problems, n_samples: int = 64) -> dict[str, dict[str, float]]:
    """SORT's regime at its warm start: pass@k without the hint ("no_hint"), with the rule planner's hint before the
    question ("hint", the teacher prompt), and the near reference's log-probs under the base prompt ("base") and the
    teacher prompt with the plan ("teacher")."""
    from .evaluate import evaluate
    from .hint import hinted_prompt_fn

    ks = tuple(k for k in (1, 8, 64) if k <= n_samples)
    hinted = hinted_prompt_fn()
    return {
        "no_hint": evaluate(model, tokenizer, problems, n_samples, ks=ks),
        "hint": evaluate(model, tokenizer, problems, n_samples, ks=ks, prompt_fn=hinted),
        "base": reference_logprobs(model, tokenizer, problems),
        "teacher": reference_logprobs(model, tokenizer, problems, prompt_fn=hinted),
    }


def hint_table(result: dict) -> str:
    """Markdown of `hint_calibration`: pass@k in %, log-probs in nats."""
    ks = [k for k in (1, 8, 64) if f"pass@{k}" in result["no_hint"]]
    lines = ["| prompt | " + " | ".join(f"pass@{k}" for k in ks) + " | mean token log-prob | @-step result log-prob |"]
    lines.append("|---" * (len(ks) + 3) + "|")
    for name, pass_key, lp_key in (("no hint (base)", "no_hint", "base"), ("rule hint (teacher)", "hint", "teacher")):
        cells = [f"{100 * result[pass_key][f'pass@{k}']:.2f}" for k in ks]
        cells += [f"{result[lp_key]['mean_token_logprob']:.3f}", f"{result[lp_key]['decisive_logprob']:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_table(rows: dict[str, dict]) -> str:
    """Markdown table of `{regime: calibrate(...)}` in %; a missing k or familiar form is `-`."""
    lines = [
        "| regime | pass@1 | pass@8 | pass@64 | familiar notation: pass@1 | pass@8 |",
        "|---|---|---|---|---|---|",
    ]
    for regime, result in rows.items():
        cells = [result["sampled"].get(f"pass@{k}") for k in (1, 8, 64)]
        cells += [result.get("familiar", {}).get(f"pass@{k}") for k in (1, 8)]
        lines.append(f"| {regime} | " + " | ".join("-" if c is None else f"{100 * c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .training import REGIMES

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tasks.toy.calibration", description=__doc__)
    parser.add_argument("regimes", nargs="*", default=list(REGIMES))
    parser.add_argument("--problems", type=int, default=96)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--model", default=None, help="default: each regime's warm start")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows, hinted = {}, {}
    for name in args.regimes:
        path = args.model or REGIMES[name].warm_start
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        problems = REGIMES[name].problems(args.problems, seed=HELDOUT_SEED)
        if REGIMES[name].planner is not None:
            hinted[name] = (path, hint_calibration(model, tokenizer, problems, args.samples))
            rows[name] = {"sampled": hinted[name][1]["no_hint"]}
        else:
            rows[name] = calibrate(model, tokenizer, problems, args.samples)
    print(f"{args.problems} held-out problems x {args.samples} samples at temperature 1 (%)")
    print(calibration_table(rows))
    for name, (path, result) in hinted.items():
        print(f"\n{name} at {path}: without and with the rule planner's hint in the prompt")
        print(hint_table(result))


if __name__ == "__main__":
    main()
