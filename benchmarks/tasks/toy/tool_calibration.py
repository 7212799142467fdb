"""Calibration of the tool task: MInTRL's two preconditions, measured on the warm start before any method.

    python -m benchmarks.tasks.toy.tool_calibration [--design NAME] [--model DIR] [--problems 96] [--samples 64]

Per regime ("in-band": lowercase registers, "reachable": UPPERCASE, the control), on held-out problems (seed 999):
- pass@1 / pass@8 / pass@64 with the tool loop on: `--samples` rollouts per problem at temperature 1 through MInTRL's
  own rollout (`InterventionRollout`, no reviews: what MInTRL's control rollouts and GRPO sample), each with its
  `RegisterEnv` behind `LocalToolEnvironment` (TRL's `parse_response`, TRL's tool-result tokens); a rollout passes
  when `tool_task.solved` (right answer, every register read). Also the share of rollouts that read every register
  (`read_all`), and pass@1 among those (`solved_given_read`: the arithmetic once the values are known);
- `correction_nats`: 8 intervened rollouts per problem through the same rollout with the rule judge (`tool_judge`,
  chunks of 16 tokens, 6 reviews, corrections up to 16 tokens, as a MInTRL run would review them); each
  correction's NLL under the warm start (summed over its tokens, given the prompt and everything before it):
  mean, std, n; the share of intervened rollouts corrected, and their pass@1 (`intervened_pass@1`).

Writes `benchmarks/results/tools_calibration.json` and `.md` with the command and commit
(`benchmarks.lib.provenance`). Each `--design` is kept under its name (a rerun replaces only its own entry), so every
design tried stays in the file with its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.records import RESULTS

from .tool_task import REGIMES, TOOL_FIELDS

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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


def markdown(report: dict) -> str:
    lines = ["# Tool task calibration", "", "Last run: " + report["provenance_line"], "",
             "Warm-start preconditions per design and regime, tool loop on, temperature 1. pass@k and shares in %; "
             "correction NLL in nats (mean ± std, n corrections) under the warm start. MInTRL's in-band preconditions: "
             "pass@8 <= 1%, pass@64 <= 5%, corrections ~7 nats (not beyond ~11). Each design's own command and commit "
             "are in the Designs section.", "",
             "| design | regime | pass@1 | pass@8 | pass@64 | read all | solved given read | correction nats | "
             "of which `[` | corrected | intervened pass@1 | judge tokens |", "|---" * 12 + "|"]  # fmt: skip
    for name, design in report["designs"].items():
        for regime, r in design["regimes"].items():
            cells = [
                f"{100 * r[k]:.2f}" if k in r else "-"
                for k in ("pass@1", "pass@8", "pass@64", "read_all", "solved_given_read")
            ]
            cells.append(f"{r['correction_nats']:.2f} ± {r['correction_nats_std']:.2f} (n={r['corrections']})")
            cells.append(f"{r['first_token_nats']:.2f}")
            cells += [f"{100 * r[k]:.1f}" for k in ("corrected_share", "intervened_pass@1", "judge_token_share")]
            lines.append(f"| {name} | {regime} | " + " | ".join(cells) + " |")
    if report.get("committed"):
        lines += ["", report["committed"]]
    lines += ["", "## Designs", ""]
    for name, design in report["designs"].items():
        note = f"; {design['note']}" if design.get("note") else ""
        lines.append(
            f"- **{name}**: {design['description']}{note} (`{design['command']}` at `{design['commit'][:12]}`)"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..provenance import command_line, provenance
    from .tool_task import DESIGN, DESIGNS
    from .warm_start_tools_build import WARM_START_TOOLS_DIR

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tasks.toy.tool_calibration", description=__doc__)
    parser.add_argument("regimes", nargs="*", default=list(REGIMES))
    parser.add_argument("--design", default=DESIGN, choices=sorted(DESIGNS), help="default: the committed design")
    parser.add_argument(
        "--model",
        default=None,
        help="default: the committed warm start (for the committed design); "
        "another design's: its build (python -m benchmarks.tasks.toy.warm_start_tools_build DIR --design NAME)",
    )
    parser.add_argument("--note", default="", help="recorded with the design (e.g. its build time)")
    parser.add_argument("--problems", type=int, default=96)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--out", default=str(RESULTS / "tools_calibration"))
    args = parser.parse_args(argv)
    if args.model is None and args.design != DESIGN:
        parser.error(f"--design {args.design} needs --model: the committed warm start is design {DESIGN}")
    args.model = args.model or str(WARM_START_TOOLS_DIR)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    regimes = {}
    for regime in args.regimes:
        regimes[regime] = calibrate_tools(model, tokenizer, regime, args.problems, args.samples, design=args.design)
        print(regime, json.dumps(regimes[regime]), flush=True)
    prov = provenance("-m benchmarks.tasks.toy.tool_calibration", sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    report = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {"designs": {}}
    report["designs"][args.design] = {"description": DESIGNS[args.design].description, "model": args.model,
                                      "call_rates": DESIGNS[args.design].call_rates, "note": args.note,
                                      "problems": args.problems, "samples": args.samples, "rollout": ROLLOUT,
                                      **prov, "regimes": regimes}  # fmt: skip
    report["provenance_line"] = command_line(prov).split("; runs taken")[0] + "."
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
