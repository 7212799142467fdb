"""Calibration of the tool task: MInTRL's two preconditions, measured on the warm start before any method.

    python -m benchmarks.studies.tool_calibration [--design NAME] [--model DIR] [--problems 96] [--samples 64]

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
import sys
from pathlib import Path

from benchmarks.lib.provenance import command_line, provenance
from benchmarks.lib.records import RESULTS
from benchmarks.tasks.toy.tool_calibration import ROLLOUT, calibrate_tools
from benchmarks.tasks.toy.tool_task import REGIMES


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

    from benchmarks.tasks.toy.tool_task import DESIGN, DESIGNS
    from benchmarks.tasks.toy.warm_start_tools_build import WARM_START_TOOLS_DIR

    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.tool_calibration", description=__doc__)
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
    prov = provenance("-m benchmarks.studies.tool_calibration", sys.argv[1:] if argv is None else argv)
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
