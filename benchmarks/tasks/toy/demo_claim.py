"""What the committed learning benchmark says about the main demo's arm, read from `learning.json` at run time.

The demo (`examples/mintrl_toy.py`) trains one seed of MInTRL-const and of GRPO; one seed cannot tell them apart. It
ends with `committed_comparison(...)`: the paired difference MInTRL - GRPO over the benchmark's seeds on the matching
regime, with its 95% t-interval and whether it is resolved, and in what the benchmark's arm differs from the demo.
No number in it is written by hand: change the JSON and the text follows.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.lib.records import RESULTS, final_by_seed, run_provenance, runs_of
from benchmarks.lib.stats import format_interval, paired_difference

LEARNING_JSON = RESULTS / "learning.json"
METRICS = ("pass@1", "pass@8")


def load_results(path: Path = LEARNING_JSON) -> dict | None:
    """The committed benchmark results, or None when the file is missing."""
    return json.loads(path.read_text()) if path.is_file() else None


def arm_differences(runs: list[dict], results: dict, demo: dict) -> list[str]:
    """How the benchmark's runs differ from the demo's settings (`demo`: steps, prompts_per_step, final_prompts,
    seed), as phrases; empty when the benchmark ran exactly the demo's arm."""
    settings = results.get("settings", {})
    names = {"steps": "optimizer steps", "prompts_per_step": "prompts per step", "final_prompts": "held-out problems"}
    out = []
    for key, name in names.items():
        values = sorted({r.get(key, settings.get(key)) for r in runs}, key=str)
        if values != [demo[key]]:
            out.append(f"{'/'.join(map(str, values))} {name}, the demo {demo[key]}")
    overrides = sorted({json.dumps(r.get("overrides", {}), sort_keys=True) for r in runs})
    if overrides != ["{}"]:
        out.append(f"config overrides {', '.join(overrides)}, the demo none")
    if demo["seed"] not in {r["seed"] for r in runs}:
        out.append(f"seeds {sorted({r['seed'] for r in runs})} do not include the demo's seed {demo['seed']}")
    return out


def arms_commit(results: dict, regime: str, labels: tuple[str, ...]) -> str:
    """The commit(s) that wrote these arms' runs on `regime` (learning.json runs in parts, and fresh seeds merged
    from reproduce.py: `run_provenance`), 12 digits each."""
    runs = [run for label in labels for run in runs_of(results, regime, label)]
    return ", ".join(sorted({run_provenance(results, run)["commit"][:12] for run in runs}))


def committed_comparison(
    results: dict | None,
    demo: dict,
    *,
    regime: str = "in-band",
    label: str = "mintrl-const",
    baseline: str = "grpo",
    source: str = "benchmarks/results/learning.json",
) -> str:
    """Lines for the demo's end: `label` - `baseline` on `regime` in the committed benchmark `results` (the content
    of learning.json), paired by seed with 95% t-intervals, and the verdict the intervals allow."""
    pointer = f"See the summary tables in docs/benchmarks.md (full tables: {source.removesuffix('.json')}.md)."
    if results is None:
        return f"No committed benchmark results ({source} is missing): nothing to compare with. {pointer}"
    commit = arms_commit(results, regime, (label, baseline))
    runs, base = runs_of(results, regime, label), runs_of(results, regime, baseline)
    if not runs or not base:
        return (
            f"The committed benchmark ({source}, commit {commit}) has no {label} and {baseline} runs on the "
            f"{regime} regime: nothing resolves a difference for this demo's arm. {pointer}"
        )
    differences = arm_differences(runs + base, results, demo)
    arm = (
        "the closest committed benchmark arm, which differs: " + "; ".join(differences)
        if differences
        else f"the same arm as this demo (whose seed {demo['seed']} is one of its seeds)"
    )
    diffs = {m: paired_difference(final_by_seed(runs, m), final_by_seed(base, m)) for m in METRICS}
    seeds = max(d.n for d in diffs.values() if d is not None) if any(diffs.values()) else 0
    cells, better, worse = [], [], []
    for metric, diff in diffs.items():
        if diff is None or diff.low is None:
            cells.append(f"{metric} {format_interval(diff)} (no interval)")
            continue
        state = "resolved" if diff.resolved else "not resolved"
        cells.append(f"{metric} {format_interval(diff)} ({state})")
        if diff.resolved:
            (better if diff.mean > 0 else worse).append(metric)
    if worse:
        verdict = f"{label} is worse than {baseline} on this regime ({', '.join(worse)})."
    elif better:
        verdict = f"{label} beats {baseline} on this regime ({', '.join(better)}), the difference resolved."
    else:
        verdict = f"no difference is resolved: on this regime {label} is not shown to beat {baseline}."
    return "\n".join(
        [
            f"Committed benchmark ({source}, commit {commit}), {regime} regime, {arm}.",
            f"{label} - {baseline} over {seeds} seeds, paired by seed, points with 95% t-interval: "
            f"{', '.join(cells)}; {verdict}",
            pointer,
        ]
    )
