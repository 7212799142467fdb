"""Rerun a README headline at seeds it was never measured on, and say whether the fresh result agrees.

    python -m benchmarks.studies.reproduce in-band                  # the in-band arms at fresh seeds (5-9; ~25 min, 1 worker)
    python -m benchmarks.studies.reproduce in-band --seeds 10 11    # other fresh seeds (added to the same file)
    .venv-vllm/bin/python -m benchmarks.studies.reproduce async     # the asynchronous speedup, fresh rounds (~20 min)
    python -m benchmarks.studies.reproduce --replot                 # the report from reproduce.json, no run
    python -m benchmarks.studies.reproduce --merge                  # add the fresh runs to learning.json as more seeds

A headline is a paired difference over seeds (MInTRL-const - GRPO, ...) from `learning.json`, measured on the seeds
its regime was designed on. This script runs the headline's arms with exactly the recorded jobs' settings
(`benchmarks.tasks.toy.arms.main_job` on `learning.json`'s settings, only the seeds differ) at fresh seeds, and prints, per
difference, the recorded interval, the fresh one, and the pooled one over every seed run (what the README quotes).
The two agree unless Welch's two-sample test rejects equal means at 5% (the 95% interval of fresh - recorded
excludes 0); any disagreement makes the exit status 1. `reproduce.json` holds the command, the commit and one record
per fresh run (the same records as learning.json's), rewritten after every run; `reproduce.md` is rendered from it.

`async` reruns `benchmarks/studies/cost_async.py`'s headline pairs (AsyncMInTRLTrainer at max_staleness=2 over
MInTRLTrainer, and TRL's pair for reference) with `cost_async.json`'s settings, in fresh rounds on this machine, in
the vLLM environment, and records the machine's conditions beside them (CPU, usable cores, load before and during):
a speedup is a property of the machine it was measured on. The check is the same Welch test on the per-round
ratios; every rerun is kept (`async_reruns`).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from benchmarks.lib.provenance import MachineWatch, conditions_text, provenance
from benchmarks.lib.records import RESULTS, ROOT, final_by_seed, runs_of
from benchmarks.lib.stats import (
    Interval,
    format_interval,
    format_ratio,
    mean_interval,
    paired_difference,
    t_quantile_975,
)
from benchmarks.tasks.toy.arms import LABELS, main_job
from benchmarks.tasks.toy.run import execute, run_job

JSON_NAME = "reproduce.json"
# headline -> the regime and the arms it reruns, and the differences it checks (arm, baseline)
HEADLINES = {
    "in-band": dict(
        regime="in-band",
        labels=["grpo", "grpo-2x", "mintrl-const", "sort-uniform"],
        differences=[("mintrl-const", "grpo"), ("sort-uniform", "grpo"), ("grpo-2x", "grpo")],
        fresh_seeds=[5, 6, 7, 8, 9],
    ),
}
METRICS = ("pass@1", "pass@8")
ASYNC_PAIRS = ("mintrl_s2", "grpo")  # the README's asynchronous headline, and TRL's pair for reference


def fresh_jobs(recorded: dict, headline: str, seeds: list[int]) -> list[dict]:
    """The headline's jobs at `seeds`, with the recorded runs' settings (steps, prompts, evaluation); refuses seeds
    the recorded benchmark already ran (they are not fresh)."""
    spec = HEADLINES[headline]
    used = sorted(set(seeds) & set(recorded["settings"]["seeds"]))
    if used:
        raise SystemExit(f"--seeds {used}: already run by learning.json (seeds {recorded['settings']['seeds']})")
    settings = recorded["settings"]
    return [
        main_job(settings, spec["regime"], label, *LABELS[label], seed) for seed in seeds for label in spec["labels"]
    ]


def difference_of_means(fresh: Interval, recorded: Interval) -> Interval | None:
    """fresh - recorded with Welch's 95% interval (Welch-Satterthwaite degrees of freedom, rounded down); None when
    either side has fewer than two seeds."""
    if fresh.std is None or recorded.std is None:
        return None
    va, vb = fresh.std**2 / fresh.n, recorded.std**2 / recorded.n
    mean = fresh.mean - recorded.mean
    if va + vb == 0:
        return Interval(mean, 0.0, mean, mean, fresh.n + recorded.n)
    df = (va + vb) ** 2 / (va**2 / (fresh.n - 1) + vb**2 / (recorded.n - 1))
    half = t_quantile_975(max(1, math.floor(df))) * math.sqrt(va + vb)
    return Interval(mean, math.sqrt(va + vb), mean - half, mean + half, fresh.n + recorded.n)


def comparisons(recorded: dict, fresh_runs: list[dict], headline: str) -> list[dict]:
    """Per checked difference and metric: the recorded, fresh and pooled paired intervals, fresh - recorded (Welch),
    and whether they agree."""
    spec = HEADLINES[headline]
    regime = spec["regime"]
    design_seeds = set(recorded["settings"]["seeds"])  # learning.json may hold merged fresh seeds as well
    rows = []
    for arm, base in spec["differences"]:
        old = {
            label: [r for r in runs_of(recorded, regime, label) if r["seed"] in design_seeds] for label in (arm, base)
        }
        new = {
            label: sorted((r for r in fresh_runs if r["label"] == label), key=lambda r: r["seed"])
            for label in (arm, base)
        }
        for metric in METRICS:
            by_seed = {
                side: {label: final_by_seed(runs[label], metric) for label in (arm, base)}
                for side, runs in (("recorded", old), ("fresh", new))
            }
            intervals = {side: paired_difference(d[arm], d[base]) for side, d in by_seed.items()}
            pooled = paired_difference(
                {**by_seed["recorded"][arm], **by_seed["fresh"][arm]},
                {**by_seed["recorded"][base], **by_seed["fresh"][base]},
            )
            gap = None
            if intervals["fresh"] is not None and intervals["recorded"] is not None:
                gap = difference_of_means(intervals["fresh"], intervals["recorded"])
            agree = None if gap is None else not gap.resolved
            rows.append(
                dict(arm=arm, baseline=base, metric=metric, **intervals, pooled=pooled, fresh_minus_recorded=gap,
                     agree=agree)
            )  # fmt: skip
    return rows


def rerun_async(out: Path, rounds: int, argv: list[str]) -> dict:
    """Fresh rounds of `ASYNC_PAIRS`'s arms with the recorded `cost_async.json`'s settings, and the machine's
    conditions while they ran."""
    from benchmarks.tasks.toy import cost_async_arms as cost_async

    recorded = json.loads((out / "cost_async.json").read_text())["settings"]
    arms = [arm for arm in cost_async.ARMS if any(arm in cost_async.PAIRS[pair] for pair in ASYNC_PAIRS)]
    watch = MachineWatch()
    result = cost_async.measure(
        arms, rounds, recorded["warmup"], recorded["steps"], recorded["shape"], recorded["delay_fraction"], out,
        server_processes=recorded.get("server_processes", "multi"),
    )  # fmt: skip
    return {
        "provenance": provenance("-m benchmarks.studies.reproduce", argv),
        "machine": watch.stop(),
        "settings": {**recorded, "rounds": rounds, "pairs": list(ASYNC_PAIRS), "arms": arms},
        "result": result,
    }


def per_round_ratios(runs: list[dict], pair: str) -> list[float]:
    """async / sync steps per second of each round that ran both arms of `pair` (cost_async's pairing)."""
    async_arm, sync_arm = PAIRS_OF_COST_ASYNC[pair]
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["arm"]] = run["steps_per_second"]
    return [r[async_arm] / r[sync_arm] for _, r in sorted(by_round.items()) if async_arm in r and sync_arm in r]


# cost_async.PAIRS, without importing cost_async (torch, TRL) to render a report
PAIRS_OF_COST_ASYNC = {"mintrl_s2": ("mintrl_async_s2", "mintrl_sync"), "grpo": ("grpo_async", "grpo_sync")}


# the settings a rerun must share with the recorded run to be compared with it (the shape of a step, the judge's
# delay, the server's processes); the machine's conditions are recorded beside, not required
ASYNC_SETTINGS_COMPARED = ("warmup", "steps", "shape", "delay_fraction", "server_processes")


def comparable(rerun: dict, recorded: dict) -> bool:
    """Whether `rerun` ran the recorded `cost_async.json`'s settings (`ASYNC_SETTINGS_COMPARED`; a file from before
    `server_processes` was recorded ran the multi-process server)."""

    def setting(settings: dict, key: str):
        return settings.get(key, "multi") if key == "server_processes" else settings.get(key)

    return all(setting(rerun["settings"], k) == setting(recorded["settings"], k) for k in ASYNC_SETTINGS_COMPARED)


def async_comparisons(recorded: dict, reruns: list[dict]) -> list[dict]:
    """Per pair: the recorded ratio interval, the fresh one (every comparable rerun's rounds), fresh - recorded
    (Welch), and the pooled interval over every round run with those settings."""
    rows = []
    reruns = [rerun for rerun in reruns if comparable(rerun, recorded)]
    for pair in ASYNC_PAIRS:
        old = per_round_ratios(recorded["result"]["runs"], pair)
        fresh = [ratio for rerun in reruns for ratio in per_round_ratios(rerun["result"]["runs"], pair)]
        if not old or not fresh:
            continue
        recorded_i, fresh_i = mean_interval(old), mean_interval(fresh)
        gap = difference_of_means(fresh_i, recorded_i)
        rows.append(
            dict(pair=pair, recorded=recorded_i, fresh=fresh_i, fresh_minus_recorded=gap,
                 agree=None if gap is None else not gap.resolved, pooled=mean_interval(old + fresh))
        )  # fmt: skip
    return rows


def async_report(results: dict, out: Path) -> list[str]:
    reruns = results.get("async_reruns", [])
    recorded_path = out / "cost_async.json"
    if not reruns or not recorded_path.is_file():
        return []
    recorded = json.loads(recorded_path.read_text())
    lines = [
        "",
        "## async (benchmarks/studies/cost_async.py's headline pairs): optimizer steps per second, async / sync",
        "",
        f"Recorded: `{recorded['provenance']['command']}` at `{recorded['provenance']['commit'][:12]}`, "
        f"{len(per_round_ratios(recorded['result']['runs'], 'mintrl_s2'))} rounds; "
        f"{conditions_text(recorded.get('machine'))}.",
        "",
    ]
    for rerun in reruns:
        prov = rerun["provenance"]
        other = "" if comparable(rerun, recorded) else " (other settings than the recorded run's: not compared)"
        lines.append(
            f"- Rerun `{prov['command']}` at `{prov['commit'][:12]}`{other}: {rerun['settings']['rounds']} rounds, "
            f"server {rerun['settings'].get('server_processes', 'multi')}-process; "
            f"{conditions_text(rerun['machine'])}; per-round ratios "
            + "; ".join(
                f"{pair} " + ", ".join(f"{r:.2f}" for r in per_round_ratios(rerun["result"]["runs"], pair))
                for pair in ASYNC_PAIRS
            )
        )
    lines += [
        "",
        "| pair | recorded | fresh | fresh - recorded | verdict | all rounds | pooled |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in async_comparisons(recorded, reruns):
        verdict = {None: "-", True: "agree", False: "**disagree**"}[row["agree"]]
        lines.append(
            f"| {row['pair']} | {format_ratio(row['recorded'])} | {format_ratio(row['fresh'])} | "
            f"{format_interval(row['fresh_minus_recorded'], 1, 2)} | {verdict} | {row['pooled'].n} | "
            f"{format_ratio(row['pooled'])} |"
        )
    return lines


def report(results: dict, recorded: dict, out: Path) -> str:
    """reproduce.md: per headline, the fresh runs' provenance and the comparison table."""
    commands = {}  # each invocation that wrote runs, once
    for r in results["runs"]:
        prov = r["provenance"]
        changed = prov["changed_files_that_matter"]
        text = f"`{prov['command']}` at commit `{prov['commit'][:12]}`" + (
            f" (changed files: {', '.join(changed)})" if changed else ""
        )
        commands.setdefault(text, []).append(r["name"])
    lines = [
        "# Reproduction of the README's headlines (written by benchmarks/studies/reproduce.py from reproduce.json; do not edit)",
        "",
        "Recorded runs: `benchmarks/results/learning.json`. Differences in points, paired by seed, with 95% "
        "t-intervals; fresh - recorded with Welch's 95% interval; **disagree** when that interval excludes 0.",
        "",
        "Fresh runs written by:",
        *(f"- {text}: {len(names)} runs" for text, names in commands.items()),
    ]
    for headline, spec in HEADLINES.items():
        runs = [r for r in results["runs"] if r["headline"] == headline]
        if not runs:
            continue
        seeds = sorted({r["seed"] for r in runs})
        lines += [
            "",
            f"## {headline} ({spec['regime']} regime): fresh seeds {', '.join(map(str, seeds))}",
            "",
            "| difference | metric | recorded seeds | recorded | fresh seeds | fresh | fresh - recorded | verdict "
            "| all seeds | pooled (every seed run) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in comparisons(recorded, runs, headline):
            verdict = {None: "-", True: "agree", False: "**disagree**"}[row["agree"]]
            n = lambda interval: interval.n if interval is not None else 0  # noqa: E731
            lines.append(
                f"| {row['arm']} - {row['baseline']} | {row['metric']} | {n(row['recorded'])} "
                f"| {format_interval(row['recorded'])} | {n(row['fresh'])} | {format_interval(row['fresh'])} "
                f"| {format_interval(row['fresh_minus_recorded'])} | {verdict} | {n(row['pooled'])} "
                f"| {format_interval(row['pooled'])} |"
            )
        lines += ["", "Per fresh run (final held-out pass@1 / pass@8, %; train seconds):", ""]
        for r in sorted(runs, key=lambda r: (r["label"], r["seed"])):
            lines.append(
                f"- {r['name']}: {100 * r['final']['pass@1']:.2f} / {100 * r['final']['pass@8']:.2f}; "
                f"{r['train_seconds']:.0f} s"
            )
    lines += async_report(results, out)
    return "\n".join(lines) + "\n"


def merge_into_learning(out: Path) -> int:
    """Add reproduce.json's fresh runs to learning.json as more seeds of their arms (a run of the same regime,
    label and seed is replaced; each keeps its own provenance) and re-render learning.md: every table, the README's
    and the demos' closing lines then quote every seed run, not the design seeds alone. Returns how many."""
    path = out / "learning.json"
    results = json.loads(path.read_text())
    fresh = json.loads((out / JSON_NAME).read_text())["runs"]
    keys = {(r["regime"], r["label"], r["seed"]) for r in fresh}
    results["runs"] = [r for r in results["runs"] if (r["regime"], r["label"], r["seed"]) not in keys] + fresh
    path.write_text(json.dumps(results, indent=1))
    replot = [sys.executable, "-m", "benchmarks.studies.learning", "--replot", str(path.resolve())]
    subprocess.run(replot, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)  # the learning study's own rendering
    return len(fresh)


def all_agree(results: dict, recorded: dict, out: Path) -> bool:
    rows = [
        row for h in HEADLINES for row in comparisons(recorded, [r for r in results["runs"] if r["headline"] == h], h)
    ]
    if results.get("async_reruns"):
        rows += async_comparisons(json.loads((out / "cost_async.json").read_text()), results["async_reruns"])
    return all(row["agree"] is not False for row in rows)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("headline", nargs="?", choices=[*sorted(HEADLINES), "async"], help="the headline to rerun")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="fresh seeds (default: the headline's)")
    parser.add_argument("--rounds", type=int, default=3, help="async: fresh rounds of the paired arms")
    parser.add_argument("--workers", type=int, default=1, help="parallel runs (0: inline)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of learning.json and reproduce.json")
    parser.add_argument("--replot", action="store_true", help="only render reproduce.md from reproduce.json")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add reproduce.json's fresh runs to learning.json as more seeds and re-render learning.md",
    )
    args = parser.parse_args(argv)
    recorded = json.loads((args.out / "learning.json").read_text())
    path = args.out / JSON_NAME
    previous = json.loads(path.read_text()) if path.is_file() else None

    def render(results: dict, out: Path, plots: bool = True) -> str:
        text = report(results, recorded, out)
        (out / "reproduce.md").write_text(text)
        return text

    if args.merge:
        if previous is None:
            raise SystemExit(f"--merge: no {path}")
        print(f"added {merge_into_learning(args.out)} runs to {args.out / 'learning.json'}")
        return
    if args.replot:
        if previous is None:
            raise SystemExit(f"--replot: no {path}")
        print(render(previous, args.out))
        sys.exit(0 if all_agree(previous, recorded, args.out) else 1)
    if args.headline is None:
        parser.error("name a headline to rerun (or --replot)")
    prov = provenance("-m benchmarks.studies.reproduce", argv)
    if args.headline == "async":
        results = previous or {"provenance": prov, "baselines": [], "runs": []}
        results.setdefault("async_reruns", []).append(rerun_async(args.out, args.rounds, argv))
        path.write_text(json.dumps(results, indent=1))
        print(render(results, args.out))
        sys.exit(0 if all_agree(results, recorded, args.out) else 1)
    seeds = args.seeds or HEADLINES[args.headline]["fresh_seeds"]
    # each run records the command and commit that wrote it: the file gathers runs of several invocations
    jobs = [
        {**job, "headline": args.headline, "provenance": prov} for job in fresh_jobs(recorded, args.headline, seeds)
    ]
    results = {"provenance": prov, "baselines": [], "runs": []}
    if previous is not None:  # keep the other seeds', headlines' and async runs; a rerun seed replaces its record
        names = {job["name"] for job in jobs}
        results["runs"] = [r for r in previous["runs"] if r["name"] not in names]
        results["async_reruns"] = previous.get("async_reruns", [])
    execute(results, args.out, JSON_NAME, render, [], run_job, jobs, args.workers)
    sys.exit(0 if all_agree(results, recorded, args.out) else 1)


if __name__ == "__main__":
    main()
