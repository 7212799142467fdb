"""Tables of the toy task's learning runs, read from their records (`run.run_job`'s runs, `run.baseline`'s
calibrations): where each regime's warm start stands against MInTRL's two preconditions, the judge's distance swept
over the in-band family, the held-out scores kept after the intervention phase, whether the trainer's not-absorbed
warning fired, and a logged metric's mean over a run's intervention phase."""

from __future__ import annotations

import statistics

from benchmarks.lib.harness import verdict_cell
from benchmarks.lib.records import final_by_seed, runs_of
from benchmarks.lib.stats import format_interval, format_mean_std, paired_difference

from .task import OFFSETS
from .training import DISTANCE_REGIMES, REGIMES, phase_end_step

CALIBRATION_KEYS = ("pass@1", "pass@8", "pass@64")
BAND_PASS8, BAND_PASS64, BAND_NATS = 0.01, 0.05, 7.0  # in band: outside the inference support, inside training's


def log_mean(run: dict, key: str, intervention_phase: bool = False) -> float | None:
    """A logged metric's mean over the run's steps, or over its intervention phase (None where it never logged it)."""
    until = _interv_steps(run) if intervention_phase else None
    values = [e[key] for e in run["logs"] if key in e and (until is None or e["step"] <= until)]
    return statistics.fmean(values) if values else None


def _interv_steps(run: dict) -> int:
    return run["overrides"].get("intervention_steps", phase_end_step(run["steps"]))


def precondition(base: dict, notation: str = "near") -> str:
    """Whether a regime's warm start meets MInTRL's two preconditions: outside the inference support (pass@8 <= 1%,
    pass@64 <= 5%) and inside the training support (`correction_nats` <= 7 with the `notation` judge)."""
    final, judge = base["final"], base.get("judge", {}).get(notation)
    if judge is None or "pass@64" not in final:
        return "not measured"
    misses = []
    if final["pass@8"] > BAND_PASS8 or final["pass@64"] > BAND_PASS64:
        misses.append("within sampling's reach")
    if not judge["correction_nats"] <= BAND_NATS:
        misses.append("corrections too far")
    return "in band" if not misses else "fails: " + ", ".join(misses)


def calibration_table(results: dict) -> list[str]:
    """Every regime's warm start: pass@k, the judge's distance (`correction_nats`, per notation) and coverage, and
    the precondition verdict with the near judge (the notation of the in-band family)."""
    lines = [
        "Warm start on the held-out problems (pass@k in %, 64 samples); `correction_nats`: mean ± std NLL of the "
        "rule judge's corrections under the warm start (summed over a correction's tokens) on its own rollouts, the "
        "whole completion reviewed; coverage: share of corrected wrong steps inside the reviewed chunks (the regime's "
        f"max_reviews x 16 tokens). In band: pass@8 <= {100 * BAND_PASS8:.0f}%, pass@64 <= {100 * BAND_PASS64:.0f}% "
        f"and near corrections <= {BAND_NATS:.0f} nats.",
        "",
        "| regime | pass@1 | pass@8 | pass@64 | correction_nats, near judge | far judge | corrected rollouts | coverage "
        "| preconditions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for regime in results["settings"]["plan"]:
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        if base is None:
            continue
        final, judge = base["final"], base.get("judge", {})
        cells = [f"{100 * final[k]:.2f}" if k in final else "-" for k in ("pass@1", "pass@8", "pass@64")]
        for notation in ("near", "far"):
            j = judge.get(notation) or (judge.get("far") if notation == "near" and not _has_new_op(regime) else None)
            cells.append(f"{j['correction_nats']:.1f} ± {j['correction_nats_std']:.1f}" if j else "-")
        j = judge.get("near") or judge.get("far")
        cells += [f"{100 * j['corrected_share']:.0f}%", f"{100 * j['coverage']:.0f}%"] if j else ["-", "-"]
        cells.append(precondition(base, "near" if "near" in judge else "far"))
        lines.append(f"| {regime} | " + " | ".join(cells) + " |")
    return lines


def _has_new_op(regime: str) -> bool:
    return bool(REGIMES[regime].new_op) if regime in REGIMES else True


def not_absorbed_warning(run: dict) -> bool | None:
    """Whether the trainer's not-absorbed warning fired in a MInTRL run (None for other methods): from the logged
    `mintrl/corrections_not_absorbed`, or, in records from before it was logged, by replaying the logged judge-token
    NLL of each step through the trainer's own `AbsorptionTracker` with MInTRLConfig's defaults."""
    if not run.get("method", "").startswith("mintrl"):
        return None
    flags = [e["mintrl/corrections_not_absorbed"] for e in run["logs"] if "mintrl/corrections_not_absorbed" in e]
    if flags:
        return any(flags)
    from trl_mintrl.mintrl import MInTRLConfig
    from trl_mintrl.mintrl.absorption import AbsorptionTracker

    defaults = {f.name: f.default for f in MInTRLConfig.__dataclass_fields__.values()}
    tracker = AbsorptionTracker(
        defaults["absorption_window"], defaults["absorption_max_nll"], defaults["absorption_min_fall"]
    )
    for entry in run["logs"]:
        if "mintrl/judge_token_nll" in entry:
            _, warn = tracker.update(entry["step"], entry["mintrl/judge_token_nll"], 1.0)
            if warn:
                return True
    return False


def retention_table(results: dict, regime: str, labels: list[str]) -> list[str]:
    """Held-out scores at the end of the intervention phase, at the end of the run and at the step the validation
    set selected, per arm, each paired against GRPO at the same point (runs that recorded them)."""
    grpo = [r for r in runs_of(results, regime, "grpo") if r.get("phase_end")]
    rows = [(label, [r for r in runs_of(results, regime, label) if r.get("phase_end")]) for label in labels]
    rows = [(label, runs) for label, runs in rows if runs]
    if not rows:
        return []
    step = rows[0][1][0]["phase_end"]["step"]
    lines = [
        "",
        f"Retention: held-out pass@1 / pass@8 at the end of the intervention phase (step {step}), at the end of the "
        "run, and at the step a validation set (other problems) selects among the curve points and the phase end "
        "(steps chosen per seed); differences to GRPO at the same point, paired by seed.",
        "",
        "| method | phase end | end | validation-selected (steps) | phase end - GRPO: pass@1 | pass@8 "
        "| selected - GRPO: pass@1 | pass@8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, runs in rows:
        point = lambda key, k, runs=runs: {r["seed"]: r[key][k] for r in runs}  # noqa: E731
        grpo_point = lambda key, k: {r["seed"]: r[key][k] for r in grpo}  # noqa: E731
        cells = [
            " / ".join(format_mean_std(list(point(key, k).values())) for k in ("pass@1", "pass@8"))
            for key in ("phase_end", "final", "selected")
        ]
        cells[2] += f" ({', '.join(str(r['selected']['step']) for r in runs)})"
        for key in ("phase_end", "selected"):
            for k in ("pass@1", "pass@8"):
                diff = None if label == "grpo" else paired_difference(point(key, k), grpo_point(key, k))
                cells.append(format_interval(diff) if diff else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def distance_points(results: dict) -> list[dict]:
    """The judge's distance sweep: per regime of the in-band family with both arms run, its near `correction_nats`
    and MInTRL-const - GRPO (pass@1 and pass@8, paired by seed)."""
    points = []
    for regime in DISTANCE_REGIMES:
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        grpo, mintrl = runs_of(results, regime, "grpo"), runs_of(results, regime, "mintrl-const")
        if base is None or "near" not in base.get("judge", {}) or not grpo or not mintrl:
            continue
        points.append(
            {
                "regime": regime,
                "k": OFFSETS[REGIMES[regime].new_op],
                "nats": base["judge"]["near"]["correction_nats"],
                "base": base,
                "grpo": [r["final"]["pass@1"] for r in grpo],
                "mintrl": [r["final"]["pass@1"] for r in mintrl],
                "diff1": paired_difference(final_by_seed(mintrl), final_by_seed(grpo)),
                "diff8": paired_difference(final_by_seed(mintrl, "pass@8"), final_by_seed(grpo, "pass@8")),
            }
        )
    return sorted(points, key=lambda p: p["nats"])


def distance_table(results: dict) -> list[str]:
    points = distance_points(results)
    if not points:
        return []
    lines = [
        "",
        "## The judge's distance (MInTRL-const vs GRPO on the in-band design, the rule `a+b+k` moved)",
        "",
        "| regime | k | correction_nats | warm start pass@8 / pass@64 | preconditions | seeds | GRPO pass@1 "
        "| MInTRL-const pass@1 | pass@1 difference [95% CI] | pass@8 difference [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        final = {k: f"{100 * v:.2f}" for k, v in p["base"]["final"].items()}
        lines.append(
            f"| {p['regime']} | {p['k']:+d} | {p['nats']:.1f} | {final.get('pass@8', '-')} / "
            f"{final.get('pass@64', '-')} | {precondition(p['base'])} | {p['diff1'].n} | {format_mean_std(p['grpo'])} "
            f"| {format_mean_std(p['mintrl'])} | {format_interval(p['diff1'])} | {format_interval(p['diff8'])} |"
        )
    return lines


def calibration_text(base: dict) -> str:
    """The warm start's pass@k on a regime's held-out problems, and in familiar notation where it has a new
    operator."""
    keys = [*CALIBRATION_KEYS, *(k for k in base["final"] if k.startswith("pass@") and k not in CALIBRATION_KEYS)]
    sampled = ", ".join(
        f"{k} {100 * base['final'][k]:.1f}" if k in base["final"] else f"{k} not recorded" for k in keys
    )
    text = f"warm start {sampled}"
    if "familiar" in base:
        text += (
            f"; the same problems in familiar notation (`a#b` as `a+(b+2)`, `a@b` as `a-(7-b)`): pass@1 "
            f"{100 * base['familiar']['pass@1']:.1f}, pass@8 {100 * base['familiar']['pass@8']:.1f}"
        )
    return text


def mean_curve(runs: list[dict], base: dict | None) -> str:
    """`step: pass@1 / pass@8` in % at every curve point all runs share, from step 0 (the warm start's `curve0`)."""
    steps = sorted(set.intersection(*(set(r["curve"]) for r in runs)), key=int)
    start = base.get("curve0") if base else None
    points = [] if start is None else [f"0: {100 * start['pass@1']:.1f} / {100 * start['pass@8']:.1f}"]
    for step in steps:
        p1, p8 = (statistics.fmean(r["curve"][step][k] for r in runs) for k in ("pass@1", "pass@8"))
        points.append(f"{step}: {100 * p1:.1f} / {100 * p8:.1f}")
    return ", ".join(points)


def regime_section(results: dict, regime: str, labels: list[str]) -> list[str]:
    """A regime's section of the learning report: its calibration, GRPO's curve, each arm's scores paired against
    GRPO with its judge measures, and what the arms kept after the intervention phase (`retention_table`)."""
    base = next((b for b in results["baselines"] if b["regime"] == regime), None)
    grpo = runs_of(results, regime, "grpo")
    lines = ["", f"## Regime: {regime}", ""]
    if base is not None:
        lines += [f"Calibration: {calibration_text(base)}.", ""]
    peaks = [[p["pass@8"] for p in r["curve"].values() if "pass@8" in p] for r in grpo]
    if any(peaks):  # records of the previous version have pass@1 curves only
        text = ", ".join(f"{100 * max(p):.1f}" if p else "-" for p in peaks)
        lines += [f"GRPO's highest held-out pass@8 on the curve set over the run, per seed: {text}.", ""]
        lines += [
            f"GRPO's curve (curve set, mean over seeds, pass@1 / pass@8 by step): {mean_curve(grpo, base)}.",
            "",
        ]
    lines += [
        "| method | seeds | pass@1 | pass@8 | pass@1 - GRPO [95% CI] | resolved | pass@8 - GRPO [95% CI] "
        "| judge-token share | reward interv. - control | judge-token NLL | not-absorbed warning | train s/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        runs = runs_of(results, regime, label)
        if not runs:
            lines.append(f"| {label} | 0 | (not run yet) |||||||||")
            continue
        lines.append(arm_row(label, runs, grpo))
    lines += retention_table(results, regime, labels)
    return lines


def arm_row(label: str, runs: list[dict], grpo: list[dict]) -> str:
    """An arm's row of a regime's table: its scores, their differences to GRPO paired by seed, its judge-token share,
    reward gap and judge-token NLL over the intervention phase, the not-absorbed warning and its training time."""
    diff1 = paired_difference(final_by_seed(runs), final_by_seed(grpo)) if label != "grpo" else None
    diff8 = paired_difference(final_by_seed(runs, "pass@8"), final_by_seed(grpo, "pass@8"))
    cells = []
    for key in ("mintrl/judge_token_frac", "mintrl/reward_gap"):
        values = [v for r in runs if (v := log_mean(r, key, intervention_phase=True)) is not None]
        cells.append(format_mean_std(values))
    nll = [v for r in runs if (v := log_mean(r, "mintrl/judge_token_nll", True)) is not None]
    cells.append(f"{statistics.fmean(nll):.2f}" if nll else "-")
    warned = [w for r in runs if (w := not_absorbed_warning(r)) is not None]
    cells.append(f"{sum(warned)} of {len(warned)} seeds" if warned else "-")
    return (
        f"| {label} | {len(runs)} | {format_mean_std([r['final']['pass@1'] for r in runs])} "
        f"| {format_mean_std([r['final']['pass@8'] for r in runs])} | {format_interval(diff1)} "
        f"| {verdict_cell(diff1)} | {format_interval(diff8) if label != 'grpo' else '-'} "
        f"| {' | '.join(cells)} "
        f"| {statistics.fmean(r['train_seconds'] for r in runs):.0f} |"
    )


def warm_start_line(results: dict, regimes: list[str]) -> list[str]:
    """The summary block's line on the warm start: per regime its pass@8, pass@64, the judge's correction NLL and
    the precondition verdict (regimes calibrated with pass@64)."""
    calibrations = []
    for regime in regimes:
        base = next((b for b in results["baselines"] if b["regime"] == regime), None)
        if base is not None and "pass@64" in base["final"]:
            judge = base.get("judge", {})
            j = judge.get("near") or judge.get("far")
            nats = f", corrections {j['correction_nats']:.1f} nats" if j else ""
            calibrations.append(
                f"{regime} pass@8 {100 * base['final']['pass@8']:.1f}%, pass@64 {100 * base['final']['pass@64']:.1f}%"
                f"{nats} ({precondition(base, 'near' if 'near' in judge else 'far')})"
            )
    return ["", "Warm start: " + "; ".join(calibrations) + "."] if calibrations else []


def distance_line(results: dict) -> list[str]:
    """The summary block's line on the judge's distance: MInTRL-const - GRPO at each regime's correction NLL."""
    points = distance_points(results)
    if not points:
        return []
    return [
        "",
        "Judge's distance (MInTRL-const - GRPO, pass@1, by the corrections' NLL under the warm start): "
        + "; ".join(f"{p['nats']:.1f} nats {format_interval(p['diff1'])}" for p in points)
        + ".",
    ]
