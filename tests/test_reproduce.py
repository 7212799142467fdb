"""`benchmarks/studies/reproduce.py`: a headline's arms rerun at fresh seeds with exactly the recorded jobs' settings, the
recorded, fresh and pooled intervals side by side, and an exit status of 1 when fresh and recorded disagree."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.lib.records import runs_of
from benchmarks.lib.stats import format_ratio, mean_interval
from benchmarks.studies import reproduce

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def test_fresh_jobs_are_the_recorded_jobs_at_other_seeds():
    """The committed in-band runs' settings, arm by arm: only the seed (and so the name) differs."""
    recorded = json.loads((RESULTS / "learning.json").read_text())
    fresh = reproduce.fresh_jobs(recorded, "in-band", [7])
    assert {job["label"] for job in fresh} == set(reproduce.HEADLINES["in-band"]["labels"])
    for job in fresh:
        [run] = [r for r in runs_of(recorded, "in-band", job["label"]) if r["seed"] == 0]
        differing = {key for key in job if run.get(key) != job[key]}
        assert differing == {"seed", "name"}, (job["label"], differing)
    with pytest.raises(SystemExit, match=r"--seeds \[0\]: already run"):
        reproduce.fresh_jobs(recorded, "in-band", [0, 7])


def test_welch_difference_of_means_by_hand():
    fresh, recorded = mean_interval([1.0, 2.0, 3.0]), mean_interval([5.0, 7.0, 6.0, 6.0])
    gap = reproduce.difference_of_means(fresh, recorded)
    va, vb = 1.0 / 3, (2.0 / 3) / 4  # sample variances over n
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)  # Welch-Satterthwaite: 3.86
    half = 3.182 * math.sqrt(va + vb)  # t_0.975 at floor(df) = 3
    assert math.floor(df) == 3 and gap.mean == pytest.approx(-4.0)
    assert (gap.low, gap.high) == pytest.approx((-4.0 - half, -4.0 + half))
    assert gap.resolved


@pytest.mark.slow
def test_reproduce_reruns_at_fresh_seeds_and_fails_when_they_disagree(copy_learning_smoke):
    """On a smoke-mode learning.json (seeds 0, 1): fresh seeds 2 and 3 of the headline's four arms run with its
    settings and agree (exit 0); a recorded MInTRL gain of +50 points that the fresh seeds do not show makes the
    check fail (exit 1), and the report says so."""
    tmp_path = copy_learning_smoke
    command = [sys.executable, "-m", "benchmarks.studies.reproduce", "in-band", "--seeds", "2", "3", "--workers", "0",
               "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "reproduce.json").read_text())
    labels = set(reproduce.HEADLINES["in-band"]["labels"])
    assert {(r["label"], r["seed"]) for r in saved["runs"]} == {(label, s) for label in labels for s in (2, 3)}
    assert all(
        r["provenance"]["command"].startswith("python -m benchmarks.studies.reproduce in-band") for r in saved["runs"]
    )
    table = (tmp_path / "reproduce.md").read_text()
    assert "| mintrl-const - grpo | pass@1 | 2 |" in table and "| agree |" in table

    # merged into learning.json: every arm then has seeds 0-3, the fresh ones with their own provenance, and the
    # comparison still sets the design seeds (0, 1) against the fresh ones
    merge = [sys.executable, "-m", "benchmarks.studies.reproduce", "--merge", "--out", str(tmp_path)]
    subprocess.run(merge, cwd=ROOT, check=True, capture_output=True, timeout=300)
    merged = json.loads((tmp_path / "learning.json").read_text())
    assert {r["seed"] for r in merged["runs"] if r["label"] == "mintrl-const"} == {0, 1, 2, 3}
    assert "| mintrl-const | 4 |" in (tmp_path / "learning.md").read_text()
    # the fresh runs' provenance line
    assert "benchmarks.studies.reproduce in-band" in (tmp_path / "learning.md").read_text()
    replot = [sys.executable, "-m", "benchmarks.studies.reproduce", "--replot", "--out", str(tmp_path)]
    assert subprocess.run(replot, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    assert (tmp_path / "reproduce.md").read_text() == table

    tampered = json.loads((tmp_path / "learning.json").read_text())
    for run in tampered["runs"]:
        if run["label"] == "mintrl-const" and run["seed"] in (0, 1):
            run["final"]["pass@1"] += 0.5 + 0.01 * run["seed"]  # a recorded gain the fresh seeds do not show
    (tmp_path / "learning.json").write_text(json.dumps(tampered))
    assert subprocess.run(replot, cwd=ROOT, capture_output=True, timeout=300).returncode == 1
    assert "| mintrl-const - grpo | pass@1 | 2 |" in (tmp_path / "reproduce.md").read_text()
    assert "**disagree**" in (tmp_path / "reproduce.md").read_text()


def test_the_async_report_pairs_rounds_and_records_the_machine(tmp_path):
    """The asynchronous headline's report from a rerun: per-round ratios of the committed rounds, the machine's
    conditions, and the Welch check (a rerun of the same rounds agrees; one twice as fast does not)."""
    shutil.copy(RESULTS / "cost_async.json", tmp_path / "cost_async.json")
    recorded = json.loads((tmp_path / "cost_async.json").read_text())
    machine = {"cpu_model": "test CPU", "logical_cpus": 2, "usable_cpus": 2, "load_before": 0.1,
               "load_during_mean": 1.9, "load_during_max": 2.3}  # fmt: skip
    rounds = len(reproduce.per_round_ratios(recorded["result"]["runs"], "mintrl_s2"))
    rerun = {"provenance": recorded["provenance"], "machine": machine,
             "settings": {**recorded["settings"], "rounds": rounds}, "result": recorded["result"]}  # fmt: skip
    [mintrl, grpo] = reproduce.async_comparisons(recorded, [rerun])
    assert mintrl["agree"] and grpo["agree"] and mintrl["pooled"].n == 2 * rounds
    text = "\n".join(reproduce.async_report({"runs": [], "async_reruns": [rerun]}, tmp_path))
    assert "test CPU, 2 of 2 CPUs usable; 1-minute load 0.10 before, 1.90 mean / 2.30 max during" in text
    assert f"| mintrl_s2 | {format_ratio(mintrl['recorded'])} |" in text and "not compared" not in text
    # a rerun with the server's processes other than the recorded run's is listed, never pooled with it
    other = json.loads(json.dumps(rerun))
    other["settings"]["server_processes"] = {"single": "multi"}.get(
        recorded["settings"].get("server_processes"), "single"
    )
    [mintrl_alone, _] = reproduce.async_comparisons(recorded, [rerun, other])
    assert mintrl_alone["pooled"].n == 2 * rounds
    assert reproduce.async_comparisons(recorded, [other]) == []
    text = "\n".join(reproduce.async_report({"runs": [], "async_reruns": [rerun, other]}, tmp_path))
    assert text.count("(other settings than the recorded run's: not compared)") == 1
    faster = json.loads(json.dumps(rerun))
    for run in faster["result"]["runs"]:
        if run["arm"] == "mintrl_async_s2":
            run["steps_per_second"] *= 2
    [mintrl, _] = reproduce.async_comparisons(recorded, [faster])
    assert mintrl["agree"] is False
