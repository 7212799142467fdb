"""A learned toy judge: a copy of the warm start fine-tuned to review chunks and write corrections
from the rule judge's transcripts, then used by MInTRL through the package's model judge (`judge="model"`), the same
templates, generation and strict parsing a user's Qwen judge goes through.

Transcripts: the in-band regime's MInTRL rollout loop run on the warm start at learning rate 0 (so every rollout is
the warm start's) with the exact rule judge recording every review and correction request and its answer, on
problems of their own seeds, none of them in the learning benchmark's held-out or validation sets. The judge's
answers are what `trl_mintrl.judges.parsing` accepts: `VERDICT: KEEP`, `VERDICT: REVISE <k>` (1-based), and for a
correction the text itself. Its templates are compact custom ones (`JUDGE_REVIEW_TEMPLATE`,
`JUDGE_CORRECTION_TEMPLATE`: the package's fields, a few hundred characters, where the math presets' English would
cost the tiny model a thousand tokens a review); docs/judges.md shows them as an example of writing one.

Accuracy (`judge_accuracy`) compares the learned judge's answers with the rule judge's on held-out transcripts:
REVISE precision and recall, first-wrong-step accuracy, exact corrections, parse failures, and the three error
rates of `benchmarks.tasks.toy.task.JUDGE_ERRORS` (false REVISE, missed error, wrong correction) that place it on the
fallible-judge curve of `benchmarks/studies/beyond.py`.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from pathlib import Path

from trl_mintrl.judges import Correction, CorrectionRequest, Judge, ReviewRequest, Verdict

from .warm_start import WARM_START_DIR, sft_batch, sft_optimizer, sft_step, warmup_cosine_schedule

JUDGE_DIR = Path(__file__).parent / "judge_model"
JUDGE_TRAIN_SEED, JUDGE_HELDOUT_SEED = 2000, 2001  # transcript problems: seeds no learning run draws from
JUDGE_REVIEW_TEMPLATE = (
    "Review\n{question}\n\n{reference}## Accepted\n{prefix}\n\n## New ({num_steps})\n{steps}\n{unfinished_note}"
)
JUDGE_CORRECTION_TEMPLATE = "Next step\n{question}\n\n{reference}## Accepted\n{prefix}"
MAX_REVIEW_TOKENS, MAX_CORRECTION_TOKENS = 24, 16  # `VERDICT: REVISE 6` is 17 characters; a step about 10


def judge_config_fields(judge_dir: str | Path = JUDGE_DIR) -> dict:
    """The `MInTRLConfig` fields that make a trainer build the learned judge itself (`judge="model"`), greedy."""
    return dict(
        judge="model",
        judge_model_name_or_path=str(judge_dir),
        judge_review_template=JUDGE_REVIEW_TEMPLATE,
        judge_correction_template=JUDGE_CORRECTION_TEMPLATE,
        judge_max_review_tokens=MAX_REVIEW_TOKENS,
        judge_temperature=0.0,
    )


class RecordingJudge(Judge):
    """Answers with `inner` and keeps every request with its answer (the transcripts)."""

    def __init__(self, inner: Judge):
        self.inner = inner
        self.reviews: list[tuple[ReviewRequest, Verdict]] = []
        self.corrections: list[tuple[CorrectionRequest, Correction]] = []

    def review(self, requests: list[ReviewRequest]) -> list[Verdict]:
        verdicts = self.inner.review(requests)
        self.reviews += zip(requests, verdicts, strict=True)
        return verdicts

    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]:
        corrections = self.inner.correct(requests)
        self.corrections += zip(requests, corrections, strict=True)
        return corrections


def excluded_questions(n: int = 96) -> set[str]:
    """The questions of the learning benchmark's held-out and validation sets (`n` each, its largest), which no
    transcript may hold."""
    from .training import HELDOUT_SEED, REGIMES, VALIDATION_SEED

    regime = REGIMES["in-band"]
    return {p.question for seed in (HELDOUT_SEED, VALIDATION_SEED) for p in regime.problems(n, seed)}


def collect_transcripts(seed: int, steps: int, prompts_per_step: int = 8) -> dict:
    """The rule judge's reviews and corrections on the warm start's in-band rollouts of `steps x prompts_per_step`
    problems drawn at `seed` (those in the benchmark's evaluation sets left out): MInTRL's rollout loop at learning
    rate 0 with every step an intervention step. Returns {"reviews": [...], "corrections": [...]} of plain dicts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from .training import REGIMES, build_trainer, rl_config

    torch.set_num_threads(1)
    regime = REGIMES["in-band"]
    excluded = excluded_questions()
    data = regime.dataset(steps * prompts_per_step * 2, seed=seed)
    data = data.filter(lambda row: row["prompt"][-1]["content"] not in excluded)
    data = data.select(range(steps * prompts_per_step))
    tokenizer = AutoTokenizer.from_pretrained(regime.warm_start)
    model = AutoModelForCausalLM.from_pretrained(regime.warm_start)
    args = rl_config(
        "mintrl-const",
        f"/tmp/trl_mintrl_bench/judge-transcripts-{seed}",
        steps=steps,
        seed=seed,
        regime="in-band",
        per_device_train_batch_size=prompts_per_step * 8,
        intervention_steps=steps,
        learning_rate=0.0,
    )
    judge = RecordingJudge(regime.judge())
    trainer = build_trainer("mintrl-const", model, tokenizer, data, args, judge=judge, reward=regime.reward)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return {
        "reviews": [{"request": asdict(r), "verdict": asdict(v)} for r, v in judge.reviews],
        "corrections": [{"request": asdict(r), "correction": asdict(c)} for r, c in judge.corrections],
    }


def review_answer(verdict: dict) -> str:
    """The rule verdict as the line `parse_verdict` reads."""
    step = verdict["wrong_step"]
    return "VERDICT: KEEP" if step is None else f"VERDICT: REVISE {step + 1}"


def training_examples(transcripts: dict) -> list[tuple[list[dict], str]]:
    """(prompt messages, answer) pairs for `sft_batch`: every review and every correction, rendered with the
    learned judge's templates exactly as `GeneratingJudge` renders them."""
    from trl_mintrl.judges import JudgeTemplates

    templates = JudgeTemplates(JUDGE_REVIEW_TEMPLATE, JUDGE_CORRECTION_TEMPLATE)

    def message(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    examples = [
        (message(templates.render_review(ReviewRequest(**row["request"]))), review_answer(row["verdict"]))
        for row in transcripts["reviews"]
    ]
    examples += [
        (message(templates.render_correction(CorrectionRequest(**row["request"]))), row["correction"]["text"])
        for row in transcripts["corrections"]
    ]
    return examples


def train_judge(
    examples: list[tuple[list[dict], str]],
    out_dir: str | Path = JUDGE_DIR,
    *,
    epochs: int,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    seed: int = 0,
    log_every: int = 100,
) -> dict:
    """Fine-tune a copy of the warm start on `examples` (next-token loss on the answers, the warm start's optimiser,
    a 50-step warm-up, then cosine decay to 10%), `epochs` passes in a seeded shuffle (`length_batches`); saves model and tokenizer to
    `out_dir`. Returns the steps, seconds and the last 100 steps' mean loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    model.train()
    optimizer = sft_optimizer(model, learning_rate)
    scheduler = warmup_cosine_schedule(optimizer, 50, epochs * -(-len(examples) // batch_size))
    losses, start, step = [], time.perf_counter(), 0
    for _ in range(epochs):
        for batch in length_batches(examples, batch_size, rng):
            losses.append(sft_step(model, optimizer, sft_batch(tokenizer, batch)))
            scheduler.step()
            step += 1
            if log_every and step % log_every == 0:
                recent = sum(losses[-log_every:]) / len(losses[-log_every:])
                print(f"judge step {step}  loss {recent:.4f}  {time.perf_counter() - start:.0f}s", flush=True)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    tail = losses[-100:]
    return {"steps": step, "seconds": time.perf_counter() - start, "final_loss": sum(tail) / len(tail)}


def length_batches(examples: list, batch_size: int, rng: random.Random, pool: int = 16) -> list[list]:
    """One epoch of `examples` in batches of `batch_size`: shuffled, each run of `pool` batches sorted by prompt
    length so that a batch pads little (a review is 200-480 characters), then the batches shuffled."""
    order = list(examples)
    rng.shuffle(order)
    batches = []
    for first in range(0, len(order), batch_size * pool):
        group = sorted(order[first : first + batch_size * pool], key=lambda example: len(example[0][0]["content"]))
        batches += [group[i : i + batch_size] for i in range(0, len(group), batch_size)]
    rng.shuffle(batches)
    return batches


def load_judge(judge_dir: str | Path = JUDGE_DIR):
    """The learned judge as `judge="model"` builds it: `GeneratingJudge.from_pretrained` with its templates."""
    from trl_mintrl.judges import GeneratingJudge

    return GeneratingJudge.from_pretrained(
        str(judge_dir),
        device="cpu",
        review_template=JUDGE_REVIEW_TEMPLATE,
        correction_template=JUDGE_CORRECTION_TEMPLATE,
        max_review_tokens=MAX_REVIEW_TOKENS,
        max_correction_tokens=MAX_CORRECTION_TOKENS,
        temperature=0.0,
    )


def judge_accuracy(judge: Judge, transcripts: dict, batch_size: int = 64) -> dict:
    """`judge`'s answers against the rule judge's on `transcripts` (held out): counts and rates.

    - `revise_precision`: of the judge's REVISE verdicts, the share where the rule revises too; `revise_recall`: of
      the rule's REVISE verdicts, the share the judge revises; `first_wrong_step_accuracy`: of the chunks both revise,
      the share cut at the same step;
    - `false_revise`: P(judge REVISE | rule KEEP); `missed_error`: P(judge KEEP | rule REVISE) (failed verdicts count
      as KEEP, as in training); `wrong_correction`: P(judge's text != rule's | correction answered);
    - `exact_corrections`, `review_parse_failures`, `correction_failures`: shares of all requests.
    """
    reviews = [ReviewRequest(**row["request"]) for row in transcripts["reviews"]]
    truth = [row["verdict"]["wrong_step"] for row in transcripts["reviews"]]
    verdicts = [v for i in range(0, len(reviews), batch_size) for v in judge.review(reviews[i : i + batch_size])]
    corrections = [CorrectionRequest(**row["request"]) for row in transcripts["corrections"]]
    wanted = [row["correction"]["text"] for row in transcripts["corrections"]]
    written = [
        c for i in range(0, len(corrections), batch_size) for c in judge.correct(corrections[i : i + batch_size])
    ]
    said = [None if v.failed else v.wrong_step for v in verdicts]
    both = [(s, t) for s, t in zip(said, truth, strict=True) if s is not None and t is not None]
    judge_revise, rule_revise = sum(s is not None for s in said), sum(t is not None for t in truth)
    rule_keep = len(truth) - rule_revise
    answered = [(c.text, w) for c, w in zip(written, wanted, strict=True) if not c.failed]

    def share(a: int, b: int) -> float | None:
        return a / b if b else None

    return {
        "reviews": len(reviews),
        "rule_revise": rule_revise,
        "judge_revise": judge_revise,
        "corrections": len(corrections),
        "revise_precision": share(len(both), judge_revise),
        "revise_recall": share(len(both), rule_revise),
        "first_wrong_step_accuracy": share(sum(s == t for s, t in both), len(both)),
        "false_revise": share(sum(s is not None and t is None for s, t in zip(said, truth, strict=True)), rule_keep),
        "missed_error": share(sum(s is None and t is not None for s, t in zip(said, truth, strict=True)), rule_revise),
        "wrong_correction": share(sum(text != want for text, want in answered), len(answered)),
        "exact_corrections": share(sum(text == want for text, want in answered), len(corrections)),
        "review_parse_failures": share(sum(v.failed for v in verdicts), len(verdicts)),
        "correction_failures": share(sum(c.failed for c in written), len(written)),
    }
