"""The studies' recorded results (a study's JSON: its settings, baselines and runs), read for reports and by other
studies: where the committed files live (and where a run writes), the runs of one arm, their scores by seed and their
logged metrics, the command and commit that wrote each run (kept per arm as runs are recorded), and the recorded runs
a new study may reuse instead of running the same job again. Task-independent: a run is a dict with at least
`regime`, `label`, `seed` and `final`."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.lib.harness import by_seed, find_record, record_provenance, select

ROOT = Path(__file__).resolve().parents[2]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"  # the committed results: each study's JSON and what it renders from it

final_by_seed = by_seed  # seed -> final score: final_by_seed(runs, "pass@8")


def output_folder(out: Path | None, mode: str) -> Path:
    """Where a study's run writes (created): `out` when given, else the committed results for its full mode and
    `RESULTS/<mode>` for the others."""
    out = out or (RESULTS if mode == "full" else RESULTS / mode)
    out.mkdir(parents=True, exist_ok=True)
    return out


def runs_of(results: dict, regime: str, label: str) -> list[dict]:
    return select(results["runs"], regime=regime, label=label)


def error_of(run: dict) -> tuple[str | None, float]:
    """The run's judge error: (kind, rate), or (None, 0.0) for the exact judge."""
    fired = [(kind, rate) for kind, rate in run.get("judge_errors", {}).items() if rate]
    if len(fired) > 1:
        raise ValueError(f"{run['name']}: more than one kind of judge error {fired}")
    return fired[0] if fired else (None, 0.0)


def runs_with_error(results: dict, label: str, kind: str | None = None, rate: float = 0.0) -> list[dict]:
    """The runs of `label` whose judge made errors of `kind` at `rate` (`error_of`), in order of seed."""
    return sorted(
        (r for r in results["runs"] if r["label"] == label and error_of(r) == (kind, rate)), key=lambda r: r["seed"]
    )


def log_values(run: dict, key: str) -> list[float]:
    """The values of a logged metric over the run's steps (the steps that logged it)."""
    return [e[key] for e in run["logs"] if key in e]


def logged_per_run(runs: list[dict], key: str, reduce=statistics.fmean) -> list[float]:
    """Per run, `reduce` of the metric's logged values (runs that never logged it are left out)."""
    return [reduce(values) for r in runs if (values := log_values(r, key))]


def total_judge_tokens(run: dict, rollouts: int) -> float:
    """Judge tokens over the run, from each step's judge-token share f (judge / all completion tokens), TRL's
    `completions/mean_length` (the policy's tokens only: 1 - f of them) and its rows (`rollouts` per prompt):
    f / (1 - f) x that x rows."""
    rows = run["prompts_per_step"] * rollouts
    return sum(
        e["mintrl/judge_token_frac"] / (1 - e["mintrl/judge_token_frac"]) * e["completions/mean_length"] * rows
        for e in run["logs"]
        if "mintrl/judge_token_frac" in e
    )


def arm_key(run: dict) -> str:
    return f"{run['regime']}:{run['label']}"


def arm_provenance(results: dict, regime: str, label: str) -> dict:
    """The command and commit that wrote the runs of `label` on `regime` (a part may rerun only some of a regime's
    arms); a file from before `arm_provenance`: its regime's, else its top-level provenance."""
    by_arm = results.get("arm_provenance") or {}
    by_regime = results.get("regime_provenance") or {}
    return by_arm.get(f"{regime}:{label}") or by_regime.get(regime) or results["provenance"]


def run_provenance(results: dict, run: dict) -> dict:
    """The command and commit that wrote `run`: its own (a run merged from `benchmarks/studies/reproduce.py` at a fresh
    seed, or any run the harness recorded), else its arm's."""
    return run.get("provenance") or record_provenance(run) or arm_provenance(results, run["regime"], run["label"])


def provenance_text(prov: dict) -> str:
    changed = prov["changed_files_that_matter"]
    differed = f" (files under benchmarks/ or trl_mintrl/ differed: {', '.join(changed)})" if changed else ""
    return f"`{prov['command']}` at commit `{prov['commit'][:12]}`{differed}"


def provenance_lines(results: dict) -> list[str]:
    """Which command and commit wrote each regime's runs (one line per distinct run; a regime whose arms were
    written by several runs names its arms, and the seeds where an arm's runs came from several)."""
    groups: dict[str, list[str]] = {}
    for regime in results["settings"]["plan"]:
        by_text: dict[str, dict[str, list[int]]] = {}
        for run in sorted((r for r in results["runs"] if r["regime"] == regime), key=lambda r: r["seed"]):
            text = provenance_text(run_provenance(results, run))
            by_text.setdefault(text, {}).setdefault(run["label"], []).append(run["seed"])
        all_seeds = {r["seed"] for r in results["runs"] if r["regime"] == regime}
        for text, arms in by_text.items():
            seeds = sorted({seed for arm_seeds in arms.values() for seed in arm_seeds})
            which = "" if set(seeds) == all_seeds else f", seeds {', '.join(map(str, seeds))}"
            groups.setdefault(text, []).append(regime if len(by_text) == 1 else f"{regime} ({', '.join(arms)}{which})")
    return [f"- {'; '.join(regimes)}: {text}" for text, regimes in groups.items()]


def note_arm(results: dict, collection: str, record: dict) -> None:
    """A run's arm (regime and label) was last written by the command and commit that recorded the run (the
    harness's `on_record`)."""
    if collection == "runs":
        prov = record_provenance(record) or results["provenance"]
        results.setdefault("arm_provenance", {})[arm_key(record)] = prov


def split_recorded(jobs: list[dict], recorded: dict | None) -> tuple[list[dict], list[dict], dict]:
    """(jobs to run, `recorded`'s runs of the other jobs, their arms' provenance): a recorded run (of another study's
    file) is used when every field of the job is the run's (the same job: runs are deterministic)."""
    if recorded is None:
        return jobs, [], {}
    to_run, reused, prov = [], [], {}
    for job in jobs:
        match = find_record(job, runs_of(recorded, job["regime"], job["label"]))
        if match is not None:
            reused.append(match)
            prov[arm_key(match)] = arm_provenance(recorded, job["regime"], job["label"])
        else:
            to_run.append(job)
    return to_run, reused, prov
