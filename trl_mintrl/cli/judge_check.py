"""`trl-mintrl judge-check {mintrl,mintrl-sort} --config RECIPE.yaml [--field value ...] [--prompts N]`: try a
recipe's judge on a few of the run's own rollouts before training on it.

A judge whose reviews fail costs nothing visible: a failed review counts as KEEP, so the run quietly trains as GRPO
with a control baseline. This command builds the trainer `trl-mintrl train` would build (same recipe, checks, model,
data and judge: `train.build_trainer`), rolls out the groups of the first N train prompts once through the trainer's
own rollout (`MInTRLTrainer.rollout_groups`, as its first training batch would), and prints what the judge did: the
counts the trainer logs, a few of its reviews, and a verdict worded by the trainer's own `JudgeFailureWarning`. No
reward, optimizer step or checkpoint. Exit status 1 when more than half of the reviews failed or none was asked.

`--reference_judge DOTTED.FACTORY` measures the judge against another one (a rule judge, a stronger model): every
chunk the recipe's judge reviewed is also put to the reference (the same `ReviewRequest` objects, one reference call
per review round of the rollout, after the rollout so that the reference changes nothing in it), and the report adds
REVISE precision and recall against the reference, agreement on the first wrong step, and the checked judge's
failures. `--json PATH` writes the report's numbers (and every compared review) for a benchmark to record.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

from ..judges.base import (
    Correction,
    CorrectionRequest,
    Judge,
    ReviewRequest,
    TransportStatus,
    Verdict,
    VoteTally,
    tally_votes,
)
from ..rewards.math import writes_final_answer
from .judge_agreement import agreement_lines, build_reference_judge, compare_with_reference, reference_verdicts
from .recipe import JUDGED, RecipeError

DEFAULT_PROMPTS = 4
SHOWN_REVIEWS = 3  # reviews printed in full
SHOWN_CHARS = 160  # of each text in them

USAGE = f"""usage: trl-mintrl judge-check {{{",".join(JUDGED)}}} --config RECIPE.yaml [--FIELD VALUE ...] [--prompts N]
       [--reference_judge DOTTED.FACTORY] [--json PATH]

Build what `trl-mintrl train METHOD --config RECIPE.yaml` would build, roll out the first N train prompts once
(each with the recipe's num_intervened_generations reviewed rollouts beside its controls), and report the judge's
REVISE rate, failed reviews and corrections and judge-token share, with a few of its reviews. Nothing is trained or
saved. Exit status 1 when more than half of the reviews failed or no review was asked.

options:
  --prompts N            train prompts to roll out (default {DEFAULT_PROMPTS})
  --reference_judge DOTTED.FACTORY
                         a zero-argument factory returning a trl_mintrl.judges.Judge (like the recipe field
                         judge_function): every chunk the recipe's judge reviewed is also put to it, and the report
                         adds REVISE precision and recall against it, agreement on the first wrong step and the
                         checked judge's failures
  --json PATH            also write the report's numbers (and, with --reference_judge, every compared review) as JSON
  --config, --FIELD VALUE
                         as for `trl-mintrl train` (`trl-mintrl train METHOD --help` lists the fields)

examples:
  trl-mintrl judge-check mintrl --config recipes/cpu/mintrl.yaml --prompts 2
  trl-mintrl judge-check mintrl --config self-judge.yaml --judge self --prompts 8 \\
      --reference_judge benchmarks.tasks.real.judge.rule_judge --json judge_check.json
  (a recipe with judge_function set checks that factory: judge_function cannot be unset by a flag, so the self
  judge needs a recipe without it)"""


@dataclass
class CheckFlags:
    """judge-check's own flags: the train prompts to roll out, the reference judge's factory (its dotted path and
    the judge it built) and where to write the JSON report."""

    prompts: int = DEFAULT_PROMPTS
    reference_path: str | None = None
    reference: Judge | None = None
    json_path: str | None = None


def split_check_flags(argv: list[str]) -> tuple[CheckFlags, list[str]]:
    """judge-check's flags (the reference judge not built yet) and the rest, which is `trl-mintrl train`'s command
    line."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--reference_judge", default=None)
    parser.add_argument("--json", default=None)
    known, rest = parser.parse_known_args(argv)
    if not known.prompts.isdigit() or int(known.prompts) < 1:
        raise RecipeError(f"--prompts {known.prompts}: give a positive number of train prompts to roll out.")
    if known.json is not None and (not known.json or os.path.isdir(known.json)):
        raise RecipeError(f"--json {known.json!r}: give the path of a file to write the report to.")
    return CheckFlags(int(known.prompts), known.reference_judge, None, known.json), rest


def command_line(recipe, flags: CheckFlags) -> str:
    """The judge-check command as the JSON report records it: the recipe's command line (secrets masked), then
    judge-check's own flags."""
    own = [f"--prompts {flags.prompts}"]
    own += [f"--reference_judge {flags.reference_path}"] * (flags.reference_path is not None)
    own += [f"--json {flags.json_path}"] * (flags.json_path is not None)
    return " ".join([recipe.command.replace("trl-mintrl train", "trl-mintrl judge-check", 1), *own])


class JudgeRecorder(Judge):
    """A judge answering exactly as `judge` does, keeping every request it answers with its answer."""

    def __init__(self, judge: Judge):
        self.judge = judge
        self.lock = threading.Lock()  # the continuous rollout calls the judge from worker threads
        self.reviews: list[tuple[ReviewRequest, Verdict]] = []  # in answer order
        self.review_rounds: list[list[ReviewRequest]] = []  # each review call's distinct requests (votes share one)
        self.corrections: list[tuple[CorrectionRequest, Correction]] = []

    def __repr__(self) -> str:
        return repr(self.judge)

    @property
    def concurrent_batches(self) -> int:
        return self.judge.concurrent_batches

    @property
    def engine(self):
        """The judge's own generation engine, which the continuous rollout steps (None for judges without one)."""
        return getattr(self.judge, "engine", None)

    def review(self, requests: list[ReviewRequest]) -> list[Verdict]:
        verdicts = self.judge.review(requests)
        with self.lock:
            self.reviews.extend(zip(requests, verdicts, strict=True))
            self.review_rounds.append(list({id(request): request for request in requests}.values()))
        return verdicts

    def correct(self, requests: list[CorrectionRequest]) -> list[Correction]:
        corrections = self.judge.correct(requests)
        with self.lock:
            self.corrections.extend(zip(requests, corrections, strict=True))
        return corrections

    def transport_status(self) -> TransportStatus:
        return self.judge.transport_status()


@dataclass
class ReviewedChunk:
    """One chunk the judge reviewed: its request, its `judge_votes` verdicts, their decision as the rollout takes
    it (`tally_votes`) and, when it was revised, the correction the judge wrote."""

    request: ReviewRequest
    verdicts: list[Verdict]
    decision: VoteTally
    correction: Correction | None = None

    @property
    def rank(self) -> int:
        """The report shows revised chunks first, then failed ones, then kept ones."""
        return 0 if self.decision.wrong_step is not None else 1 if self.decision.usable == 0 else 2


def _continues(correction: CorrectionRequest, review: ReviewRequest) -> bool:
    """`correction` was asked for after a cut in `review`'s chunk: same question, and a prefix that is the
    review's accepted text followed by the start of its chunk."""
    whole = review.prefix + "".join(review.steps)
    same_question = correction.question == review.question
    return same_question and correction.prefix.startswith(review.prefix) and whole.startswith(correction.prefix)


def reviewed_chunks(recorder: JudgeRecorder, min_agree: int) -> list[ReviewedChunk]:
    """The recorded reviews by chunk (a chunk's votes share one request object), the revised ones with their
    corrections."""
    by_request: dict[int, tuple[ReviewRequest, list[Verdict]]] = {}
    for request, verdict in recorder.reviews:
        by_request.setdefault(id(request), (request, []))[1].append(verdict)
    chunks = [
        ReviewedChunk(request, verdicts, tally_votes(verdicts, len(request.steps), min_agree))
        for request, verdicts in by_request.values()
    ]
    unclaimed = list(recorder.corrections)
    for chunk in chunks:
        if chunk.decision.wrong_step is not None:
            pair = next((pair for pair in unclaimed if _continues(pair[0], chunk.request)), None)
            if pair is not None:
                unclaimed.remove(pair)
                chunk.correction = pair[1]
    return chunks


class _Messages(logging.Handler):
    """Keeps the messages logged while it is attached."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def trainer_failure_warning(args, rollout, measured) -> str | None:
    """What the trainer's `JudgeFailureWarning` would log after this batch (None: nothing), fed as the trainer's
    schedule feeds it: the check names the fields to change in the trainer's words, and by its rule."""
    from ..mintrl.judge_watch import JudgeFailureWarning

    logger = logging.getLogger(JudgeFailureWarning.__module__)
    captured, propagate = _Messages(), logger.propagate
    logger.addHandler(captured)
    logger.propagate = False  # printed once, in the report
    try:
        JudgeFailureWarning(args).update(
            measured.reviews * args.judge_votes,
            measured.judge_parse_failures,
            measured.judge_transport_failures,
            rollout.judge_last_error,
        )
    finally:
        logger.removeHandler(captured)
        logger.propagate = propagate
    return captured.messages[0] if captured.messages else None


def _shown(text: str) -> str:
    return repr(text[:SHOWN_CHARS]) + ("..." if len(text) > SHOWN_CHARS else "")


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.2f}" if whole else "n/a"


def chunk_lines(number: int, chunk: ReviewedChunk) -> list[str]:
    """A reviewed chunk as the report shows it: question, chunk, verdict, correction."""
    steps, decision = chunk.request.steps, chunk.decision
    votes = len(chunk.verdicts)
    tally = f" ({decision.usable} of {votes} votes usable)" if votes > 1 else ""
    if decision.wrong_step is not None:
        verdict = f"REVISE at step {decision.wrong_step + 1} of {len(steps)}: {_shown(steps[decision.wrong_step])}"
    elif decision.usable == 0:
        verdict = "FAILED: no usable answer, counted as KEEP"
    else:
        verdict = "KEEP"
    lines = [
        f"  [{number}] question    {_shown(chunk.request.question)}",
        f"      chunk       {_shown(''.join(steps))} ({len(steps)} step{'s' * (len(steps) > 1)}, after "
        f"{len(chunk.request.prefix)} accepted characters)",
        f"      verdict     {verdict}{tally}",
    ]
    if decision.wrong_step is not None and chunk.correction is not None:
        correction = chunk.correction
        shown = "FAILED: no usable answer, the chunk is kept" if correction.failed else _shown(correction.text)
        lines.append(f"      correction  {shown}")
    return lines


def check_judge(
    recipe, prompts: int, reference: Judge | None = None, json_path: str | None = None, command: str | None = None
) -> int:
    """Build the recipe's trainer, roll out the groups of its first `prompts` train prompts, print the report (with
    `reference`: the judge's reviews against that judge's) and write its numbers to `json_path`; returns the exit
    status (1: the judge is not usable)."""
    args = recipe.training_args
    if args.intervention_steps == 0 or args.num_intervened_generations == 0:
        raise RecipeError(
            f"intervention_steps={args.intervention_steps}, num_intervened_generations="
            f"{args.num_intervened_generations}: this run never calls its judge, so there is nothing to check. Set "
            "both above 0."
        )
    recorder, rollout, measured, seconds = roll_out(recipe, prompts)
    chunks = reviewed_chunks(recorder, args.judge_min_agree)
    numbers = {**review_counts(recorder, chunks, measured), **seconds}
    agreement = None
    if reference is not None:  # after the rollout: the reference's answers change nothing in it
        answers, error = reference_verdicts(reference, recorder.review_rounds)
        agreement = compare_with_reference(chunks, answers, repr(reference), error)
    print(
        f"judge-check: {prompts} prompt{'s' * (prompts > 1)} x {args.num_intervened_generations} intervened "
        f"rollouts (beside {args.num_control_generations} controls each), judge {recorder!r}"
    )
    print("\n".join(count_lines(numbers, args.judge_share_warning, args.revised_length_warning,
                                 args.end_at_judge_answer)))  # fmt: skip
    if agreement is not None:
        print("\n".join(agreement_lines(agreement)))
    shown = sorted(chunks, key=lambda chunk: chunk.rank)[:SHOWN_REVIEWS]
    if shown:
        print(f"reviews (up to {SHOWN_REVIEWS}, revised first):")
        for number, chunk in enumerate(shown, 1):
            print("\n".join(chunk_lines(number, chunk)))
    status, verdict = judge_verdict(trainer_failure_warning(args, rollout, measured), numbers)
    if json_path is not None:
        settings = ("num_intervened_generations", "num_control_generations", "judge_votes", "judge_min_agree")
        report = {
            "command": command or recipe.command.replace("trl-mintrl train", "trl-mintrl judge-check", 1),
            "method": recipe.method,
            "prompts": prompts,
            "judge": repr(recorder),
            **{name: getattr(args, name) for name in settings},
            **numbers,
            "exit_status": status,
            "verdict": verdict,
            "reference": None if agreement is None else agreement.as_dict(),
        }
        write_json(json_path, report)
    print(verdict)
    return status


def roll_out(recipe, prompts: int):
    """The recipe's trainer built, its judge recorded, the groups of its first `prompts` train prompts rolled out:
    (recorder, rollout, its measures, seconds spent building and rolling out)."""
    import torch

    from ..mintrl.rollout_batch import RolloutMeasures
    from .train import build_trainer

    started = time.perf_counter()
    trainer = build_trainer(recipe)
    built = time.perf_counter()
    dataset = trainer.train_dataset
    if prompts > len(dataset):
        raise RecipeError(f"--prompts {prompts}: the train split has only {len(dataset)} prompts; give at most that.")
    trainer.judge = recorder = JudgeRecorder(trainer.judge)
    rollout = trainer.rollout_groups([dataset[i] for i in range(prompts)])
    seconds = {"build_seconds": built - started, "rollout_seconds": time.perf_counter() - built}
    measured = RolloutMeasures.of(torch.full((rollout.stats.size(0),), torch.nan), rollout)  # no rewards: NaN
    return recorder, rollout, measured, seconds


def review_counts(recorder: JudgeRecorder, chunks: list[ReviewedChunk], measured) -> dict:
    """What the judge did, as the report and its JSON give it: reviews (one per vote), corrections, failures."""
    votes = [tally_votes([verdict], len(chunk.request.steps), 1) for chunk in chunks for verdict in chunk.verdicts]
    usable = sum(vote.usable for vote in votes)
    revise = sum(vote.wrong_step is not None for vote in votes)
    return {
        "reviewed_chunks": len(chunks),
        "reviews_asked": len(votes),
        "usable_reviews": usable,
        "revise_reviews": revise,
        "revise_rate": revise / usable if usable else None,
        "failed_reviews": len(votes) - usable,
        "corrections": len(recorder.corrections),
        "failed_corrections": sum(correction.failed for _, correction in recorder.corrections),
        "judge_parse_failures": measured.judge_parse_failures,
        "judge_transport_failures": measured.judge_transport_failures,
        "judge_token_share": measured.judge_token_share,
        "length_control": measured.length_control,
        "length_revised": measured.length_revised,
        "corrections_with_answer": sum(
            writes_final_answer(correction.text) for _, correction in recorder.corrections if not correction.failed
        ),
    }


def count_lines(
    n: dict,
    judge_share_warning: float | None = None,
    revised_length_warning: float | None = None,
    end_at_judge_answer: bool = False,
) -> list[str]:
    """The report's lines on what the judge did; with `judge_share_warning` and `revised_length_warning`, whether the
    share and the revised rollouts' length against the controls' are above them; `end_at_judge_answer`: whether a
    correction that writes the final answer ends its rollout."""
    share = n["judge_token_share"]
    above = judge_share_warning is not None and share > judge_share_warning
    return [
        f"  reviews asked        {n['reviews_asked']}",
        f"  REVISE rate          {_share(n['revise_reviews'], n['usable_reviews'])} ({n['revise_reviews']} REVISE of "
        f"{n['usable_reviews']} usable reviews)",
        f"  failed reviews       {n['failed_reviews']} of {n['reviews_asked']} (each counts as KEEP)",
        f"  failed corrections   {n['failed_corrections']} of {n['corrections']} (each keeps its chunk)",
        f"  these failures       {n['judge_parse_failures']:.0f} unusable answers (mintrl/judge_parse_failures), "
        f"{n['judge_transport_failures']:.0f} unanswered requests (mintrl/judge_transport_failures)",
        f"  judge-token share    {share:.3f} (judge tokens / completion tokens, controls included: "
        "mintrl/judge_token_frac; the paper's corrections are 0.02-0.04)",
        *(
            [
                f"                       above judge_share_warning={judge_share_warning}: training warns when two "
                "intervention steps in a row are; judge_token_target=0.03 reviews only a share of the intervened slots"
            ]
            * above
        ),
        *length_lines(n, revised_length_warning),
        f"  answer in correction {n['corrections_with_answer']} of {n['corrections']} corrections write a final answer "
        "(\\boxed{}, '#### N', 'the answer is'): "
        + (
            "end_at_judge_answer ends the rollout there"
            if end_at_judge_answer
            else "the reward reads it, so what the policy writes after it goes unchecked (end_at_judge_answer=True "
            "ends the rollout there)"
        ),
    ]


def length_lines(n: dict, revised_length_warning: float | None) -> list[str]:
    """The revised rollouts' length against the controls' (every token): a correction that adds the steps the policy
    left out, rather than replacing a wrong one, makes a revised rollout longer than the policy writes."""
    control, revised = n["length_control"], n["length_revised"]
    if revised is None:
        return ["  revised length       no rollout revised"]
    ratio = revised / control if control else float("inf")
    lines = [f"  revised length       {revised:.1f} tokens against the controls' {control:.1f} ({ratio:.2f}x, every "
             "token counted; training logs mintrl/length_control, and mintrl/length_intervened over every intervened "
             "rollout, revised or not)"]  # fmt: skip
    if revised_length_warning is not None and ratio >= revised_length_warning:
        lines.append(
            f"                       at or above revised_length_warning={revised_length_warning}: the corrections add "
            "steps the policy left out; training warns when two intervention steps that revise are (and score above "
            "the controls); a warm-up on whole solutions makes a correction replace a step instead"
        )
    return lines


def judge_verdict(warning: str | None, n: dict) -> tuple[int, str]:
    """The exit status and the report's last line: the trainer's failure warning, no review at all, or usable."""
    if warning is not None:
        return 1, f"judge-check: NOT USABLE. {warning}"
    if not n["reviews_asked"]:
        return 1, (
            "judge-check: NOT USABLE. No chunk was reviewed: every intervened rollout ended before writing any text, "
            "so the judge was never asked. Roll out more prompts (--prompts) or check max_completion_length."
        )
    return 0, f"judge-check: usable. {n['usable_reviews']} of {n['reviews_asked']} reviews answered."


def write_json(path: str, report: dict) -> None:
    """`report` as indented JSON at `path` (its folder made if missing)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


def main(argv: list[str] | None = None) -> None:
    from ..input_checks import InputError
    from .recipe import check_environment, parse_recipe

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    try:
        if argv[0] not in JUDGED:
            raise RecipeError(f"judge-check takes a method with a judge, one of {list(JUDGED)} (got {argv[0]!r}).")
        flags, train_argv = split_check_flags(argv)
        recipe = parse_recipe(train_argv)
        check_environment(recipe)
        if flags.reference_path is not None:  # built before any model loads
            flags.reference = build_reference_judge(flags.reference_path, recipe.config_path)
    except ValueError as err:  # RecipeError and the configs' own checks, as `trl-mintrl train` reports them
        sys.exit(f"trl-mintrl judge-check: error: {err}")
    try:
        status = check_judge(recipe, flags.prompts, flags.reference, flags.json_path, command_line(recipe, flags))
    except (RecipeError, InputError) as err:
        sys.exit(f"trl-mintrl judge-check: error: {err}")
    if status:
        sys.exit(status)
