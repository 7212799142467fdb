"""benchmarks/studies/learning_real.py, the real-model comparison: its tables are computed from the recorded runs (on a small
hand-made results JSON: change a number, a table changes; `--replot` writes the same report from the file), and,
marked `smollm2`, its `--smoke` mode trains the real model for one step (mintrl-const), records every measure, and
`--resume` runs nothing again."""

from __future__ import annotations

import copy
import json
import re

import pytest

from benchmarks.lib.harness import job_key
from benchmarks.lib.stats import format_interval, mean_interval
from benchmarks.studies import learning_real as study
from benchmarks.tasks.real.run import MODEL_ENV, plan_jobs

SEEDS = (0, 1, 2)
# per arm and seed: final held-out pass@1 (pass@8 is twice it, capped at 1), the curve's middle point
PASS1 = {
    "grpo": (0.10, 0.20, 0.15),
    "mintrl-const": (0.30, 0.35, 0.25),
    "sft-grpo": (0.20, 0.30, 0.40),
    "sort": (0.15, 0.25, 0.20),
}
STEP_SECONDS = {"grpo": 10.0, "mintrl-const": 20.0, "sft-grpo": 10.0, "sort": 11.0}


def make_run(arm: str, seed: int) -> dict:
    p1 = PASS1[arm][seed]
    step_s = STEP_SECONDS[arm] + seed
    final = {"pass@1": p1, "pass@8": min(1.0, 2 * p1), "longer_pass@1": p1 / 2, "longer_pass@8": p1,
             "chat_nll": 2.5 + p1, "chat_nll_change": p1 / 10, "kl": p1 / 5}  # fmt: skip
    run = {
        "name": f"real-in-band-{arm}-s{seed}", "regime": "in-band", "arm": arm, "seed": seed, "steps": 4,
        "final": final, "curve": {"2": {"pass@1": p1 / 2}, "4": {"pass@1": p1}},
        "step_seconds": [step_s] * 4, "train_seconds": 4 * step_s + (5.0 if arm == "sft-grpo" else 0.0),
        "machine_during": {"load_during_mean": 2.0},
        "logs": [{"step": s, "reward": 0.1 * s, "entropy": 1.0 - 0.1 * s, "completions/mean_length": 40.0}
                 for s in range(1, 5)],
    }  # fmt: skip
    if arm == "mintrl-const":
        for entry, share in zip(run["logs"], (0.2, 0.1, None, None), strict=True):
            if share is not None:
                entry["mintrl/judge_token_frac"] = share
    if arm == "sft-grpo":
        run["sft"] = {"seconds": 5.0, "steps": 2}
    return run


def make_results() -> dict:
    warm = {"problems": 256, "num_steps": 1, "seed": "warmup/0", "batch_size": 8, "learning_rate": 3e-5}
    baseline = {
        "name": "real-in-band-warm-start", "regime": "in-band", "arm": "warm-start",
        "scores": {"heldout": {"pass@1": 0.05, "pass@8": 0.2}, "heldout_longer": {"pass@1": 0.01, "pass@8": 0.05},
                   "curve": {"pass@1": 0.04}},
        "chat": {"nats_per_token": 2.5},
        "built": {"hash": "abc123", "settings": warm, "steps": 32, "sft_seconds": 300.0, "losses": [1.0, 0.3],
                  "machine": {"cpu_model": "cpu", "usable_cpus": 2, "logical_cpus": 2, "load_before": 1.0,
                              "load_during_mean": 2.0, "load_during_max": 3.0}},
    }  # fmt: skip
    settings = {**study.MODES["full"], "mode": "full", "engine": "transformers", "steps": 4, "seeds": list(SEEDS),
                "plan": {"in-band": list(PASS1)}}  # fmt: skip
    return {
        "provenance": {"command": "python -m benchmarks.studies.learning_real", "commit": "0" * 40, "dirty": False,
                       "changed_files_that_matter": []},
        "settings": settings,
        "baselines": [baseline],
        "runs": [make_run(arm, seed) for seed in SEEDS for arm in PASS1],
    }  # fmt: skip


def row(text: str, *starts: str) -> str:
    """The table line of `text` that starts with `| ` + the cells `starts`."""
    prefix = "| " + " | ".join(starts) + " |"
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return line


def test_the_paired_rows_are_computed_from_the_records():
    results = make_results()
    text = study.report(results)
    diffs = [a - b for a, b in zip(PASS1["mintrl-const"], PASS1["grpo"], strict=True)]
    line = row(text, "in-band", "mintrl-const − grpo")
    assert line.split(" | ")[2] == format_interval(mean_interval(diffs)) == "+15.0 [+2.6, +27.4]"
    versus_sft = [a - b for a, b in zip(PASS1["mintrl-const"], PASS1["sft-grpo"], strict=True)]
    assert row(text, "in-band", "mintrl-const − sft-grpo").split(" | ")[2] == format_interval(
        mean_interval(versus_sft)
    )
    assert row(text, "in-band", "sft-grpo − grpo")  # every arm against GRPO
    # H3's other half: sort against sft-grpo, paired by seed (-5, -5, -20 points)
    assert row(text, "in-band", "sort − sft-grpo").split(" | ")[2] == "-10.0 [-31.5, +11.5]"
    assert "grpo-2x" not in text  # a pair is written only when both its arms are in the plan
    assert "| in-band | warm start | - | 5.0 | 20.0 | 1.0 | 5.0 |" in text
    # the cost: mintrl's seconds per step over GRPO's, per seed: 20/10, 21/11, 22/12
    ratios = [(20 + s) / (10 + s) for s in SEEDS]
    assert f"| in-band | mintrl-const | {mean_interval(ratios).mean:.2f} [" in text
    # time to GRPO's final curve accuracy (mean 15%): mintrl reaches it at step 2 on seeds 0 and 1 (15, 17.5 >= 15),
    # at step 4 on seed 2 (12.5 < 15); sft-grpo at step 2 on seed 1 and 2, step 4 on seed 0
    assert row(text, "in-band", "15.0", "mintrl-const").endswith("| 3 of 3 | 3 [0, 6] | 57 [0, 124] |")
    assert row(text, "in-band", "15.0", "grpo").split(" | ")[3] == "2 of 3"
    health = row(text, "in-band", "mintrl-const", "0")
    assert "20.00 → 10.00" in health and "0.90 → 0.60" in health  # judge share, entropy
    # length with the judge's tokens: 40 policy tokens at a 20% share are 50 tokens; GRPO's are its own
    assert "| 50.00 → 40.00 |" in health and "| 40.00 → 40.00 |" in row(text, "in-band", "grpo", "0")


def test_a_changed_number_changes_its_tables():
    results = make_results()
    before = study.report(results)
    changed = copy.deepcopy(results)
    changed["runs"][1]["final"]["pass@1"] = 0.9  # mintrl-const, seed 0
    after = study.report(changed)
    assert row(after, "in-band", "mintrl-const − grpo") != row(before, "in-band", "mintrl-const − grpo")
    assert row(after, "in-band", "mintrl-const", "3") != row(before, "in-band", "mintrl-const", "3")
    assert row(after, "in-band", "sft-grpo − grpo") == row(before, "in-band", "sft-grpo − grpo")
    changed["runs"][0]["step_seconds"] = [40.0] * 4  # grpo, seed 0: every arm's cost ratio moves
    assert cost_row(study.report(changed), "mintrl-const") != cost_row(before, "mintrl-const")
    assert cost_row(before, "mintrl-const").startswith("| in-band | mintrl-const | 1.91 [1.71, 2.12] |")


def cost_row(text: str, arm: str) -> str:
    """The cost table's line of `arm` (the one whose third cell is a ratio)."""
    ratio = re.compile(rf"\| in-band \| {arm} \| \d+\.\d\d \[")
    [line] = [line for line in text.splitlines() if ratio.match(line)]
    return line


def test_replot_rewrites_the_report_from_the_json(tmp_path):
    results = make_results()
    path = tmp_path / "learning_real.json"
    path.write_text(json.dumps(results))
    out = tmp_path / "out"
    study.main(["--replot", str(path), "--out", str(out)])
    assert (out / "learning_real.md").read_text() == study.report(results)
    assert (out / "learning_real.png").is_file()
    results["runs"][0]["final"]["pass@1"] = 0.5
    path.write_text(json.dumps(results))
    study.main(["--replot", str(path), "--out", str(out)])
    assert (out / "learning_real.md").read_text() == study.report(results)
    assert "| in-band | grpo | 3 | 28.3 ± 18.9 |" in (out / "learning_real.md").read_text()


def test_jobs_have_the_same_keys_in_every_invocation_and_arms_filter_them():
    settings = {**study.MODES["full"], "mode": "full", "engine": "transformers"}
    baselines, runs = plan_jobs(settings)
    assert [b["regime"] for b in baselines] == ["in-band", "reachable"]
    assert len(runs) == 3 * 6 + 3 * 2
    _, again = plan_jobs(settings, ["grpo", "mintrl-const"])
    keys = {job_key(j) for j in runs}
    assert {job_key(j) for j in again} <= keys and {j["arm"] for j in again} == {"grpo", "mintrl-const"}
    _, fresh = plan_jobs({**study.MODES["fresh"], "mode": "fresh", "engine": "transformers"})
    assert {j["seed"] for j in fresh} == {3, 4, 5} and not keys & {job_key(j) for j in fresh}


def test_sittings_run_at_most_max_runs_and_keep_every_other_record(tmp_path, monkeypatch):
    """A sitting runs the next `--max_runs` runs not yet recorded; `--resume` with `--arms` or `--max_runs` keeps the
    records of the jobs it does not run (the harness alone would drop them when it rewrites the file)."""
    ran = []

    def fake_run(job):
        ran.append(job["arm"])
        record = make_run(job["arm"] if job["arm"] in PASS1 else "grpo", job["seed"])
        return {**job, **record, "arm": job["arm"], "name": job["name"]}

    monkeypatch.setattr(study, "run_job", fake_run)
    monkeypatch.setattr(study, "measure_warm_start", lambda job: {**make_results()["baselines"][0], **job})
    argv = ["--smoke", "--workers", "0", "--out", str(tmp_path)]
    study.main([*argv, "--max_runs", "2"])
    assert ran == ["grpo", "grpo-2x"]
    study.main([*argv, "--resume", "--arms", "sort"])
    study.main([*argv, "--resume", "--max_runs", "1"])
    assert ran == ["grpo", "grpo-2x", "sort", "mintrl-const"]
    saved = json.loads((tmp_path / "learning_real_smoke.json").read_text())
    assert sorted(r["arm"] for r in saved["runs"]) == ["grpo", "grpo-2x", "mintrl-const", "sort"]
    assert len(saved["baselines"]) == 1
    assert "| in-band | sort − grpo |" in (tmp_path / "learning_real_smoke.md").read_text()


@pytest.mark.smollm2
def test_smoke_records_every_measure_and_resume_reruns_nothing(smollm2_path, tmp_path, monkeypatch):
    argv = ["--smoke", "--arms", "mintrl-const", "--workers", "0", "--out", str(tmp_path), "--model", smollm2_path]
    monkeypatch.setenv(MODEL_ENV, smollm2_path)
    results = study.main(argv)
    saved = json.loads((tmp_path / "learning_real_smoke.json").read_text())
    assert saved["runs"] == results["runs"] and [r["arm"] for r in saved["runs"]] == ["mintrl-const"]
    [warm] = saved["baselines"]
    assert warm["built"]["steps"] == 1 and warm["built"]["sft_seconds"] > 0 and set(warm["scores"]) >= {"heldout"}
    for run in saved["runs"]:
        assert set(run["final"]) == {"pass@1", "pass@8", "longer_pass@1", "longer_pass@8", "chat_nll",
                                     "chat_nll_change", "kl"}  # fmt: skip
        assert all(0 <= run["final"][k] <= 1 for k in ("pass@1", "pass@8", "longer_pass@1", "longer_pass@8"))
        assert run["kl"]["tokens"] > 0 and run["chat_start"]["answers"] == 20
        assert len(run["step_seconds"]) == 1 and run["train_seconds"] > 0 and "1" in run["curve"]
        [log] = run["logs"]
        assert {"entropy", "reward", "completions/mean_length"} <= set(log)
        assert run["recorded"]["commit"] and "load_1min" in run["recorded"]["machine"]
    [mintrl] = saved["runs"]
    assert "mintrl/judge_token_frac" in mintrl["logs"][0] and mintrl["logs"][0]["mintrl/reviews_per_rollout"] > 0
    text = (tmp_path / "learning_real_smoke.md").read_text()
    assert f"| in-band | mintrl-const | 1 | {100 * mintrl['final']['pass@1']:.1f} |" in text

    def must_not_run(job):
        raise AssertionError(f"{job['name']} ran again")

    monkeypatch.setattr(study, "run_job", must_not_run)
    monkeypatch.setattr(study, "measure_warm_start", must_not_run)
    again = study.main([*argv, "--resume"])
    assert again["runs"] == saved["runs"] and again["baselines"] == saved["baselines"]
