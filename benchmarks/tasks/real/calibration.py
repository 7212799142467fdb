"""MInTRL's two preconditions measured on SmolLM2-135M-Instruct, per difficulty, before any method runs
(docs/mintrl.md; `benchmarks/studies/real_calibration.py` runs it and writes the report): on a difficulty's
calibration problems, what sampling finds (pass@k by the package's math reward and by readers of its own, the shares
that write an answer line or hit the token cap), what the rule judge keeps whole and where it flags, and what its
corrections cost the model (their NLL where the judge would insert them, on the model's own samples and after the
reference's own prefix), with the whole references' NLL."""

from __future__ import annotations

import re
import statistics
import time

from benchmarks.lib.logprobs import sequence_nll, token_ids
from benchmarks.lib.provenance import MachineWatch

from .judge import ANSWER, COMPUTATION, correct_step, evaluate, number, review_chunk
from .scoring import sample
from .task import DECISIVE_OP, calibration_problems

_HASH = re.compile(r"####\s*\$?(-?\d+(?:,\d{3})*(?:\.\d+)?)")

_INT = re.compile(r"-?\d+(?:,\d{3})*")


def hash_answer(text: str) -> int | None:
    found = _HASH.findall(text)
    return _as_int(found[-1]) if found else None


def line_answer(text: str) -> int | None:
    """The last answer line's number (`#### N`, "the answer is N", `\\boxed{N}`), the judge's reading."""
    found = list(ANSWER.finditer(text))
    return _as_int(found[-1].group("result")) if found else None


def last_int(text: str) -> int | None:
    found = _INT.findall(text)
    return _as_int(found[-1]) if found else None


def _as_int(text: str) -> int | None:
    try:
        return int(text.replace("$", "").replace(",", ""))
    except ValueError:
        return None


def math_reward_reads_hash() -> bool:
    """Whether the package's math reward reads GSM8K's `#### N` at this commit."""
    from trl_mintrl.rewards import math_reward

    return math_reward(["Jack has 28 - 12 = 16 stickers left.\n#### 16"], ["Jack has 28 - 12 = 16.\n#### 16"]) == [1.0]


def pass_at(flags: list[list[bool]], k: int) -> float | None:
    from trl_mintrl.eval import pass_at_k

    groups = [g for g in flags if len(g) >= k]
    return sum(pass_at_k(len(g), sum(g), k) for g in groups) / len(groups) if groups else None


def cut_tokens(tokenizer, ids: list[int], chars: int) -> int:
    """The most tokens of `ids` whose text is at most the first `chars` characters (a cut at a token boundary on or
    before the step boundary, as the rollout cuts)."""
    best = 0
    for t in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:t], skip_special_tokens=True)) > chars:
            break
        best = t
    return best


def summary(nats: list[float], tokens: list[int]) -> dict:
    if not nats:
        return {"n": 0}
    return {
        "n": len(nats),
        "mean_nats": statistics.fmean(nats),
        "median_nats": statistics.median(nats),
        "nats_per_token": sum(nats) / sum(tokens),
        "mean_tokens": statistics.fmean(tokens),
        "max_tokens": max(tokens),
    }


def judge_samples(tokenizer, problems, prompts, generations, texts, samples: int) -> tuple[dict, list, list]:
    """Where the rule judge would insert its first correction in each sample it flags (the cut token, its line), the
    (context, correction) token pairs there, and a few examples."""
    eos = tokenizer.eos_token_id
    indices, pairs, starts, examples = [], [], [], []
    for row, (generation, text) in enumerate(zip(generations, texts, strict=True)):
        problem = problems[row // samples]
        question, reference = problem.prompt[0]["content"], problem.solution
        steps = text.splitlines(keepends=True) or [text]
        finished = bool(generation.token_ids) and generation.token_ids[-1] == eos
        index = review_chunk(question, "", steps, reference, last_step_complete=finished)
        correction = None
        if index is not None:
            indices.append(index)
            ids = [t for t in generation.token_ids if t != eos]
            cut = cut_tokens(tokenizer, ids, len("".join(steps[:index])))
            prefix = tokenizer.decode(ids[:cut], skip_special_tokens=True)
            correction = correct_step(question, prefix, reference)
            pairs.append((prompts[row] + ids[:cut], token_ids(tokenizer, correction)))
            starts.append(cut)
        if row % samples == 0 and len(examples) < 6:
            examples.append({"question": problem.question, "completion": text, "flagged_line": index,
                             "correction": correction})  # fmt: skip
    stats = {
        "mean_flagged_line": statistics.fmean(indices) if indices else None,
        "mean_cut_token": statistics.fmean(starts) if starts else None,
    }
    return stats, pairs, examples


def text_stats(problems, texts: list[str], capped: list[bool], samples: int, family: str = "mixed") -> dict:
    """What the samples' text says (no model: `--rescore` recomputes it): pass@k by each answer reader, the shares
    that write `####`, an answer line, a computation, that hit the cap; the computations' truth; the rule judge's
    whole-sample verdicts and, for the chain family, where its first flag falls (`first_flagged`)."""
    rows = [problems[i // samples] for i in range(len(texts))]
    questions = [p.prompt[0]["content"] for p in rows]
    readers = answer_readers(texts, [p.answer for p in rows], [p.solution for p in rows])
    finished = [not c for c in capped]
    flagged = [
        review_chunk(q, "", t.splitlines(keepends=True) or [t], p.solution, last_step_complete=f)
        for q, t, p, f in zip(questions, texts, rows, finished, strict=True)
    ]
    found = [list(COMPUTATION.finditer(t)) for t in texts]
    computations = [m for ms in found for m in ms]
    true = [evaluate(m.group("expr")) == number(m.group("result")) for m in computations]
    kept = [index is None for index in flagged]
    return {
        "pass": {name: _pass(flags, samples) for name, flags in readers.items()},
        "first_flagged": first_flagged(rows, flagged) if family == "chain" else None,
        "writes_hash": statistics.fmean("####" in t for t in texts),
        "writes_answer_line": statistics.fmean(line_answer(t) is not None for t in texts),
        "writes_computation": statistics.fmean(bool(ms) for ms in found),
        "computations_per_sample": len(computations) / len(texts),
        "computations_true": statistics.fmean(true) if true else None,
        "capped": statistics.fmean(capped),
        "judge": {
            "kept_whole": statistics.fmean(kept),
            "kept_whole_with_computation": _share([k for k, ms in zip(kept, found, strict=True) if ms]),
            **_agreement(kept, readers["hash_reader"], capped),
        },
    }


def first_flagged(problems, flagged: list[int | None]) -> dict:
    """Where the rule judge's first flag falls in each sample of a chain problem (`task.make_chain_problem`), as
    shares: before its decisive step, at it, after it, nowhere. A regime where the judge's correction is local needs
    most first flags at the decisive step."""
    decisive = [next(i for i, c in enumerate(p.computations) if c[1] == DECISIVE_OP) for p in problems]
    where = [
        "none" if f is None else "before" if f < d else "at" if f == d else "after"
        for f, d in zip(flagged, decisive, strict=True)
    ]
    return {place: where.count(place) / len(where) for place in ("before", "at", "after", "none")}


def _share(flags: list[bool]) -> float | None:
    return statistics.fmean(flags) if flags else None


def reference_pairs(tokenizer, problems, prompts_by_problem) -> tuple[list, list]:
    """(context, step) pairs after each reference prefix, and (prompt, whole reference + EOS) pairs."""
    steps, whole = [], []
    for problem, prompt in zip(problems, prompts_by_problem, strict=True):
        for k, step in enumerate(problem.steps):
            before = "".join(s + "\n" for s in problem.steps[:k])
            steps.append((prompt + token_ids(tokenizer, before), token_ids(tokenizer, step + "\n")))
        whole.append((prompt, token_ids(tokenizer, problem.solution) + [tokenizer.eos_token_id]))
    return steps, whole


def calibrate_difficulty(model, tokenizer, num_steps: int, args) -> tuple[dict, dict]:
    from trl_mintrl.text import prompt_token_ids

    watch = MachineWatch()
    problems = calibration_problems(num_steps, args.problems, family=args.family)
    by_problem = [prompt_token_ids(tokenizer, p.prompt) for p in problems]
    prompts = [ids for ids in by_problem for _ in range(args.samples)]
    began = time.perf_counter()
    generations, seconds = sample(
        model,
        tokenizer,
        prompts,
        args.max_new_tokens,
        seed=args.seed * 1000 + num_steps,
        batch_size=args.batch_size,
        temperature=args.temperature,
        top_k=args.top_k,
        on_batch=_progress(num_steps, len(args.steps)),
    )
    generated = time.perf_counter() - began
    texts = tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
    golds = [p.solution for p in problems for _ in range(args.samples)]
    answers = [p.answer for p in problems for _ in range(args.samples)]
    judged, own_pairs, examples = judge_samples(tokenizer, problems, prompts, generations, texts, args.samples)
    step_pairs, whole_pairs = reference_pairs(tokenizer, problems, by_problem)
    scoring_began = time.perf_counter()
    own, ref_steps, whole = (sequence_nll(model, pairs) for pairs in (own_pairs, step_pairs, whole_pairs))
    scored = time.perf_counter() - scoring_began
    eos = tokenizer.eos_token_id
    capped = [not g.token_ids or g.token_ids[-1] != eos for g in generations]
    n_tokens = sum(g.num_tokens for g in generations)
    record = {
        "num_steps": num_steps,
        "problems": len(problems),
        "samples_per_problem": args.samples,
        **text_stats(problems, texts, capped, args.samples, args.family),
        "mean_completion_tokens": n_tokens / len(generations),
        "judge_corrections": judged,
        "corrections_own_samples": summary(own, [len(t) for _, t in own_pairs]),
        "corrections_reference_prefix": summary(ref_steps, [len(t) for _, t in step_pairs]),
        "reference_solution": summary(whole, [len(t) for _, t in whole_pairs]),
        "timing": {
            "generate_s": round(generated, 1),
            "batch_s": [round(s, 1) for s in seconds],
            "tokens_per_s": round(n_tokens / generated, 1),
            "nll_s": round(scored, 1),
        },
        "machine": watch.stop(),
        "examples": examples,
    }
    return record, {"completions": texts, "capped": capped, "answers": answers, "solutions": golds}


def _progress(num_steps: int, total_difficulties: int):
    def on_batch(index: int, batches: int, seconds: float, rows: int) -> None:
        line = f"num_steps={num_steps}: batch {index + 1}/{batches} ({rows} rows) took {seconds:.0f} s"
        if index == 0:
            line += f"; this difficulty about {batches * seconds / 60:.0f} min to sample"
            line += f", {total_difficulties} difficulties about {total_difficulties * batches * seconds / 60:.0f} min"
        print(line, flush=True)

    return on_batch


def answer_readers(texts: list[str], answers: list[int], golds: list[str]) -> dict[str, list[bool]]:
    """Per sample, right by each reader: the package's math reward, the last `#### N`, the last answer line, the
    last integer."""
    from trl_mintrl.rewards import math_reward

    return {
        "math_reward": [r == 1.0 for r in math_reward(texts, solution=golds)],
        "hash_reader": [hash_answer(t) == a for t, a in zip(texts, answers, strict=True)],
        "answer_line": [line_answer(t) == a for t, a in zip(texts, answers, strict=True)],
        "last_integer": [last_int(t) == a for t, a in zip(texts, answers, strict=True)],
    }


def _pass(flags: list[bool], samples: int) -> dict:
    groups = [flags[i : i + samples] for i in range(0, len(flags), samples)]
    return {"pass@1": pass_at(groups, 1), "pass@8": pass_at(groups, 8), "samples_right": statistics.fmean(flags)}


def _agreement(kept: list[bool], right: list[bool], capped: list[bool]) -> dict:
    """How the judge's whole-sample verdict lines up with the answer (`#### N` reader) on finished samples."""
    finished = [i for i, c in enumerate(capped) if not c]
    kept_done = [i for i in finished if kept[i]]
    right_done = [i for i in finished if right[i]]
    return {
        "finished_kept_and_right": statistics.fmean(right[i] for i in kept_done) if kept_done else None,
        "finished_right_and_kept": statistics.fmean(kept[i] for i in right_done) if right_done else None,
    }


def rollout_locality(model, tokenizer, problems, *, max_completion_length: int, chunk_size: int, seed: int) -> dict:
    """How local MInTRL's corrections are on `problems`: one group each (4 controls, 4 intervened, every intervened
    slot reviewed) rolled out by the package's own loop with `mintrl-const`'s settings (`arms.build_trainer`: the
    rule judge, 4 reviews, corrections of at most 32 tokens) at `chunk_size`, nothing trained. The judge's share of
    all completion tokens and of each intervened rollout (every token counted, the policy's and the judge's), how
    many intervened rollouts it revised, and what the math reward gives each half."""
    import tempfile

    import torch
    from datasets import Dataset

    from trl_mintrl.rewards import math_reward

    from .arms import build_trainer

    job = {"steps": 1, "prompts_per_step": len(problems), "max_completion_length": max_completion_length,
           "seed": seed, "engine": "transformers", "overrides": {"chunk_size": chunk_size}}  # fmt: skip
    dataset = Dataset.from_list([p.row() for p in problems])
    torch.manual_seed(seed)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = build_trainer("mintrl-const", job, model, tokenizer, dataset, output_dir)
        rollout = trainer.rollout_groups([dataset[i] for i in range(len(dataset))])
    seconds = time.perf_counter() - began
    model.eval()
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    group = len(texts) // len(problems)
    rewards = math_reward(texts, [p.solution for p in problems for _ in range(group)])
    judge, tokens = rollout.stat("judge_tokens"), rollout.stat("completion_tokens")
    intervened, revised = rollout.stat("intervened").bool(), rollout.stat("revised").bool()
    control = rollout.is_control
    share = judge / tokens.clamp(min=1)  # of each rollout
    return {
        "problems": len(problems),
        "rollouts": len(texts),
        "chunk_size": chunk_size,
        "max_completion_length": max_completion_length,
        "judge_share_all": judge.sum().item() / max(tokens.sum().item(), 1.0),
        "judge_share_per_intervened": share[intervened].mean().item(),
        "judge_share_per_revised": share[revised].mean().nan_to_num().item(),
        "revised_share": revised[intervened].float().mean().item(),
        "reviews_per_intervened": rollout.stat("reviews")[intervened].mean().item(),
        "judge_tokens_per_revised": judge[revised].mean().nan_to_num().item(),
        "length_control": tokens[control].mean().item(),
        "length_intervened": tokens[intervened].mean().item(),
        "capped_control": rollout.stat("truncated")[control].mean().item(),
        "capped_intervened": rollout.stat("truncated")[intervened].mean().item(),
        "reward_control": statistics.fmean(r or 0.0 for r, c in zip(rewards, control.tolist(), strict=True) if c),
        "reward_intervened": statistics.fmean(
            r or 0.0 for r, i in zip(rewards, intervened.tolist(), strict=True) if i
        ),
        "seconds": round(seconds, 1),
        "examples": [texts[i] for i in range(len(texts)) if revised[i]][:3],
    }
